/*
 * The kernels' public face (gradsync.h, "Data types and reduction
 * operators"): gs_reduce_local, one reduction step in the caller's memory,
 * and the half-precision conversions the kernels round with. Checks the
 * arguments, then calls reduce.c; knows nothing of communicators.
 */
#include "kernel/reduce.h"

#include "util/log.h"

#include <stdint.h>

gs_status gs_reduce_local(void *dst, const void *src, size_t count, gs_dtype dtype, gs_redop op)
{
    const char *why = op == GS_AVG ? "avg has no local form (sum, then divide by the number of operands)"
                                   : gs_red_invalid_why(dtype, op);
    size_t bytes;
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;

    if (why)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "gs_reduce_local: %s %s: %s", gs_dtype_name(dtype),
                       gs_redop_name(op), why);
    if (count == 0)
        return GS_OK;
    if (!dst || !src)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "gs_reduce_local: NULL %s with count %zu",
                       !dst ? "dst" : "src", count);
    bytes = count * gs_dtype_size(dtype);
    if (bytes / gs_dtype_size(dtype) != count || d + bytes < d || s + bytes < s)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "gs_reduce_local: count %zu of %s overflows memory",
                       count, gs_dtype_name(dtype));
    if (d != s && d < s + bytes && s < d + bytes)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID,
                       "gs_reduce_local: dst and src overlap without being the same buffer");
    gs_red_apply(dtype, op, dst, dst, src, count);
    return GS_OK;
}

uint16_t gs_f16_from_f32(float value)
{
    return gs_red_f32_to_f16(value);
}

float gs_f16_to_f32(uint16_t bits)
{
    return gs_red_f16_to_f32(bits);
}

uint16_t gs_bf16_from_f32(float value)
{
    return gs_red_f32_to_bf16(value);
}

float gs_bf16_to_f32(uint16_t bits)
{
    return gs_red_bf16_to_f32(bits);
}
