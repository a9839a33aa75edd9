/*
 * The newer collectives as blocks: for each peer q, the block of the input
 * this rank sends q, the block of the result it receives from q, and the
 * block it copies from its own input to its own result (q == rank). Offsets
 * and lengths in elements, from op->send and op->recv; c is the count, r
 * this rank.
 *
 *                     send to q              receive from q             own
 *   reduce            root: [0, c)           root: [0, c), reduced      root: [0, c) -> [0, c)
 *   gather            root: [0, c)           root: [qc, qc + c)         root: [0, c) -> [rc, rc + c)
 *   scatter           root: [qc, qc + c)     from root: [0, c)          root: [rc, rc + c) -> [0, c)
 *   alltoall          [qc, qc + c)           [qc, qc + c)               [rc, ...) -> [rc, ...)
 *   alltoallv         sdispls, scounts [q]   rdispls, rcounts [q]       sdispls[r] -> rdispls[r]
 *   allgatherv        [0, counts[r])         [displs[q], + counts[q])   [0, ...) -> displs[r]
 *   reduce_scatter_v  block q of the input   [0, counts[r]), reduced    block r -> [0, counts[r])
 *
 * (root: only when the rank or the peer is the root, as the case may be;
 * every other block is empty.) reduce_scatter_v's blocks lie one after the
 * other in the input, block q at counts[0] + ... + counts[q-1].
 */
#include "coll/coll.h"

bool gs_block_reduces(gs_coll_kind kind)
{
    return kind == GS_COLL_REDUCE || kind == GS_COLL_REDUCE_SCATTER_V;
}

/* reduce_scatter_v: where block q starts in the input. */
static size_t prefix(const size_t *counts, int q)
{
    size_t off = 0;
    for (int i = 0; i < q; i++)
        off += counts[i];
    return off;
}

static void set(size_t *off_p, size_t *len_p, size_t off, size_t len)
{
    *off_p = off;
    *len_p = len;
}

void gs_block_send(const gs_coll_op *op, int q, size_t *off_p, size_t *len_p)
{
    int r = op->comm->rank;
    size_t c = op->count;
    set(off_p, len_p, 0, 0);
    switch (op->kind) {
    case GS_COLL_REDUCE:
    case GS_COLL_GATHER:
        if (q == op->root && r != op->root)
            set(off_p, len_p, 0, c);
        break;
    case GS_COLL_SCATTER:
        if (r == op->root)
            set(off_p, len_p, (size_t)q * c, c);
        break;
    case GS_COLL_ALLTOALL: set(off_p, len_p, (size_t)q * c, c); break;
    case GS_COLL_ALLTOALLV: set(off_p, len_p, op->sdispls[q], op->scounts[q]); break;
    case GS_COLL_ALLGATHERV: set(off_p, len_p, 0, op->rcounts[r]); break;
    case GS_COLL_REDUCE_SCATTER_V: set(off_p, len_p, prefix(op->rcounts, q), op->rcounts[q]); break;
    default: break;
    }
}

void gs_block_recv(const gs_coll_op *op, int q, size_t *off_p, size_t *len_p)
{
    int r = op->comm->rank;
    size_t c = op->count;
    set(off_p, len_p, 0, 0);
    switch (op->kind) {
    case GS_COLL_REDUCE:
        if (r == op->root)
            set(off_p, len_p, 0, c);
        break;
    case GS_COLL_GATHER:
        if (r == op->root)
            set(off_p, len_p, (size_t)q * c, c);
        break;
    case GS_COLL_SCATTER:
        if (q == op->root)
            set(off_p, len_p, 0, c);
        break;
    case GS_COLL_ALLTOALL: set(off_p, len_p, (size_t)q * c, c); break;
    case GS_COLL_ALLTOALLV: set(off_p, len_p, op->rdispls[q], op->rcounts[q]); break;
    case GS_COLL_ALLGATHERV: set(off_p, len_p, op->rdispls[q], op->rcounts[q]); break;
    case GS_COLL_REDUCE_SCATTER_V: set(off_p, len_p, 0, op->rcounts[r]); break;
    default: break;
    }
}

void gs_block_self(const gs_coll_op *op, size_t *from_p, size_t *to_p, size_t *len_p)
{
    int r = op->comm->rank;
    bool root = r == op->root;
    size_t c = op->count, rc = (size_t)r * c, len = 0, from = 0, to = 0;
    switch (op->kind) {
    case GS_COLL_REDUCE: len = root ? c : 0; break;
    case GS_COLL_GATHER: len = root ? c : 0, to = rc; break;
    case GS_COLL_SCATTER: len = root ? c : 0, from = rc; break;
    case GS_COLL_ALLTOALL: len = c, from = to = rc; break;
    case GS_COLL_ALLTOALLV: len = op->scounts[r], from = op->sdispls[r], to = op->rdispls[r]; break;
    case GS_COLL_ALLGATHERV: len = op->rcounts[r], to = op->rdispls[r]; break;
    case GS_COLL_REDUCE_SCATTER_V: len = op->rcounts[r], from = prefix(op->rcounts, r); break;
    default: break;
    }
    *from_p = from;
    *to_p = to;
    *len_p = len;
}
