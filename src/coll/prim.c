/*
 * The steps algorithms are made of. A step runs when everything it needs is
 * there (its message arrived, its peer has a free slot, an outbox slot is
 * free); otherwise it returns GS_INPROGRESS having done nothing it would
 * repeat, and the engine runs it again after the next completions.
 *
 *   PAIR      send local to one peer, and/or receive from one peer: the
 *             result (what arrived, or what arrived op local) goes to out
 *             and/or is forwarded from the slot it arrived in; split: what
 *             it sends is a block of its own (send_data), not local; with
 *             no peer and `with`: out = local op with, here alone
 *   SEND_ALL  local (or local + q * stride) to every peer q
 *   RECV_ALL  one message from every peer, combined in rank order
 */
#include "coll/coll.h"

#include "util/log.h"

#include <stdio.h>
#include <string.h>

/* What every step starts from: no root, no outbox slot in use. */
static gs_prim prim(gs_prim_kind kind, gs_prim_mode mode, const void *local, void *out, size_t bytes)
{
    return (gs_prim){
        .kind = kind, .mode = mode, .local = local, .out = out, .bytes = bytes, .root = -1, .out_slot = -1};
}

gs_prim gs_prim_send_all(const void *local, size_t bytes, size_t stride)
{
    gs_prim p = prim(GS_PRIM_SEND_ALL, GS_PRIM_COPY, local, NULL, bytes);
    p.stride = stride;
    return p;
}

gs_prim gs_prim_recv_all(gs_prim_mode mode, const void *local, void *out, size_t bytes, int root)
{
    gs_prim p = prim(GS_PRIM_RECV_ALL, mode, local, out, bytes);
    p.root = root;
    return p;
}

gs_prim gs_prim_pair(int send_to, int recv_from, gs_prim_mode mode, const void *local, void *out,
                     size_t bytes)
{
    gs_prim p = prim(GS_PRIM_PAIR, mode, local, out, bytes);
    p.send_to = send_to;
    p.recv_from = recv_from;
    return p;
}

/* Copies src into the next outbox slot and posts it to tx; from_user: posts
 * src straight from the caller's input, the header alone in the slot. */
static gs_status send_copy(gs_coll_op *op, gs_chan *tx, const uint8_t *src, size_t bytes, uint32_t unit,
                           bool from_user)
{
    gs_comm *c = op->comm;
    int i = c->out_next;
    bool sig = !gs_coll_unsignaled(op);
    uint64_t wr_id = GS_WR_ID(GS_WR_OUTBOX, i, 0);
    gs_status st;
    if (!gs_chan_has_credit(tx) || gs_coll_outbox_busy(c, i))
        return GS_INPROGRESS;
    uint8_t *slot = gs_coll_outbox_slot(c, i);
    if (from_user) {
        st = gs_chan_post_apart(c, tx, slot, c->outbox, src, op->send_mr, bytes, op, unit, wr_id, sig);
    } else {
        if (bytes)
            memcpy(gs_coll_payload(slot), src, bytes);
        st = gs_chan_post(c, tx, slot, c->outbox, bytes, op, unit, wr_id, sig);
    }
    if (st == GS_ERR_AGAIN)
        return GS_INPROGRESS;
    if (st != GS_OK)
        return st;
    if (sig)
        c->out_pending[i]++;
    else
        c->out_call[i] = op->seq, c->out_unit[i] = unit;
    c->out_next = (i + 1) % c->out_nslots;
    return GS_OK;
}

/* The result of a PAIR step from the payload that arrived. */
static void combine(gs_coll_op *op, const gs_prim *p, uint8_t *data, bool forward)
{
    uint8_t *result = data;
    size_t n = p->bytes / op->es;
    if (p->mode == GS_PRIM_REDUCE) {
        const void *a = p->recv_first ? (const void *)data : p->local;
        const void *b = p->recv_first ? p->local : (const void *)data;
        if (p->from_user) { /* into out, cached (not streamed): it is sent from there next */
            gs_red_apply(op->dtype, op->redop, p->out, a, b, n);
            result = p->out;
        } else if (forward || !p->out || p->finish) { /* in the slot: it goes on, or is finished first */
            gs_red_apply(op->dtype, op->redop, data, a, b, n);
        } else {
            gs_coll_reduce_out(op, p->out, a, b, n);
            result = p->out;
        }
    }
    if (p->finish)
        gs_red_avg_finish(op->dtype, result, n, op->comm->size);
    if (p->out && p->out != result && p->bytes)
        gs_coll_copy_out(op, p->out, result, p->bytes);
}

