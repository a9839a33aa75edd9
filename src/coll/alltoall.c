/*
 * alltoall over the shared-memory boxes: direct's two steps per chunk
 * column. Every rank posts chunk k of each of its n blocks (a piece per
 * rank; its own piece's place stays empty), then copies piece r of rank q's post to block q
 * of its result (its own block straight from its input). In place works:
 * a column's chunks are all in the box before any of them is overwritten.
 */
#include "coll/coll.h"

void gs_alltoall_fill(gs_coll_op *op, int step, size_t first, size_t bytes, gs_prim *p)
{
    size_t es = op->es, block = op->count * es;
    int r = op->comm->rank;
    if (step == 0) {
        *p = (gs_prim){.kind = GS_PRIM_SEND_ALL,
                       .local = gs_coll_at(op->send, first * es),
                       .bytes = bytes,
                       .stride = block,
                       .pieces = true, /* my own piece stays out: I copy it from my input */
                       .root = -1,
                       .out_slot = -1};
        return;
    }
    *p = (gs_prim){.kind = GS_PRIM_RECV_ALL,
                   .mode = GS_PRIM_GATHER,
                   .local = gs_coll_at(op->send, (size_t)r * block + first * es),
                   .out = gs_coll_at(op->recv, first * es),
                   .bytes = bytes,
                   .stride = block,
                   .pieces = true,
                   .root = -1,
                   .out_slot = -1};
}
