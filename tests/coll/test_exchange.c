/*
 * alltoall, alltoallv, allgatherv and reduce_scatter_v over 1..8 ranks:
 * counts 0, 1, n-1, n, n+1 and several 4 KiB chunk columns (the v-variants:
 * uneven counts around them, some empty), several types, in place and out
 * of place, the boxes (auto over shm) and the pairwise exchange
 * (GS_ALGO=ring), blocking and non-blocking; exact results, and the
 * allgatherv result bitwise identical on every rank (hashed through the
 * store). Large counts (1M+3) for a few combinations.
 */
#include "coll_check.h"

#include "coll/coll.h"

#define COLUMNS_COUNT 1500
#define MAX_RANKS     8

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

/* The value rank src sends rank dst at index i: rank and place in its bits. */
static void put(gs_dtype t, int src, int dst, size_t i, void *p)
{
    cc_put(t, GS_SUM, src * MAX_RANKS + dst, i, p);
}

static void check_from(const char *what, gs_dtype t, int src, int dst, const uint8_t *buf, size_t count)
{
    size_t es = gs_dtype_size(t);
    for (size_t i = 0; i < count; i++) {
        uint8_t want[8];
        put(t, src, dst, i, want);
        if (memcmp(buf + i * es, want, es) != 0)
            gs_test_fail_here(__FILE__, __LINE__, "%s: element %zu from rank %d differs", what, i, src);
    }
}

/* Blocking, or started and waited for. */
static void finish(gs_status st, gs_req *const *req_p)
{
    GS_ASSERT_OK(st);
    if (*req_p)
        GS_ASSERT_OK(gs_req_wait(*req_p));
}

static void alltoall_case(gs_comm *comm, bufs *b, gs_dtype t, size_t count, bool in_place, bool nb)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t es = gs_dtype_size(t), bytes = count * es;
    char what[128];
    gs_req *req = NULL;
    snprintf(what, sizeof(what), "rank %d alltoall count %zu %s", rank, count, in_place ? "in place" : "");
    reset(b);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++)
            put(t, rank, q, i, b->in + ((size_t)q * count + i) * es);
    uint8_t *dst = in_place ? b->in : b->out;
    finish(nb ? gs_ialltoall(comm, b->in, dst, count, t, &req) : gs_alltoall(comm, b->in, dst, count, t),
           &req);
    for (int q = 0; q < n; q++)
        check_from(what, t, q, rank, dst + (size_t)q * bytes, count);
    cc_check_guard(dst, (size_t)n * bytes, what);
}

/* Uneven counts: rank src sends dst this many (some 0). */
static size_t vcount(size_t base, int src, int dst)
{
    size_t k = (size_t)(src * 3 + dst * 5) % 4;
    return k == 0 ? 0 : base * k / 2 + (size_t)src;
}

static void alltoallv_case(gs_comm *comm, bufs *b, gs_dtype t, size_t base, bool nb)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t es = gs_dtype_size(t), sc[MAX_RANKS], sd[MAX_RANKS], rc[MAX_RANKS], rd[MAX_RANKS], so = 0, ro = 0;
    char what[128];
    gs_req *req = NULL;
    snprintf(what, sizeof(what), "rank %d alltoallv base %zu", rank, base);
    reset(b);
    for (int q = n - 1; q >= 0; q--) { /* blocks in reverse order, gaps between them */
        sc[q] = vcount(base, rank, q), sd[q] = so, so += sc[q] + 1;
        rc[q] = vcount(base, q, rank), rd[q] = ro, ro += rc[q] + 2;
        for (size_t i = 0; i < sc[q]; i++)
            put(t, rank, q, i, b->in + (sd[q] + i) * es);
    }
    GS_ASSERT_LE(ro * es, b->cap);
    finish(nb ? gs_ialltoallv(comm, b->in, sc, sd, b->out, rc, rd, t, &req)
              : gs_alltoallv(comm, b->in, sc, sd, b->out, rc, rd, t),
           &req);
    for (int q = 0; q < n; q++) {
        check_from(what, t, q, rank, b->out + rd[q] * es, rc[q]);
        for (size_t g = 0; g < 2; g++) /* the gaps stay untouched */
            GS_ASSERT_EQ(b->out[(rd[q] + rc[q]) * es + g], CC_GUARD);
    }
}

static uint64_t allgatherv_case(gs_comm *comm, bufs *b, gs_dtype t, size_t base, bool in_place, bool nb,
                                uint64_t h)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t es = gs_dtype_size(t), rc[MAX_RANKS], rd[MAX_RANKS], off = 0;
    char what[128];
    gs_req *req = NULL;
    snprintf(what, sizeof(what), "rank %d allgatherv base %zu %s", rank, base, in_place ? "in place" : "");
    reset(b);
    for (int q = 0; q < n; q++)
        rc[q] = vcount(base, q, 0), rd[q] = off, off += rc[q] + 1;
    uint8_t *src = in_place ? b->out + rd[rank] * es : b->in;
    for (size_t i = 0; i < rc[rank]; i++)
        put(t, rank, 0, i, src + i * es);
    finish(nb ? gs_iallgatherv(comm, src, b->out, rc, rd, t, &req)
              : gs_allgatherv(comm, src, b->out, rc, rd, t),
           &req);
    for (int q = 0; q < n; q++)
        check_from(what, t, q, 0, b->out + rd[q] * es, rc[q]);
    cc_check_guard(b->out, off * es, what);
    return cc_hash(h, b->out, off * es);
}

