/*
 * Reduction kernels against a scalar reference written independently here:
 * every type x operator (bitwise ones on the integer types and bool), lengths 0, 1, 7, 33, 1003, pointers off
 * vector alignment, out of place and in place on either operand; the f16 and bf16 conversions exhaustively
 * (f16) or over edge cases and random patterns.
 */
#include "kernel/reduce.h"
#include "gs_test.h"

#include <math.h>

#define ALIGN   64
#define MAX_LEN 1003
#define SLACK   8

static const size_t lengths[] = {0, 1, 7, 33, MAX_LEN};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- reference conversions ---------------------------------------------- */

#ifdef __FLT16_MAX__
#define HAVE_FLOAT16 1
static float ref_f16_to_f32(uint16_t h)
{
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

static uint16_t ref_f32_to_f16(float f)
{
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
#else
#define HAVE_FLOAT16 0
static float ref_f16_to_f32(uint16_t h)
{
    return gs_red_f16_to_f32(h);
}
static uint16_t ref_f32_to_f16(float f)
{
    return gs_red_f32_to_f16(f);
}
#endif

/* bf16 rounding by exact arithmetic: the two neighbours, the nearer wins,
 * the even one on a tie. */
static uint16_t ref_f32_to_bf16(float f)
{
    if (isnan(f))
        return (uint16_t)((gs_red_f32_bits(f) >> 16) | 0x40);
    uint32_t bits = gs_red_f32_bits(f);
    uint16_t lo = (uint16_t)(bits >> 16);
    uint16_t hi = (uint16_t)(lo + 1);
    double dlo = gs_red_bf16_to_f32(lo);
    /* past the largest finite value the next step would be 2^128 */
    double dhi = (lo & 0x7fff) == 0x7f7f ? copysign(ldexp(1.0, 128), f) : (double)gs_red_bf16_to_f32(hi);
    double dist_lo = fabs((double)f - dlo), dist_hi = fabs((double)f - dhi);
    if (isinf(f) || dist_lo < dist_hi || (dist_lo == dist_hi && (lo & 1) == 0))
        return lo;
    return hi;
}

/* ---- values -------------------------------------------------------------- */

static bool is_float_type(gs_dtype t)
{
    return t == GS_F32 || t == GS_F64 || t == GS_F16 || t == GS_BF16;
}

static const uint16_t f16_specials[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00,
                                        0xfc00, 0x7e00, 0x7d01, 0x3c00, 0xbc00, 0x8001};

/* A random element of type t; one in 16 floats is a special value. */
static void random_value(gs_dtype t, gs_redop op, void *out)
{
    uint64_t r = rng_next();
    bool special = (r & 15) == 0 && op != GS_SUM && op != GS_AVG;
    double v = (double)(int64_t)(r >> 11) / (double)(1ull << 50) * (op == GS_PROD ? 2.0 : 100.0);
    if ((r & 15) == 1)
        special = true; /* sums see specials too, NaN and inf included */
    switch (t) {
    case GS_F32: {
        float f = special ? gs_red_f16_to_f32(f16_specials[(r >> 8) % 13]) : (float)v;
        memcpy(out, &f, 4);
        break;
    }
    case GS_F64: {
        double d = special ? (double)gs_red_f16_to_f32(f16_specials[(r >> 8) % 13]) : v;
        memcpy(out, &d, 8);
        break;
    }
    case GS_F16: {
        uint16_t h = special ? f16_specials[(r >> 8) % 13] : ref_f32_to_f16((float)v);
        memcpy(out, &h, 2);
        break;
    }
    case GS_BF16: {
        uint16_t h = special ? (uint16_t)(r >> 48) : ref_f32_to_bf16((float)v);
        memcpy(out, &h, 2);
        break;
    }
    case GS_I32: {
        int32_t i = (int32_t)(uint32_t)(r >> 20);
        memcpy(out, &i, 4);
        break;
    }
    case GS_I64: {
        int64_t i = (int64_t)rng_next();
        memcpy(out, &i, 8);
        break;
    }
    case GS_I16: {
        uint16_t i = (uint16_t)(r >> 30);
        memcpy(out, &i, 2);
        break;
    }
    case GS_U8:
    case GS_I8: *(uint8_t *)out = (uint8_t)(r >> 40); break;
    case GS_BOOL: *(uint8_t *)out = (r >> 40) & 1 ? (uint8_t)(r >> 48) : 0; break; /* any nonzero is true */
    default: break;
    }
}

/* ---- scalar reference ---------------------------------------------------- */

static double ref_fop(gs_redop op, double x, double y)
{
    switch (op) {
    case GS_SUM:
    case GS_AVG: return x + y;
    case GS_PROD: return x * y;
    case GS_MIN: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
    case GS_MAX: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
    default: return 0;
    }
}

static float ref_fop32(gs_redop op, float x, float y)
{
    switch (op) {
    case GS_SUM:
    case GS_AVG: return x + y;
    case GS_PROD: return x * y;
    default: return (float)ref_fop(op, x, y);
    }
}

static int64_t ref_iop(gs_redop op, int64_t x, int64_t y, int bits)
{
    unsigned __int128 wide;
    switch (op) {
    case GS_SUM:
    case GS_AVG: wide = (unsigned __int128)(__int128)x + (unsigned __int128)(__int128)y; break;
    case GS_PROD: wide = (unsigned __int128)(__int128)x * (unsigned __int128)(__int128)y; break;
    case GS_MIN: return x < y ? x : y;
    case GS_MAX: return x > y ? x : y;
    case GS_BAND: wide = (unsigned __int128)(__int128)(x & y); break;
    case GS_BOR: wide = (unsigned __int128)(__int128)(x | y); break;
    case GS_BXOR: wide = (unsigned __int128)(__int128)(x ^ y); break;
    default: return 0;
    }
    switch (bits) {
    case 8: return (int64_t)(int8_t)(uint8_t)wide;
    case 16: return (int64_t)(int16_t)(uint16_t)wide;
    case 32: return (int64_t)(int32_t)(uint32_t)wide;
    default: return (int64_t)(uint64_t)wide;
    }
}

/* bool as PyTorch reduces it: sum, max, bor are or; prod, min, band are and. */
static uint8_t ref_bop(gs_redop op, uint8_t x, uint8_t y)
{
    bool a = x != 0, b = y != 0;
    switch (op) {
    case GS_SUM:
    case GS_MAX:
    case GS_BOR: return a || b;
    case GS_BXOR: return a != b;
    default: return a && b;
    }
}

/* out = x op y for one element of type t. */
static void ref_apply(gs_dtype t, gs_redop op, const void *xp, const void *yp, void *out)
{
    switch (t) {
    case GS_F32: {
        float x, y, r;
        memcpy(&x, xp, 4), memcpy(&y, yp, 4);
        r = ref_fop32(op, x, y);
        memcpy(out, &r, 4);
        break;
    }
    case GS_F64: {
        double x, y, r;
        memcpy(&x, xp, 8), memcpy(&y, yp, 8);
        r = ref_fop(op, x, y);
        memcpy(out, &r, 8);
        break;
    }
    case GS_F16:
    case GS_BF16: {
        uint16_t x, y, r;
        memcpy(&x, xp, 2), memcpy(&y, yp, 2);
        float fx = t == GS_F16 ? ref_f16_to_f32(x) : gs_red_bf16_to_f32(x);
        float fy = t == GS_F16 ? ref_f16_to_f32(y) : gs_red_bf16_to_f32(y);
        float fr = ref_fop32(op, fx, fy);
        r = t == GS_F16 ? ref_f32_to_f16(fr) : ref_f32_to_bf16(fr);
        memcpy(out, &r, 2);
        break;
    }
    case GS_I32: {
        int32_t x, y, r;
        memcpy(&x, xp, 4), memcpy(&y, yp, 4);
        r = (int32_t)ref_iop(op, x, y, 32);
        memcpy(out, &r, 4);
        break;
    }
    case GS_I64: {
        int64_t x, y, r;
        memcpy(&x, xp, 8), memcpy(&y, yp, 8);
        r = ref_iop(op, x, y, 64);
        memcpy(out, &r, 8);
        break;
    }
    case GS_I16: {
        int16_t x, y, r;
        memcpy(&x, xp, 2), memcpy(&y, yp, 2);
        r = (int16_t)ref_iop(op, x, y, 16);
        memcpy(out, &r, 2);
        break;
    }
    case GS_I8: *(int8_t *)out = (int8_t)ref_iop(op, *(const int8_t *)xp, *(const int8_t *)yp, 8); break;
    case GS_U8: /* compares unsigned */
        *(uint8_t *)out = (uint8_t)ref_iop(op, *(const uint8_t *)xp, *(const uint8_t *)yp, 8);
        break;
    case GS_BOOL: *(uint8_t *)out = ref_bop(op, *(const uint8_t *)xp, *(const uint8_t *)yp); break;
    default: break;
    }
}

static double as_double(gs_dtype t, const void *p)
{
    float f;
    double d;
    uint16_t h;
    switch (t) {
    case GS_F32: memcpy(&f, p, 4); return f;
    case GS_F64: memcpy(&d, p, 8); return d;
    case GS_F16: memcpy(&h, p, 2); return ref_f16_to_f32(h);
    case GS_BF16: memcpy(&h, p, 2); return gs_red_bf16_to_f32(h);
    default: return 0;
    }
}

/* Bitwise equal; for floats also both NaN, or (min/max) zeros of either sign. */
static bool same_element(gs_dtype t, gs_redop op, const void *got, const void *want)
{
    size_t es = gs_dtype_size(t);
    if (memcmp(got, want, es) == 0)
        return true;
    if (!is_float_type(t))
        return false;
    double g = as_double(t, got), w = as_double(t, want);
    if (isnan(g) && isnan(w))
        return true;
    return (op == GS_MIN || op == GS_MAX) && g == 0 && w == 0;
}

/* ---- kernel runs ---------------------------------------------------------- */

typedef enum { OUT_OF_PLACE, INTO_A, INTO_B, ALL_SAME } mode;

static void fill(gs_dtype t, gs_redop op, uint8_t *p, size_t n)
{
    size_t es = gs_dtype_size(t);
    for (size_t i = 0; i < n; i++)
        random_value(t, op, p + i * es);
}

/* One case: random a, b at element offsets; kernel vs reference. */
static void check_case(gs_dtype t, gs_redop op, size_t len, size_t off_d, size_t off_a, size_t off_b, mode m)
{
    static uint8_t abuf[(MAX_LEN + SLACK) * 8] __attribute__((aligned(ALIGN)));
    static uint8_t bbuf[(MAX_LEN + SLACK) * 8] __attribute__((aligned(ALIGN)));
    static uint8_t dbuf[(MAX_LEN + SLACK) * 8] __attribute__((aligned(ALIGN)));
    static uint8_t want[(MAX_LEN + SLACK) * 8];
    size_t es = gs_dtype_size(t);
    uint8_t *a = abuf + off_a * es, *b = bbuf + off_b * es, *d = dbuf + off_d * es;
    fill(t, op, abuf, MAX_LEN + SLACK);
    fill(t, op, bbuf, MAX_LEN + SLACK);
    memset(dbuf, 0xa5, sizeof(dbuf));
    if (m == ALL_SAME)
        b = a;
    if (m == INTO_A || m == ALL_SAME)
        d = a;
    else if (m == INTO_B)
        d = b;
    for (size_t i = 0; i < len; i++)
        ref_apply(t, op, a + i * es, b + i * es, want + i * es);
    uint8_t *dbase = m == INTO_A || m == ALL_SAME ? abuf : m == INTO_B ? bbuf : dbuf;
    uint8_t guard_before[8], guard_after[8];
    size_t d_off = (size_t)(d - dbase);
    if (d_off >= es)
        memcpy(guard_before, d - es, es);
    memcpy(guard_after, d + len * es, es);
    gs_red_apply(t, op, d, a, b, len);
    for (size_t i = 0; i < len; i++) {
        if (!same_element(t, op, d + i * es, want + i * es))
            gs_test_fail_here(
                __FILE__, __LINE__,
                "%s %s len %zu offsets d%zu a%zu b%zu mode %d: element %zu differs (got %g want %g)",
                gs_dtype_name(t), gs_redop_name(op), len, off_d, off_a, off_b, (int)m, i,
                is_float_type(t) ? as_double(t, d + i * es) : 0.0,
                is_float_type(t) ? as_double(t, want + i * es) : 0.0);
    }
    if (d_off >= es)
        GS_ASSERT(memcmp(guard_before, d - es, es) == 0);
    GS_ASSERT(memcmp(guard_after, d + len * es, es) == 0);
}

static void check_type(gs_dtype t)
{
    static const size_t offsets[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 2, 3}, {3, 0, 5}, {7, 1, 0}};
    for (int op = 0; op < GS_REDOP_COUNT; op++)
        for (size_t li = 0; gs_red_valid(t, (gs_redop)op) && li < sizeof(lengths) / sizeof(lengths[0]); li++)
            for (size_t oi = 0; oi < sizeof(offsets) / sizeof(offsets[0]); oi++)
                for (int m = OUT_OF_PLACE; m <= ALL_SAME; m++)
                    check_case(t, (gs_redop)op, lengths[li], offsets[oi][0], offsets[oi][1], offsets[oi][2],
                               (mode)m);
}

GS_TEST(reduce_f32_matches_reference)
{
    check_type(GS_F32);
}

GS_TEST(reduce_f64_matches_reference)
{
    check_type(GS_F64);
}

GS_TEST(reduce_f16_matches_reference)
{
    check_type(GS_F16);
}

GS_TEST(reduce_f16_portable_path_matches_reference)
{
    gs_red_force_portable(true);
    check_type(GS_F16);
}

GS_TEST(reduce_bf16_matches_reference)
{
    check_type(GS_BF16);
}

GS_TEST(reduce_i32_matches_reference)
{
    check_type(GS_I32);
}

GS_TEST(reduce_i64_matches_reference)
{
    check_type(GS_I64);
}

GS_TEST(reduce_i16_matches_reference)
{
    check_type(GS_I16);
}

GS_TEST(reduce_i8_matches_reference)
{
    check_type(GS_I8);
}

GS_TEST(reduce_u8_matches_reference)
{
    check_type(GS_U8);
}

GS_TEST(reduce_bool_matches_reference)
{
    check_type(GS_BOOL);
}

/* Which (type, operator) pairs exist: bitwise on integers and bool only,
 * avg everywhere but bool. */
GS_TEST(bitwise_operators_need_integer_types)
{
    for (int t = 0; t < GS_DTYPE_COUNT; t++) {
        bool floating = is_float_type((gs_dtype)t);
        for (int op = GS_BAND; op <= GS_BXOR; op++) {
            GS_ASSERT_EQ(gs_red_valid((gs_dtype)t, (gs_redop)op), !floating);
            GS_ASSERT_EQ(gs_red_invalid_why((gs_dtype)t, (gs_redop)op) == NULL, !floating);
        }
        GS_ASSERT_EQ(gs_red_valid((gs_dtype)t, GS_AVG), t != GS_BOOL);
    }
    GS_ASSERT_CONTAINS(gs_red_invalid_why(GS_F32, GS_BXOR), "integer or bool");
    GS_ASSERT_CONTAINS(gs_red_invalid_why(GS_BOOL, GS_AVG), "bool");
    GS_ASSERT_EQ(gs_dtype_size(GS_U8), 1u);
    GS_ASSERT_EQ(gs_dtype_size(GS_I16), 2u);
    GS_ASSERT_EQ(gs_dtype_size(GS_BOOL), 1u);
    GS_ASSERT_STR_EQ(gs_dtype_name(GS_BOOL), "bool");
    GS_ASSERT_STR_EQ(gs_redop_name(GS_BXOR), "bxor");
    /* bool results are 0 or 1 whatever true byte came in */
    uint8_t a[4] = {0, 7, 0, 200}, b[4] = {0, 0, 3, 9}, d[4];
    gs_red_apply(GS_BOOL, GS_SUM, d, a, b, 4);
    GS_ASSERT(d[0] == 0 && d[1] == 1 && d[2] == 1 && d[3] == 1);
    gs_red_apply(GS_BOOL, GS_BXOR, d, a, b, 4);
    GS_ASSERT(d[0] == 0 && d[1] == 1 && d[2] == 1 && d[3] == 0);
    int16_t x[2] = {INT16_MAX, -3}, y[2] = {2, 5}, z[2];
    gs_red_apply(GS_I16, GS_SUM, z, x, y, 2);
    GS_ASSERT(z[0] == INT16_MIN + 1 && z[1] == 2);
    gs_red_apply(GS_I16, GS_PROD, z, x, x, 2); /* wraps without undefined behaviour */
    GS_ASSERT(z[0] == 1 && z[1] == 9);
}

/* ---- conversions ----------------------------------------------------------- */

GS_TEST(f16_to_f32_is_exact_for_every_value)
{
    if (!HAVE_FLOAT16)
        GS_SKIP("the compiler has no _Float16 to serve as reference");
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float got = gs_red_f16_to_f32((uint16_t)h), want = ref_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            GS_ASSERT(isnan(got));
            GS_ASSERT_EQ(signbit(got) != 0, signbit(want) != 0);
            /* payload kept: converting back gives the same quiet pattern */
            GS_ASSERT_EQ(gs_red_f32_to_f16(got) | 0x200, h | 0x200);
        } else if (gs_red_f32_bits(got) != gs_red_f32_bits(want)) {
            gs_test_fail_here(__FILE__, __LINE__, "f16 0x%04x: got %a want %a", h, (double)got, (double)want);
        }
    }
}