static gs_status run_pair(gs_coll_op *op, gs_prim *p)
{
    gs_comm *c = op->comm;
    gs_chan *tx = p->send_to >= 0 ? &c->chans[p->send_to] : NULL;
    gs_chan *rx = p->recv_from >= 0 ? &c->chans[p->recv_from] : NULL;
    gs_status st;

    /* 1. this rank's own data leaves first: the result may overwrite it */
    if (tx && p->send_local && !p->sent) {
        st = send_copy(op, tx, p->split ? p->send_data : p->local, p->split ? p->send_bytes : p->bytes,
                       p->send_unit, p->from_user);
        if (st != GS_OK)
            return st;
        p->sent = true;
    }
    if (!rx && p->with) { /* a step of this rank alone: out = local op with */
        if (!p->bytes)
            return GS_OK;
        gs_red_apply(op->dtype, op->redop, p->out, p->local, p->with, p->bytes / op->es);
        if (p->finish)
            gs_red_avg_finish(op->dtype, p->out, p->bytes / op->es, c->size);
        return GS_OK;
    }
    if (!rx) {
        if (p->out && p->local && p->out != p->local && p->bytes)
            gs_coll_copy_out(op, p->out, p->local, p->bytes);
        if (p->mode == GS_PRIM_REDUCE && op->dtype == GS_BOOL && p->out) /* one rank's bools: 0 or 1 */
            gs_red_apply(GS_BOOL, GS_BOR, p->out, p->out, p->out, p->bytes);
        return GS_OK;
    }
    /* 2. the message, and room at the next peer if the result goes on */
    bool forward = tx && !p->send_local;
    if (!gs_chan_has_msg(rx) || (forward && !gs_chan_has_credit(tx)))
        return GS_INPROGRESS;
    uint8_t *slot = gs_chan_head(c, rx);
    if (!p->combined) {
        st = gs_desc_check(c, op, gs_coll_hdr_of(slot), p->recv_from, p->recv_unit, p->bytes);
        if (st != GS_OK)
            return st;
        combine(op, p, gs_coll_payload(slot), forward && !p->from_user); /* from_user: into out */
        p->combined = true;
    }
    if (!forward) {
        gs_chan_consume(c, rx, false);
        return GS_OK;
    }
    /* 3. forward from the slot it arrived in, held until the write is done
     * (signaled) or the peer's next step proves it arrived (unsignaled) */
    unsigned held = (unsigned)(rx->rx_next % GS_COLL_SLOTS);
    bool sig = !gs_coll_unsignaled(op);
    uint64_t wr_id = GS_WR_ID(GS_WR_FORWARD, rx->peer, held);
    if (p->from_user) /* the result from out, the header from the slot */
        st = gs_chan_post_apart(c, tx, slot, c->inbox, p->out, op->recv_mr, p->bytes, op, p->send_unit, wr_id,
                                sig);
    else
        st = gs_chan_post(c, tx, slot, c->inbox, p->bytes, op, p->send_unit, wr_id, sig);
    if (st == GS_ERR_AGAIN)
        return GS_INPROGRESS;
    if (st != GS_OK)
        return st;
    if (!sig)
        gs_chan_hold_until_proof(rx, op->seq, p->send_unit);
    gs_chan_consume(c, rx, true);
    return GS_OK;
}

static gs_status run_send_all(gs_coll_op *op, gs_prim *p)
{
    gs_comm *c = op->comm;
    for (; p->next_peer < c->size - 1; p->next_peer++) {
        int q = (c->rank + 1 + p->next_peer) % c->size;
        gs_chan *tx = &c->chans[q];
        gs_status st;
        if (p->stride) {
            st = send_copy(op, tx, p->local + (size_t)q * p->stride, p->bytes, p->send_unit, false);
            if (st != GS_OK)
                return st;
            continue;
        }
        /* the same data to everyone: one copy into the outbox, one write per peer */
        if (p->out_slot < 0) {
            if (gs_coll_outbox_busy(c, c->out_next))
                return GS_INPROGRESS;
            p->out_slot = gs_coll_outbox_take(c);
            op->last_out_slot = p->out_slot;
            if (p->bytes)
                memcpy(gs_coll_payload(gs_coll_outbox_slot(c, p->out_slot)), p->local, p->bytes);
        }
        if (!gs_chan_has_credit(tx))
            return GS_INPROGRESS;
        bool sig = !gs_coll_unsignaled(op);
        st = gs_chan_post(c, tx, gs_coll_outbox_slot(c, p->out_slot), c->outbox, p->bytes, op, p->send_unit,
                          GS_WR_ID(GS_WR_OUTBOX, p->out_slot, 0), sig);
        if (st == GS_ERR_AGAIN)
            return GS_INPROGRESS;
        if (st != GS_OK)
            return st;
        if (sig)
            c->out_pending[p->out_slot]++;
        else
            c->out_call[p->out_slot] = op->seq, c->out_unit[p->out_slot] = p->send_unit;
    }
    if (p->out && p->local && p->out != p->local && p->bytes)
        gs_coll_copy_out(op, p->out, p->local, p->bytes);
    return GS_OK;
}

/* Operand q of a RECV_ALL reduce: this rank's data or peer q's payload. */
static const uint8_t *operand(gs_coll_op *op, const gs_prim *p, int q)
{
    gs_comm *c = op->comm;
    if (q != c->rank)
        return gs_coll_payload(gs_chan_head(c, &c->chans[q]));
    if (p->local)
        return p->local;
    return gs_coll_payload(gs_coll_outbox_slot(c, op->last_out_slot));
}

