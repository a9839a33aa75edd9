/*
 * The quick path (src/coll/engine.c, gs_engine_quick): a blocking call of
 * one box column between 2 ranks (allreduce, reduce, gather, scatter,
 * allgather, alltoall by direct) posts, spins on the peer's post and reads
 * it without queueing a request. What it posts is what the engine posts, so
 * a peer that runs the same call non-blocking (gs_i*, always the engine)
 * meets it; a peer that comes late hands the call over to the engine; a
 * different call is a mismatch on both ranks. Over tcp (no boxes) the same
 * calls take the engine's path and none goes the quick way.
 */
#include "coll_check.h"

#include "coll/coll.h"

#include <unistd.h>

#define FAST_MS 8000 /* a mismatch is reported well before the deadline */

enum { K_REDUCE, K_GATHER, K_SCATTER, K_ALLGATHER, K_ALLTOALL, K_COUNT };
static const char *const kind_names[] = {"reduce", "gather", "scatter", "allgather", "alltoall"};

/* in[i] = 1000 * rank + i: every result element names its origin. */
static void fill(int32_t *in, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++)
        in[i] = (int32_t)(1000 * rank + (int)i);
}

/* Call k with count elements per block, blocking or not, root 1. */
static gs_status call(gs_comm *comm, int k, bool blocking, const int32_t *in, int32_t *out, size_t count)
{
    gs_req *req = NULL;
    gs_status st;
    switch (k) {
    case K_REDUCE:
        st = blocking ? gs_reduce(comm, in, out, count, GS_I32, GS_SUM, 1)
                      : gs_ireduce(comm, in, out, count, GS_I32, GS_SUM, 1, &req);
        break;
    case K_GATHER:
        st = blocking ? gs_gather(comm, in, out, count, GS_I32, 1)
                      : gs_igather(comm, in, out, count, GS_I32, 1, &req);
        break;
    case K_SCATTER:
        st = blocking ? gs_scatter(comm, in, out, count, GS_I32, 1)
                      : gs_iscatter(comm, in, out, count, GS_I32, 1, &req);
        break;
    case K_ALLGATHER:
        st = blocking ? gs_allgather(comm, in, out, count, GS_I32)
                      : gs_iallgather(comm, in, out, count, GS_I32, &req);
        break;
    default:
        st = blocking ? gs_alltoall(comm, in, out, count, GS_I32)
                      : gs_ialltoall(comm, in, out, count, GS_I32, &req);
        break;
    }
    return st == GS_OK && req ? gs_req_wait(req) : st;
}

/* The result of call k on rank, element i, when rank q put 1000 q + j at j. */
static int32_t want(int k, int rank, size_t count, size_t i)
{
    size_t b = i / count, j = i % count;
    switch (k) {
    case K_REDUCE: return (int32_t)(1000 + 2 * (int)i); /* ranks 0 and 1 summed at the root */
    case K_GATHER:
    case K_ALLGATHER: return (int32_t)(1000 * (int)b + (int)j);
    case K_SCATTER: return (int32_t)(1000 + (int)(rank * count + i));   /* root 1's block of this rank */
    default: return (int32_t)(1000 * (int)b + (int)(rank * count + j)); /* alltoall: block b from rank b */
    }
}

static size_t out_count(int k, int rank, size_t count)
{
    switch (k) {
    case K_REDUCE: return rank == 1 ? count : 0;
    case K_GATHER: return rank == 1 ? 2 * count : 0;
    case K_SCATTER: return count;
    default: return 2 * count;
    }
}

static void check(int k, int rank, size_t count, const int32_t *out)
{
    for (size_t i = 0; i < out_count(k, rank, count); i++)
        if (out[i] != want(k, rank, count, i))
            gs_test_fail_here(__FILE__, __LINE__, "%s count %zu rank %d: element %zu is %d, want %d",
                              kind_names[k], count, rank, i, (int)out[i], (int)want(k, rank, count, i));
}

/* param 0: one rank blocking, the other not (both ways round); param 1: the
 * rank that calls first waits 30 ms (far beyond the quick spin). */
static void body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    static const size_t counts[] = {1, 3, 1000};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    int32_t *in = malloc(2 * 1000 * sizeof(int32_t)), *out = malloc(2 * 1000 * sizeof(int32_t));
    GS_ASSERT(in && out);
    for (int k = 0; k < K_COUNT; k++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int turn = 0; turn < 2; turn++) {
                size_t n = counts[c];
                fill(in, 2 * n, rank);
                memset(out, 0x5a, 2 * n * sizeof(int32_t));
                bool blocking = a->param == 1 || rank == turn;
                if (a->param == 1 && rank == turn)
                    usleep(30000);
                GS_ASSERT_OK(call(comm, k, blocking, in, out, n));
                check(k, rank, n, out);
            }
    if (strcmp(a->transport, "shm") == 0)
        GS_ASSERT_GT(comm->quick_calls, 0);
    else
        GS_ASSERT_EQ(comm->quick_calls, 0);
    free(in);
    free(out);
    cc_close(comm, tp);
}

GS_TEST_TP(quick_meets_the_engine_of_the_peer)
{
    cc_run_env(transport, 2, body, 0, NULL);
}

GS_TEST_TP(quick_late_peer_continues_in_the_engine)
{
    cc_run_env(transport, 2, body, 1, NULL);
}

/* Rank 0 reduces, rank 1 gathers (the same counts and root): GS_ERR_MISMATCH
 * on both, well before the deadline, naming both calls. */
static void mismatch_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    int32_t in[2] = {1, 2}, out[4];
    uint64_t t0 = gs_now_ns();
    gs_status st =
        rank == 0 ? gs_reduce(comm, in, out, 2, GS_I32, GS_SUM, 1) : gs_gather(comm, in, out, 2, GS_I32, 1);
    GS_ASSERT_EQ(st, GS_ERR_MISMATCH);
    GS_ASSERT(strstr(gs_last_error(), "reduce") && strstr(gs_last_error(), "gather"));
    GS_ASSERT_LT((gs_now_ns() - t0) / 1000000u, FAST_MS);
    gs_comm_destroy(comm);
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(quick_mismatch_on_both_ranks)
{
    cc_run_env(transport, 2, mismatch_body, 0, NULL);
}