static void check_f32_to_f16(uint32_t bits)
{
    float f = gs_red_bits_f32(bits);
    uint16_t got = gs_red_f32_to_f16(f), want = ref_f32_to_f16(f);
    if (isnan(f)) {
        GS_ASSERT_EQ((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0, 1);
        GS_ASSERT_EQ(got & 0x8000, want & 0x8000);
    } else if (got != want) {
        gs_test_fail_here(__FILE__, __LINE__, "f32 0x%08x (%a): got 0x%04x want 0x%04x", bits, (double)f, got,
                          want);
    }
}

GS_TEST(f32_to_f16_rounds_to_nearest_even)
{
    if (!HAVE_FLOAT16)
        GS_SKIP("the compiler has no _Float16 to serve as reference");
    /* every f16 value, and the halfway points and their neighbours between
     * consecutive f16 values (subnormal, normal, overflow to inf) */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        uint32_t lo = gs_red_f32_bits(gs_red_f16_to_f32((uint16_t)h));
        uint32_t hi = gs_red_f32_bits(h == 0x7bff ? 65536.0f : gs_red_f16_to_f32((uint16_t)(h + 1)));
        uint32_t mid = gs_red_f32_bits((gs_red_bits_f32(lo) + gs_red_bits_f32(hi)) / 2);
        const uint32_t probes[] = {lo, mid - 1, mid, mid + 1, hi - 1};
        for (int s = 0; s < 2; s++)
            for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++)
                check_f32_to_f16(probes[i] | (s ? 0x80000000u : 0));
    }
    const uint32_t edges[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffc12345u,
                              0x7f7fffffu, 0x00000001u, 0x33000000u, 0x33000001u, 0x32ffffffu};
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        check_f32_to_f16(edges[i]);
    for (int i = 0; i < 1000000; i++)
        check_f32_to_f16((uint32_t)rng_next());
}

