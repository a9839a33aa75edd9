/*
 * Posts by reference over the boxes (GS_BOX_REF_BYTES; shm with
 * cross-memory attach): instead of its data a post names the poster's
 * registered buffers (gs_coll_box_ref), and the ranks copy straight between
 * the callers' buffers with the transport's reads and writes of caller
 * memory, one copy per byte. Such a call has one column of data and an
 * empty last one that keeps every buffer registered and unchanged until
 * every rank is done with it (direct.c).
 *
 * A post names
 *   region  (GS_COLL_HDR_REF)  the poster's input, for its peers to read;
 *   into    (GS_COLL_HDR_INTO) the poster's result buffer, for its peers to
 *           write into.
 *
 * Who copies what, so that no rank waits while another copies for both:
 *   broadcast  the root writes the first 1/n of each non-root's result
 *              (gs_box_ref_share), each non-root reads the rest
 *   gather     each non-root writes its block into the root's result, the
 *              root copies its own
 *   scatter, allgather, alltoall
 *              every rank reads what it gets (each rank copies its share)
 *   reduce     (to comm->box_ref_reduce_max) the root reads each peer's
 *              operand piece by piece into a buffer in its cache
 *              (comm->ref_mr) and reduces from there; at 2 ranks only the
 *              first GS_BOX_REF_ROOT_EIGHTHS / 8, and the other rank reads
 *              the root's operand for the rest, reduces it (rank order, the
 *              same bits) and writes the result into the root's.
 * Every split is computed the same way on every rank from the call and the
 * communicator alone.
 */
#include "coll/box.h"

#include "transport/tp.h"
#include "util/log.h"

#include <string.h>

/* 2 ranks: the root's part of a reduce by reference, in eighths. The other
 * rank also writes its part across (a copy the root's part does not have):
 * measured at 64 KiB, 5 / 8 evens the two. */
#define GS_BOX_REF_ROOT_EIGHTHS 5

/* Bytes of one rank's piece of the call. */
static size_t piece_bytes(const gs_coll_op *op)
{
    return (size_t)op->count * op->es;
}

bool gs_box_ref_possible(const gs_comm *comm, size_t piece)
{
    return comm->box && comm->size > 1 && piece >= GS_BOX_REF_BYTES &&
           (gs_tp_caps(comm->tp) & GS_TP_CAP_USER_MEM);
}

bool gs_box_ref_wanted(const gs_coll_op *op)
{
    gs_coll_kind k = op->kind;
    if (!op->box || op->parts || !gs_box_ref_possible(op->comm, piece_bytes(op)))
        return false;
    if (k == GS_COLL_ALLTOALL) /* in place, a peer would read blocks this rank is overwriting */
        return op->send != op->recv;
    if (k == GS_COLL_REDUCE) /* the same on every rank: the count decides */
        return piece_bytes(op) <= op->comm->box_ref_reduce_max;
    return k == GS_COLL_BROADCAST || k == GS_COLL_ALLGATHER || k == GS_COLL_GATHER || k == GS_COLL_SCATTER;
}

/* A 2-rank reduce splits its work (the header comment). */
static bool reduce_split(const gs_coll_op *op)
{
    return op->kind == GS_COLL_REDUCE && op->comm->size == 2;
}

/* Where a split reduce's root part ends, and a broadcast's pushed share:
 * whole cache lines (whole elements: es divides GS_COLL_LINE). */
static size_t lines(size_t bytes)
{
    return bytes / GS_COLL_LINE * GS_COLL_LINE;
}

static size_t reduce_root_part(const gs_coll_op *op)
{
    size_t all = piece_bytes(op);
    return reduce_split(op) ? lines(all / 8 * GS_BOX_REF_ROOT_EIGHTHS) : all;
}

size_t gs_box_ref_share(const gs_coll_op *op)
{
    return op->kind == GS_COLL_BROADCAST ? lines(piece_bytes(op) / (size_t)op->comm->size) : 0;
}

/* What a broadcast's root writes into each non-root: the share when its
 * own result is its input; out of place it copies its whole input to its
 * result already, as much as a non-root reads, and writes nothing. */
static size_t root_pushes(const gs_coll_op *op)
{
    return op->send == op->recv || !op->recv ? gs_box_ref_share(op) : 0;
}

