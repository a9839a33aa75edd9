/*
 * Allreduce by parts over the shared-memory boxes: the direct algorithm's
 * large allreduces when every rank shares one host (2 ranks: by halves,
 * from 1 MiB). Rank r owns part r of the vector
 * (ceil(count/n) elements; the last parts shorter or empty). Per column,
 * a chunk of every part:
 *
 *   step 0  post my chunks of the other ranks' parts, packed in rank order
 *   step 1  wait for every post; reduce my part's chunk, x0 op x1 op ...
 *           op x(n-1) in rank order (mine from my buffer, the others from
 *           their boxes), straight into my box's next slot
 *   step 2  post that result; store it in my result buffer
 *   step 3  wait for every result; copy them into my result buffer
 *
 * Each part is reduced by one rank and copied by the others, so every rank
 * ends with the same bits. A rank moves about 5 bytes of memory per vector
 * byte (the full direct reduces all n vectors: n + 2; the ring through the
 * transport about 8 at 4 ranks) and waits twice per column, where the ring
 * waits for 2(n-1) messages: with more ranks than cores every wait is a
 * trip through the scheduler.
 *
 * The reduction may fill the next slot before posting it: that slot held
 * my result of the previous column (or my last post of an earlier call),
 * which every peer read before making the post step 1 waited for.
 */
#include "coll/coll.h"

/* Elements [first, first + n) of part t's chunk in column col. */
static void piece(const gs_coll_op *op, int t, size_t col, size_t *first_p, size_t *n_p)
{
    size_t parts = (size_t)op->comm->size, len = (op->count + parts - 1) / parts;
    size_t base = (size_t)t * len, first, n;
    if (base > op->count)
        base = op->count;
    if (len > op->count - base)
        len = op->count - base;
    gs_coll_chunk(op, len, col, &first, &n);
    *first_p = base + first;
    *n_p = n;
}

/* Where the chunk for rank t sits in sender s's data post (s skips its own). */
static size_t packed_at(const gs_coll_op *op, int t, int s)
{
    return (size_t)(t < s ? t : t - 1) * op->col_elems * op->es;
}

/* The column and step a unit names (fill gives each post's unit to its reception). */
static size_t unit_col(const gs_coll_op *op, uint32_t unit)
{
    return unit / (uint32_t)op->nsteps;
}

static bool unit_is_data(const gs_coll_op *op, uint32_t unit)
{
    return unit % (uint32_t)op->nsteps == 0;
}

/* Bytes of sender s's post that the current reception (op->prim) expects. */
static size_t data_bytes(const gs_coll_op *op, int s)
{
    size_t total = 0, first, n;
    for (int t = 0; t < op->comm->size; t++) {
        if (t == s)
            continue;
        piece(op, t, unit_col(op, op->prim.recv_unit), &first, &n);
        total += n * op->es;
    }
    return total;
}

static size_t result_bytes(const gs_coll_op *op, int s)
{
    size_t first, n;
    piece(op, s, unit_col(op, op->prim.recv_unit), &first, &n);
    return n * op->es;
}

void gs_parts_start(gs_coll_op *op)
{
    size_t parts = (size_t)op->comm->size;
    /* a data post holds a chunk of every part but mine */
    gs_coll_layout_pieces(op, (op->count + parts - 1) / parts, parts - 1);
    op->nsteps = 4;
    if (parts == 2) {
        const gs_comm *c = op->comm;
        op->box_nt = c->box_stream == GS_BOX_STREAM_ALWAYS ||
                     (c->box_stream == GS_BOX_STREAM_AUTO && c->box_line_ns >= GS_BOX_FAR_NS);
        op->far_ns = 0;
    }
}

void gs_parts_fill(gs_coll_op *op, int step, gs_prim *p)
{
    *p = (gs_prim){.kind = step % 2 ? GS_PRIM_RECV_ALL : GS_PRIM_SEND_ALL, .root = -1, .out_slot = -1};
    p->finish = step == 1 && op->redop == GS_AVG;
    /* a reception checks the unit of the post it waits for */
    p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, step & ~1);
}

/* Step 0: my chunks of the other parts, packed; step 2: my part's result. */
gs_status gs_parts_post(gs_coll_op *op, gs_prim *p)
{
    gs_comm *c = op->comm;
    size_t col = unit_col(op, p->send_unit), first, n, bytes = 0;
    uint8_t *dst = gs_box_next_payload(c);
    if (unit_is_data(op, p->send_unit)) {
        for (int t = 0; t < c->size; t++) {
            if (t == c->rank)
                continue;
            piece(op, t, col, &first, &n);
            if (n && op->box_nt) /* the peer is far: it reads this from memory (GS_BOX_FAR_NS) */
                gs_red_copy_nt(dst + packed_at(op, t, c->rank), op->send + first * op->es, n * op->es);
            else if (n)
                memcpy(dst + packed_at(op, t, c->rank), op->send + first * op->es, n * op->es);
            bytes += n * op->es;
        }
        gs_box_publish(op, p->send_unit, bytes);
        return GS_OK;
    }
    piece(op, c->rank, col, &first, &n); /* step 1 left the result in dst */
    gs_box_publish(op, p->send_unit, n * op->es);
    if (n)
        gs_coll_copy_out(op, op->recv + first * op->es, dst, n * op->es);
    return GS_OK;
}

/* Rank q's chunk of my part in column col: mine in my buffer, the others' in their boxes. */
static const uint8_t *operand(const gs_coll_op *op, int q, size_t first)
{
    int r = op->comm->rank;
    return q == r ? op->send + first * op->es : gs_box_peer_payload(op, q) + packed_at(op, r, q);
}

/* Step 1: my part's chunk, reduced in rank order into my next slot. */
static void reduce_mine(gs_coll_op *op, const gs_prim *p, size_t col)
{
    gs_comm *c = op->comm;
    size_t first, n;
    uint8_t *acc = gs_box_next_payload(c);
    piece(op, c->rank, col, &first, &n);
    if (!n)
        return;
    gs_red_apply(op->dtype, op->redop, acc, operand(op, 0, first), operand(op, 1, first), n);
    for (int q = 2; q < c->size; q++)
        gs_red_apply(op->dtype, op->redop, acc, acc, operand(op, q, first), n);
    if (p->finish)
        gs_red_avg_finish(op->dtype, acc, n, c->size);
}

/* Step 3: every other part's result into my result buffer. */
static void store_theirs(gs_coll_op *op, size_t col)
{
    gs_comm *c = op->comm;
    size_t first, n;
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank)
            continue;
        piece(op, q, col, &first, &n);
        if (n)
            gs_coll_copy_out(op, op->recv + first * op->es, gs_box_peer_payload(op, q), n * op->es);
    }
}

gs_status gs_parts_gather(gs_coll_op *op, gs_prim *p)
{
    bool data = unit_is_data(op, p->recv_unit);
    gs_status st = gs_box_arrived(op, p->recv_unit, data ? data_bytes : result_bytes);
    if (st != GS_OK)
        return st;
    if (data)
        reduce_mine(op, p, unit_col(op, p->recv_unit));
    else
        store_theirs(op, unit_col(op, p->recv_unit));
    op->comm->progress_count++;
    return GS_OK;
}
