/*
 * Pipelined ring. Ranks form a ring (left = r - 1, right = r + 1); the data
 * is cut into segments and each segment into chunk columns. Column by
 * column, every rank runs the same steps, each a message to the right and
 * one from the left, so all links carry a chunk at once and a chunk never
 * waits for the whole buffer.
 *
 * allreduce (2n - 1 steps per column), rank r:
 *   step 0          send segment r
 *   steps 1..n-2    receive segment r-j, reduce with mine, forward
 *   step n-1        receive segment r+1, reduce: final (owned by r); store, forward
 *   steps n..2n-3   receive a final segment, store, forward
 *   step 2n-2       receive the last final segment, store
 * Each segment's final value is computed by exactly one rank and copied to
 * the others, so every rank ends with the same bits.
 *
 * reduce_scatter: the first n steps, shifted so that rank r owns segment r.
 * allgather: step 0 sends block r, then n-1 receive-store(-forward) steps.
 * broadcast: a chain root -> root+1 -> ... -> root-1 (the tail); once the
 * tail has checked the first chunk it sends every rank a token, and every
 * rank waits for it: a rank returns only after all ranks agreed on the call.
 *
 * The ring's order is comm->ring: the ranks host by host (rank order
 * inside a host, hosts in the order of their first ranks), so that it
 * crosses from host to host H times, whatever the placement; on one host
 * it is rank order. Positions are numbered along it.
 */
#include "coll/coll.h"

/* ---- allreduce ------------------------------------------------------------ */

/* Segment i of count elements over n ranks: offset and length. */
static void segment(const gs_coll_op *op, int i, size_t *off_p, size_t *len_p)
{
    size_t n = (size_t)op->comm->size, q = op->count / n, rem = op->count % n;
    *off_p = (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
    *len_p = q + ((size_t)i < rem ? 1 : 0);
}

static bool allreduce_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    int n = c->size, r = c->ring_pos, j = op->step; /* segments are numbered by ring position */
    int left = c->ring[gs_coll_mod(r - 1, n)], right = c->ring[gs_coll_mod(r + 1, n)];
    int seg = j == 0 ? r : j <= n - 1 ? gs_coll_mod(r - j, n) : gs_coll_mod(r + 1 - (j - (n - 1)), n);
    size_t off, len, first, cnt;
    if (op->col == op->ncols)
        return false;
    segment(op, seg, &off, &len);
    gs_coll_chunk(op, len, op->col, &first, &cnt);
    const uint8_t *in = gs_coll_at(op->send, (off + first) * op->es);
    uint8_t *out = gs_coll_at(op->recv, (off + first) * op->es);
    size_t bytes = cnt * op->es;

    if (j == 0) { /* send my segment */
        *p = gs_prim_pair(right, -1, GS_PRIM_COPY, in, NULL, bytes);
        p->send_local = true;
    } else if (j < n - 1) { /* receive, reduce with mine, forward */
        *p = gs_prim_pair(right, left, GS_PRIM_REDUCE, in, NULL, bytes);
    } else if (j == n - 1) { /* the final value of segment r+1: store and forward */
        *p = gs_prim_pair(right, left, GS_PRIM_REDUCE, in, out, bytes);
        p->finish = op->redop == GS_AVG;
    } else if (j < 2 * n - 2) { /* a final segment: store and forward */
        *p = gs_prim_pair(right, left, GS_PRIM_COPY, NULL, out, bytes);
    } else { /* the last final segment: store */
        *p = gs_prim_pair(-1, left, GS_PRIM_COPY, NULL, out, bytes);
    }
    p->recv_first = true;
    p->send_unit = gs_coll_unit(op, op->col, j);
    p->recv_unit = gs_coll_unit(op, op->col, j - 1);
    /* 2 ranks, buffers registered: my segment goes from my input, the final
     * segment from my result (reduced straight into it), both without a
     * staging copy; the call's last forward still goes from its slot (it
     * is proven arrived only by the peer's next call, after this one
     * returned the buffers to the caller) */
    p->from_user = op->send_mr && (j == 0 || (n == 2 && j == 1 && op->col + 1 < op->ncols));
    gs_coll_cursor_advance(op);
    return true;
}

/* ---- reduce_scatter ------------------------------------------------------- */

static bool reduce_scatter_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    int n = c->size, r = c->ring_pos, j = op->step;
    int left = c->ring[gs_coll_mod(r - 1, n)], right = c->ring[gs_coll_mod(r + 1, n)];
    int blk = c->ring[gs_coll_mod(r - 1 - j, n)]; /* step n-1 reaches this rank's block */
    size_t first, cnt;
    if (op->col == op->ncols)
        return false;
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    const uint8_t *in = gs_coll_at(op->send, ((size_t)blk * op->count + first) * op->es);
    size_t bytes = cnt * op->es;

    if (j == 0) { /* send the block that travels furthest */
        *p = gs_prim_pair(right, -1, GS_PRIM_COPY, in, NULL, bytes);
        p->send_local = true;
    } else if (j < n - 1) { /* receive, reduce with mine, forward */
        *p = gs_prim_pair(right, left, GS_PRIM_REDUCE, in, NULL, bytes);
    } else { /* my block, complete: store */
        *p = gs_prim_pair(-1, left, GS_PRIM_REDUCE, in, gs_coll_at(op->recv, first * op->es), bytes);
        p->finish = op->redop == GS_AVG;
    }
    p->recv_first = true;
    p->send_unit = gs_coll_unit(op, op->col, j);
    p->recv_unit = gs_coll_unit(op, op->col, j - 1);
    gs_coll_cursor_advance(op);
    return true;
}

