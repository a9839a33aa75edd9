/*
 * Posts by reference over the shared-memory boxes (box_ref.c,
 * GS_BOX_REF_BYTES): broadcast (out of place, and in place at the root,
 * where the root writes a share into every non-root), allgather, gather
 * (every non-root writes its block into the root's result), scatter,
 * alltoall and reduce (sum, and avg in place at the root; at 2 ranks split
 * between the root and the other rank, which writes its part into the
 * root's result; one piece and several) of pieces large enough to be read
 * straight from the posters' buffers, on 2 and 3 ranks, the root moving.
 * Every call's input is new, and each rank overwrites its input the moment
 * the call returns: a reader still copying from it would get the garbage,
 * and a writer still writing into a result would be missing from it, so this
 * fails if a call could end before every peer finished (the last, empty
 * column). Over
 * shm with cross-memory attach the calls must have gone by reference
 * (counted); over tcp and verbs the same calls take the messages and must
 * give the same results. Also below the threshold (by value), mixed in the
 * same run.
 */
#include "coll_check.h"

#include "coll/coll.h"
#include "transport/tp.h"

#define REF_COUNT    (GS_BOX_REF_BYTES / 4 + 1001)        /* f32 elements per piece: above the threshold */
#define SMALL_COUNT  700                                  /* below it */
#define PIECES_COUNT (3 * GS_BOX_REF_READ_BYTES / 4 + 17) /* a reduce read in several pieces */
#define ROUNDS       6

enum {
    K_BCAST,
    K_ALLGATHER,
    K_GATHER,
    K_SCATTER,
    K_ALLTOALL,
    K_BCAST_IN_PLACE,
    K_REDUCE,
    K_REDUCE_AVG,
    K_COUNT
};
static const char *const kind_names[] = {"broadcast", "allgather",          "gather", "scatter",
                                         "alltoall",  "broadcast in place", "reduce", "reduce avg in place"};

/* What rank src gives rank dst at index i in round t (exact in f32). */
static float value(int t, int src, int dst, size_t i)
{
    return (float)(t * 1000 + src * 100 + dst * 10) + (float)(i % 4096);
}

/* Fills rank's input for kind in round t; returns the elements in it. */
static size_t fill(int kind, int t, int rank, int n, int root, size_t count, float *in)
{
    size_t total = kind == K_ALLTOALL || (kind == K_SCATTER && rank == root) ? (size_t)n * count : count;
    for (size_t j = 0; j < total; j++) {
        size_t q = j / count, i = j % count;
        switch (kind) {
        case K_BCAST:
        case K_BCAST_IN_PLACE: in[j] = value(t, root, 0, i); break;
        case K_SCATTER: in[j] = value(t, root, (int)q, i); break;
        case K_ALLTOALL: in[j] = value(t, rank, (int)q, i); break;
        case K_REDUCE_AVG: in[j] = (float)n * value(t, rank, 0, i); break; /* the mean is exact */
        default: in[j] = value(t, rank, 0, i); break;                      /* allgather, gather, reduce */
        }
    }
    return total;
}

static gs_status call(gs_comm *comm, int kind, const float *in, float *out, size_t count, int root)
{
    switch (kind) {
    case K_BCAST: return gs_broadcast(comm, in, out, count, GS_F32, root);
    case K_ALLGATHER: return gs_allgather(comm, in, out, count, GS_F32);
    case K_GATHER: return gs_gather(comm, in, out, count, GS_F32, root);
    case K_SCATTER: return gs_scatter(comm, in, out, count, GS_F32, root);
    case K_ALLTOALL: return gs_alltoall(comm, in, out, count, GS_F32);
    case K_BCAST_IN_PLACE: /* the root's result is its input */
        return gs_broadcast(comm, in, gs_comm_rank(comm) == root ? (void *)in : out, count, GS_F32, root);
    case K_REDUCE: return gs_reduce(comm, in, out, count, GS_F32, GS_SUM, root);
    default: /* avg, in place at the root */
        return gs_reduce(comm, in, gs_comm_rank(comm) == root ? (void *)in : NULL, count, GS_F32, GS_AVG,
                         root);
    }
}

/* The sum over ranks of value(t, q, 0, i), in rank order. */
static float sum_of(int t, int n, size_t i)
{
    float s = value(t, 0, 0, i);
    for (int q = 1; q < n; q++)
        s += value(t, q, 0, i);
    return s;
}

