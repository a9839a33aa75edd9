/*
 * Posts by reference over the shared-memory boxes (box.c, GS_BOX_REF_BYTES):
 * broadcast, allgather, gather, scatter and alltoall of pieces large enough
 * to be read straight from the posters' buffers, on 2 and 3 ranks, the root
 * moving. Every call's input is new, and each rank overwrites its input the
 * moment the call returns: a reader still copying from it would get the
 * garbage, so this fails if a call could end before every peer finished
 * reading (the last, empty column). Over shm with cross-memory attach the
 * calls must have gone by reference (counted); over tcp and verbs the same
 * calls take the messages and must give the same results. Also below the
 * threshold (by value), mixed in the same run.
 */
#include "coll_check.h"

#include "coll/coll.h"
#include "transport/tp.h"

#define REF_COUNT   (GS_BOX_REF_BYTES / 4 + 1001) /* f32 elements per piece: above the threshold */
#define SMALL_COUNT 700                           /* below it */
#define ROUNDS      6

enum { K_BCAST, K_ALLGATHER, K_GATHER, K_SCATTER, K_ALLTOALL, K_COUNT };
static const char *const kind_names[] = {"broadcast", "allgather", "gather", "scatter", "alltoall"};

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
        case K_BCAST: in[j] = value(t, root, 0, i); break;
        case K_SCATTER: in[j] = value(t, root, (int)q, i); break;
        case K_ALLTOALL: in[j] = value(t, rank, (int)q, i); break;
        default: in[j] = value(t, rank, 0, i); break; /* allgather, gather */
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
    default: return gs_alltoall(comm, in, out, count, GS_F32);
    }
}

static void check(int kind, int t, int rank, int n, int root, size_t count, const float *out)
{
    size_t total = kind == K_ALLGATHER || kind == K_ALLTOALL || (kind == K_GATHER && rank == root)
                       ? (size_t)n * count
                   : kind == K_GATHER ? 0
                                      : count;
    for (size_t j = 0; j < total; j++) {
        size_t q = j / count, i = j % count;
        float want = kind == K_BCAST      ? value(t, root, 0, i)
                     : kind == K_SCATTER  ? value(t, root, rank, i)
                     : kind == K_ALLTOALL ? value(t, (int)q, rank, i)
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
    size_t cap = (size_t)n * REF_COUNT;
    float *in = (float *)cc_alloc(cap * sizeof(float)), *out = (float *)cc_alloc(cap * sizeof(float));
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, arg->transport, &tp);
    uint64_t by_ref = 0, want_ref = 0;
    /* the boxes open exactly where the transport maps peers' regions */
    GS_ASSERT_EQ(comm->box != NULL, (gs_tp_caps(tp) & GS_TP_CAP_LOCAL_MAP) != 0);
    for (int t = 0; t < ROUNDS; t++) {
        for (int kind = 0; kind < K_COUNT; kind++) {
            size_t count = t % 3 == 2 ? SMALL_COUNT : REF_COUNT;
            int root = (t + kind) % n;
            size_t total = fill(kind, t, rank, n, root, count, in);
            memset(out, 0xee, cap * sizeof(float));
            GS_ASSERT_OK(call(comm, kind, in, out, count, root));
            memset(in, 0xdd, total * sizeof(float)); /* at once: no reader may still need it */
            check(kind, t, rank, n, root, count, out);
            static const gs_coll_kind kinds[] = {GS_COLL_BROADCAST, GS_COLL_ALLGATHER, GS_COLL_GATHER,
                                                 GS_COLL_SCATTER, GS_COLL_ALLTOALL};
            size_t sel = count * 4 * (kind == K_ALLGATHER || kind == K_ALLTOALL ? (size_t)n : 1);
            want_ref += count == REF_COUNT && gs_coll_select(comm, kinds[kind], sel) == &gs_direct_algo;
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
