/* Fixed-point encoding of gradients for atomic aggregation: the bound that
 * keeps W workers' sum inside int64, encoding with every element checked,
 * decoding (fixed.h; the wrap check on FETCH_ADD's old value is inline
 * there). Pure arithmetic: no transport, no server state. */
#include "ps/fixed.h"

#include "util/log.h"

#include <math.h>

gs_status gs_ps_fixed_init(gs_ps_fixed *fx, int frac_bits, int workers)
{
    if (frac_bits < 0 || frac_bits > 62 || workers < 1)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                       "atomic aggregation: GS_PS_ATOMIC_FRAC_BITS=%d with %d workers is not usable "
                       "(bits must be 0..62)",
                       frac_bits, workers);
    fx->frac_bits = frac_bits;
    fx->workers = workers;
    fx->scale = ldexp(1.0, frac_bits);
    fx->bound = INT64_MAX / workers;
    return GS_OK;
}

/* (double)bound may round up past bound; the largest double not above it
 * is what encode compares against, so llrint never sees a value it cannot
 * hold. */
static double limit_of(const gs_ps_fixed *fx)
{
    return nextafter((double)fx->bound, 0.0);
}

double gs_ps_fixed_max_abs(const gs_ps_fixed *fx)
{
    return limit_of(fx) / fx->scale;
}

gs_status gs_ps_fixed_encode(const gs_ps_fixed *fx, const float *g, int64_t *q, size_t count, size_t *bad_p)
{
    double limit = limit_of(fx);
    for (size_t i = 0; i < count; i++) {
        double x = (double)g[i] * fx->scale; /* exact: a power-of-two scaling of an f32 */
        if (!(fabs(x) <= limit)) {           /* also catches NaN */
            *bad_p = i;
            return GS_ERR_OVERFLOW;
        }
        q[i] = llrint(x);
    }
    return GS_OK;
}

void gs_ps_fixed_decode(const gs_ps_fixed *fx, const int64_t *acc, float *out, size_t count)
{
    double k = 1.0 / fx->scale; /* a power of two: exact */
    for (size_t i = 0; i < count; i++)
        out[i] = (float)((double)acc[i] * k);
}
