/*
 * Fixed-point gradients for atomic aggregation (GS_PS_AGG=atomic).
 *
 * A gradient element g travels as q = round(g * 2^frac_bits) in a signed
 * int64 and W workers add theirs into one int64 accumulator with FETCH_ADD.
 * Overflow is never silent:
 *  - before anything is sent, every |q| must be at most bound =
 *    (2^63 - 1) / W, so that the sum of W of them cannot leave int64; an
 *    element beyond it (or NaN, or infinite) refuses the whole push with
 *    GS_ERR_OVERFLOW naming the element and the largest magnitude allowed;
 *  - every FETCH_ADD returns the old value, and the worker checks that
 *    old + q did not wrap (which would mean the accumulator held more than
 *    the bound allows, e.g. it was not drained); a wrap is reported as
 *    GS_ERR_OVERFLOW to the worker and flagged to the server, which then
 *    refuses the step.
 * Integer-valued gradients (and any g whose g * 2^frac_bits is an integer)
 * are exact: the scaling by a power of two and the int64 sum lose nothing.
 * Other values are rounded to the nearest multiple of 2^-frac_bits.
 */
#ifndef GS_PS_FIXED_H
#define GS_PS_FIXED_H

#include "gradsync.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gs_ps_fixed {
    int frac_bits; /* 0 .. 62 */
    int workers;
    double scale;  /* 2^frac_bits */
    int64_t bound; /* largest |q| one worker may add */
} gs_ps_fixed;

/* GS_ERR_INVALID (logged) for frac_bits outside 0..62 or workers < 1. */
gs_status gs_ps_fixed_init(gs_ps_fixed *fx, int frac_bits, int workers);
/* The largest |g| one worker may push. */
double gs_ps_fixed_max_abs(const gs_ps_fixed *fx);
/* q[i] = round(g[i] * scale). GS_ERR_OVERFLOW (not logged; *bad_p = the
 * first element out of range) if some |q[i]| would exceed the bound. */
gs_status gs_ps_fixed_encode(const gs_ps_fixed *fx, const float *g, int64_t *q, size_t count, size_t *bad_p);
/* Whether adding add to an accumulator that held old wrapped around. */
static inline bool gs_ps_fixed_wrapped(int64_t old, int64_t add)
{
    int64_t sum;
    return __builtin_add_overflow(old, add, &sum);
}
/* out[i] = acc[i] / scale: exact in double while |acc[i]| < 2^53, then
 * rounded once to f32. */
void gs_ps_fixed_decode(const gs_ps_fixed *fx, const int64_t *acc, float *out, size_t count);

#endif
