/*
 * Mismatched calls: one rank calls with another count, type, operator,
 * root, collective or algorithm. Every rank must return GS_ERR_MISMATCH
 * from that very call, well before GS_TIMEOUT_MS, with a message naming
 * what both sides called; later calls fail the same way. Also: a rank that
 * never comes (GS_ERR_TIMEOUT naming it) and a rank that dies.
 */
#include "coll_check.h"

#include <unistd.h>

#define RANK_TIMEOUT_MS 20000
#define FAST_MS         8000 /* a mismatch must be reported well before the deadline */

typedef enum mm_kind {
    MM_COUNT,
    MM_COUNT_ZERO,
    MM_DTYPE,
    MM_OP,
    MM_ROOT,
    MM_BCAST_VS_ALLREDUCE,
    MM_BARRIER_VS_ALLREDUCE,
    MM_ALLGATHER_VS_REDUCE_SCATTER,
    MM_ALGO,
    MM_BCAST_COUNT,
    MM_COUNT_HUGE,
    MM_KINDS
} mm_kind;

typedef struct mm_arg {
    const char *transport;
    mm_kind kind;
    int algo;
    const char *want[2]; /* both must appear in every rank's message */
} mm_arg;

/* Rank `odd` (the last) deviates as arg->kind says. */
static gs_status mismatched_call(gs_comm *comm, const mm_arg *a, bool odd, float *buf)
{
    size_t count = 40;
    switch (a->kind) {
    case MM_COUNT: return gs_allreduce(comm, buf, buf, odd ? count + 1 : count, GS_F32, GS_SUM);
    case MM_COUNT_ZERO: return gs_allreduce(comm, buf, buf, odd ? 0 : 5, GS_F32, GS_SUM);
    case MM_DTYPE: return gs_allreduce(comm, buf, buf, count, odd ? GS_I32 : GS_F32, GS_SUM);
    case MM_OP: return gs_allreduce(comm, buf, buf, count, GS_F32, odd ? GS_MAX : GS_SUM);
    case MM_ROOT: return gs_broadcast(comm, buf, buf, count, GS_F32, odd ? 1 : 0);
    case MM_BCAST_VS_ALLREDUCE:
        return odd ? gs_broadcast(comm, buf, buf, count, GS_F32, 0)
                   : gs_allreduce(comm, buf, buf, count, GS_F32, GS_SUM);
    case MM_BARRIER_VS_ALLREDUCE:
        return odd ? gs_barrier(comm) : gs_allreduce(comm, buf, buf, count, GS_F32, GS_SUM);
    case MM_ALLGATHER_VS_REDUCE_SCATTER:
        return odd ? gs_allgather(comm, buf, buf + 200, 4, GS_F32)
                   : gs_reduce_scatter(comm, buf, buf + 200, 4, GS_F32, GS_SUM);
    case MM_ALGO: return gs_allreduce(comm, buf, buf, count, GS_F32, GS_SUM);
    case MM_BCAST_COUNT: return gs_broadcast(comm, buf, buf, odd ? 3000 : count, GS_F32, 0);
    case MM_COUNT_HUGE: /* auto picks different algorithms for the two sizes */
        return gs_allreduce(comm, buf, buf, odd ? 300000 : count, GS_F32, GS_SUM);
    default: return GS_ERR_INVALID;
    }
}

static void mismatch_body(gs_ctx *ctx, int rank, void *argp)
{
    const mm_arg *a = argp;
    bool odd = rank == gs_ctx_size(ctx) - 1;
    float *buf = calloc(300000, sizeof(float));
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    cc_set_algo(ctx, a->algo);
    /* a good call first: the mismatch is not the first thing on the wire */
    GS_ASSERT_OK(gs_allreduce(comm, buf, buf, 7, GS_F32, GS_SUM));
    if (a->kind == MM_ALGO && odd)
        cc_set_algo(ctx, a->algo == GS_ALGO_RING ? GS_ALGO_RD : GS_ALGO_RING);
    uint64_t t0 = gs_now_ns();
    GS_ASSERT_STATUS(mismatched_call(comm, a, odd, buf), GS_ERR_MISMATCH);
    GS_ASSERT_LT((gs_now_ns() - t0) / 1000000u, FAST_MS);
    GS_ASSERT_CONTAINS(gs_last_error(), "mismatched collective calls");
    for (int i = 0; i < 2; i++)
        if (a->want[i])
            GS_ASSERT_CONTAINS(gs_last_error(), a->want[i]);
    /* the communicator stays failed */
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 7, GS_F32, GS_SUM), GS_ERR_MISMATCH);
    GS_ASSERT_CONTAINS(gs_last_error(), "mismatched collective calls");
    cc_close(comm, tp);
    free(buf);
}

