/*
 * Channels: the per-peer message streams every algorithm uses. Message m
 * from a peer lands in slot m mod GS_COLL_SLOTS of this rank's block for
 * it; messages are consumed in order and their slots released in order
 * (a slot being forwarded from stays held until the forward completes).
 * Credits (released counts) travel in the immediates of data messages going
 * the other way, or in a credit write when none is going.
 */
#include "coll/coll.h"

#include "transport/tp.h"

#include "util/log.h"

#include <stdio.h>
#include <string.h>

uint8_t *gs_chan_head(gs_comm *comm, gs_chan *ch)
{
    return ch->slots + (size_t)(ch->rx_next % GS_COLL_SLOTS) * comm->slot_stride;
}

/* Releases slots in order up to the first one still held; the credit goes
 * back with the next message to the peer, or from gs_chan_flush_credits. */
static void advance_released(gs_chan *ch)
{
    while (ch->rx_released < ch->rx_next && !ch->rx_held[ch->rx_released % GS_COLL_SLOTS])
        ch->rx_released++;
}

void gs_chan_flush_credits(gs_comm *comm)
{
    for (int p = 0; p < comm->size; p++) {
        gs_status st = p == comm->rank ? GS_OK : gs_chan_credit(comm, &comm->chans[p]);
        if (st != GS_OK) {
            gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(), true);
            return;
        }
    }
}

void gs_chan_hold_until_proof(gs_chan *rx, uint64_t seq, uint32_t unit)
{
    unsigned slot = (unsigned)(rx->rx_next % GS_COLL_SLOTS);
    rx->held_call[slot] = seq;
    rx->held_unit[slot] = unit;
}

/* A message of (seq, unit) arrived from ch's peer: slots held for
 * unsignaled forwards of earlier steps to it are free. */
static void release_proven(gs_chan *ch, uint64_t seq, uint32_t unit)
{
    for (unsigned s = 0; s < GS_COLL_SLOTS; s++) {
        uint64_t call = ch->held_call[s];
        if (call != 0 && (seq > call || (seq == call && unit > ch->held_unit[s]))) {
            ch->held_call[s] = 0;
            ch->rx_held[s] = false;
        }
    }
    advance_released(ch);
}

void gs_chan_consume(gs_comm *comm, gs_chan *ch, bool hold)
{
    ch->rx_held[ch->rx_next % GS_COLL_SLOTS] = hold;
    ch->rx_next++;
    comm->progress_count++;
    advance_released(ch);
}

void gs_chan_release(gs_chan *ch, unsigned slot)
{
    ch->rx_held[slot % GS_COLL_SLOTS] = false;
    advance_released(ch);
}

/* A post of bytes to ch's peer failed (from NULL: a credit return): the
 * transport's sentence of a lost peer passes up as it is; any other error
 * gets what was posted in front. */
static gs_status post_failed(gs_comm *comm, const gs_chan *ch, gs_status st, size_t bytes, const char *from)
{
    int writer;
    if (st == GS_ERR_PEER_LOST)
        return st;
    if (!from)
        return gs_fail(GS_SUBSYS_COLL, st, "rank %d: returning credits to rank %d failed: %s", comm->rank,
                       ch->peer, gs_error_skip_rank(gs_last_error(), &writer));
    return gs_fail(GS_SUBSYS_COLL, st, "rank %d: posting %zu bytes%s to rank %d failed: %s", comm->rank,
                   bytes, from, ch->peer, gs_error_skip_rank(gs_last_error(), &writer));
}