void gs_box_ref_extents(const gs_coll_op *op, size_t *send_p, size_t *recv_p, unsigned *recv_access_p)
{
    size_t one = piece_bytes(op), all = one * (size_t)op->comm->size;
    bool root = op->comm->rank == op->root;
    *recv_access_p = GS_ACCESS_LOCAL_WRITE;
    switch (op->kind) {
    case GS_COLL_BROADCAST:
        *send_p = root ? one : 0, *recv_p = root ? 0 : one;
        if (gs_box_ref_share(op))
            *recv_access_p |= GS_ACCESS_REMOTE_WRITE;
        break;
    case GS_COLL_GATHER:
        *send_p = root ? 0 : one, *recv_p = root ? all : 0;
        *recv_access_p |= GS_ACCESS_REMOTE_WRITE;
        break;
    case GS_COLL_SCATTER: *send_p = root ? all : 0, *recv_p = root ? 0 : one; break;
    case GS_COLL_ALLGATHER: *send_p = one, *recv_p = all; break;
    case GS_COLL_REDUCE: /* operands are read into comm->ref_mr; a split's result written into the root's */
        *send_p = root && !reduce_split(op) ? 0 : one;
        *recv_p = root && reduce_split(op) ? one : 0;
        *recv_access_p |= GS_ACCESS_REMOTE_WRITE;
        break;
    default: *send_p = all, *recv_p = all; break; /* alltoall */
    }
}

/* ---- posting ----------------------------------------------------------------- */

/* Whether this rank's post names its result buffer for its peers to write. */
static bool posts_into(const gs_coll_op *op)
{
    bool root = op->comm->rank == op->root;
    switch (op->kind) {
    case GS_COLL_BROADCAST: return !root && gs_box_ref_share(op) > 0;
    case GS_COLL_GATHER: return root;
    case GS_COLL_REDUCE: return root && reduce_split(op);
    default: return false;
    }
}

uint8_t gs_box_ref_fill(gs_coll_op *op, const gs_prim *p, uint8_t *payload)
{
    /* the names go in the data column's post, empty ones included (a gather's root, a
     * broadcast's non-roots; a split reduce's root names its operand in an empty post) */
    bool first = op->col == 0 && piece_bytes(op) > 0;
    const uint8_t *data = p->bytes && p->local                          ? p->local
                          : first && reduce_split(op) && posts_into(op) ? op->send
                                                                        : NULL;
    bool into = first && posts_into(op);
    if (!data && !into)
        return 0;
    gs_coll_box_ref ref = {.offset = data ? (uint64_t)(data - op->send) : 0,
                           .stride = p->stride,
                           .pushed = op->kind == GS_COLL_BROADCAST && data ? root_pushes(op) : 0};
    if (data)
        gs_mr_pack(op->send_mr, &ref.region);
    if (into)
        gs_mr_pack(op->recv_mr, &ref.into);
    memcpy(payload, &ref, sizeof(ref));
    return (uint8_t)((data ? GS_COLL_HDR_REF : 0) | (into ? GS_COLL_HDR_INTO : 0));
}

/* ---- copying ----------------------------------------------------------------- */

static const gs_coll_box_ref *ref_of(const gs_coll_op *op, int q, gs_coll_box_ref *ref)
{
    memcpy(ref, gs_box_payload(gs_box_slot(op->comm->box, q, op->box_post)), sizeof(*ref));
    return ref;
}

static bool posted_into(const gs_coll_op *op, int q)
{
    return q != op->comm->rank && (gs_box_slot(op->comm->box, q, op->box_post)->hdr.flags & GS_COLL_HDR_INTO);
}

/* One copy between this rank's local (in lmr) and peer q's buffer that its
 * post names: a read from its input at offset at (from this rank's piece
 * when the post holds one per rank), or a write into its result at at. */
static gs_status copy_ref(gs_coll_op *op, int q, bool into, bool pieces, void *local, gs_mr *lmr, uint64_t at,
                          size_t len)
{
    gs_comm *c = op->comm;
    gs_coll_box_ref ref;
    gs_ep *ep = gs_tp_ep(c->tp, q);
    gs_status st;
    if (!len)
        return GS_OK;
    ref_of(op, q, &ref);
    st = into ? gs_ep_write(ep, local, lmr, len, &ref.into, at, 0, 0)
              : gs_ep_read(ep, local, lmr, len, &ref.region,
                           ref.offset + (pieces ? (uint64_t)c->rank * ref.stride : 0) + at, 0, 0);
    if (st != GS_OK)
        return gs_fail(GS_SUBSYS_COLL, st, "rank %d: %s %zu bytes %s rank %d's %s (by reference) failed: %s",
                       c->rank, into ? "writing" : "reading", len, into ? "into" : "of", q,
                       into ? "result" : "buffer", gs_last_error());
    return GS_OK;
}

gs_status gs_box_ref_read(gs_coll_op *op, const gs_prim *p, int q, uint8_t *dst, gs_mr *lmr, size_t at,
                          size_t len)
{
    return copy_ref(op, q, false, p->pieces, dst, lmr, at, len);
}

/* Writes len bytes from src (in lmr) at offset off of the result buffer
 * that peer q's post names. */
static gs_status write_into(gs_coll_op *op, int q, const uint8_t *src, gs_mr *lmr, uint64_t off, size_t len)
{
    return copy_ref(op, q, true, false, (void *)src, lmr, off, len);
}

