/*
 * Helpers for the collective tests (GS_TEST_TP cases, one per built
 * transport): communicators over the case's transport, input values whose
 * reductions are exact in every type, the expected result computed here
 * independently, and a hash to compare results across ranks.
 */
#ifndef GS_TESTS_COLL_CHECK_H
#define GS_TESTS_COLL_CHECK_H

#include "gs_test.h"
#include "multirank.h"

#include "bootstrap/boot.h"
#include "kernel/reduce.h"
#include "transport/tp.h"
#include "util/clock.h"
#include "util/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What job rank `world` contributes at index i (cc_check_member_sums). */
static inline float cc_member_value(int world, size_t i)
{
    return (float)((world + 1) * (int)(i % 13));
}

/* On a communicator of some of the job's ranks (after a shrink or a grow;
 * old_rank: this rank's job rank): its ranks are in job-rank order, and
 * `calls` allreduces of up to count floats give the sums over exactly those
 * ranks. */
static inline void cc_check_member_sums(gs_comm *comm, int old_rank, int calls, size_t count_max)
{
    int n = gs_comm_size(comm);
    int32_t mine = old_rank, olds[GS_TEST_RANKS_MAX];
    float *buf = malloc(count_max * sizeof(float));
    GS_ASSERT(buf != NULL && n <= GS_TEST_RANKS_MAX);
    GS_ASSERT_OK(gs_allgather(comm, &mine, olds, 1, GS_I32));
    for (int q = 1; q < n; q++)
        GS_ASSERT_LT(olds[q - 1], olds[q]); /* dense, in the old order */
    GS_ASSERT_EQ(olds[gs_comm_rank(comm)], old_rank);
    for (int c = 0; c < calls; c++) {
        size_t count = c == 0 ? count_max : (size_t)(c * 1009 + 1) % count_max;
        for (size_t i = 0; i < count; i++)
            buf[i] = cc_member_value(old_rank, i + (size_t)c);
        GS_ASSERT_OK(gs_allreduce(comm, buf, buf, count, GS_F32, GS_SUM));
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int q = 0; q < n; q++)
                want += cc_member_value(olds[q], i + (size_t)c);
            if (buf[i] != want)
                gs_test_fail_here(__FILE__, __LINE__, "rank %d: call %d: [%zu] = %g, expected %g", old_rank,
                                  c, i, (double)buf[i], (double)want);
        }
    }
    free(buf);
}

/* What a multirank body gets. */
typedef struct cc_arg {
    const char *transport;
    int param;
} cc_arg;

/* A communicator over the named transport (its tp is closed after the
 * communicator: cc_close). */
static inline gs_comm *cc_open(gs_ctx *ctx, const char *transport, gs_tp **tp_p)
{
    gs_comm *comm = NULL;
    GS_ASSERT_OK(gs_tp_open(ctx, transport, tp_p));
    GS_ASSERT_OK(gs_comm_create(ctx, *tp_p, &comm));
    return comm;
}

static inline void cc_close(gs_comm *comm, gs_tp *tp)
{
    GS_ASSERT_OK(gs_comm_destroy(comm));
    GS_ASSERT_OK(gs_tp_close(tp));
}

/* n ranks run fn (arg: transport and param) with the extra "NAME=VALUE"
 * environment (NULL-terminated); every rank must exit 0 within 20 s. */
