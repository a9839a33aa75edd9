/*
 * Direct: every rank sends its data to every other rank in one step, and
 * every rank combines all n contributions itself, in rank order 0..n-1 (so
 * all ranks compute the same bits). One message latency; n-1 times the
 * data per rank, so it is chosen for small messages (or a few ranks on one
 * host, where a write is a memcpy). Every rank hears from every rank in
 * each column, so a mismatched call is seen by all of them at once.
 *
 *   allreduce       send mine to all; receive all; out = x0 op x1 op ... op x(n-1)
 *   reduce_scatter  send block q to rank q; receive block r from all; reduce
 *   allgather       send mine to all; block q of out = rank q's data
 *   broadcast       root sends its data, the others an empty message (their
 *                   agreement); later columns: root to all
 *   barrier         empty messages to all, from all
 *   reduce, gather, scatter, alltoall: over the boxes only (rooted.c,
 *                   alltoall.c); over messages they run pairwise (pairwise.c)
 *
 * On one host over shm the sends and receives go through shared-memory
 * boxes instead of messages (box.c): a post instead of n-1 writes, and the
 * data read in place. Large allreduces there split the reduction: each rank
 * reduces one part and the others copy it (by parts, parts.c).
 */
#include "coll/coll.h"

static void direct_start(gs_coll_op *op)
{
    op->box = op->comm->box != NULL;
    op->parts = op->box && op->comm->size > 1 &&
                (op->kind == GS_COLL_ALLREDUCE || op->kind == GS_COLL_ALLREDUCE_MULTI) &&
                op->count * op->es >= op->comm->parts_bytes;
    if (op->parts) {
        gs_parts_start(op);
        return;
    }
    /* through the boxes, a reduce_scatter column holds a piece for every rank */
    bool per_rank =
        op->kind == GS_COLL_REDUCE_SCATTER || op->kind == GS_COLL_SCATTER || op->kind == GS_COLL_ALLTOALL;
    size_t pieces = op->box && per_rank ? (size_t)op->comm->size : 1;
    bool pipe = gs_block_kind(op->kind) ||
                (op->box && (op->kind == GS_COLL_BROADCAST || op->kind == GS_COLL_ALLGATHER));
    op->box_ref = pipe && gs_box_ref_wanted(op);
    if (op->box_ref) { /* one column read straight from the posters' buffers, one to let them go (coll.h) */
        gs_coll_layout_cap(op, op->count, pieces, SIZE_MAX);
        op->ncols++;
        op->comm->box_ref_calls++;
    } else if (pipe) { /* pipelined columns (coll.h) */
        size_t col = op->count * op->es * pieces / GS_BOX_PIPE_COLUMNS;
        col = col < GS_BOX_PIPE_MIN_BYTES * pieces ? GS_BOX_PIPE_MIN_BYTES * pieces : col;
        gs_coll_layout_cap(op, op->count, pieces, col < op->comm->box_chunk ? col : op->comm->box_chunk);
    } else {
        gs_coll_layout_pieces(op, op->kind == GS_COLL_BARRIER ? 0 : op->count, pieces);
    }
    op->nsteps = 2; /* send, receive */
}

/* Broadcast: column 0 is all to all (agreement), later ones root to all. */
static bool broadcast_step(gs_coll_op *op, int step, size_t first, size_t bytes, gs_prim *p)
{
    bool root = op->comm->rank == op->root;
    const uint8_t *in = gs_coll_at(op->send, first * op->es);
    uint8_t *out = gs_coll_at(op->recv, first * op->es);
    if (op->col == 0 || op->box) { /* boxes: every rank posts every column */
        *p = step == 0 ? gs_prim_send_all(root ? in : NULL, root ? bytes : 0, 0)
                       : gs_prim_recv_all(GS_PRIM_BCAST, root ? in : NULL, out, bytes, -1);
        p->root = op->root;
        return true;
    }
    if (step == 0) {
        if (!root)
            return false;
        *p = gs_prim_send_all(in, bytes, 0);
        p->out = out; /* and store my own copy */
    } else {
        if (root)
            return false;
        *p = gs_prim_pair(-1, op->root, GS_PRIM_COPY, NULL, out, bytes);
    }
    return true;
}

static bool fill(gs_coll_op *op, int step, gs_prim *p, const void *unused)
{
    (void)unused;
    int r = op->comm->rank;
    if (op->parts) {
        gs_parts_fill(op, step, p);
        return true;
    }
    size_t first, cnt, es = op->es;
    gs_coll_chunk(op, op->kind == GS_COLL_BARRIER ? 0 : op->count, op->col, &first, &cnt);
    size_t bytes = cnt * es;
    bool avg = op->redop == GS_AVG;

    switch (op->kind) {
    case GS_COLL_REDUCE_SCATTER:
        /* my own piece: in place it is also out, so the boxes use their copy */
        *p = step == 0 ? gs_prim_send_all(gs_coll_at(op->send, first * es), bytes, op->count * es)
                       : gs_prim_recv_all(
                             GS_PRIM_REDUCE,
                             op->box ? NULL : gs_coll_at(op->send, ((size_t)r * op->count + first) * es),
                             gs_coll_at(op->recv, first * es), bytes, -1);
        p->stride = op->count * es; /* the boxes find my piece of every rank's post with it */
        p->finish = avg && step == 1;
        break;
    case GS_COLL_ALLGATHER:
        *p = step == 0 ? gs_prim_send_all(gs_coll_at(op->send, first * es), bytes, 0)
                       : gs_prim_recv_all(GS_PRIM_GATHER, gs_coll_at(op->send, first * es),
                                          gs_coll_at(op->recv, first * es), bytes, -1);
        p->stride = step == 0 ? 0 : op->count * es;
        break;
    case GS_COLL_BROADCAST:
        if (!broadcast_step(op, step, first, bytes, p))
            return false;
        break;
    case GS_COLL_BARRIER:
        *p = step == 0 ? gs_prim_send_all(NULL, 0, 0) : gs_prim_recv_all(GS_PRIM_GATHER, NULL, NULL, 0, -1);
        break;
    case GS_COLL_REDUCE: /* over the boxes only (select.c) */
    case GS_COLL_GATHER:
    case GS_COLL_SCATTER: gs_rooted_fill(op, step, first, bytes, p); break;
    case GS_COLL_ALLTOALL: gs_alltoall_fill(op, step, first, bytes, p); break;
    default: /* allreduce: my operand is the copy the send step made */
        *p = step == 0 ? gs_prim_send_all(gs_coll_at(op->send, first * es), bytes, 0)
                       : gs_prim_recv_all(GS_PRIM_REDUCE, NULL, gs_coll_at(op->recv, first * es), bytes, -1);
        p->finish = avg && step == 1;
        break;
    }
    p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, 0);
    return true;
}

static bool direct_next(gs_coll_op *op, gs_prim *p)
{
    return gs_coll_next_mine(op, p, fill, NULL);
}

const gs_coll_algo gs_direct_algo = {
    .name = "direct",
    .id = GS_COLL_ALGO_DIRECT,
    .start = direct_start,
    .next = direct_next,
};