GS_TEST(bf16_conversion_rounds_to_nearest_even)
{
    const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu,
                              0x7f7f8000u, 0x7f7f7fffu, 0x00008000u, 0x00018000u, 0x7f800000u, 0xff800000u};
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
        float f = gs_red_bits_f32(edges[i]);
        GS_ASSERT_EQ(gs_red_f32_to_bf16(f), ref_f32_to_bf16(f));
    }
    for (int i = 0; i < 1000000; i++) {
        float f = gs_red_bits_f32((uint32_t)rng_next());
        uint16_t got = gs_red_f32_to_bf16(f);
        if (isnan(f))
            GS_ASSERT(isnan(gs_red_bf16_to_f32(got)));
        else
            GS_ASSERT_EQ(got, ref_f32_to_bf16(f));
    }
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = gs_red_bf16_to_f32((uint16_t)h);
        GS_ASSERT_U64_EQ(gs_red_f32_bits(f), (uint64_t)h << 16);
        if (!isnan(f))
            GS_ASSERT_EQ(gs_red_f32_to_bf16(f), h);
    }
}

/* ---- avg ----------------------------------------------------------------- */

GS_TEST(avg_finish_divides_once)
{
    float f[33];
    double d[7];
    uint16_t h[7], b[7];
    int32_t i32[7] = {7, -7, 6, INT32_MAX, INT32_MIN, 0, 1};
    int64_t i64[3] = {INT64_MIN, -9, 9};
    for (int i = 0; i < 33; i++)
        f[i] = (float)i * 3.0f;
    gs_red_avg_finish(GS_F32, f, 33, 3);
    for (int i = 0; i < 33; i++)
        GS_ASSERT(f[i] == (float)i);
    for (int i = 0; i < 7; i++) {
        d[i] = 1.0;
        h[i] = ref_f32_to_f16(1.0f);
        b[i] = ref_f32_to_bf16(1.0f);
    }
    gs_red_avg_finish(GS_F64, d, 7, 3);
    gs_red_avg_finish(GS_F16, h, 7, 3);
    uint16_t h33[33];
    for (int pass = 0; pass < 2; pass++) {
        gs_red_force_portable(pass == 1);
        for (int i = 0; i < 33; i++)
            h33[i] = ref_f32_to_f16((float)(i * 7 + 1));
        gs_red_avg_finish(GS_F16, h33, 33, 7);
        for (int i = 0; i < 33; i++)
            GS_ASSERT_EQ(h33[i], ref_f32_to_f16((float)(i * 7 + 1) / 7.0f));
    }
    gs_red_avg_finish(GS_BF16, b, 7, 3);
    for (int i = 0; i < 7; i++) {
        GS_ASSERT(d[i] == 1.0 / 3.0);
        GS_ASSERT_EQ(h[i], ref_f32_to_f16(1.0f / 3.0f));
        GS_ASSERT_EQ(b[i], ref_f32_to_bf16(1.0f / 3.0f));
    }
    gs_red_avg_finish(GS_I32, i32, 7, 2);
    GS_ASSERT_EQ(i32[0], 3);
    GS_ASSERT_EQ(i32[1], -3);
    GS_ASSERT_EQ(i32[2], 3);
    GS_ASSERT_EQ(i32[3], INT32_MAX / 2);
    GS_ASSERT_EQ(i32[4], INT32_MIN / 2);
    gs_red_avg_finish(GS_I64, i64, 3, 4);
    GS_ASSERT_EQ(i64[0], INT64_MIN / 4);
    GS_ASSERT_EQ(i64[1], -2);
    GS_ASSERT_EQ(i64[2], 2);
    uint8_t u8[2] = {255, 7};
    int8_t i8[2] = {-7, 127};
    int16_t i16[2] = {-9, INT16_MIN};
    gs_red_avg_finish(GS_U8, u8, 2, 2);
    gs_red_avg_finish(GS_I8, i8, 2, 2);
    gs_red_avg_finish(GS_I16, i16, 2, 4);
    GS_ASSERT(u8[0] == 127 && u8[1] == 3 && i8[0] == -3 && i8[1] == 63);
    GS_ASSERT(i16[0] == -2 && i16[1] == INT16_MIN / 4);
    gs_red_avg_finish(GS_F32, f, 33, 1); /* one rank: unchanged */
    GS_ASSERT(f[5] == 5.0f);
}

