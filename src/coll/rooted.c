/*
 * reduce, gather and scatter over the shared-memory boxes: direct's two
 * steps per chunk column (post, then read every post), as the other
 * direct collectives run them there. Every rank posts every column, the
 * root's post or the others' empty, so every rank checks every rank's
 * descriptor (a mismatch is seen by all) and the boxes' two slots stay in
 * step.
 *
 *   reduce   the others post chunk k of their input; the root reduces all,
 *            in rank order, its own operand from its input
 *   gather   the others post chunk k of their input; the root copies each
 *            to block q of its result, its own from its input
 *   scatter  the root posts chunk k of every block (a piece per rank);
 *            rank q copies piece q to its result
 */
#include "coll/coll.h"

void gs_rooted_fill(gs_coll_op *op, int step, size_t first, size_t bytes, gs_prim *p)
{
    bool root = op->comm->rank == op->root;
    size_t es = op->es, block = op->count * es;
    const uint8_t *in = gs_coll_at(op->send, first * es);
    uint8_t *out = gs_coll_at(op->recv, first * es);
    switch (op->kind) {
    case GS_COLL_REDUCE:
        *p = step == 0 ? gs_prim_send_all(root ? NULL : in, root ? 0 : bytes, 0)
                       : gs_prim_recv_all(root ? GS_PRIM_REDUCE : GS_PRIM_GATHER, root ? in : NULL,
                                          root ? out : NULL, bytes, op->root);
        p->to_root = true;
        p->finish = root && step == 1 && op->redop == GS_AVG;
        break;
    case GS_COLL_GATHER:
        *p = step == 0
                 ? gs_prim_send_all(root ? NULL : in, root ? 0 : bytes, 0)
                 : gs_prim_recv_all(GS_PRIM_GATHER, root ? in : NULL, root ? out : NULL, bytes, op->root);
        p->to_root = true;
        p->stride = step == 0 ? 0 : block;
        break;
    default: /* scatter: the root's piece for rank q is chunk k of block q */
        *p = step == 0
                 ? gs_prim_send_all(root ? in : NULL, root ? bytes : 0,
                                    root ? block : 0) /* my piece: from my input */
                 : gs_prim_recv_all(GS_PRIM_BCAST,
                                    root ? gs_coll_at(op->send, (size_t)op->root * block + first * es) : NULL,
                                    out, bytes, op->root);
        p->pieces = true;
        break;
    }
}
