/*
 * allreduce over 1..8 ranks: every algorithm x type x operator x count
 * (0, 1, n-1, n, n+1, and 3077 = several chunk columns with 4 KiB chunks),
 * in place and out of place; results exact and bitwise identical on every
 * rank. Large counts (1M+3) for a few combinations with the default chunk.
 */
#include "coll_check.h"

#include "coll/coll.h"
#include "transport/tcp/tcp.h"

#define SMALL_CHUNK_ENV "GS_CHUNK_BYTES=4096"
#define COLUMNS_COUNT   3077 /* 12 KiB of f32: several 4 KiB chunks per segment */

enum { MATRIX_PLAIN, MATRIX_STREAMED, MATRIX_PARTS };

/* One checked allreduce of count elements from in (out of place: into out,
 * else in place in in), guard bytes around both; returns h with the result
 * hashed in. */
static uint64_t checked_allreduce(gs_comm *comm, const char *what, int t, int op, int n, uint8_t *in,
                                  uint8_t *out, bool in_place, size_t count, size_t max_bytes, uint64_t h)
{
    size_t bytes = count * gs_dtype_size((gs_dtype)t);
    uint8_t *dst = in_place ? in : out;
    memset(out, CC_GUARD, max_bytes + 64);
    memset(in, CC_GUARD, max_bytes + 64);
    cc_fill((gs_dtype)t, (gs_redop)op, gs_comm_rank(comm), in, count);
    GS_ASSERT_OK(gs_allreduce(comm, in, dst, count, (gs_dtype)t, (gs_redop)op));
    cc_check_reduced(what, (gs_dtype)t, (gs_redop)op, n, dst, 0, count);
    cc_check_guard(dst, bytes, what);
    return cc_hash(h, dst, bytes);
}

static void matrix_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    size_t counts[] = {0, 1, (size_t)(n - 1), (size_t)n, (size_t)n + 1, COLUMNS_COUNT};
    size_t max_bytes = COLUMNS_COUNT * 8;
    uint8_t *in = cc_alloc(max_bytes), *out = cc_alloc(max_bytes);
    uint64_t h = 1469598103934665603ull;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    char what[160];
    if (arg->param == MATRIX_STREAMED) /* every result streamed: odd sizes through the non-temporal paths */
        comm->nt_bytes = 0;
    if (arg->param == MATRIX_PARTS) /* 3+ ranks over shm: every direct allreduce by parts (parts.c) */
        comm->parts_bytes = 0;

    for (size_t a = 0; a < sizeof(cc_algos) / sizeof(cc_algos[0]); a++) {
        cc_set_algo(ctx, cc_algos[a]);
        for (int t = 0; t < GS_DTYPE_COUNT; t++) {
            for (int op = 0; op < GS_REDOP_COUNT; op++) {
                if (!gs_red_valid((gs_dtype)t, (gs_redop)op))
                    continue;
                for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                    size_t count = counts[c];
                    /* the byte-like types and bitwise operators: two counts, one algorithm each, for time */
                    if ((t >= GS_U8 || op >= GS_BAND) && (c < 4 || (size_t)(t + op) % 3 != a))
                        continue;
                    bool in_place = (c + (size_t)op) % 2 == 0;
                    snprintf(what, sizeof(what), "rank %d %s count %zu %s", rank, cc_algo_names[cc_algos[a]],
                             count, in_place ? "in place" : "out of place");
                    h = checked_allreduce(comm, what, t, op, n, in, out, in_place, count, max_bytes, h);
                }
            }
        }
    }
    cc_same_everywhere(ctx, "allreduce-matrix", h);
    cc_close(comm, tp);
    free(in);
    free(out);
}

static void run_matrix_opts(const char *transport, int n, int variant)
{
    const char *const env[] = {SMALL_CHUNK_ENV, NULL};
    cc_run_env(transport, n, matrix_body, variant, env);
}

static void run_matrix(const char *transport, int n)
{
    run_matrix_opts(transport, n, MATRIX_PLAIN);
}

GS_TEST_TP(allreduce_matrix_streamed_2_ranks)
{
    run_matrix_opts(transport, 2, MATRIX_STREAMED);
}
GS_TEST_TP(allreduce_matrix_streamed_3_ranks)
{
    run_matrix_opts(transport, 3, MATRIX_STREAMED);
}
/* by parts at every count (0, 1, fewer elements than ranks: empty parts);
 * parts need the shared-memory boxes */