static void reduce_scatter_v_case(gs_comm *comm, bufs *b, gs_dtype t, gs_redop op, size_t base, bool in_place,
                                  bool nb)
{
    int rank = gs_comm_rank(comm), n = gs_comm_size(comm);
    size_t es = gs_dtype_size(t), rc[MAX_RANKS], total = 0, mine = 0;
    char what[128];
    gs_req *req = NULL;
    snprintf(what, sizeof(what), "rank %d reduce_scatter_v base %zu %s", rank, base,
             in_place ? "in place" : "");
    reset(b);
    for (int q = 0; q < n; q++) {
        rc[q] = vcount(base, 0, q);
        if (q < rank)
            mine += rc[q];
        total += rc[q];
    }
    cc_fill(t, op, rank, b->in, total);
    uint8_t *dst = in_place ? b->in + mine * es : b->out;
    finish(nb ? gs_ireduce_scatter_v(comm, b->in, dst, rc, t, op, &req)
              : gs_reduce_scatter_v(comm, b->in, dst, rc, t, op),
           &req);
    cc_check_reduced(what, t, op, n, dst, mine, rc[rank]);
    if (!in_place)
        cc_check_guard(dst, rc[rank] * es, what);
}

static void matrix_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    size_t counts[] = {0, 1, (size_t)(n - 1), (size_t)n, (size_t)n + 1, COLUMNS_COUNT};
    static const gs_dtype types[] = {GS_F32, GS_I8, GS_F64, GS_I16, GS_BOOL, GS_I64};
    enum { NTYPES = sizeof(types) / sizeof(types[0]) };
    bufs b = {.cap = COLUMNS_COUNT * 8 * 4 * (size_t)n};
    uint64_t h = 1469598103934665603ull;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    b.in = cc_alloc(b.cap);
    b.out = cc_alloc(b.cap);
    (void)rank;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
        cc_set_algo(ctx, algos[a]);
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            size_t k = counts[c];
            bool nb = (c + a) % 3 == 1;
            for (size_t t = 0; t < NTYPES; t += 2)
                alltoall_case(comm, &b, types[(t + c) % NTYPES], k, (t / 2 + c) % 2, nb);
            alltoallv_case(comm, &b, types[(c + 1) % NTYPES], k, nb);
            h = allgatherv_case(comm, &b, types[(c + 2) % NTYPES], k, c % 2, nb, h);
            for (int op = 0; op < GS_REDOP_COUNT; op++) {
                gs_dtype t = types[(c + (size_t)op) % NTYPES];
                if (gs_red_valid(t, (gs_redop)op))
                    reduce_scatter_v_case(comm, &b, t, (gs_redop)op, k, (op + c) % 2, nb);
            }
        }
    }
    cc_same_everywhere(ctx, "exchange-matrix", h);
    cc_close(comm, tp);
    free(b.in);
    free(b.out);
}

static void run_matrix(const char *transport, int n)
{
    const char *const env[] = {"GS_CHUNK_BYTES=4096", NULL};
    cc_run_env(transport, n, matrix_body, 0, env);
}

GS_TEST_TP(exchange_matrix_1_rank)
{
    run_matrix(transport, 1);
}
GS_TEST_TP(exchange_matrix_2_ranks)
{
    run_matrix(transport, 2);
}
GS_TEST_TP(exchange_matrix_3_ranks)
{
    run_matrix(transport, 3);
}
GS_TEST_TP(exchange_matrix_4_ranks)
{
    run_matrix(transport, 4);
}
GS_TEST_TP(exchange_matrix_5_ranks)
{
    run_matrix(transport, 5);
}
GS_TEST_TP(exchange_matrix_8_ranks)
{
    run_matrix(transport, 8);
}

/* ---- 1M+3 elements, default chunk ---------------------------------------------------------- */

#define LARGE_COUNT ((1u << 20) + 3)

static void large_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    bufs b = {.cap = LARGE_COUNT * 2 * (size_t)n * 2};
    uint64_t h = 1469598103934665603ull;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    b.in = cc_alloc(b.cap);
    b.out = cc_alloc(b.cap);
    (void)rank;
    for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
        cc_set_algo(ctx, algos[a]);
        alltoall_case(comm, &b, GS_I16, LARGE_COUNT, a == 1, a == 0);
    }
    alltoallv_case(comm, &b, GS_U8, LARGE_COUNT, false);
    h = allgatherv_case(comm, &b, GS_U8, LARGE_COUNT, true, false, h);
    reduce_scatter_v_case(comm, &b, GS_I16, GS_SUM, LARGE_COUNT / 2, false, true);
    cc_same_everywhere(ctx, "exchange-large", h);
    cc_close(comm, tp);
    free(b.in);
    free(b.out);
}

GS_TEST_TP(exchange_large_2_ranks)
{
    cc_run_env(transport, 2, large_body, 0, NULL);
}
GS_TEST_TP(exchange_large_3_ranks)
{
    cc_run_env(transport, 3, large_body, 0, NULL);
}