gs_status gs_chan_post(gs_comm *comm, gs_chan *ch, uint8_t *slot, gs_mr *lmr, size_t bytes,
                       const gs_coll_op *op, uint32_t unit, uint64_t wr_id, bool signaled)
{
    uint64_t off = ch->remote_off + (ch->tx_sent % GS_COLL_SLOTS) * comm->slot_stride;
    uint32_t imm = GS_COLL_IMM(GS_COLL_IMM_DATA, unit, ch->rx_released);
    gs_desc_fill(op, gs_coll_hdr_of(slot), unit, bytes);
    gs_desc_fill_peer(op, gs_coll_hdr_of(slot), ch->peer);
    gs_status st = gs_ep_write_imm(gs_tp_ep(comm->tp, ch->peer), slot, lmr, GS_COLL_HDR_BYTES + bytes,
                                   &comm->peer_inbox[ch->peer], off, imm, wr_id,
                                   (signaled ? GS_OP_SIGNALED : 0) | (op->zcopy ? GS_OP_ZCOPY : 0));
    if (st == GS_ERR_AGAIN)
        return st;
    if (st != GS_OK)
        return post_failed(comm, ch, st, bytes, "");
    ch->tx_sent++;
    ch->rx_returned = ch->rx_released;
    return GS_OK;
}

gs_status gs_chan_post_apart(gs_comm *comm, gs_chan *ch, uint8_t *hdr_slot, gs_mr *hdr_mr,
                             const void *payload, gs_mr *payload_mr, size_t bytes, const gs_coll_op *op,
                             uint32_t unit, uint64_t wr_id, bool signaled)
{
    uint64_t off = ch->remote_off + (ch->tx_sent % GS_COLL_SLOTS) * comm->slot_stride;
    uint32_t imm = GS_COLL_IMM(GS_COLL_IMM_DATA, unit, ch->rx_released);
    gs_ep *ep = gs_tp_ep(comm->tp, ch->peer);
    gs_coll_hdr *h = gs_coll_hdr_of(hdr_slot);
    gs_status st;
    gs_desc_fill(op, h, unit, bytes);
    gs_desc_fill_peer(op, h, ch->peer);
    h->flags = GS_COLL_HDR_APART;
    /* the payload first; if the header cannot follow now, both go again
     * later (the same bytes to the same place) */
    st = gs_ep_write(ep, payload, payload_mr, bytes, &comm->peer_inbox[ch->peer], off + GS_COLL_HDR_BYTES, 0,
                     op->zcopy ? GS_OP_ZCOPY : 0);
    if (st == GS_OK)
        st = gs_ep_write_imm(ep, h, hdr_mr, GS_COLL_HDR_BYTES, &comm->peer_inbox[ch->peer], off, imm, wr_id,
                             signaled ? GS_OP_SIGNALED : 0);
    if (st == GS_ERR_AGAIN)
        return st;
    if (st != GS_OK)
        return post_failed(comm, ch, st, bytes, " from user memory");
    ch->tx_sent++;
    ch->rx_returned = ch->rx_released;
    return GS_OK;
}

gs_status gs_chan_credit(gs_comm *comm, gs_chan *ch)
{
    /* lazily: the peer still has at least half its slots */
    if (ch->credit_inflight || ch->rx_released - ch->rx_returned < GS_COLL_SLOTS / 2)
        return GS_OK;
    *ch->credit_src = ch->rx_released;
    gs_status st = gs_ep_write_imm(
        gs_tp_ep(comm->tp, ch->peer), ch->credit_src, comm->outbox, sizeof(uint64_t),
        &comm->peer_inbox[ch->peer], ch->remote_off + GS_COLL_SLOTS * comm->slot_stride,
        GS_COLL_IMM(GS_COLL_IMM_CREDIT, 0, 0), GS_WR_ID(GS_WR_CREDIT, ch->peer, 0), GS_OP_SIGNALED);
    if (st == GS_ERR_AGAIN)
        return GS_OK; /* sent again after the next completion */
    if (st != GS_OK)
        return post_failed(comm, ch, st, 0, NULL);
    ch->credit_inflight = true;
    ch->rx_returned = ch->rx_released;
    return GS_OK;
}

/* A credit value that arrived as the low 16 bits of an immediate. */
static void take_ack(gs_chan *ch, uint32_t low)
{
    uint64_t delta = (low - (uint32_t)ch->tx_acked) & 0xffffu;
    if (ch->tx_acked + delta <= ch->tx_sent)
        ch->tx_acked += delta;
}

