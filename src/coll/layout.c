/*
 * How the algorithms cut a call into chunk columns. A segment (a rank's
 * block, or the whole vector) of seg elements is cut into ncols chunks of
 * col_elems (the last ones shorter or empty), the same ncols for every
 * segment of the call, so that every rank runs the same number of steps.
 */
#include "coll/coll.h"

void gs_coll_layout(gs_coll_op *op, size_t max_seg)
{
    gs_coll_layout_pieces(op, max_seg, 1);
}

void gs_coll_layout_pieces(gs_coll_op *op, size_t max_seg, size_t pieces)
{
    gs_coll_layout_cap(op, max_seg, pieces, op->box ? op->comm->box_chunk : op->comm->chunk);
}

void gs_coll_layout_cap(gs_coll_op *op, size_t max_seg, size_t pieces, size_t chunk)
{
    size_t unit = op->es * pieces, fit = unit ? chunk / unit : chunk; /* elements one column holds */
    if (fit == 0)
        fit = 1;
    if (max_seg <= fit) { /* one column: no division */
        op->ncols = 1;
        op->col_elems = max_seg;
    } else { /* columns of at most fit elements, as even as can be */
        op->ncols = (max_seg + fit - 1) / fit;
        op->col_elems = (max_seg + op->ncols - 1) / op->ncols;
    }
    op->col = 0;
    op->step = 0;
}

void gs_coll_cursor_advance(gs_coll_op *op)
{
    if (++op->step == op->nsteps) {
        op->step = 0;
        op->col++;
    }
}

bool gs_coll_next_mine(gs_coll_op *op, gs_prim *p, gs_coll_fill_fn fill, const void *arg)
{
    while (op->col < op->ncols) {
        bool mine = fill(op, op->step, p, arg);
        gs_coll_cursor_advance(op);
        if (mine)
            return true;
    }
    return false;
}

void gs_coll_chunk(const gs_coll_op *op, size_t seg, size_t col, size_t *first_p, size_t *n_p)
{
    size_t first = col * op->col_elems;
    size_t n = 0;
    if (first < seg)
        n = seg - first < op->col_elems ? seg - first : op->col_elems;
    *first_p = first < seg ? first : seg;
    *n_p = n;
}