static inline void cc_run_env(const char *transport, int n, gs_test_rank_fn fn, int param,
                              const char *const *env)
{
    cc_arg arg = {.transport = transport, .param = param};
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = 110000, .rank_timeout_ms = 20000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    int ok = gs_test_run_ranks_opts(&opts, fn, &arg, status);
    for (int r = 0; r < n; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
    GS_ASSERT_EQ(ok, n);
}

static const int cc_algos[] = {GS_ALGO_RING, GS_ALGO_RD, GS_ALGO_DIRECT};
static const char *const cc_algo_names[] = {"auto", "ring", "rd", "direct"};

/* As if GS_ALGO were set to algo on every rank (the ranks do it in step). */
static inline void cc_set_algo(gs_ctx *ctx, int algo)
{
    ctx->cfg.algo = algo;
}

/* ---- values with exact reductions ---------------------------------------------- */

/* The value rank contributes at index i: small integers for sums (exact in
 * every type even as f16/bf16 partial sums), powers of two for products,
 * and for integer sums now and then a huge one, so that they wrap. */
static inline double cc_value(gs_dtype t, gs_redop op, int rank, size_t i)
{
    static const double prod_f[] = {1, -1, 2, 0.5, -0.5};
    switch (op) {
    case GS_PROD:
        return t == GS_I32 || t == GS_I64 || t == GS_U8 || t == GS_I8 || t == GS_I16
                   ? (double)((long)((rank + i) % 5) - 2)
                   : prod_f[(rank + i) % 5];
    case GS_MIN:
    case GS_MAX: return (double)((long)((rank * 31 + i * 17) % 101) - 50);
    default: return (double)((long)((rank * 7 + i * 13) % 17) - 8);
    }
}

static inline bool cc_is_int(gs_dtype t)
{
    return t == GS_I32 || t == GS_I64 || t == GS_U8 || t == GS_I8 || t == GS_I16;
}

static inline bool cc_huge(gs_dtype t, gs_redop op, size_t i)
{
    return cc_is_int(t) && (op == GS_SUM || op == GS_AVG) && i % 7 == 3;
}

/* Bitwise operators: any bits; bool: a true byte now and then not 1. */
static inline int64_t cc_bits(int rank, size_t i)
{
    return (int64_t)((((uint64_t)rank + 1) * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ull));
}

/* Stores rank's element i into p. */
static inline void cc_put(gs_dtype t, gs_redop op, int rank, size_t i, void *p)
{
    double v = cc_value(t, op, rank, i);
    switch (t) {
    case GS_F32: *(float *)p = (float)v; break;
    case GS_F64: *(double *)p = v; break;
    case GS_F16: *(uint16_t *)p = gs_red_f32_to_f16((float)v); break;
    case GS_BF16: *(uint16_t *)p = gs_red_f32_to_bf16((float)v); break;
    case GS_I32: *(int32_t *)p = cc_huge(t, op, i) ? INT32_MAX - rank : (int32_t)v; break;
    case GS_I64: *(int64_t *)p = cc_huge(t, op, i) ? INT64_MAX - rank : (int64_t)v; break;
    case GS_I16: *(int16_t *)p = cc_huge(t, op, i) ? (int16_t)(INT16_MAX - rank) : (int16_t)v; break;
    case GS_I8: *(int8_t *)p = cc_huge(t, op, i) ? (int8_t)(INT8_MAX - rank) : (int8_t)v; break;
    case GS_U8: *(uint8_t *)p = cc_huge(t, op, i) ? (uint8_t)(UINT8_MAX - rank) : (uint8_t)(int64_t)v; break;
    case GS_BOOL: *(uint8_t *)p = (uint8_t)((rank * 5 + i * 3) % 7 < 3 ? 0 : 1 + (rank + i) % 3); break;
    default: break;
    }
    if (op >= GS_BAND && cc_is_int(t)) /* every bit pattern */
        memcpy(p, &(int64_t){cc_bits(rank, i)}, gs_dtype_size(t));
}

/* The integer stored at p, as the kernels read it (u8 unsigned). */
static inline int64_t cc_load_int(gs_dtype t, const void *p)
{
    switch (t) {
    case GS_I32: return *(const int32_t *)p;
    case GS_I16: return *(const int16_t *)p;
    case GS_I8: return *(const int8_t *)p;
    case GS_U8: return *(const uint8_t *)p;
    default: return *(const int64_t *)p;
    }
}

static inline void cc_fill(gs_dtype t, gs_redop op, int rank, void *buf, size_t count)
{
    size_t es = gs_dtype_size(t);
    for (size_t i = 0; i < count; i++)
        cc_put(t, op, rank, i, (uint8_t *)buf + i * es);
}

/* The expected element i of the reduction over n ranks, into p. */
static inline void cc_expect(gs_dtype t, gs_redop op, int n, size_t i, void *p)
{
    if (t == GS_BOOL) { /* sum, max, bor: or; prod, min, band: and; bxor */
        bool acc = false;
        for (int r = 0; r < n; r++) {
            uint8_t v;
            cc_put(t, op, r, i, &v);
            bool b = v != 0;
            acc = r == 0                                         ? b
                  : op == GS_BXOR                                ? acc != b
                  : op == GS_SUM || op == GS_MAX || op == GS_BOR ? acc || b
                                                                 : acc && b;
        }
        *(uint8_t *)p = acc;
        return;
    }
    if (cc_is_int(t)) {
        uint64_t acc = 0; /* wraps like the kernels */
        int64_t mm = 0;
        size_t es = gs_dtype_size(t);
        for (int r = 0; r < n; r++) {
            uint8_t tmp[8];
            cc_put(t, op, r, i, tmp);
            int64_t v = cc_load_int(t, tmp);
            if (r == 0) {
                acc = (uint64_t)v;
                mm = v;
                continue;
            }
            switch (op) {
            case GS_PROD: acc *= (uint64_t)v; break;
            case GS_BAND: acc &= (uint64_t)v; break;
            case GS_BOR: acc |= (uint64_t)v; break;
            case GS_BXOR: acc ^= (uint64_t)v; break;
            default: acc += (uint64_t)v; break;
            }
            mm = op == GS_MIN ? (v < mm ? v : mm) : (v > mm ? v : mm);
        }
        uint8_t wrapped[8];
        memcpy(wrapped, &acc, 8); /* little-endian: the low bytes are the type's wrap */
        int64_t res = op == GS_MIN || op == GS_MAX ? mm : cc_load_int(t, wrapped);
        if (op == GS_AVG)
            res = res / n;
        memcpy(p, &res, es);
        return;
    }
    double acc = cc_value(t, op, 0, i);
    for (int r = 1; r < n; r++) {
        double v = cc_value(t, op, r, i);
        acc = op == GS_PROD  ? acc * v
              : op == GS_MIN ? (v < acc ? v : acc)
              : op == GS_MAX ? (v > acc ? v : acc)
                             : acc + v;
    }
    switch (t) {
    case GS_F32: *(float *)p = op == GS_AVG ? (float)acc / (float)n : (float)acc; break;
    case GS_F64: *(double *)p = op == GS_AVG ? acc / n : acc; break;
    case GS_F16: *(uint16_t *)p = gs_red_f32_to_f16(op == GS_AVG ? (float)acc / (float)n : (float)acc); break;
    case GS_BF16:
        *(uint16_t *)p = gs_red_f32_to_bf16(op == GS_AVG ? (float)acc / (float)n : (float)acc);
        break;
    default: break;
    }
}

/* Fails unless out[0..count) is the reduction over n ranks, bit for bit. */
static inline void cc_check_reduced(const char *what, gs_dtype t, gs_redop op, int n, const void *out,
                                    size_t first, size_t count)
{
    size_t es = gs_dtype_size(t);
    for (size_t i = 0; i < count; i++) {
        uint8_t want[8];
        cc_expect(t, op, n, first + i, want);
        if (memcmp((const uint8_t *)out + i * es, want, es) != 0)
            gs_test_fail_here(__FILE__, __LINE__, "%s: %s %s over %d ranks: element %zu differs", what,
                              gs_dtype_name(t), gs_redop_name(op), n, first + i);
    }
}

/* ---- comparing ranks -------------------------------------------------------------- */

static inline uint64_t cc_hash(uint64_t h, const void *p, size_t len)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Every rank's hash through the store (not through the code under test). */
static inline void cc_same_everywhere(gs_ctx *ctx, const char *tag, uint64_t h)
{
    uint64_t all[GS_TEST_RANKS_MAX];
    GS_ASSERT_OK(gs_store_allgather(ctx, tag, &h, sizeof(h), all));
    for (int r = 0; r < gs_ctx_size(ctx); r++)
        if (all[r] != all[0])
            gs_test_fail_here(__FILE__, __LINE__, "%s: rank %d's results differ from rank 0's", tag, r);
}

#define CC_GUARD 0x5a

/* count elements of es bytes with guard bytes after them. */
static inline uint8_t *cc_alloc(size_t bytes)
{
    uint8_t *p = malloc(bytes + 64);
    GS_ASSERT(p != NULL);
    memset(p, CC_GUARD, bytes + 64);
    return p;
}

static inline void cc_check_guard(const uint8_t *p, size_t bytes, const char *what)
{
    for (size_t i = 0; i < 64; i++)
        if (p[bytes + i] != CC_GUARD)
            gs_test_fail_here(__FILE__, __LINE__, "%s: wrote past the end of the buffer", what);
}

#endif