/* Checks a message as it arrives: one for the running call must describe
 * the same call; one for a call already finished means the peer sent more
 * than this rank took. Messages for later calls wait for their call. */
static gs_status check_arrival(gs_comm *comm, gs_chan *ch, const gs_coll_hdr *h)
{
    const gs_coll_op *op = comm->head ? &comm->head->op : NULL;
    if (h->version != GS_COLL_PROTO_VERSION || h->sender != (uint32_t)ch->peer)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                       "rank %d: malformed collective message from rank %d (version %u, sender %u)",
                       comm->rank, ch->peer, h->version, h->sender);
    if (op && h->seq == op->seq && !gs_desc_same(op, h))
        return gs_desc_mismatch(comm, op, h, "");
    if (h->seq <= comm->seq_done) {
        char theirs[160];
        gs_desc_format_hdr(h, theirs, sizeof(theirs));
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_MISMATCH,
                       "mismatched collective calls: rank %d sent data for %s after rank %d had finished "
                       "that call: the ranks called different collectives, counts or algorithms",
                       ch->peer, theirs, comm->rank);
    }
    return GS_OK;
}

static gs_status arrived(gs_comm *comm, const gs_wc *wc)
{
    gs_chan *ch = &comm->chans[wc->peer];
    uint32_t kind = GS_COLL_IMM_KIND(wc->imm);
    if (kind == GS_COLL_IMM_CREDIT) {
        uint64_t acked = *ch->credit_in;
        if (acked > ch->tx_acked && acked <= ch->tx_sent)
            ch->tx_acked = acked;
        return GS_OK;
    }
    if (kind == GS_COLL_IMM_ABORT) {
        const gs_coll_abort *a = ch->abort_in;
        size_t len = a->len < sizeof(a->text) ? a->len : sizeof(a->text) - 1;
        char text[sizeof(a->text)];
        memcpy(text, a->text, len);
        text[len] = '\0';
        gs_engine_fail_told(comm, a->status < 0 ? (gs_status)a->status : GS_ERR_PROTOCOL, a->seq, wc->peer,
                            text);
        return GS_OK; /* recorded: calls before a->seq go on */
    }
    if (kind != GS_COLL_IMM_DATA || ch->rx_arrived - ch->rx_next >= GS_COLL_SLOTS)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                       "rank %d: unexpected notification 0x%08x from rank %d (%llu messages queued)",
                       comm->rank, wc->imm, wc->peer, (unsigned long long)(ch->rx_arrived - ch->rx_next));
    uint8_t *slot = ch->slots + (size_t)(ch->rx_arrived % GS_COLL_SLOTS) * comm->slot_stride;
    const gs_coll_hdr *h = gs_coll_hdr_of(slot);
    ch->rx_arrived++;
    comm->progress_count++;
    take_ack(ch, GS_COLL_IMM_ACK(wc->imm));
    if (h->seq > ch->rx_seq_max || (h->seq == ch->rx_seq_max && h->unit > ch->rx_unit_max)) {
        ch->rx_seq_max = h->seq;
        ch->rx_unit_max = h->unit;
        release_proven(ch, h->seq, h->unit);
    }
    /* a payload written apart came before its header: the notification
     * covers the header alone */
    uint32_t len = (h->flags & GS_COLL_HDR_APART) ? GS_COLL_HDR_BYTES : GS_COLL_HDR_BYTES + h->bytes;
    if (GS_COLL_IMM_UNIT(wc->imm) != (h->unit & 0x3fffu) || wc->len != len || (h->flags & ~GS_COLL_HDR_FLAGS))
        return gs_fail(
            GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
            "rank %d: message from rank %d announces step 0x%x and %u bytes, its header step 0x%x, "
            "%u bytes and flags 0x%x",
            comm->rank, wc->peer, GS_COLL_IMM_UNIT(wc->imm), wc->len, h->unit, (unsigned)len,
            (unsigned)h->flags);
    return check_arrival(comm, ch, h);
}

