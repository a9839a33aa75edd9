/* GS_CPU_AFFINITY: parsing the spec and pinning a local rank to its core
 * (affinity.h). Knows nothing of the layers above. */
#include "util/affinity.h"

#include "util/log.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 1024

static gs_status parse_list(const char *spec, int *cpus, int *n_p)
{
    int n = 0;
    for (const char *p = spec; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= CPU_SETSIZE || (*end && *end != ',') || n == MAX_LIST)
            return gs_fail(GS_SUBSYS_UTIL, GS_ERR_CONFIG,
                           "GS_CPU_AFFINITY='%s' is not valid: expected empty, auto, or a comma-separated "
                           "list of core numbers below %d",
                           spec, CPU_SETSIZE);
        cpus[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    *n_p = n;
    return GS_OK;
}

/* The i-th (modulo) core of the set this process may run on, or -1. */
static int allowed_core(int i)
{
    cpu_set_t set;
    int count, k = 0;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || (count = CPU_COUNT(&set)) == 0)
        return -1;
    i %= count;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set) && k++ == i)
            return cpu;
    return -1;
}

gs_status gs_affinity_apply(const char *spec, int local_rank, int *cpu_p)
{
    int *cpus = NULL, n = 0, cpu = -1;
    gs_status status = GS_OK;
    cpu_set_t set;

    if (local_rank < 0)
        local_rank = 0;
    if (!spec || !*spec)
        goto out;
    if (strcmp(spec, "auto") == 0) {
        cpu = allowed_core(local_rank);
    } else {
        cpus = malloc(MAX_LIST * sizeof(*cpus));
        if (!cpus) {
            status = GS_ERR_NOMEM;
            goto out;
        }
        status = parse_list(spec, cpus, &n);
        if (status != GS_OK || n == 0)
            goto out;
        cpu = cpus[local_rank % n];
    }
    if (cpu < 0)
        goto out;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        gs_log_warn(UTIL, "GS_CPU_AFFINITY: cannot pin local rank %d to core %d: %s; running unpinned",
                    local_rank, cpu, strerror(errno));
        cpu = -1;
    } else {
        gs_log_info(UTIL, "local rank %d pinned to core %d (GS_CPU_AFFINITY=%s)", local_rank, cpu, spec);
    }
out:
    free(cpus);
    if (status == GS_OK && cpu_p)
        *cpu_p = cpu;
    return status;
}
