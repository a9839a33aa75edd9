/*
 * reduce, gather and scatter over 1..8 ranks: every root, counts 0, 1,
 * n-1, n, n+1 and several 4 KiB chunk columns, several types (reduce: every
 * operator the type has), in place and out of place, the boxes (auto over
 * shm) and the pairwise exchange (GS_ALGO=ring); exact results. Large
 * counts (1M+3) for a few combinations with the default chunk. Reduces of
 * 40 KB to 320 KB (every type, every operator, every root), which over shm
 * post by reference (box_ref.c: at 2 ranks split between the root and the
 * other rank, in several read pieces).
 */
#include "coll_check.h"

#include "coll/coll.h"

#define COLUMNS_COUNT 1500 /* with 4 KiB chunks: several columns of f32 */

static const int algos[] = {GS_ALGO_AUTO, GS_ALGO_RING};

typedef struct bufs {
    uint8_t *in, *out;
    size_t cap;
} bufs;

static void reset(bufs *b)
{
    memset(b->in, CC_GUARD, b->cap + 64);
    memset(b->out, CC_GUARD, b->cap + 64);
}

/* Fails unless buf[0..count) is rank src's values (cc_put with op) from index first. */
static void check_values(const char *what, gs_dtype t, gs_redop op, int src, const uint8_t *buf, size_t first,
                         size_t count)
{
    size_t es = gs_dtype_size(t);
    for (size_t i = 0; i < count; i++) {
        uint8_t want[8];
        cc_put(t, op, src, first + i, want);
        if (memcmp(buf + i * es, want, es) != 0)
            gs_test_fail_here(__FILE__, __LINE__, "%s: element %zu (of rank %d's) differs", what, first + i,
                              src);
    }
}

static void reduce_case(gs_comm *comm, bufs *b, int root, gs_dtype t, gs_redop op, size_t count,
                        bool in_place)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t bytes = count * gs_dtype_size(t);
    char what[128];
    snprintf(what, sizeof(what), "rank %d reduce to %d count %zu %s", rank, root, count,
             in_place ? "in place" : "");
    reset(b);
    cc_fill(t, op, rank, b->in, count);
    bool mine = rank == root;
    uint8_t *dst = mine ? (in_place ? b->in : b->out) : (count % 2 ? NULL : b->out);
    GS_ASSERT_OK(gs_reduce(comm, b->in, dst, count, t, op, root));
    if (mine) {
        cc_check_reduced(what, t, op, n, dst, 0, count);
        cc_check_guard(dst, bytes, what);
    } else {
        check_values(what, t, op, rank, b->in, 0, count); /* input untouched */
        if (dst)
            cc_check_guard(dst, 0, what);
    }
}

static void gather_case(gs_comm *comm, bufs *b, int root, gs_dtype t, size_t count, bool in_place)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t es = gs_dtype_size(t), bytes = count * es;
    char what[128];
    snprintf(what, sizeof(what), "rank %d gather to %d count %zu %s", rank, root, count,
             in_place ? "in place" : "");
    reset(b);
    bool mine = rank == root;
    uint8_t *src = mine && in_place ? b->out + (size_t)rank * bytes : b->in;
    cc_fill(t, GS_SUM, rank, src, count);
    GS_ASSERT_OK(gs_gather(comm, src, mine ? b->out : NULL, count, t, root));
    if (!mine)
        return;
    for (int q = 0; q < n; q++)
        check_values(what, t, GS_SUM, q, b->out + (size_t)q * bytes, 0, count);
    cc_check_guard(b->out, (size_t)n * bytes, what);
}

static void scatter_case(gs_comm *comm, bufs *b, int root, gs_dtype t, size_t count, bool in_place)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t es = gs_dtype_size(t), bytes = count * es;
    char what[128];
    snprintf(what, sizeof(what), "rank %d scatter from %d count %zu %s", rank, root, count,
             in_place ? "in place" : "");
    reset(b);
    bool mine = rank == root;
    if (mine) /* block q: root + 100's values from q * count */
        cc_fill(t, GS_MAX, root + 100, b->in, count * (size_t)n);
    uint8_t *dst = mine && in_place ? b->in + (size_t)rank * bytes : b->out;
    GS_ASSERT_OK(gs_scatter(comm, mine ? b->in : NULL, dst, count, t, root));
    check_values(what, t, GS_MAX, root + 100, dst, (size_t)rank * count, count);
    if (!(mine && in_place))
        cc_check_guard(dst, bytes, what);
}

