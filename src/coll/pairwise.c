/*
 * Pairwise exchange: the newer collectives (reduce, gather, scatter,
 * alltoall, alltoallv, allgatherv, reduce_scatter_v) over messages, on
 * every transport. Each is a set of blocks (blocks.c): one for each peer
 * each way, and one this rank copies to itself.
 *
 *   step "own"   copy my own block from the input to the result (for the
 *                reductions: my contribution, the start of the sum)
 *   step s       s = 0 .. n-1: exchange with q = s - r (mod n), the one
 *                rank whose step s is an exchange with me (r + q = s), in
 *                chunk columns: send chunk k of my block for q, receive
 *                chunk k of q's block for me (copied, or reduced into the
 *                result); none when q = r
 *
 * Both ranks of a pair run the same step, so the steps of all ranks never
 * wait on each other in a cycle. The two sides of a pair send each other
 * at least one message (an empty block: one empty message), so every rank
 * hears from every rank in every call: a mismatched call is seen by all of
 * them. A rank sends chunk k before it stores the peer's chunk k, so
 * alltoall in place works (each chunk leaves before its place is written).
 *
 * The reductions add each peer's block into the result in step order (the
 * same order on every run; each rank's result is its own, so no bits need
 * to agree between ranks); avg divides once, in the last exchange.
 */
#include "coll/coll.h"

/* Elements one message carries. */
static size_t fit(const gs_coll_op *op)
{
    size_t f = op->comm->chunk / op->es;
    return f ? f : 1;
}

/* Chunks of a block of len elements: at least one (the empty message). */
static size_t chunks(const gs_coll_op *op, size_t len)
{
    return len == 0 ? 1 : (len + fit(op) - 1) / fit(op);
}

/* Elements [first, first + n) of chunk k of a block of len elements. */
static void chunk_of(const gs_coll_op *op, size_t len, size_t k, size_t *first_p, size_t *n_p)
{
    size_t f = fit(op), first = k * f < len ? k * f : len;
    *first_p = first;
    *n_p = len - first < f ? len - first : f;
}

/* The peer of step s, or -1 (the step pairs this rank with itself). */
static int peer_of(const gs_coll_op *op, int s)
{
    int q = gs_coll_mod(s - op->comm->rank, op->comm->size);
    return q == op->comm->rank ? -1 : q;
}

static void pairwise_start(gs_coll_op *op)
{
    op->nsteps = op->comm->size;
    op->step = -1; /* my own block first */
    op->col = 0;
    op->ncols = 1;
}

/* Moves the cursor to the next step that has a peer (op->step == nsteps: none). */
static void next_step(gs_coll_op *op)
{
    size_t so, sl, ro, rl;
    op->col = 0;
    while (++op->step < op->nsteps) {
        int q = peer_of(op, op->step);
        if (q < 0)
            continue;
        gs_block_peer(op, q, &so, &sl, &ro, &rl);
        size_t a = chunks(op, sl), b = chunks(op, rl);
        op->ncols = a > b ? a : b;
        return;
    }
}

/* Whether step s is the last exchange of the call. */
static bool last_exchange(const gs_coll_op *op, int s)
{
    for (int t = s + 1; t < op->nsteps; t++)
        if (peer_of(op, t) >= 0)
            return false;
    return true;
}

/* Column op->col of the exchange with q. */
static void exchange(gs_coll_op *op, int q, gs_prim *p)
{
    size_t so, sl, ro, rl, sf, sn, rf, rn, k = op->col, es = op->es;
    gs_block_peer(op, q, &so, &sl, &ro, &rl);
    chunk_of(op, sl, k, &sf, &sn);
    chunk_of(op, rl, k, &rf, &rn);
    bool sends = k < chunks(op, sl), receives = k < chunks(op, rl), reduce = gs_block_reduces(op->kind);
    uint8_t *out = gs_coll_at(op->recv, (ro + rf) * es);
    *p = gs_prim_pair(sends ? q : -1, receives ? q : -1, reduce ? GS_PRIM_REDUCE : GS_PRIM_COPY,
                      reduce ? out : NULL, rn ? out : NULL, rn * es);
    p->send_local = true;
    p->split = true;
    p->send_data = gs_coll_at(op->send, (so + sf) * es);
    p->send_bytes = sn * es;
    p->recv_first = q < op->comm->rank;
    p->finish = reduce && op->redop == GS_AVG && last_exchange(op, op->step);
    p->send_unit = p->recv_unit = gs_coll_unit(op, k, op->step);
}

static bool pairwise_next(gs_coll_op *op, gs_prim *p)
{
    if (op->step < 0) { /* my own block */
        size_t from, to, len;
        gs_block_self(op, &from, &to, &len);
        bool alone = gs_block_reduces(op->kind) && op->comm->size == 1; /* a reduction of one rank's data */
        *p = gs_prim_pair(-1, -1, alone ? GS_PRIM_REDUCE : GS_PRIM_COPY, gs_coll_at(op->send, from * op->es),
                          gs_coll_at(op->recv, to * op->es), len * op->es);
        next_step(op);
        return true;
    }
    if (op->step >= op->nsteps)
        return false;
    exchange(op, peer_of(op, op->step), p);
    if (++op->col == op->ncols)
        next_step(op);
    return true;
}

const gs_coll_algo gs_pairwise_algo = {
    .name = "pairwise",
    .id = GS_COLL_ALGO_PAIRWISE,
    .start = pairwise_start,
    .next = pairwise_next,
};
