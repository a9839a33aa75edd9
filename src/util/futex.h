/* The futex system call (glibc has no wrapper). */
#ifndef GS_UTIL_FUTEX_H
#define GS_UTIL_FUTEX_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* op as for futex(2): FUTEX_WAIT / FUTEX_WAKE, with FUTEX_PRIVATE_FLAG
 * where the word is not shared between processes; ts: NULL or a relative
 * timeout for FUTEX_WAIT. */
static inline long gs_futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, 0);
}

#endif