gs_status gs_box_ref_take(gs_coll_op *op, const gs_prim *p, int q, uint8_t *dst)
{
    gs_comm *c = op->comm;
    gs_coll_box_ref ref;
    size_t skip = 0;
    if (op->kind == GS_COLL_GATHER) /* every non-root writes its own block into mine */
        return GS_OK;
    if (op->kind == GS_COLL_BROADCAST && posts_into(op)) { /* the first bytes, if the root wrote them */
        skip = (size_t)ref_of(op, q, &ref)->pushed;
        if (skip != 0 && skip != gs_box_ref_share(op))
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                           "rank %d: broadcast #%llu: rank %d's post says it wrote %zu bytes into this rank, "
                           "not 0 or %zu",
                           c->rank, (unsigned long long)op->seq, q, skip, gs_box_ref_share(op));
    }
    return gs_box_ref_read(op, p, q, dst + skip, op->recv_mr, skip, p->bytes - skip);
}

/* Operand q of the piece [at, at + len) of a reduce: mine from my input, a
 * peer's read by reference into buf (in comm->ref_mr). */
static gs_status operand(gs_coll_op *op, const uint8_t *mine, int q, size_t at, size_t len, uint8_t *buf,
                         const uint8_t **x_p)
{
    if (q == op->comm->rank) {
        *x_p = mine + at;
        return GS_OK;
    }
    *x_p = buf;
    return copy_ref(op, q, false, false, buf, op->comm->ref_mr, at, len);
}

/* The pieces [from, to) of a reduce, each peer's operand read into the
 * buffers of comm->ref_mr (x0 into the first, the others into the second)
 * while they are in this rank's cache, reduced in rank order as box.c's
 * reduce_all does, into out + at (or the third buffer where out is my
 * operand, in place at more than 2 ranks, or avg must still divide; the
 * first when the result is written into rank to's). */
static gs_status reduce_pieces(gs_coll_op *op, const uint8_t *mine, uint8_t *out, size_t from, size_t to,
                               int to_rank)
{
    gs_comm *c = op->comm;
    gs_status st = GS_OK;
    uint8_t *buf0 = gs_mr_addr(c->ref_mr), *buf = buf0 + GS_BOX_REF_READ_BYTES,
            *stage = buf + GS_BOX_REF_READ_BYTES;
    bool avg = op->redop == GS_AVG;
    bool staged = avg || (c->size > 2 && mine == out) || !out;
    for (size_t at = from; at < to && st == GS_OK; at += GS_BOX_REF_READ_BYTES) {
        size_t len = to - at < GS_BOX_REF_READ_BYTES ? to - at : GS_BOX_REF_READ_BYTES, n = len / op->es;
        /* a result to write across stays in the buffer x0 was in (or mine, when x0 is mine) */
        uint8_t *acc = !out ? buf0 : staged ? stage : out + at;
        const uint8_t *a, *b;
        if ((st = operand(op, mine, 0, at, len, buf0, &a)) != GS_OK ||
            (st = operand(op, mine, 1, at, len, buf, &b)) != GS_OK)
            break;
        gs_red_apply(op->dtype, op->redop, acc, a, b, n);
        for (int q = 2; q < c->size && st == GS_OK; q++)
            if ((st = operand(op, mine, q, at, len, buf, &b)) == GS_OK)
                gs_red_apply(op->dtype, op->redop, acc, acc, b, n);
        if (st != GS_OK)
            break;
        if (avg)
            gs_red_avg_finish(op->dtype, acc, n, c->size);
        if (!out)
            st = write_into(op, to_rank, acc, c->ref_mr, at, len);
        else if (staged)
            gs_coll_copy_out(op, out + at, acc, len);
    }
    return st;
}

gs_status gs_box_ref_reduce(gs_coll_op *op, const gs_prim *p)
{
    return reduce_pieces(op, p->local, p->out, 0, reduce_root_part(op), -1);
}

gs_status gs_box_ref_push(gs_coll_op *op, const gs_prim *p)
{
    gs_comm *c = op->comm;
    gs_status st = GS_OK;
    bool root = c->rank == op->root;
    if (!p->bytes)
        return GS_OK;
    switch (op->kind) {
    case GS_COLL_BROADCAST: /* the root: each non-root's first share */
        for (int q = 0; q < c->size && root && st == GS_OK; q++)
            if (posted_into(op, q))
                st = write_into(op, q, p->local, op->send_mr, 0, root_pushes(op));
        return st;
    case GS_COLL_GATHER: /* a non-root: its block into the root's result */
        return root || !posted_into(op, op->root)
                   ? GS_OK
                   : write_into(op, op->root, op->send, op->send_mr, (uint64_t)c->rank * p->stride, p->bytes);
    case GS_COLL_REDUCE: /* 2 ranks, the other rank: the part after the root's */
        if (root || !posted_into(op, op->root))
            return GS_OK;
        /* mine is my input (the prim of this step names none); the result goes across */
        return reduce_pieces(op, op->send, NULL, reduce_root_part(op), p->bytes, op->root);
    default: return GS_OK;
    }
}