/* out = x_0 op x_1 op ... op x_{n-1}, left to right: every rank computes the
 * same bits. The partial result lives in a peer's slot, so out (which may be
 * this rank's own input) is written only by the last step. */
static void reduce_all(gs_coll_op *op, const gs_prim *p)
{
    gs_comm *c = op->comm;
    size_t n = p->bytes / op->es;
    int last = c->size - 1;
    uint8_t *acc = c->size == 2 ? NULL : gs_coll_payload(gs_chan_head(c, &c->chans[c->rank == 0 ? 1 : 0]));
    if (acc) {
        gs_red_apply(op->dtype, op->redop, acc, operand(op, p, 0), operand(op, p, 1), n);
        for (int q = 2; q < last; q++)
            gs_red_apply(op->dtype, op->redop, acc, acc, operand(op, p, q), n);
    }
    if (p->finish) { /* the division needs the sum in cache: finish in the slot, then store */
        if (!acc)
            acc = c->scratch;
        gs_red_apply(op->dtype, op->redop, acc, acc == c->scratch ? operand(op, p, 0) : acc,
                     operand(op, p, last), n);
        gs_red_avg_finish(op->dtype, acc, n, c->size);
        gs_coll_copy_out(op, p->out, acc, p->bytes);
        return;
    }
    gs_coll_reduce_out(op, p->out, acc ? acc : operand(op, p, 0), operand(op, p, last), n);
}

static gs_status run_recv_all(gs_coll_op *op, gs_prim *p)
{
    gs_comm *c = op->comm;
    gs_status st;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && !gs_chan_has_msg(&c->chans[q]))
            return GS_INPROGRESS;
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank)
            continue;
        st = gs_desc_check(c, op, gs_coll_hdr_of(gs_chan_head(c, &c->chans[q])), q, p->recv_unit,
                           gs_prim_peer_bytes(p, q));
        if (st != GS_OK)
            return st;
    }
    if (p->mode == GS_PRIM_REDUCE) {
        reduce_all(op, p);
    } else if (p->mode == GS_PRIM_GATHER && p->out && p->bytes) {
        for (int q = 0; q < c->size; q++)
            if (q != c->rank || p->out + (size_t)q * p->stride != p->local)
                gs_coll_copy_out(op, p->out + (size_t)q * p->stride, operand(op, p, q), p->bytes);
    } else if (p->mode == GS_PRIM_BCAST && p->out && p->bytes) {
        const uint8_t *src = operand(op, p, p->root);
        if (src != p->out)
            gs_coll_copy_out(op, p->out, src, p->bytes);
    }
    for (int q = 0; q < c->size; q++)
        if (q != c->rank)
            gs_chan_consume(c, &c->chans[q], false);
    return GS_OK;
}

gs_status gs_prim_run(gs_coll_op *op, gs_prim *prim)
{
    switch (prim->kind) {
    case GS_PRIM_PAIR: return run_pair(op, prim);
    case GS_PRIM_SEND_ALL:
        return op->parts ? gs_parts_post(op, prim) : op->box ? gs_box_post(op, prim) : run_send_all(op, prim);
    case GS_PRIM_RECV_ALL:
        return op->parts ? gs_parts_gather(op, prim)
               : op->box ? gs_box_gather(op, prim)
                         : run_recv_all(op, prim);
    }
    return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL, "unknown step kind %d", (int)prim->kind);
}

void gs_prim_describe_wait(const gs_coll_op *op, const gs_prim *p, char *buf, size_t cap)
{
    const gs_comm *c = op->comm;
    size_t used = 0;
    buf[0] = '\0';
    if (op->box && p->kind == GS_PRIM_RECV_ALL) {
        gs_box_describe_wait(op, buf, cap);
        return;
    }
    if (p->kind == GS_PRIM_PAIR) {
        if (p->recv_from >= 0 && !gs_chan_has_msg(&c->chans[p->recv_from]))
            used += (size_t)snprintf(buf + used, cap - used, "waiting for step 0x%x from rank %d",
                                     p->recv_unit, p->recv_from);
        else if (p->send_to >= 0)
            snprintf(buf + used, cap - used, "waiting for rank %d to free a slot (step 0x%x)", p->send_to,
                     p->send_unit);
        return;
    }
    used += (size_t)snprintf(buf, cap, "waiting for step 0x%x %s ranks",
                             p->kind == GS_PRIM_RECV_ALL ? p->recv_unit : p->send_unit,
                             p->kind == GS_PRIM_RECV_ALL ? "from" : "to free slots at");
    for (int q = 0; q < c->size && used + 8 < cap; q++) {
        bool missing = q != c->rank && (p->kind == GS_PRIM_RECV_ALL ? !gs_chan_has_msg(&c->chans[q])
                                                                    : !gs_chan_has_credit(&c->chans[q]));
        if (missing)
            used += (size_t)snprintf(buf + used, cap - used, " %d", q);
    }
}
