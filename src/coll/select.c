/*
 * Which algorithm runs a call. Every rank computes the same answer from the
 * same inputs (collective, bytes, rank count, GS_ALGO); a rank whose
 * GS_ALGO differs is caught by the descriptor check as a mismatch.
 *
 * auto: small messages go where latency is lowest (direct: one step; rd:
 * log2 n steps), large ones to the ring (each rank sends and receives
 * 2(n-1)/n of the data, the bandwidth optimum). The crossovers were
 * measured with gsbench over shm (docs/collectives.md).
 */
#include "coll/coll.h"

/* ---- one rank: copies only ------------------------------------------------ */

static void local_start(gs_coll_op *op)
{
    op->col = 0;
    op->ncols = 1;
    op->nsteps = 1;
}

static bool local_next(gs_coll_op *op, gs_prim *p)
{
    if (op->col++ > 0)
        return false;
    bool reduction = op->kind == GS_COLL_ALLREDUCE || op->kind == GS_COLL_ALLREDUCE_MULTI ||
                     op->kind == GS_COLL_REDUCE_SCATTER;
    *p = gs_prim_pair(-1, -1, reduction ? GS_PRIM_REDUCE : GS_PRIM_COPY, op->send, op->recv,
                      op->kind == GS_COLL_BARRIER ? 0 : op->count * op->es);
    return true;
}

const gs_coll_algo gs_local_algo = {
    .name = "local",
    .id = GS_COLL_ALGO_LOCAL,
    .start = local_start,
    .next = local_next,
};

/* ---- the choice ----------------------------------------------------------- */

#define DIRECT_MAX_BYTES   (64u << 10)  /* allreduce with at most DIRECT_MAX_RANKS */
#define PAIR_MAX_BYTES     (512u << 10) /* 2 ranks through the transport: direct up to here */
#define DIRECT_MAX_RANKS   4
#define BOX_PAIR_MAX_BYTES (16u << 20) /* shared-memory boxes, 2 ranks: direct (halves from 1 MiB) */
#define BOX_MAX_RANKS      8           /* shared-memory boxes, 3 to 8 ranks: direct at every size */
#define RD_MAX_BYTES       (16u << 10)
#define SMALL_TOTAL_BYTES  (16u << 10) /* reduce_scatter, allgather, broadcast */

static const gs_coll_algo *forced(int algo)
{
    switch (algo) {
    case GS_ALGO_RING: return &gs_ring_algo;
    case GS_ALGO_RD: return &gs_rd_algo;
    case GS_ALGO_DIRECT: return &gs_direct_algo;
    case GS_ALGO_HIER: return &gs_hier_algo;
    default: return NULL;
    }
}

/* reduce, gather, scatter, alltoall: direct over the boxes (one copy into
 * shared memory, read in place), unless GS_ALGO names another; the rest,
 * and every one of them over messages, pairwise. */
static const gs_coll_algo *select_blocks(const gs_comm *comm, gs_coll_kind kind, const gs_coll_algo *want)
{
    bool boxed = kind == GS_COLL_REDUCE || kind == GS_COLL_GATHER || kind == GS_COLL_SCATTER ||
                 kind == GS_COLL_ALLTOALL;
    if (comm->box && comm->size > 1 && boxed && (!want || want == &gs_direct_algo))
        return &gs_direct_algo;
    return &gs_pairwise_algo;
}

const gs_coll_algo *gs_coll_select(const gs_comm *comm, gs_coll_kind kind, size_t bytes)
{
    const gs_coll_algo *want = forced(comm->cfg->algo);
    int n = comm->size;
    if (gs_block_kind(kind)) /* the newer collectives (any rank count) */
        return select_blocks(comm, kind, want);
    if (n == 1)
        return &gs_local_algo;
    switch (kind) {
    case GS_COLL_ALLREDUCE:
    case GS_COLL_ALLREDUCE_MULTI:
    case GS_COLL_BARRIER:
        if (want == &gs_hier_algo && !comm->hier_hosts)
            return &gs_ring_algo; /* hier needs two hosts or more, one of several ranks */
        if (want)
            return want;
        /* 3 to BOX_MAX_RANKS ranks over the boxes: direct at every size
         * (by parts from GS_BOX_PARTS_BYTES), fewer waits than the ring's */
        if (comm->box && (n == 2 ? bytes <= BOX_PAIR_MAX_BYTES : n <= BOX_MAX_RANKS))
            return &gs_direct_algo;
        /* several hosts of several ranks: across hosts once per host's share, small calls through
         * one rank per host (measured over emulated hosts, tests/netns/hosts.sh: faster than direct
         * at every size, 8 B included: 75-90 us against 120-160 us over 2x2) */
        if (comm->hier_hosts && kind != GS_COLL_BARRIER)
            return &gs_hier_algo;
        /* 2 ranks: direct sends what the ring sends, without the ring's
         * dependency of the all-gather on the reduce-scatter; from about
         * 1 MiB the ring's halved reduction work wins (tcp, measured) */
        if (n <= DIRECT_MAX_RANKS && bytes <= (n == 2 ? PAIR_MAX_BYTES : DIRECT_MAX_BYTES))
            return &gs_direct_algo;
        return bytes <= RD_MAX_BYTES ? &gs_rd_algo : &gs_ring_algo;
    default: { /* reduce_scatter, allgather, broadcast: ring, direct or (not broadcast) hier; rd means ring */
        /* hier: hosts of several ranks, even or not (broadcast's chain already enters each host once) */
        bool hier = kind != GS_COLL_BROADCAST && comm->hier_hosts && comm->hier_scratch;
        if (want == &gs_direct_algo || want == &gs_ring_algo)
            return want;
        if (want)
            return want == &gs_hier_algo && hier ? &gs_hier_algo : &gs_ring_algo;
        /* 2 ranks over the boxes: one copy into shared memory, pipelined columns (measured faster
         * than the ring from 1 MiB, docs/collectives.md) */
        if (comm->box && n == 2 && kind != GS_COLL_REDUCE_SCATTER)
            return &gs_direct_algo;
        /* 3 to BOX_MAX_RANKS over the boxes, pieces large enough to post by reference: every rank
         * reads each piece once, straight from its owner (box.c), where the ring passes it on */
        if (kind != GS_COLL_REDUCE_SCATTER && n <= BOX_MAX_RANKS &&
            gs_box_ref_possible(comm, kind == GS_COLL_ALLGATHER ? bytes / (size_t)n : bytes))
            return &gs_direct_algo;
        if (bytes <= SMALL_TOTAL_BYTES && n <= 2 * DIRECT_MAX_RANKS)
            return &gs_direct_algo;
        return hier ? &gs_hier_algo : &gs_ring_algo;
    }
    }
}