/* ---- allgather ------------------------------------------------------------ */

static bool allgather_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    int n = c->size, r = c->ring_pos, j = op->step;
    int left = c->ring[gs_coll_mod(r - 1, n)], right = c->ring[gs_coll_mod(r + 1, n)];
    int blk = c->ring[gs_coll_mod(r - j, n)];
    size_t first, cnt;
    if (op->col == op->ncols)
        return false;
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    uint8_t *out = gs_coll_at(op->recv, ((size_t)blk * op->count + first) * op->es);
    size_t bytes = cnt * op->es;

    if (j == 0) { /* send my block (and store it) */
        *p = gs_prim_pair(right, -1, GS_PRIM_COPY, gs_coll_at(op->send, first * op->es), out, bytes);
        p->send_local = true;
    } else if (j < n - 1) { /* store a block and forward it */
        *p = gs_prim_pair(right, left, GS_PRIM_COPY, NULL, out, bytes);
    } else { /* the last block: store */
        *p = gs_prim_pair(-1, left, GS_PRIM_COPY, NULL, out, bytes);
    }
    p->send_unit = gs_coll_unit(op, op->col, j);
    p->recv_unit = gs_coll_unit(op, op->col, j - 1);
    gs_coll_cursor_advance(op);
    return true;
}

/* ---- broadcast ------------------------------------------------------------ */

#define TOKEN_UNIT 0xffffffffu

static bool broadcast_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    int n = c->size, r = c->ring_pos, root = c->ring_pos_of[op->root];
    int left = c->ring[gs_coll_mod(r - 1, n)], right = c->ring[gs_coll_mod(r + 1, n)];
    int tail = gs_coll_mod(root - 1, n); /* positions: r, root and tail */
    size_t first, cnt;
    if (op->step == 1) { /* the tail's token: every rank agreed */
        op->step = 2;
        if (r == tail) { /* right after the first chunk */
            *p = (gs_prim){.kind = GS_PRIM_SEND_ALL, .root = -1, .out_slot = -1, .send_unit = TOKEN_UNIT};
            return true;
        }
    }
    if (op->col == op->ncols) {
        if (op->step == 3 || r == tail)
            return false;
        op->step = 3;
        *p = gs_prim_pair(-1, c->ring[tail], GS_PRIM_COPY, NULL, NULL, 0);
        p->recv_unit = TOKEN_UNIT;
        return true;
    }
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    const uint8_t *in = gs_coll_at(op->send, first * op->es);
    uint8_t *out = gs_coll_at(op->recv, first * op->es);
    size_t bytes = cnt * op->es;
    if (r == root) { /* send (and store) */
        *p = gs_prim_pair(right, -1, GS_PRIM_COPY, in, out, bytes);
        p->send_local = true;
    } else if (r != tail) { /* store and forward */
        *p = gs_prim_pair(right, left, GS_PRIM_COPY, NULL, out, bytes);
    } else { /* store */
        *p = gs_prim_pair(-1, left, GS_PRIM_COPY, NULL, out, bytes);
    }
    p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, 0);
    if (op->col++ == 0)
        op->step = 1;
    return true;
}

/* ---- the algorithm -------------------------------------------------------- */

static void ring_start(gs_coll_op *op)
{
    size_t n = (size_t)op->comm->size;
    switch (op->kind) {
    case GS_COLL_ALLREDUCE:
    case GS_COLL_ALLREDUCE_MULTI:
    case GS_COLL_BARRIER:
        gs_coll_layout(op, (op->count + n - 1) / n);
        op->nsteps = 2 * (int)n - 1;
        break;
    case GS_COLL_REDUCE_SCATTER:
    case GS_COLL_ALLGATHER:
        gs_coll_layout(op, op->count);
        op->nsteps = (int)n;
        break;
    case GS_COLL_BROADCAST:
        gs_coll_layout(op, op->count);
        op->nsteps = 1;
        break;
    default: break; /* the newer collectives run pairwise (select.c) */
    }
}

static bool ring_next(gs_coll_op *op, gs_prim *p)
{
    switch (op->kind) {
    case GS_COLL_REDUCE_SCATTER: return reduce_scatter_next(op, p);
    case GS_COLL_ALLGATHER: return allgather_next(op, p);
    case GS_COLL_BROADCAST: return broadcast_next(op, p);
    default: return allreduce_next(op, p);
    }
}

const gs_coll_algo gs_ring_algo = {
    .name = "ring",
    .id = GS_COLL_ALGO_RING,
    .start = ring_start,
    .next = ring_next,
};