static void matrix_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    size_t counts[] = {0, 1, (size_t)(n - 1), (size_t)n, (size_t)n + 1, COLUMNS_COUNT};
    static const gs_dtype types[] = {GS_F32, GS_I16, GS_U8, GS_BOOL, GS_F64, GS_BF16};
    enum { NTYPES = sizeof(types) / sizeof(types[0]) };
    bufs b = {.cap = COLUMNS_COUNT * 8 * (size_t)n};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    b.in = cc_alloc(b.cap);
    b.out = cc_alloc(b.cap);
    (void)rank;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
        cc_set_algo(ctx, algos[a]);
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            for (int root = 0; root < n; root++) {
                gs_dtype t = types[(c + (size_t)root) % NTYPES];
                for (int op = 0; op < GS_REDOP_COUNT; op++)
                    if (gs_red_valid(t, (gs_redop)op) && (root == 0 || op % n == root % 3))
                        reduce_case(comm, &b, root, t, (gs_redop)op, counts[c], (op + root) % 2);
                gather_case(comm, &b, root, types[(c + (size_t)root + 1) % NTYPES], counts[c],
                            (c + root) % 2);
                scatter_case(comm, &b, root, types[(c + (size_t)root + 2) % NTYPES], counts[c],
                             (c + root + 1) % 2);
            }
        }
    }
    cc_close(comm, tp);
    free(b.in);
    free(b.out);
}

static void run_matrix(const char *transport, int n)
{
    const char *const env[] = {"GS_CHUNK_BYTES=4096", NULL};
    cc_run_env(transport, n, matrix_body, 0, env);
}

GS_TEST_TP(rooted_matrix_1_rank)
{
    run_matrix(transport, 1);
}
GS_TEST_TP(rooted_matrix_2_ranks)
{
    run_matrix(transport, 2);
}
GS_TEST_TP(rooted_matrix_3_ranks)
{
    run_matrix(transport, 3);
}
GS_TEST_TP(rooted_matrix_4_ranks)
{
    run_matrix(transport, 4);
}
GS_TEST_TP(rooted_matrix_5_ranks)
{
    run_matrix(transport, 5);
}
GS_TEST_TP(rooted_matrix_8_ranks)
{
    run_matrix(transport, 8);
}

/* ---- 1M+3 elements, default chunk ------------------------------------------------------ */

#define LARGE_COUNT ((1u << 20) + 3)

static void large_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    bufs b = {.cap = LARGE_COUNT * 4 * (size_t)n};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    b.in = cc_alloc(b.cap);
    b.out = cc_alloc(b.cap);
    (void)rank;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
        cc_set_algo(ctx, algos[a]);
        reduce_case(comm, &b, n - 1, GS_F32, GS_SUM, LARGE_COUNT, a == 1);
        gather_case(comm, &b, 0, GS_U8, LARGE_COUNT, a == 0);
        scatter_case(comm, &b, n - 1, GS_I16, LARGE_COUNT, a == 1);
    }
    cc_close(comm, tp);
    free(b.in);
    free(b.out);
}

/* ---- reduces posted by reference ---------------------------------------------------------- */

#define REF_COUNT 40000 /* 40 KB (u8, bool) .. 320 KB (f64): by reference over shm */

static void ref_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    static const gs_dtype types[] = {GS_F32, GS_F64, GS_I32,  GS_I64, GS_I16,
                                     GS_I8,  GS_U8,  GS_BOOL, GS_F16, GS_BF16};
    bufs b = {.cap = REF_COUNT * 8};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    b.in = cc_alloc(b.cap);
    b.out = cc_alloc(b.cap);
    (void)rank;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        for (int op = 0; op < GS_REDOP_COUNT; op++)
            if (gs_red_valid(types[i], (gs_redop)op))
                for (int root = 0; root < n; root++)
                    reduce_case(comm, &b, root, types[i], (gs_redop)op, REF_COUNT, (op + root + (int)i) % 2);
    cc_close(comm, tp);
    free(b.in);
    free(b.out);
}

GS_TEST_TP(rooted_reduce_by_reference_2_ranks)
{
    cc_run_env(transport, 2, ref_body, 0, NULL);
}
GS_TEST_TP(rooted_reduce_by_reference_3_ranks)
{
    cc_run_env(transport, 3, ref_body, 0, NULL);
}

GS_TEST_TP(rooted_large_2_ranks)
{
    cc_run_env(transport, 2, large_body, 0, NULL);
}
GS_TEST_TP(rooted_large_3_ranks)
{
    cc_run_env(transport, 3, large_body, 0, NULL);
}