/* A write of ours completed: its source may be reused. */
static gs_status written(gs_comm *comm, const gs_wc *wc)
{
    unsigned type = (unsigned)(wc->wr_id >> 56);
    unsigned a = (unsigned)(wc->wr_id >> 16) & 0xffffffffu, b = (unsigned)(wc->wr_id & 0xffff);
    switch (type) {
    case GS_WR_OUTBOX:
        if (a < (unsigned)comm->out_nslots && comm->out_pending[a] > 0)
            comm->out_pending[a]--;
        return GS_OK;
    case GS_WR_FORWARD:
        if ((int)a < comm->size)
            gs_chan_release(&comm->chans[a], b);
        return GS_OK;
    case GS_WR_CREDIT:
        if ((int)a < comm->size) {
            comm->chans[a].credit_inflight = false;
            return gs_chan_credit(comm, &comm->chans[a]);
        }
        return GS_OK;
    case GS_WR_ABORT: return GS_OK;
    default:
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL, "rank %d: completion with unknown id 0x%llx",
                       comm->rank, (unsigned long long)wc->wr_id);
    }
}

/* A completion with an error: the endpoint's own account of why (the
 * transport logged it) becomes the detail; its status, a lost peer's
 * rather than the flush that followed, the call's. */
static gs_status endpoint_failed(gs_comm *comm, const gs_wc *wc)
{
    char why[GS_COLL_CTRL_BYTES];
    gs_status st = gs_tp_ep_error(gs_tp_ep(comm->tp, wc->peer), why, sizeof(why));
    if (st == GS_OK)
        return gs_fail(GS_SUBSYS_COLL, wc->status, "rank %d: an operation with rank %d failed: %s",
                       comm->rank, wc->peer, gs_strerror(wc->status));
    if (st == GS_ERR_REMOTE_ACCESS) {
        /* every write of a communicator lands inside the peer's inbox, which
         * stays registered as long as its communicator lives: a refusal
         * means the peer is gone (rxe refuses the writes to a killed
         * process this way before its queue pair goes) */
        gs_log_info(COLL, "rank %d: rank %d refused a write into its inbox: %s", comm->rank, wc->peer, why);
        gs_error_peer_lost_text(why, sizeof(why), comm->rank, wc->peer,
                                "it refused a write into its inbox: its communicator or its process is gone");
        st = GS_ERR_PEER_LOST;
    }
    gs_error_restore(why);
    return st;
}

gs_status gs_chan_complete(gs_comm *comm, const gs_wc *wc)
{
    if (wc->status != GS_OK) {
        if (wc->opcode == GS_WC_WRITE_IMM && (wc->wr_id >> 56) == GS_WR_ABORT)
            return GS_OK; /* telling a peer about a failure failed: nothing more to do */
        return endpoint_failed(comm, wc);
    }
    if (wc->peer < 0 || wc->peer >= comm->size || wc->peer == comm->rank)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL, "rank %d: completion from unknown peer %d",
                       comm->rank, wc->peer);
    switch (wc->opcode) {
    case GS_WC_RECV_IMM: return arrived(comm, wc);
    case GS_WC_WRITE_IMM: return written(comm, wc);
    case GS_WC_SEND:
    case GS_WC_RECV:
    case GS_WC_READ: return gs_p2p_complete(comm, wc);
    default:
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                       "rank %d: unexpected completion (opcode %d) on the communicator's transport: is it "
                       "used by something else?",
                       comm->rank, (int)wc->opcode);
    }
}

gs_status gs_chan_check_queued(gs_comm *comm, const gs_coll_op *op)
{
    for (int p = 0; p < comm->size; p++) {
        gs_chan *ch = &comm->chans[p];
        for (uint64_t m = ch->rx_next; p != comm->rank && m < ch->rx_arrived; m++) {
            const gs_coll_hdr *h =
                gs_coll_hdr_of(ch->slots + (size_t)(m % GS_COLL_SLOTS) * comm->slot_stride);
            if (h->seq == op->seq && !gs_desc_same(op, h))
                return gs_desc_mismatch(comm, op, h, "");
        }
    }
    return GS_OK;
}
