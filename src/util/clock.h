/* Monotonic clock and deadlines. */
#ifndef GS_UTIL_CLOCK_H
#define GS_UTIL_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t gs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double gs_now_us(void)
{
    return (double)gs_now_ns() / 1e3;
}

/* A point in time timeout_ms from now (timeout_ms < 0: never). */
static inline uint64_t gs_deadline_after_ms(int64_t timeout_ms)
{
    return timeout_ms < 0 ? UINT64_MAX : gs_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

static inline bool gs_deadline_passed(uint64_t deadline_ns)
{
    return deadline_ns != UINT64_MAX && gs_now_ns() >= deadline_ns;
}

/* Milliseconds left until deadline (for poll()), at least 0; -1 for never. */
static inline int gs_deadline_left_ms(uint64_t deadline_ns)
{
    uint64_t now;
    if (deadline_ns == UINT64_MAX)
        return -1;
    now = gs_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

static inline void gs_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
