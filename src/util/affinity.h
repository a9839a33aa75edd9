/* GS_CPU_AFFINITY: pinning each local rank to one core. */
#ifndef GS_UTIL_AFFINITY_H
#define GS_UTIL_AFFINITY_H

#include "gradsync.h"

/* spec "" leaves the process alone; "auto" pins local rank i to the i-th
 * (modulo) core the process may run on; "3,1,2" pins local rank i to the
 * i-th (modulo) core of the list. A malformed list is GS_ERR_CONFIG naming
 * GS_CPU_AFFINITY; a core the kernel refuses is a warning, not an error.
 * *cpu_p (may be NULL) is the core chosen, or -1 when none. */
gs_status gs_affinity_apply(const char *spec, int local_rank, int *cpu_p);

#endif
