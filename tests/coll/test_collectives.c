/*
 * reduce_scatter, allgather, broadcast (every root) and barrier over 1..8
 * ranks: every algorithm that runs them (ring, direct; rd falls back to the
 * ring), counts 0, 1, n-1, n, n+1 and several 4 KiB chunk columns, in place
 * and out of place, exact results, identical bits on every rank.
 */
#include "coll_check.h"

#include "coll/coll.h"

#include <unistd.h>

#define COLUMNS_COUNT 1500 /* with 4 KiB chunks: 2 columns of f32, 3 of f64 */

typedef struct bufs {
    uint8_t *in, *out;
    size_t cap; /* bytes, guard not counted */
} bufs;

static void reset(bufs *b)
{
    memset(b->in, CC_GUARD, b->cap + 64);
    memset(b->out, CC_GUARD, b->cap + 64);
}

/* ---- reduce_scatter ----------------------------------------------------------- */

/* Each rank gets its own block: checked exactly, not compared across ranks. */
static void reduce_scatter_case(gs_comm *comm, bufs *b, int rank, int n, gs_dtype t, gs_redop op,
                                size_t count, bool in_place)
{
    size_t es = gs_dtype_size(t), bytes = count * es;
    char what[128];
    snprintf(what, sizeof(what), "rank %d reduce_scatter count %zu %s", rank, count,
             in_place ? "in place" : "");
    reset(b);
    cc_fill(t, op, rank, b->in, count * (size_t)n);
    uint8_t *dst = in_place ? b->in + (size_t)rank * bytes : b->out;
    GS_ASSERT_OK(gs_reduce_scatter(comm, b->in, dst, count, t, op));
    cc_check_reduced(what, t, op, n, dst, (size_t)rank * count, count);
    if (!in_place)
        cc_check_guard(dst, bytes, what);
}

/* ---- allgather ---------------------------------------------------------------- */

static uint64_t allgather_case(gs_comm *comm, bufs *b, int rank, int n, gs_dtype t, size_t count,
                               bool in_place, uint64_t h)
{
    size_t es = gs_dtype_size(t), bytes = count * es;
    char what[128];
    snprintf(what, sizeof(what), "rank %d allgather count %zu %s", rank, count, in_place ? "in place" : "");
    reset(b);
    uint8_t *src = in_place ? b->out + (size_t)rank * bytes : b->in;
    cc_fill(t, GS_SUM, rank, src, count);
    GS_ASSERT_OK(gs_allgather(comm, src, b->out, count, t));
    for (int q = 0; q < n; q++) {
        uint8_t want[8];
        for (size_t i = 0; i < count; i++) {
            cc_put(t, GS_SUM, q, i, want);
            if (memcmp(b->out + ((size_t)q * count + i) * es, want, es) != 0)
                gs_test_fail_here(__FILE__, __LINE__, "%s: block %d element %zu differs", what, q, i);
        }
    }
    cc_check_guard(b->out, (size_t)n * bytes, what);
    return cc_hash(h, b->out, (size_t)n * bytes);
}

/* ---- broadcast ------------------------------------------------------------------ */

static uint64_t broadcast_case(gs_comm *comm, bufs *b, int rank, int root, gs_dtype t, size_t count,
                               bool in_place, uint64_t h)
{
    size_t es = gs_dtype_size(t), bytes = count * es;
    char what[128];
    snprintf(what, sizeof(what), "rank %d broadcast from %d count %zu", rank, root, count);
    reset(b);
    uint8_t *src = rank == root ? (in_place ? b->out : b->in) : NULL;
    if (src)
        cc_fill(t, GS_MAX, root + 100, src, count);
    GS_ASSERT_OK(gs_broadcast(comm, src, b->out, count, t, root));
    uint8_t want[8];
    for (size_t i = 0; i < count; i++) {
        cc_put(t, GS_MAX, root + 100, i, want);
        if (memcmp(b->out + i * es, want, es) != 0)
            gs_test_fail_here(__FILE__, __LINE__, "%s: element %zu differs", what, i);
    }
    cc_check_guard(b->out, bytes, what);
    return cc_hash(h, b->out, bytes);
}