static void run_matrix_parts(const char *transport, int n)
{
    if (strcmp(transport, "shm") != 0)
        GS_SKIP("allreduce by parts runs over the shm transport's boxes only");
    run_matrix_opts(transport, n, MATRIX_PARTS);
}
GS_TEST_TP(allreduce_matrix_parts_3_ranks)
{
    run_matrix_parts(transport, 3);
}
GS_TEST_TP(allreduce_matrix_parts_4_ranks)
{
    run_matrix_parts(transport, 4);
}
GS_TEST_TP(allreduce_matrix_parts_5_ranks)
{
    run_matrix_parts(transport, 5);
}
GS_TEST_TP(allreduce_matrix_1_rank)
{
    run_matrix(transport, 1);
}
GS_TEST_TP(allreduce_matrix_2_ranks)
{
    run_matrix(transport, 2);
}
GS_TEST_TP(allreduce_matrix_3_ranks)
{
    run_matrix(transport, 3);
}
GS_TEST_TP(allreduce_matrix_4_ranks)
{
    run_matrix(transport, 4);
}
GS_TEST_TP(allreduce_matrix_5_ranks)
{
    run_matrix(transport, 5);
}
GS_TEST_TP(allreduce_matrix_6_ranks)
{
    run_matrix(transport, 6);
}
GS_TEST_TP(allreduce_matrix_7_ranks)
{
    run_matrix(transport, 7);
}
GS_TEST_TP(allreduce_matrix_8_ranks)
{
    run_matrix(transport, 8);
}

/* ---- 2-rank ring sending straight from the caller's buffers ----------------------- */

/* Over tcp a 2-rank ring allreduce of GS_COLL_USER_BYTES or more sends its
 * segment from the input and the final segment from the result (payload
 * written apart from its header); the call's last forward from its slot.
 * Small chunks give many columns; every type and operator, in place and
 * out of place, twice in a row (slots and outbox slots freed by the peer's
 * next call), counts at and around the threshold. */
static void from_user_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    size_t counts[] = {GS_COLL_USER_BYTES / 4, GS_COLL_USER_BYTES / 4 + 3, 40001};
    size_t max_bytes = 40001 * 8;
    uint8_t *in = cc_alloc(max_bytes), *out = cc_alloc(max_bytes);
    uint64_t h = 1469598103934665603ull;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    char what[160];
    if (arg->param)
        comm->nt_bytes = 0;
    cc_set_algo(ctx, GS_ALGO_RING);
    for (int t = 0; t < GS_U8; t++) { /* the byte-like types run the same code */
        for (int op = 0; op < GS_BAND; op++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                for (int round = 0; round < 2; round++) {
                    size_t count = counts[c];
                    bool in_place = (c + (size_t)op + (size_t)round) % 2 == 0;
                    snprintf(what, sizeof(what), "rank %d ring from user count %zu %s round %d", rank, count,
                             in_place ? "in place" : "out of place", round);
                    h = checked_allreduce(comm, what, t, op, 2, in, out, in_place, count, max_bytes, h);
                }
            }
        }
    }
    cc_same_everywhere(ctx, "allreduce-from-user", h);
    cc_close(comm, tp);
    free(in);
    free(out);
}

static void run_from_user(const char *transport, int streamed)
{
    const char *const env[] = {SMALL_CHUNK_ENV, NULL};
    cc_run_env(transport, 2, from_user_body, streamed, env);
}

GS_TEST_TP(allreduce_ring_from_user_2_ranks)
{
    run_from_user(transport, 0);
}
GS_TEST_TP(allreduce_ring_from_user_streamed_2_ranks)
{
    run_from_user(transport, 1);
}

/* ---- large counts, default chunk: many columns of 256 KiB ------------------------ */

typedef struct large_case {
    int algo;
    gs_dtype dtype;
    gs_redop op;
} large_case;

static const large_case large_cases[] = {
    {GS_ALGO_RING, GS_F32, GS_SUM},   {GS_ALGO_RING, GS_BF16, GS_AVG}, {GS_ALGO_RD, GS_F16, GS_SUM},
    {GS_ALGO_DIRECT, GS_I64, GS_MAX}, {GS_ALGO_AUTO, GS_F32, GS_PROD}, {GS_ALGO_DIRECT, GS_F64, GS_AVG},
};