GS_TEST(kernel_table_rejects_bad_arguments)
{
    GS_ASSERT(gs_red_kernel(GS_DTYPE_COUNT, GS_SUM) == NULL);
    GS_ASSERT(gs_red_kernel(GS_F32, GS_REDOP_COUNT) == NULL);
    GS_ASSERT(gs_red_kernel((gs_dtype)-1, GS_SUM) == NULL);
    GS_ASSERT(gs_red_kernel(GS_F32, GS_AVG) == gs_red_kernel(GS_F32, GS_SUM));
    GS_ASSERT(gs_red_valid(GS_BF16, GS_PROD));
}

GS_TEST(nan_propagates_through_min_and_max)
{
    float a[5] = {NAN, 1.0f, -INFINITY, 2.0f, 0.0f}, b[5] = {1.0f, NAN, NAN, -1.0f, -0.0f}, d[5];
    gs_red_apply(GS_F32, GS_MIN, d, a, b, 5);
    GS_ASSERT(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
    GS_ASSERT(d[3] == -1.0f && d[4] == 0.0f);
    gs_red_apply(GS_F32, GS_MAX, d, a, b, 5);
    GS_ASSERT(isnan(d[0]) && isnan(d[1]) && isnan(d[2]));
    GS_ASSERT(d[3] == 2.0f);
    uint16_t ha[2] = {0x7e00, 0x3c00}, hb[2] = {0x3c00, 0xfe01}, hd[2];
    gs_red_apply(GS_F16, GS_MAX, hd, ha, hb, 2);
    GS_ASSERT_EQ(hd[0], 0x7e00);
    GS_ASSERT_EQ(hd[1], 0xfe01); /* the NaN itself, payload and sign kept */
}

/* min(x, y) returns y when they compare equal: with +0 and -0 the bits show
 * which operand came first, in every aliasing form. */
GS_TEST(operand_order_is_kept_in_place)
{
    for (int form = 0; form < 3; form++) {
        float a[9], b[9], d[9];
        for (int i = 0; i < 9; i++) {
            a[i] = i & 1 ? -0.0f : 0.0f;
            b[i] = i & 1 ? 0.0f : -0.0f;
        }
        float *dst = form == 0 ? d : form == 1 ? a : b;
        gs_red_apply(GS_F32, GS_MIN, dst, a, b, 9);
        for (int i = 0; i < 9; i++)
            GS_ASSERT_EQ(signbit(dst[i]) != 0, (i & 1) == 0); /* b's sign */
    }
}

/* Streaming-store variants: same bytes as the plain ones, any alignment and
 * length (heads and tails not vector-aligned). */
GS_TEST(streamed_results_match)
{
    static uint8_t a[9000 * 8 + 64], b[9000 * 8 + 64], d1[9000 * 8 + 128], d2[9000 * 8 + 128];
    static const size_t lens[] = {0, 1, 7, 33, 255, 256, 257, 1003, 4096, 8999};
    for (size_t i = 0; i < sizeof(a); i++) {
        a[i] = (uint8_t)rng_next();
        b[i] = (uint8_t)(rng_next() & 0x3f); /* keeps floats finite-ish */
    }
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        for (size_t off = 0; off < 5; off++) {
            size_t len = lens[li];
            memset(d1, 0x77, sizeof(d1));
            memset(d2, 0x77, sizeof(d2));
            memcpy(d1 + off, a + off, len);
            gs_red_copy_nt(d2 + off, a + off, len);
            GS_ASSERT(memcmp(d1, d2, sizeof(d1)) == 0);
            for (int t = 0; t < GS_DTYPE_COUNT; t++) {
                if (!gs_red_valid((gs_dtype)t, GS_SUM))
                    continue;
                size_t es = gs_dtype_size((gs_dtype)t), n = len < 9000 ? len : 8999;
                uint8_t *dd1 = d1 + off * es, *dd2 = d2 + off * es;
                memset(d1, 0x55, sizeof(d1));
                memset(d2, 0x55, sizeof(d2));
                gs_red_apply((gs_dtype)t, GS_SUM, dd1, a + es, b + off * es, n);
                gs_red_apply_nt((gs_dtype)t, GS_SUM, dd2, a + es, b + off * es, n);
                GS_ASSERT(memcmp(d1, d2, sizeof(d1)) == 0);
                /* in place */
                memcpy(dd1, a, n * es);
                memcpy(dd2, a, n * es);
                gs_red_apply((gs_dtype)t, GS_MAX, dd1, dd1, b, n);
                gs_red_apply_nt((gs_dtype)t, GS_MAX, dd2, dd2, b, n);
                GS_ASSERT(memcmp(d1, d2, sizeof(d1)) == 0);
            }
        }
    }
}