static void check(int kind, int t, int rank, int n, int root, size_t count, const float *out)
{
    bool rooted_result = kind == K_GATHER || kind == K_REDUCE || kind == K_REDUCE_AVG;
    size_t total = kind == K_ALLGATHER || kind == K_ALLTOALL || (kind == K_GATHER && rank == root)
                       ? (size_t)n * count
                   : rooted_result && rank != root ? 0
                                                   : count;
    for (size_t j = 0; j < total; j++) {
        size_t q = j / count, i = j % count;
        float want = kind == K_BCAST || kind == K_BCAST_IN_PLACE ? value(t, root, 0, i)
                     : kind == K_SCATTER                         ? value(t, root, rank, i)
                     : kind == K_ALLTOALL                        ? value(t, (int)q, rank, i)
                     : kind == K_REDUCE || kind == K_REDUCE_AVG  ? sum_of(t, n, i)
                                                                 : value(t, (int)q, 0, i);
        if (out[j] != want)
            gs_test_fail_here(__FILE__, __LINE__,
                              "%s round %d (root %d, %zu per rank): rank %d element %zu: %g, want %g",
                              kind_names[kind], t, root, count, rank, j, (double)out[j], (double)want);
    }
}

static void body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *arg = argp;
    int n = gs_ctx_size(ctx);
    size_t cap = (size_t)n * REF_COUNT > PIECES_COUNT ? (size_t)n * REF_COUNT : PIECES_COUNT;
    float *in = (float *)cc_alloc(cap * sizeof(float)), *out = (float *)cc_alloc(cap * sizeof(float));
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    uint64_t by_ref = 0, want_ref = 0;
    /* the limit comes from the ranks' L2 (box.c); every rank sets the same, so that the
     * reduces of several pieces go by reference on any machine */
    comm->box_ref_reduce_max = PIECES_COUNT * sizeof(float);
    /* the boxes open exactly where the transport maps peers' regions */
    GS_ASSERT_EQ(comm->box != NULL, (gs_tp_caps(tp) & GS_TP_CAP_LOCAL_MAP) != 0);
    for (int t = 0; t < ROUNDS; t++) {
        for (int kind = 0; kind < K_COUNT; kind++) {
            bool reduce = kind == K_REDUCE || kind == K_REDUCE_AVG;
            size_t count = t % 3 == 2 ? SMALL_COUNT : reduce && t % 3 == 1 ? PIECES_COUNT : REF_COUNT;
            int root = (t + kind) % n;
            size_t total = fill(kind, t, rank, n, root, count, in);
            memset(out, 0xee, cap * sizeof(float));
            GS_ASSERT_OK(call(comm, kind, in, out, count, root));
            /* at once: no reader may still need my input, no writer may still write my result */
            bool result_in_input = rank == root && (kind == K_BCAST_IN_PLACE || kind == K_REDUCE_AVG);
            if (result_in_input)
                memcpy(out, in, total * sizeof(float));
            memset(in, 0xdd, total * sizeof(float));
            check(kind, t, rank, n, root, count, out);
            static const gs_coll_kind kinds[] = {GS_COLL_BROADCAST, GS_COLL_ALLGATHER, GS_COLL_GATHER,
                                                 GS_COLL_SCATTER,   GS_COLL_ALLTOALL,  GS_COLL_BROADCAST,
                                                 GS_COLL_REDUCE,    GS_COLL_REDUCE};
            size_t sel = count * 4 * (kind == K_ALLGATHER || kind == K_ALLTOALL ? (size_t)n : 1);
            want_ref += count != SMALL_COUNT && gs_coll_select(comm, kinds[kind], sel) == &gs_direct_algo;
        }
    }
    by_ref = comm->box_ref_calls;
    if (comm->box && (gs_tp_caps(tp) & GS_TP_CAP_USER_MEM))
        GS_ASSERT_EQ(by_ref, want_ref); /* shm with cross-memory attach: every large call by reference */
    else
        GS_ASSERT_EQ(by_ref, 0);
    cc_close(comm, tp);
    free(in);
    free(out);
}

GS_TEST_TP(by_reference_2_ranks)
{
    cc_run_env(transport, 2, body, 0, NULL);
}
GS_TEST_TP(by_reference_3_ranks)
{
    cc_run_env(transport, 3, body, 0, NULL);
}
/* 4 KiB chunks: box slots (and the communicator's scratch) smaller than a
 * read piece; avg at 3 ranks stages its partial results. */
GS_TEST_TP(by_reference_small_chunks_3_ranks)
{
    const char *const env[] = {"GS_CHUNK_BYTES=4096", NULL};
    cc_run_env(transport, 3, body, 0, env);
}