/* ---- the matrix ------------------------------------------------------------------ */

static void matrix_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    size_t counts[] = {0, 1, (size_t)(n - 1), (size_t)n, (size_t)n + 1, COLUMNS_COUNT};
    static const gs_dtype types[] = {GS_F32, GS_F16, GS_I64};
    bufs b = {.cap = COLUMNS_COUNT * 8 * (size_t)n};
    uint64_t h = 1469598103934665603ull;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    if (arg->param) /* every result streamed */
        comm->nt_bytes = 0;
    b.in = cc_alloc(b.cap);
    b.out = cc_alloc(b.cap);

    for (size_t a = 0; a < sizeof(cc_algos) / sizeof(cc_algos[0]); a++) {
        cc_set_algo(ctx, cc_algos[a]);
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            size_t count = counts[c];
            for (int op = 0; op < GS_REDOP_COUNT; op++)
                for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
                    if (gs_red_valid(types[t], (gs_redop)op))
                        reduce_scatter_case(comm, &b, rank, n, types[t], (gs_redop)op, count, (op + c) % 2);
            for (int t = 0; t < GS_DTYPE_COUNT; t++)
                h = allgather_case(comm, &b, rank, n, (gs_dtype)t, count, (t + c) % 2, h);
            for (int root = 0; root < n; root++)
                h = broadcast_case(comm, &b, rank, root, root % 2 ? GS_BF16 : GS_F64, count, (root + c) % 2,
                                   h);
            GS_ASSERT_OK(gs_barrier(comm));
        }
    }
    cc_same_everywhere(ctx, "collectives-matrix", h);
    cc_close(comm, tp);
    free(b.in);
    free(b.out);
}

static void run_matrix_opts(const char *transport, int n, int streamed)
{
    const char *const env[] = {"GS_CHUNK_BYTES=4096", NULL};
    cc_run_env(transport, n, matrix_body, streamed, env);
}

static void run_matrix(const char *transport, int n)
{
    run_matrix_opts(transport, n, 0);
}

GS_TEST_TP(collectives_matrix_streamed_3_ranks)
{
    run_matrix_opts(transport, 3, 1);
}
GS_TEST_TP(collectives_matrix_1_rank)
{
    run_matrix(transport, 1);
}
GS_TEST_TP(collectives_matrix_2_ranks)
{
    run_matrix(transport, 2);
}
GS_TEST_TP(collectives_matrix_3_ranks)
{
    run_matrix(transport, 3);
}
GS_TEST_TP(collectives_matrix_4_ranks)
{
    run_matrix(transport, 4);
}
GS_TEST_TP(collectives_matrix_5_ranks)
{
    run_matrix(transport, 5);
}
GS_TEST_TP(collectives_matrix_7_ranks)
{
    run_matrix(transport, 7);
}
GS_TEST_TP(collectives_matrix_8_ranks)
{
    run_matrix(transport, 8);
}

/* ---- barrier: nobody leaves before everyone arrived -------------------------------- */

static void barrier_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    for (size_t a = 0; a < sizeof(cc_algos) / sizeof(cc_algos[0]); a++) {
        cc_set_algo(ctx, cc_algos[a]);
        for (int late = 0; late < gs_ctx_size(ctx); late += 2) {
            uint64_t t0 = gs_now_ns();
            if (rank == late)
                usleep(200000);
            GS_ASSERT_OK(gs_barrier(comm));
            if (rank != late)
                GS_ASSERT_GE(gs_now_ns() - t0, 100000000ull); /* waited for the late rank */
        }
    }
    cc_close(comm, tp);
}

GS_TEST_TP(barrier_waits_for_the_last_rank)
{
    cc_arg arg = {.transport = transport};
    gs_test_run_ranks(5, barrier_body, &arg, 60000);
}
