/*
 * Reduction kernels: element-wise dst[i] = a[i] op b[i] for every data type
 * and operator, vectorized by the compiler (one clone per x86 ISA level,
 * picked at load time), and the half-precision conversions they use.
 * Below coll and ps, which both use them (and gsbench --kernels): knows
 * nothing of communicators, servers or transports.
 *
 * Semantics (the same on every rank and every run, so that a fixed reduction
 * order gives bitwise-identical results):
 *  - f32, f64: IEEE arithmetic in the type; no contraction into FMA, no
 *    fast-math reassociation.
 *  - f16, bf16: each step converts both operands to f32, applies the operator
 *    in f32 and rounds back to nearest, ties to even. A reduction over N
 *    ranks therefore rounds once per step, in the algorithm's fixed order.
 *  - i32, i64, i16, i8, u8: sum and prod wrap modulo 2^bits (two's
 *    complement, no undefined behaviour); min and max are signed (u8:
 *    unsigned); band, bor, bxor are bitwise.
 *  - bool (one byte, nonzero is true, results 0 or 1): sum, max and bor are
 *    or; prod, min and band are and; bxor is xor; avg is not defined.
 *  - min, max (floating): a NaN operand gives NaN (it propagates, as in
 *    torch.minimum); +0 and -0 compare equal and either may be returned.
 *  - avg: the kernels compute the sum; after the last step the owner of each
 *    element calls gs_red_avg_finish once, which divides by the rank count
 *    (floating: one IEEE division, f16/bf16 in f32 then rounded; integers:
 *    C division of the wrapped sum, truncating toward zero). One division at
 *    the end means every rank receives the same bits.
 */
#ifndef GS_KERNEL_REDUCE_H
#define GS_KERNEL_REDUCE_H

#include "gradsync.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* dst[i] = a[i] op b[i] for i < count, operands always in this order. dst
 * may be exactly a and/or exactly b (in place); any other overlap is not
 * allowed. Pointers need only the natural alignment of the element type. */
typedef void (*gs_red_fn)(void *dst, const void *a, const void *b, size_t count);

/* The kernel for dtype and op (GS_AVG gives the sum kernel); NULL for an
 * unknown dtype or op. */
gs_red_fn gs_red_kernel(gs_dtype dtype, gs_redop op);
/* The same, applied. */
void gs_red_apply(gs_dtype dtype, gs_redop op, void *dst, const void *a, const void *b, size_t count);
/* GS_AVG's final step: buf[i] = buf[i] / divisor (see above). */
void gs_red_avg_finish(gs_dtype dtype, void *buf, size_t count, int divisor);
/* Results too large for the cache: the same, writing dst with streaming
 * (non-temporal) stores. dst may be exactly a or b. */
void gs_red_apply_nt(gs_dtype dtype, gs_redop op, void *dst, const void *a, const void *b, size_t count);
/* memcpy with streaming stores (non-overlapping buffers). */
void gs_red_copy_nt(void *dst, const void *src, size_t len);
/* Tests: true restricts f16 to the portable integer conversion (instead of
 * the F16C instructions), so both paths can be checked. */
void gs_red_force_portable(bool on);
/* Whether dtype and op are valid (known, and the operator defined on the type). */
bool gs_red_valid(gs_dtype dtype, gs_redop op);
/* Why not, in a few words (NULL when valid). */
const char *gs_red_invalid_why(gs_dtype dtype, gs_redop op);

static inline uint32_t gs_red_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float gs_red_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* cond ? a : b as mask arithmetic, which gcc if-converts and vectorizes
 * where nested conditionals would become branches. */
static inline uint32_t gs_red_select(bool cond, uint32_t a, uint32_t b)
{
    uint32_t mask = 0u - (uint32_t)cond;
    return (a & mask) | (b & ~mask);
}

/* IEEE binary16 -> binary32, exact for normals, subnormals, infinities and
 * NaN (payload kept, quiet bit as given). Branch-free so loops vectorize. */
static inline float gs_red_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    uint32_t exp = em & 0x7c00u;
    uint32_t normal = (em << 13) + ((127u - 15u) << 23);
    uint32_t special = (em << 13) + ((255u - 31u) << 23);                                 /* inf, nan */
    float sub = gs_red_bits_f32((em << 13) + (113u << 23)) - gs_red_bits_f32(113u << 23); /* em * 2^-24 */
    uint32_t mag =
        gs_red_select(exp == 0x7c00u, special, gs_red_select(exp == 0, gs_red_f32_bits(sub), normal));
    return gs_red_bits_f32(mag | sign);
}

/* IEEE binary32 -> binary16, round to nearest, ties to even; overflow gives
 * infinity, NaN stays NaN (quiet). Branch-free so loops vectorize. */
static inline uint16_t gs_red_f32_to_f16(float f)
{
    const uint32_t f16_inf_from = (127u + 16u) << 23; /* 65536: rounds to inf at least */
    const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t x = gs_red_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t mag = x & 0x7fffffffu;
    /* subnormal or zero result: add 0.5 so the FPU rounds the mantissa into place */
    uint32_t sub = gs_red_f32_bits(gs_red_bits_f32(mag) + gs_red_bits_f32(magic)) - magic;
    /* normal result: rebias, then round to nearest even on the 13 dropped bits */
    uint32_t norm = (mag + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((mag >> 13) & 1u)) >> 13;
    uint32_t big = gs_red_select(mag > 0x7f800000u, 0x7e00u | ((mag >> 13) & 0x3ffu), 0x7c00u);
    uint32_t out = gs_red_select(mag >= f16_inf_from, big, gs_red_select(mag < (113u << 23), sub, norm));
    return (uint16_t)(out | sign);
}

static inline float gs_red_bf16_to_f32(uint16_t h)
{
    return gs_red_bits_f32((uint32_t)h << 16);
}

/* binary32 -> bfloat16, round to nearest, ties to even; NaN stays NaN (quiet). */
static inline uint16_t gs_red_f32_to_bf16(float f)
{
    uint32_t x = gs_red_f32_bits(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)gs_red_select((x & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

#endif
