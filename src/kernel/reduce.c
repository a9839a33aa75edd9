/*
 * Reduction kernels (semantics in reduce.h). Each (type, operator) pair is
 * one simple loop over restrict pointers that gcc vectorizes; the file is
 * compiled at -O3 whatever the build type, without FMA contraction, and each
 * loop is cloned for AVX-512, AVX2 and baseline x86-64, chosen at load time.
 * Check with: gcc -O3 -fopt-info-vec-optimized -Iinclude -Isrc -c src/kernel/reduce.c
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "kernel/reduce.h"
#include "util/copy.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define GS_RED_HAVE_F16C_PATH 1

/* AVX and F16C usable: the CPU has both (CPUID.1:ECX bits 28, 29) and the OS
 * saves the YMM state (OSXSAVE, bit 27, and XCR0 bits 1-2). Asked once;
 * cpuid rather than __builtin_cpu_supports("f16c"), which clang lacks. */
static bool red_cpu_has_f16c(void)
{
    static int known = -1;
    if (known < 0) {
        unsigned a, b, c, d, lo, hi;
        bool ok = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27)) && (c & (1u << 28)) && (c & (1u << 29));
        if (ok) {
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ok = (lo & 6u) == 6u;
        }
        known = ok;
    }
    return known;
}
#endif

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define GS_RED_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GS_RED_CLONES
#endif

/* Element access: native types load and store as they are; the 16-bit
 * floating types go through f32. */
#define LOAD_ID(v)    (v)
#define STORE_ID(v)   (v)
#define LOAD_F16(v)   gs_red_f16_to_f32(v)
#define STORE_F16(v)  gs_red_f32_to_f16(v)
#define LOAD_BF16(v)  gs_red_bf16_to_f32(v)
#define STORE_BF16(v) gs_red_f32_to_bf16(v)

/* Operators on the accumulation type; x and y are the operands. */
#define OP_SUM(x, y)  ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y)  ((x) < (y) ? (x) : (y))
#define OP_MAX(x, y)  ((x) > (y) ? (x) : (y))
/* Floating min/max: a NaN in x is kept; a NaN in y falls out of the compare. */
#define OP_FMIN(x, y) ((x) != (x) ? (x) : (x) < (y) ? (x) : (y))
#define OP_FMAX(x, y) ((x) != (x) ? (x) : (x) > (y) ? (x) : (y))

/*
 * One kernel: a three-operand loop (d = a op b) and two in-place loops
 * (d = d op b, d = a op d) so that every pointer can stay restrict and the
 * operand order is always exactly a op b; then the dispatcher.
 */
#define GS_RED_DEFINE(name, T, ACC, LOAD, STORE, OP)                                                         \
    GS_RED_CLONES static void name##_3(T *restrict d, const T *restrict a, const T *restrict b, size_t n)    \
    {                                                                                                        \
        for (size_t i = 0; i < n; i++) {                                                                     \
            ACC x = LOAD(a[i]), y = LOAD(b[i]);                                                              \
            d[i] = STORE(OP(x, y));                                                                          \
        }                                                                                                    \
    }                                                                                                        \
    GS_RED_CLONES static void name##_da(T *restrict d, const T *restrict b, size_t n)                        \
    {                                                                                                        \
        for (size_t i = 0; i < n; i++) {                                                                     \
            ACC x = LOAD(d[i]), y = LOAD(b[i]);                                                              \
            d[i] = STORE(OP(x, y));                                                                          \
        }                                                                                                    \
    }                                                                                                        \
    GS_RED_CLONES static void name##_db(T *restrict d, const T *restrict a, size_t n)                        \
    {                                                                                                        \
        for (size_t i = 0; i < n; i++) {                                                                     \
            ACC x = LOAD(a[i]), y = LOAD(d[i]);                                                              \
            d[i] = STORE(OP(x, y));                                                                          \
        }                                                                                                    \
    }                                                                                                        \
    static void name##_dd(T *d, size_t n)                                                                    \
    {                                                                                                        \
        for (size_t i = 0; i < n; i++) {                                                                     \
            ACC x = LOAD(d[i]);                                                                              \
            d[i] = STORE(OP(x, x));                                                                          \
        }                                                                                                    \
    }                                                                                                        \
    static void name(void *d, const void *a, const void *b, size_t n)                                        \
    {                                                                                                        \
        if (d == a && d == b)                                                                                \
            name##_dd(d, n);                                                                                 \
        else if (d == a)                                                                                     \
            name##_da(d, b, n);                                                                              \
        else if (d == b)                                                                                     \
            name##_db(d, a, n);                                                                              \
        else                                                                                                 \
            name##_3(d, a, b, n);                                                                            \
    }

