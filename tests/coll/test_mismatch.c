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
    MM_REDUCE_ROOT,
    MM_REDUCE_VS_ALLREDUCE,
    MM_GATHER_VS_SCATTER,
    MM_SCATTER_COUNT,
    MM_ALLTOALL_COUNT,
    MM_ALLGATHERV_COUNTS,
    MM_REDUCE_SCATTER_V_COUNTS,
    MM_ALLTOALLV_COUNTS, /* only the two ranks of the pair need see it in the call itself */
    MM_KINDS
} mm_kind;

typedef struct mm_arg {
    const char *transport;
    mm_kind kind;
    int algo;
    const char *want[2]; /* both must appear in every rank's message */
} mm_arg;

/* The newer collectives: rank `odd` deviates as arg->kind says. */
static gs_status newer_call(gs_comm *comm, const mm_arg *a, bool odd, float *buf)
{
    size_t counts[8] = {3, 3, 3, 3, 3, 3, 3, 3}, displs[8], sends[8];
    int n = gs_comm_size(comm), r = gs_comm_rank(comm);
    for (int q = 0; q < 8; q++)
        displs[q] = (size_t)q * 10;
    switch (a->kind) {
    case MM_REDUCE_ROOT: return gs_reduce(comm, buf, buf, 40, GS_F32, GS_SUM, odd ? 1 : 0);
    case MM_REDUCE_VS_ALLREDUCE:
        return odd ? gs_allreduce(comm, buf, buf, 40, GS_F32, GS_SUM)
                   : gs_reduce(comm, buf, buf, 40, GS_F32, GS_SUM, 0);
    case MM_GATHER_VS_SCATTER:
        return odd ? gs_gather(comm, buf, buf + 1000, 4, GS_F32, 0)
                   : gs_scatter(comm, buf + 1000, buf, 4, GS_F32, 0);
    case MM_SCATTER_COUNT: return gs_scatter(comm, buf + 1000, buf, odd ? 7 : 4, GS_F32, 0);
    case MM_ALLTOALL_COUNT: return gs_alltoall(comm, buf, buf + 1000, odd ? 5 : 4, GS_F32);
    case MM_ALLGATHERV_COUNTS:
        counts[0] = odd ? 4 : 3;
        return gs_allgatherv(comm, buf + 1000 + displs[r], buf + 1000, counts, displs, GS_F32);
    case MM_REDUCE_SCATTER_V_COUNTS:
        counts[n - 1] = odd ? 5 : 3;
        return gs_reduce_scatter_v(comm, buf, buf + 1000, counts, GS_F32, GS_SUM);
    case MM_ALLTOALLV_COUNTS: /* the odd rank sends rank 0 one more than rank 0 expects */
        memcpy(sends, counts, sizeof(sends));
        if (odd)
            sends[0] = 4;
        return gs_alltoallv(comm, buf, sends, displs, buf + 1000, counts, displs, GS_F32);
    default: return GS_ERR_INVALID;
    }
}

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
    default: return newer_call(comm, a, odd, buf);
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
    gs_status st = mismatched_call(comm, a, odd, buf);
    if (a->kind == MM_ALLTOALLV_COUNTS && st == GS_OK && rank != 0 && !odd) {
        /* not in the pair: its own exchanges agreed; the failure reaches it by the next call */
        GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 7, GS_F32, GS_SUM), GS_ERR_MISMATCH);
        cc_close(comm, tp);
        free(buf);
        return;
    }
    GS_ASSERT_STATUS(st, GS_ERR_MISMATCH);
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

GS_TEST_TP(mismatch_count)
{
    run_mismatch(transport, MM_COUNT, "count 40", "count 41");
}
GS_TEST_TP(mismatch_count_zero)
{
    run_mismatch(transport, MM_COUNT_ZERO, "count 5", "count 0");
}
GS_TEST_TP(mismatch_dtype)
{
    run_mismatch(transport, MM_DTYPE, "f32", "i32");
}
GS_TEST_TP(mismatch_op)
{
    run_mismatch(transport, MM_OP, "sum", "max");
}
GS_TEST_TP(mismatch_root)
{
    run_mismatch(transport, MM_ROOT, "root 0", "root 1");
}
GS_TEST_TP(mismatch_broadcast_vs_allreduce)
{
    run_mismatch(transport, MM_BCAST_VS_ALLREDUCE, "broadcast", "allreduce");
}
GS_TEST_TP(mismatch_barrier_vs_allreduce)
{
    run_mismatch(transport, MM_BARRIER_VS_ALLREDUCE, "barrier", "allreduce");
}
GS_TEST_TP(mismatch_allgather_vs_reduce_scatter)
{
    run_mismatch(transport, MM_ALLGATHER_VS_REDUCE_SCATTER, "allgather", "reduce_scatter");
}
GS_TEST_TP(mismatch_algorithm)
{
    run_mismatch(transport, MM_ALGO, "GS_ALGO", NULL);
}
GS_TEST_TP(mismatch_broadcast_count)
{
    run_mismatch(transport, MM_BCAST_COUNT, "count 40", "count 3000");
}
GS_TEST_TP(mismatch_reduce_root)
{
    run_mismatch(transport, MM_REDUCE_ROOT, "reduce #2 (count 40, f32, sum, root 0)", "root 1)");
}
GS_TEST_TP(mismatch_reduce_vs_allreduce)
{
    run_mismatch(transport, MM_REDUCE_VS_ALLREDUCE, "root 0", "allreduce #2");
}
GS_TEST_TP(mismatch_gather_vs_scatter)
{
    run_mismatch(transport, MM_GATHER_VS_SCATTER, "gather #2", "scatter #2");
}
GS_TEST_TP(mismatch_scatter_count)
{
    run_mismatch(transport, MM_SCATTER_COUNT, "count 4,", "count 7,");
}
GS_TEST_TP(mismatch_alltoall_count)
{
    run_mismatch(transport, MM_ALLTOALL_COUNT, "count 4 per rank", "count 5 per rank");
}
GS_TEST_TP(mismatch_allgatherv_counts)
{
    run_mismatch(transport, MM_ALLGATHERV_COUNTS, "allgatherv #2 (total count", "counts 0x");
}
GS_TEST_TP(mismatch_reduce_scatter_v_counts)
{
    run_mismatch(transport, MM_REDUCE_SCATTER_V_COUNTS, "reduce_scatter_v #2", "counts 0x");
}
GS_TEST_TP(mismatch_alltoallv_counts)
{
    run_mismatch(transport, MM_ALLTOALLV_COUNTS, "alltoallv #2 (f32)", "elements and receiving 3 from it");
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

GS_TEST_TP(absent_rank_times_out_with_its_name)
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

GS_TEST_TP(dead_rank_is_an_error_not_a_hang)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 30000, .rank_timeout_ms = 5000};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, dying_body, &a, status);
    GS_ASSERT_RANK_EXIT(status[0], 0);
    GS_ASSERT_RANK_EXIT(status[1], 3);
    GS_ASSERT_RANK_EXIT(status[2], 0);
}