/* gs_reduce_local, the public step: dst = dst op src with the same kernels,
 * refusing what the header leaves undefined; the public conversions are the
 * kernels' own. */
GS_TEST(reduce_local_is_one_kernel_step_and_refuses_what_is_undefined)
{
    float x[33], y[33], want[33];
    int32_t i[5] = {5, -7, 3, 0, 9}, j[5] = {-5, 7, 4, -1, 9};
    uint16_t h[3], k[3];
    uint8_t bools[3] = {0, 2, 1}, bools2[3] = {0, 0, 7};
    for (int n = 0; n < 33; n++) {
        x[n] = (float)n * 0.25f;
        y[n] = (float)(33 - n) * 0.5f;
    }
    gs_red_apply(GS_F32, GS_SUM, want, x, y, 33);
    GS_ASSERT_OK(gs_reduce_local(x, y, 33, GS_F32, GS_SUM));
    GS_ASSERT(memcmp(x, want, sizeof(x)) == 0);
    GS_ASSERT_OK(gs_reduce_local(i, j, 5, GS_I32, GS_MAX));
    GS_ASSERT_EQ(i[0], 5);
    GS_ASSERT_EQ(i[1], 7);
    GS_ASSERT_EQ(i[2], 4);
    GS_ASSERT_EQ(i[3], 0);
    GS_ASSERT_OK(gs_reduce_local(i, i, 5, GS_I32, GS_SUM)); /* dst == src */
    GS_ASSERT_EQ(i[4], 18);
    for (int n = 0; n < 3; n++) {
        h[n] = gs_f16_from_f32(1.0f + (float)n);
        k[n] = gs_f16_from_f32(0.5f);
    }
    GS_ASSERT_OK(gs_reduce_local(h, k, 3, GS_F16, GS_PROD));
    GS_ASSERT(gs_f16_to_f32(h[0]) == 0.5f && gs_f16_to_f32(h[2]) == 1.5f);
    GS_ASSERT_OK(gs_reduce_local(bools, bools2, 3, GS_BOOL, GS_BXOR));
    GS_ASSERT(bools[0] == 0 && bools[1] == 1 && bools[2] == 0);
    GS_ASSERT_OK(gs_reduce_local(NULL, NULL, 0, GS_F64, GS_MIN));
    /* undefined: avg (no local form), bitwise on floats, avg on bool, unknown enums, overlap */
    GS_ASSERT_STATUS(gs_reduce_local(x, y, 33, GS_F32, GS_AVG), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "avg has no local form");
    GS_ASSERT_STATUS(gs_reduce_local(x, y, 33, GS_F32, GS_BAND), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_reduce_local(bools, bools2, 3, GS_BOOL, GS_AVG), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_reduce_local(x, y, 1, GS_DTYPE_COUNT, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_reduce_local(x, y, 1, GS_F32, GS_REDOP_COUNT), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_reduce_local(x + 1, x, 4, GS_F32, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_reduce_local(NULL, y, 1, GS_F32, GS_SUM), GS_ERR_INVALID);
    /* the conversions: round to nearest even, overflow to infinity, NaN kept */
    GS_ASSERT_EQ(gs_f16_from_f32(1.0f), 0x3c00);
    GS_ASSERT_EQ(gs_f16_from_f32(1.0f + 0x1p-11f), 0x3c00); /* a tie: to even */
    GS_ASSERT_EQ(gs_f16_from_f32(1.0f + 0x3p-11f), 0x3c02);
    GS_ASSERT_EQ(gs_f16_from_f32(65520.0f), 0x7c00);
    GS_ASSERT(isnan(gs_f16_to_f32(gs_f16_from_f32(NAN))));
    GS_ASSERT_EQ(gs_bf16_from_f32(1.0f), 0x3f80);
    GS_ASSERT_EQ(gs_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80); /* a tie: to even */
    GS_ASSERT(gs_bf16_to_f32(0x3f81) == 1.0f + 0x1p-7f);
    for (uint32_t bits = 0; bits < 0x10000u; bits++) { /* the kernels' own, every f16 */
        float f = gs_red_f16_to_f32((uint16_t)bits), g = gs_f16_to_f32((uint16_t)bits);
        GS_ASSERT(memcmp(&f, &g, sizeof(f)) == 0);
        GS_ASSERT_EQ(gs_f16_from_f32(f), gs_red_f32_to_f16(f));
        GS_ASSERT_EQ(gs_bf16_from_f32(f), gs_red_f32_to_bf16(f));
    }
}
