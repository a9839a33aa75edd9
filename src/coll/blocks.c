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

void gs_block_peer(const gs_coll_op *op, int q, size_t *send_off_p, size_t *send_len_p, size_t *recv_off_p,
                   size_t *recv_len_p)
{
    int r = op->comm->rank;
    bool root = r == op->root, peer_root = q == op->root;
    size_t c = op->count, qc = (size_t)q * c, so = 0, sl = 0, ro = 0, rl = 0;
    switch (op->kind) {
    case GS_COLL_REDUCE: sl = peer_root && !root ? c : 0, rl = root ? c : 0; break;
    case GS_COLL_GATHER: sl = peer_root && !root ? c : 0, ro = root ? qc : 0, rl = root ? c : 0; break;
    case GS_COLL_SCATTER: so = root ? qc : 0, sl = root ? c : 0, rl = peer_root ? c : 0; break;
    case GS_COLL_ALLTOALL: so = ro = qc, sl = rl = c; break;
    case GS_COLL_ALLTOALLV:
        so = op->sdispls[q], sl = op->scounts[q], ro = op->rdispls[q], rl = op->rcounts[q];
        break;
    case GS_COLL_ALLGATHERV: sl = op->rcounts[r], ro = op->rdispls[q], rl = op->rcounts[q]; break;
    case GS_COLL_REDUCE_SCATTER_V:
        so = prefix(op->rcounts, q), sl = op->rcounts[q], rl = op->rcounts[r];
        break;
    default: break;
    }
    *send_off_p = so;
    *send_len_p = sl;
    *recv_off_p = ro;
    *recv_len_p = rl;
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