static void large_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    const size_t count = (1u << 20) + 3;
    uint8_t *in = cc_alloc(count * 8), *out = cc_alloc(count * 8);
    uint64_t h = 1469598103934665603ull;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    for (size_t c = 0; c < 2 * sizeof(large_cases) / sizeof(large_cases[0]); c++) {
        const large_case *lc = &large_cases[c % (sizeof(large_cases) / sizeof(large_cases[0]))];
        /* the second round streams every result (as calls above 8 MiB do) */
        comm->nt_bytes = c < sizeof(large_cases) / sizeof(large_cases[0]) ? GS_COLL_NT_BYTES : 0;
        /* and 2 ranks' data posts too (the first round: as the peer's distance decides) */
        comm->box_stream = comm->nt_bytes ? GS_BOX_STREAM_AUTO : GS_BOX_STREAM_ALWAYS;
        char what[96];
        snprintf(what, sizeof(what), "rank %d large call %zu %s", rank, c, cc_algo_names[lc->algo]);
        cc_set_algo(ctx, lc->algo);
        h = checked_allreduce(comm, what, lc->dtype, lc->op, gs_ctx_size(ctx), in, out, c % 2 == 1, count,
                              count * 8, h);
    }
    if (arg->param && strcmp(gs_tp_name(comm->tp), "tcp") == 0) { /* zcopy: the payloads went by the pipes */
        gs_tcp_tp *tcp = gs_tcp_tp_of(comm->tp);
        gs_tcp_ep *right = gs_tcp_ep_at(tcp, (rank + 1) % gs_ctx_size(ctx));
        GS_ASSERT(right->pipe[0] >= 0 && !right->zcopy_off);
    }
    cc_same_everywhere(ctx, "allreduce-large", h);
    cc_close(comm, tp);
    free(in);
    free(out);
}

static void run_large(const char *transport, int n)
{
    cc_arg arg = {.transport = transport};
    gs_test_run_ranks(n, large_body, &arg, 110000);
}

GS_TEST_TP(allreduce_large_2_ranks)
{
    run_large(transport, 2);
}
GS_TEST_TP(allreduce_large_3_ranks)
{
    run_large(transport, 3);
}
GS_TEST_TP(allreduce_large_4_ranks)
{
    run_large(transport, 4);
}

/* ---- tcp: payloads by reference (GS_TCP_ZCOPY=on) ----------------------------------- */

/* The large calls again with every call's data posts by vmsplice + splice
 * over tcp (elsewhere the hint is ignored): the peer reads the sender's
 * pages when it receives, so a buffer reused before the peer has it would
 * show as a wrong result (each call brings other data, in place and out of
 * place in turn, back to back); 64 KiB chunks give 128 KiB frames. */
static void run_zcopy(const char *transport, int n)
{
    const char *const env[] = {"GS_TCP_ZCOPY=on", "GS_CHUNK_BYTES=64K", NULL};
    cc_run_env(transport, n, large_body, 1, env);
}

GS_TEST_TP(allreduce_zcopy_2_ranks)
{
    run_zcopy(transport, 2);
}
GS_TEST_TP(allreduce_zcopy_3_ranks)
{
    run_zcopy(transport, 3);
}

/* ---- the same bits run after run --------------------------------------------------- */

/* Values whose f32 sums round, so the reduction order shows in the bits:
 * two runs of each algorithm must give identical results. */
static void repeat_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    const size_t count = 5000;
    float *in = malloc(count * sizeof(float)),
          *out[2] = {malloc(count * sizeof(float)), malloc(count * sizeof(float))};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < count; i++)
        in[i] = 1.0f / (float)(rank * 7 + (int)i % 13 + 1) * (i % 2 ? 1e7f : 1e-3f);
    for (size_t a = 0; a < sizeof(cc_algos) / sizeof(cc_algos[0]); a++) {
        cc_set_algo(ctx, cc_algos[a]);
        for (int run = 0; run < 2; run++)
            GS_ASSERT_OK(gs_allreduce(comm, in, out[run], count, GS_F32, GS_SUM));
        GS_ASSERT(memcmp(out[0], out[1], count * sizeof(float)) == 0);
        h = cc_hash(h, out[0], count * sizeof(float));
    }
    /* +0 and -0 compare equal: which one min returns depends on the operand
     * order, so this shows whether all ranks combined in the same order */
    for (size_t i = 0; i < count; i++)
        in[i] = (rank + i) % 3 ? 0.0f : -0.0f;
    for (size_t a = 0; a < sizeof(cc_algos) / sizeof(cc_algos[0]); a++) {
        cc_set_algo(ctx, cc_algos[a]);
        GS_ASSERT_OK(gs_allreduce(comm, in, out[0], count, GS_F32, GS_MIN));
        h = cc_hash(h, out[0], count * sizeof(float));
    }
    cc_same_everywhere(ctx, "allreduce-repeat", h);
    cc_close(comm, tp);
    free(in);
    free(out[0]);
    free(out[1]);
}

GS_TEST_TP(allreduce_rounding_sums_identical_everywhere)
{
    const char *env[] = {SMALL_CHUNK_ENV, NULL};
    cc_arg arg = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 5, .timeout_ms = 60000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, repeat_body, &arg, status), 5);
}