static void run_mismatch(const char *transport, mm_kind kind, const char *want0, const char *want1)
{
    static const int ranks[] = {2, 3, 4};
    static const int algos[] = {GS_ALGO_AUTO, GS_ALGO_RING, GS_ALGO_RD, GS_ALGO_DIRECT};
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
        for (size_t al = 0; al < sizeof(algos) / sizeof(algos[0]); al++) {
            if (kind == MM_ALGO && algos[al] == GS_ALGO_AUTO)
                continue;
            mm_arg a = {.transport = transport, .kind = kind, .algo = algos[al], .want = {want0, want1}};
            gs_test_ranks_opts opts = {
                .n = ranks[i], .timeout_ms = 60000, .rank_timeout_ms = RANK_TIMEOUT_MS};
            int status[GS_TEST_RANKS_MAX];
            int ok = gs_test_run_ranks_opts(&opts, mismatch_body, &a, status);
            if (ok != ranks[i])
                gs_test_fail_here(__FILE__, __LINE__, "%d ranks, GS_ALGO=%s: %d of them did not pass",
                                  ranks[i], cc_algo_names[cc_algos[al]], ranks[i] - ok);
        }
    }
}

CC_TEST(mismatch_count)
{
    run_mismatch(transport, MM_COUNT, "count 40", "count 41");
}
CC_TEST(mismatch_count_zero)
{
    run_mismatch(transport, MM_COUNT_ZERO, "count 5", "count 0");
}
CC_TEST(mismatch_dtype)
{
    run_mismatch(transport, MM_DTYPE, "f32", "i32");
}
CC_TEST(mismatch_op)
{
    run_mismatch(transport, MM_OP, "sum", "max");
}
CC_TEST(mismatch_root)
{
    run_mismatch(transport, MM_ROOT, "root 0", "root 1");
}
CC_TEST(mismatch_broadcast_vs_allreduce)
{
    run_mismatch(transport, MM_BCAST_VS_ALLREDUCE, "broadcast", "allreduce");
}
CC_TEST(mismatch_barrier_vs_allreduce)
{
    run_mismatch(transport, MM_BARRIER_VS_ALLREDUCE, "barrier", "allreduce");
}
CC_TEST(mismatch_allgather_vs_reduce_scatter)
{
    run_mismatch(transport, MM_ALLGATHER_VS_REDUCE_SCATTER, "allgather", "reduce_scatter");
}
CC_TEST(mismatch_algorithm)
{
    run_mismatch(transport, MM_ALGO, "GS_ALGO", NULL);
}
CC_TEST(mismatch_broadcast_count)
{
    run_mismatch(transport, MM_BCAST_COUNT, "count 40", "count 3000");
}

/* ---- a rank that does not come, a rank that dies ---------------------------------- */

static void absent_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float buf[16] = {0};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    if (rank == 1) { /* comes only after the others gave up: they told it why */
        usleep(2500000);
        GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 16, GS_F32, GS_SUM), GS_ERR_TIMEOUT);
        GS_ASSERT_CONTAINS(gs_last_error(), "made no progress");
    } else {
        uint64_t t0 = gs_now_ns();
        GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 16, GS_F32, GS_SUM), GS_ERR_TIMEOUT);
        GS_ASSERT_GE((gs_now_ns() - t0) / 1000000u, 900);
        GS_ASSERT_CONTAINS(gs_last_error(), "GS_TIMEOUT_MS");
        GS_ASSERT_CONTAINS(gs_last_error(), "rank");
    }
    GS_ASSERT_OK(gs_comm_destroy(comm)); /* failed: the closing wait is not an error */
    GS_ASSERT_OK(gs_tp_close(tp));
}

CC_TEST(absent_rank_times_out_with_its_name)
{
    const char *env[] = {"GS_TIMEOUT_MS=1000", NULL};
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 30000, .rank_timeout_ms = 1000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, absent_body, &a, status), 3);
}

static void dying_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float buf[16] = {0};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    GS_ASSERT_OK(gs_allreduce(comm, buf, buf, 16, GS_F32, GS_SUM));
    GS_ASSERT_OK(gs_store_barrier(ctx, "first-done"));
    if (rank == 1)
        _exit(3);
    gs_status st = gs_allreduce(comm, buf, buf, 16, GS_F32, GS_SUM);
    GS_ASSERT(st == GS_ERR_PEER_LOST || st == GS_ERR_TIMEOUT);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank");
    gs_comm_destroy(comm);
    gs_tp_close(tp);
}

CC_TEST(dead_rank_is_an_error_not_a_hang)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 30000, .rank_timeout_ms = 5000};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, dying_body, &a, status);
    GS_ASSERT_RANK_EXIT(status[0], 0);
    GS_ASSERT_RANK_EXIT(status[1], 3);
    GS_ASSERT_RANK_EXIT(status[2], 0);
}