/* The four operators of one type (avg uses sum). */
#define GS_RED_TYPE(tn, T, TW, ACC, LOAD, STORE, MIN, MAX)                                                   \
    GS_RED_DEFINE(red_##tn##_sum, TW, TW, LOAD, STORE, OP_SUM)                                               \
    GS_RED_DEFINE(red_##tn##_prod, TW, TW, LOAD, STORE, OP_PROD)                                             \
    GS_RED_DEFINE(red_##tn##_min, T, ACC, LOAD, STORE, MIN)                                                  \
    GS_RED_DEFINE(red_##tn##_max, T, ACC, LOAD, STORE, MAX)

/* Integers add and multiply as unsigned (wrapping), compare as signed. */
GS_RED_TYPE(f32, float, float, float, LOAD_ID, STORE_ID, OP_FMIN, OP_FMAX)
GS_RED_TYPE(f64, double, double, double, LOAD_ID, STORE_ID, OP_FMIN, OP_FMAX)
GS_RED_TYPE(i32, int32_t, uint32_t, int32_t, LOAD_ID, STORE_ID, OP_MIN, OP_MAX)
GS_RED_TYPE(i64, int64_t, uint64_t, int64_t, LOAD_ID, STORE_ID, OP_MIN, OP_MAX)

/* Bitwise operators of the integer types (on the unsigned storage type). */
#define OP_BAND(x, y) ((x) & (y))
#define OP_BOR(x, y)  ((x) | (y))
#define OP_BXOR(x, y) ((x) ^ (y))
#define GS_RED_BITS(tn, TW)                                                                                  \
    GS_RED_DEFINE(red_##tn##_band, TW, TW, LOAD_ID, STORE_ID, OP_BAND)                                       \
    GS_RED_DEFINE(red_##tn##_bor, TW, TW, LOAD_ID, STORE_ID, OP_BOR)                                         \
    GS_RED_DEFINE(red_##tn##_bxor, TW, TW, LOAD_ID, STORE_ID, OP_BXOR)

GS_RED_BITS(i32, uint32_t)
GS_RED_BITS(i64, uint64_t)

/* The byte-like integers: sums and products in uint32_t (the promotion to
 * int would overflow a 16-bit product), truncated when stored, which is
 * the wrap modulo 2^8 / 2^16; min and max compare in the type. */
#define GS_RED_SMALL(tn, T, TW)                                                                              \
    GS_RED_DEFINE(red_##tn##_sum, TW, uint32_t, LOAD_ID, (TW), OP_SUM)                                       \
    GS_RED_DEFINE(red_##tn##_prod, TW, uint32_t, LOAD_ID, (TW), OP_PROD)                                     \
    GS_RED_DEFINE(red_##tn##_min, T, T, LOAD_ID, STORE_ID, OP_MIN)                                           \
    GS_RED_DEFINE(red_##tn##_max, T, T, LOAD_ID, STORE_ID, OP_MAX)                                           \
    GS_RED_BITS(tn, TW)

GS_RED_SMALL(u8, uint8_t, uint8_t)
GS_RED_SMALL(i8, int8_t, uint8_t)
GS_RED_SMALL(i16, int16_t, uint16_t)

/* bool: any nonzero byte is true, results are 0 or 1 (as PyTorch's sum on
 * bool: or; prod and min: and; max: or). */
#define OP_LAND(x, y) ((uint8_t)(((x) != 0) & ((y) != 0)))
#define OP_LOR(x, y)  ((uint8_t)(((x) | (y)) != 0))
#define OP_LXOR(x, y) ((uint8_t)(((x) != 0) ^ ((y) != 0)))
GS_RED_DEFINE(red_bool_and, uint8_t, uint8_t, LOAD_ID, STORE_ID, OP_LAND)
GS_RED_DEFINE(red_bool_or, uint8_t, uint8_t, LOAD_ID, STORE_ID, OP_LOR)
GS_RED_DEFINE(red_bool_xor, uint8_t, uint8_t, LOAD_ID, STORE_ID, OP_LXOR)

/* 16-bit float min/max compare in f32 and return one operand's bits
 * unchanged (exact, and NaN keeps its payload): x is kept when it is NaN or
 * wins the compare. */
#define GS_RED_HALF_PICK(tn, LOAD)                                                                           \
    static inline uint16_t tn##_min(uint16_t x, uint16_t y)                                                  \
    {                                                                                                        \
        float fx = LOAD(x), fy = LOAD(y);                                                                    \
        return (uint16_t)gs_red_select((fx != fx) | (fx < fy), x, y);                                        \
    }                                                                                                        \
    static inline uint16_t tn##_max(uint16_t x, uint16_t y)                                                  \
    {                                                                                                        \
        float fx = LOAD(x), fy = LOAD(y);                                                                    \
        return (uint16_t)gs_red_select((fx != fx) | (fx > fy), x, y);                                        \
    }

/* The 16-bit floats: storage uint16_t, arithmetic in float. */
#define GS_RED_HALF(tn, LOAD, STORE)                                                                         \
    GS_RED_HALF_PICK(tn, LOAD)                                                                               \
    GS_RED_DEFINE(red_##tn##_sum, uint16_t, float, LOAD, STORE, OP_SUM)                                      \
    GS_RED_DEFINE(red_##tn##_prod, uint16_t, float, LOAD, STORE, OP_PROD)                                    \
    GS_RED_DEFINE(red_##tn##_min, uint16_t, uint16_t, LOAD_ID, STORE_ID, tn##_min)                           \
    GS_RED_DEFINE(red_##tn##_max, uint16_t, uint16_t, LOAD_ID, STORE_ID, tn##_max)

GS_RED_HALF(f16, LOAD_F16, STORE_F16)
GS_RED_HALF(bf16, LOAD_BF16, STORE_BF16)

/*
 * f16 sum and prod through the F16C conversion instructions where the CPU
 * has them: the compiler does not vectorize conversions of _Float16, and the
 * branch-free integer conversion above costs about 20 instructions per
 * element. Same results bit for bit (round to nearest even, NaN quieted with
 * its payload kept); the tail goes through the portable kernel.
 */
static bool red_portable_only;

void gs_red_force_portable(bool on)
{
    red_portable_only = on;
}

#ifdef GS_RED_HAVE_F16C_PATH
#define GS_RED_F16C(name, VOP, portable)                                                                     \
    __attribute__((target("avx,f16c"))) static void name##_f16c(uint16_t *d, const uint16_t *a,              \
                                                                const uint16_t *b, size_t n)                 \
    {                                                                                                        \
        size_t i = 0;                                                                                        \
        for (; i + 8 <= n; i += 8) {                                                                         \
            __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));                           \
            __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));                           \
            _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(VOP(x, y), _MM_FROUND_TO_NEAREST_INT));     \
        }                                                                                                    \
        if (i < n)                                                                                           \
            portable(d + i, a + i, b + i, n - i);                                                            \
    }                                                                                                        \
    static void name(void *d, const void *a, const void *b, size_t n)                                        \
    {                                                                                                        \
        if (!red_portable_only && red_cpu_has_f16c())                                                        \
            name##_f16c(d, a, b, n);                                                                         \
        else                                                                                                 \
            portable(d, a, b, n);                                                                            \
    }

GS_RED_F16C(red_f16_fast_sum, _mm256_add_ps, red_f16_sum)
GS_RED_F16C(red_f16_fast_prod, _mm256_mul_ps, red_f16_prod)
#define GS_RED_F16_SUM  red_f16_fast_sum
#define GS_RED_F16_PROD red_f16_fast_prod
#else
#define GS_RED_F16_SUM  red_f16_sum
#define GS_RED_F16_PROD red_f16_prod
#endif

#define GS_RED_ROW(tn)                                                                                       \
    {                                                                                                        \
        red_##tn##_sum, red_##tn##_sum, red_##tn##_min, red_##tn##_max, red_##tn##_prod                      \
    }
#define GS_RED_INT_ROW(tn)                                                                                   \
    {                                                                                                        \
        red_##tn##_sum, red_##tn##_sum, red_##tn##_min, red_##tn##_max, red_##tn##_prod, red_##tn##_band,    \
            red_##tn##_bor, red_##tn##_bxor                                                                  \
    }

/* NULL: the operator is not defined on the type (bitwise on floating
 * types, avg on bool). */
static const gs_red_fn red_table[GS_DTYPE_COUNT][GS_REDOP_COUNT] = {
    [GS_F32] = GS_RED_ROW(f32),
    [GS_F64] = GS_RED_ROW(f64),
    [GS_F16] = {GS_RED_F16_SUM, GS_RED_F16_SUM, red_f16_min, red_f16_max, GS_RED_F16_PROD},
    [GS_BF16] = GS_RED_ROW(bf16),
    [GS_I32] = GS_RED_INT_ROW(i32),
    [GS_I64] = GS_RED_INT_ROW(i64),
    [GS_U8] = GS_RED_INT_ROW(u8),
    [GS_I8] = GS_RED_INT_ROW(i8),
    [GS_I16] = GS_RED_INT_ROW(i16),
    [GS_BOOL] = {red_bool_or, NULL, red_bool_and, red_bool_or, red_bool_and, red_bool_and, red_bool_or,
                 red_bool_xor},
};
_Static_assert(GS_SUM == 0 && GS_AVG == 1 && GS_MIN == 2 && GS_MAX == 3 && GS_PROD == 4 && GS_BAND == 5 &&
                   GS_BOR == 6 && GS_BXOR == 7,
               "red_table rows follow gs_redop");

bool gs_red_valid(gs_dtype dtype, gs_redop op)
{
    return (unsigned)dtype < GS_DTYPE_COUNT && (unsigned)op < GS_REDOP_COUNT && red_table[dtype][op];
}

const char *gs_red_invalid_why(gs_dtype dtype, gs_redop op)
{
    if ((unsigned)dtype >= GS_DTYPE_COUNT)
        return "unknown data type";
    if ((unsigned)op >= GS_REDOP_COUNT)
        return "unknown reduction operator";
    if (red_table[dtype][op])
        return NULL;
    if (op >= GS_BAND)
        return "bitwise operators (band, bor, bxor) need an integer or bool type";
    return dtype == GS_BOOL && op == GS_AVG ? "avg is not defined on bool"
                                            : "operator not defined on the type";
}

gs_red_fn gs_red_kernel(gs_dtype dtype, gs_redop op)
{
    return gs_red_valid(dtype, op) ? red_table[dtype][op] : NULL;
}

void gs_red_apply(gs_dtype dtype, gs_redop op, void *dst, const void *a, const void *b, size_t count)
{
    gs_red_fn fn = gs_red_kernel(dtype, op);
    if (fn && count)
        fn(dst, a, b, count);
}

/* Division of the finished sum by the rank count, one loop per type. */
#define GS_RED_DIV(name, T, ACC, LOAD, STORE)                                                                \
    GS_RED_CLONES static void name(T *restrict buf, size_t n, ACC divisor)                                   \
    {                                                                                                        \
        for (size_t i = 0; i < n; i++)                                                                       \
            buf[i] = STORE((ACC)LOAD(buf[i]) / divisor);                                                     \
    }

GS_RED_DIV(div_f32, float, float, LOAD_ID, STORE_ID)
GS_RED_DIV(div_f64, double, double, LOAD_ID, STORE_ID)
GS_RED_DIV(div_f16, uint16_t, float, LOAD_F16, STORE_F16)
GS_RED_DIV(div_bf16, uint16_t, float, LOAD_BF16, STORE_BF16)
GS_RED_DIV(div_i32, int32_t, int32_t, LOAD_ID, STORE_ID)
GS_RED_DIV(div_i64, int64_t, int64_t, LOAD_ID, STORE_ID)
GS_RED_DIV(div_u8, uint8_t, uint32_t, LOAD_ID, STORE_ID)
GS_RED_DIV(div_i8, int8_t, int32_t, LOAD_ID, STORE_ID)
GS_RED_DIV(div_i16, int16_t, int32_t, LOAD_ID, STORE_ID)

#ifdef GS_RED_HAVE_F16C_PATH
__attribute__((target("avx,f16c"))) static void div_f16_f16c(uint16_t *buf, size_t n, float divisor)
{
    __m256 q = _mm256_set1_ps(divisor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(buf + i)));
        _mm_storeu_si128((__m128i *)(buf + i),
                         _mm256_cvtps_ph(_mm256_div_ps(x, q), _MM_FROUND_TO_NEAREST_INT));
    }
    div_f16(buf + i, n - i, divisor);
}

static void div_f16_best(uint16_t *buf, size_t n, float divisor)
{
    if (!red_portable_only && red_cpu_has_f16c())
        div_f16_f16c(buf, n, divisor);
    else
        div_f16(buf, n, divisor);
}
#else
#define div_f16_best div_f16
#endif

void gs_red_avg_finish(gs_dtype dtype, void *buf, size_t count, int divisor)
{
    if (!count || divisor <= 1)
        return;
    switch (dtype) {
    case GS_F32: div_f32(buf, count, (float)divisor); break;
    case GS_F64: div_f64(buf, count, (double)divisor); break;
    case GS_F16: div_f16_best(buf, count, (float)divisor); break;
    case GS_BF16: div_bf16(buf, count, (float)divisor); break;
    case GS_I32: div_i32(buf, count, (int32_t)divisor); break;
    case GS_I64: div_i64(buf, count, (int64_t)divisor); break;
    case GS_U8: div_u8(buf, count, (uint32_t)divisor); break;
    case GS_I8: div_i8(buf, count, (int32_t)divisor); break;
    case GS_I16: div_i16(buf, count, (int32_t)divisor); break;
    default: break;
    }
}

/* Non-temporal (streaming) stores for results too large to stay in cache
 * (util/copy.h): writing them the usual way first reads every line in (a
 * read for ownership), a third more memory traffic; the closing sfence
 * orders them before anything the caller publishes next. */
void gs_red_copy_nt(void *dst, const void *src, size_t len)
{
    gs_copy_nt(dst, src, len);
}

void gs_red_apply_nt(gs_dtype dtype, gs_redop op, void *dst, const void *a, const void *b, size_t count)
{
    enum { BLOCK = 4096 };
    uint8_t tmp[BLOCK] __attribute__((aligned(64)));
    gs_red_fn fn = gs_red_kernel(dtype, op);
    size_t es = gs_dtype_size(dtype), per = BLOCK / (es ? es : 1);
    if (!fn)
        return;
    /* block by block into a buffer that stays in L1, then streamed out */
    for (size_t i = 0; i < count; i += per) {
        size_t n = count - i < per ? count - i : per;
        fn(tmp, (const uint8_t *)a + i * es, (const uint8_t *)b + i * es, n);
        gs_copy_nt_unfenced((uint8_t *)dst + i * es, tmp, n * es);
    }
    gs_copy_nt_fence();
}
