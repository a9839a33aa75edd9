/* What the target does with each checked frame: lands WRITEs and SENDs
 * (after the key, bounds and permission check), serves READs and atomics,
 * takes replies to our own requests, and refuses (NAK, then drop) what it
 * may not do. Callers hold tp->lock. */
#include "transport/tcp/tcp.h"

#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gs_tcp_refuse(gs_tcp_ep *ep, const gs_tcp_hdr *hdr, gs_status status, const char *why)
{
    gs_tcp_hdr nak = {.version = GS_TCP_PROTO_VERSION,
                      .op = GS_TCP_OP_NAK,
                      .status = (uint8_t)-status,
                      .seq = ep->rx_seq}; /* the number the refused request should have had */
    gs_tcp_tx_drop(ep, false);
    if (ep->tx_count == 0 && gs_tcp_op_is_request(hdr->op) && gs_tcp_tx_push(ep, &nak, NULL, false))
        gs_tcp_tx_flush(ep);
    gs_tcp_ep_fail(
        ep, status,
        "rank %d: dropping the connection from rank %d: its %s (key %#llx, offset %llu, length %llu) "
        "was refused: %s",
        ep->base.tp->rank, ep->base.peer, gs_tcp_op_name(hdr->op), (unsigned long long)hdr->key,
        (unsigned long long)hdr->off,
        (unsigned long long)(hdr->op == GS_TCP_OP_READ_REQ ? hdr->arg0 : hdr->len), why);
}

/* ------------------------------------------------------------------------ */
/* Serving requests                                                          */
/* ------------------------------------------------------------------------ */

/* A request is served: count it; ack it soon if the initiator waits. */
static void served(gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    ep->rx_seq++;
    if (hdr->flags & GS_TCP_F_ACK_REQ)
        ep->ack_owed = true;
}

/* Returns 1 when the frame was taken, 0 to stall (retry later), -1 when the
 * endpoint failed. */
static int serve_write(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    const char *why;
    gs_tcp_mr *mr = gs_tcp_mr_find(tp, hdr->key);
    if (gs_tcp_mr_check(mr, hdr->off, hdr->len, GS_ACCESS_REMOTE_WRITE, &why) != GS_OK) {
        gs_tcp_refuse(ep, hdr, GS_ERR_REMOTE_ACCESS, why);
        return -1;
    }
    if (hdr->op == GS_TCP_OP_WRITE_IMM) {
        if (gs_tcp_cq_full(tp))
            return 0;
        tp->cq_reserved++;
        ep->rx.reserved = true;
    }
    ep->rx.dst = (uint8_t *)mr->base.addr + hdr->off;
    ep->rx.left = hdr->len;
    return 1;
}

static int serve_read(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    const char *why;
    gs_tcp_mr *mr = gs_tcp_mr_find(tp, hdr->key);
    gs_tcp_hdr resp = {
        .version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_READ_RESP, .len = hdr->arg0, .seq = hdr->seq};
    gs_tcp_tx *t;
    if (gs_tcp_mr_check(mr, hdr->off, hdr->arg0, GS_ACCESS_REMOTE_READ, &why) != GS_OK) {
        gs_tcp_refuse(ep, hdr, GS_ERR_REMOTE_ACCESS, why);
        return -1;
    }
    t = gs_tcp_tx_push(ep, &resp, (const uint8_t *)mr->base.addr + hdr->off, false);
    if (!t)
        return 0;
    t->ref = mr;
    mr->tx_refs++;
    served(ep, hdr);
    return 1;
}

static int serve_atomic(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    const char *why = NULL;
    gs_tcp_mr *mr = gs_tcp_mr_find(tp, hdr->key);
    gs_tcp_hdr resp = {.version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_ATOMIC_RESP, .seq = hdr->seq};
    uint64_t *word;
    if (gs_tcp_mr_check(mr, hdr->off, 8, GS_ACCESS_REMOTE_ATOMIC, &why) == GS_OK &&
        ((uintptr_t)mr->base.addr + hdr->off) % 8 != 0)
        why = "atomic on a word that is not 8-byte aligned";
    if (why) {
        gs_tcp_refuse(ep, hdr, GS_ERR_REMOTE_ACCESS, why);
        return -1;
    }
    if (ep->tx_count == GS_TCP_TX_CAP)
        return 0;
    word = (uint64_t *)(void *)((uint8_t *)mr->base.addr + hdr->off);
    if (hdr->op == GS_TCP_OP_FETCH_ADD) {
        resp.arg0 = __atomic_fetch_add(word, hdr->arg0, __ATOMIC_SEQ_CST);
    } else {
        uint64_t expected = hdr->arg0;
        __atomic_compare_exchange_n(word, &expected, hdr->arg1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        resp.arg0 = expected;
    }
    gs_tcp_tx_push(ep, &resp, NULL, false);
    served(ep, hdr);
    return 1;
}

/* A SEND lands in the next posted receive, or waits in an unexpected slot. */
static int serve_send(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    gs_tcp_posted *r = ep->recv_count ? &ep->recvs[ep->recv_head] : NULL;
    if (r && r->cap >= hdr->len) {
        if (gs_tcp_cq_full(tp))
            return 0;
        tp->cq_reserved++;
        ep->rx.reserved = true;
        ep->rx.dst = r->buf;
        ep->rx.unexp = -1;
    } else {
        uint32_t slot = (ep->unexp_head + ep->unexp_count) % GS_TCP_UNEXP_CAP;
        if (ep->unexp_count == GS_TCP_UNEXP_CAP || (r && gs_tcp_cq_full(tp)))
            return 0;
        ep->unexp[slot].buf = malloc(hdr->len ? hdr->len : 1);
        if (!ep->unexp[slot].buf)
            return 0;
        ep->unexp[slot].len = hdr->len;
        ep->rx.dst = ep->unexp[slot].buf;
        ep->rx.unexp = (int)slot;
    }
    ep->rx.left = hdr->len;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Replies to our requests                                                   */
/* ------------------------------------------------------------------------ */

static bool pend_is_read(const gs_tcp_pend *e)
{
    return e->opcode == GS_WC_READ || e->opcode == GS_WC_FETCH_ADD || e->opcode == GS_WC_CMP_SWAP;
}

/* The oldest READ or atomic still waiting for its reply. */
static gs_tcp_pend *pend_next_reply(gs_tcp_ep *ep)
{
    for (uint32_t i = 0; i < ep->pend_count; i++) {
        gs_tcp_pend *e = &ep->pend[(ep->pend_head + i) % GS_TCP_PEND_CAP];
        if (pend_is_read(e) && !e->replied)
            return e;
    }
    return NULL;
}

static int take_reply(gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    gs_tcp_pend *e = pend_next_reply(ep);
    bool is_read = hdr->op == GS_TCP_OP_READ_RESP;
    if (!e || e->seq != hdr->seq || (e->opcode == GS_WC_READ) != is_read || (is_read && e->len != hdr->len)) {
        gs_tcp_ep_fail(ep, GS_ERR_PROTOCOL,
                       "rank %d: dropping the connection from rank %d: %s for request %llu matches no "
                       "outstanding operation",
                       ep->base.tp->rank, ep->base.peer, gs_tcp_op_name(hdr->op),
                       (unsigned long long)hdr->seq);
        return -1;
    }
    if (is_read) {
        ep->rx.dst = e->local;
        ep->rx.left = hdr->len;
        return 1;
    }
    memcpy(e->local, &hdr->arg0, sizeof(hdr->arg0));
    e->replied = true;
    ep->rd_out--;
    gs_tcp_tp_of(ep->base.tp)->progressed = true;
    return 1;
}

static void take_nak(gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    gs_status status = (gs_status)(-(int)hdr->status);
    const char *what = "an unsignaled operation";
    char detail[64] = "";
    for (uint32_t i = 0; i < ep->pend_count; i++) {
        gs_tcp_pend *e = &ep->pend[(ep->pend_head + i) % GS_TCP_PEND_CAP];
        if (e->seq == hdr->seq) {
            what = e->opcode == GS_WC_READ        ? "READ"
                   : e->opcode == GS_WC_FETCH_ADD ? "FETCH_ADD"
                   : e->opcode == GS_WC_CMP_SWAP  ? "CMP_SWAP"
                   : e->opcode == GS_WC_SEND      ? "SEND"
                                                  : "WRITE";
            snprintf(detail, sizeof(detail), " (wr_id %llu)", (unsigned long long)e->wr_id);
        }
    }
    if (hdr->seq > ep->acked)
        ep->acked = hdr->seq; /* everything before the refused request was served */
    gs_tcp_ep_fail(ep, status,
                   "rank %d: rank %d refused our %s%s: %s (its log says why); the endpoint is now in error",
                   ep->base.tp->rank, ep->base.peer, what, detail, gs_strerror(status));
    ep->lost = false; /* the peer is alive: it refused an access of ours */
}

/* The peer moves its frames to its other connection: nothing may follow
 * on this one (nothing is buffered after the SWITCH), and only the higher
 * rank of a pair with two connections switches. */
static int take_switch(gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    const char *why = NULL;
    if (ep->side_fd == ep->fd)
        why = "SWITCH on an endpoint with one connection";
    else if (ep->base.peer < ep->base.tp->rank)
        why = "SWITCH from the lower rank of the pair";
    else if (ep->rx.rlen - ep->rx.rpos != sizeof(*hdr))
        why = "bytes after a SWITCH on the same connection";
    if (why) {
        gs_tcp_refuse(ep, hdr, GS_ERR_PROTOCOL, why);
        return -1;
    }
    ep->rx_fd = ep->rx_fd == ep->fd ? ep->side_fd : ep->fd;
    ep->rx.drained = false;
    return 1;
}

int gs_tcp_frame_start(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
{
    switch (hdr->op) {
    case GS_TCP_OP_WRITE:
    case GS_TCP_OP_WRITE_IMM: return serve_write(tp, ep, hdr);
    case GS_TCP_OP_READ_REQ: return serve_read(tp, ep, hdr);
    case GS_TCP_OP_FETCH_ADD:
    case GS_TCP_OP_CMP_SWAP: return serve_atomic(tp, ep, hdr);
    case GS_TCP_OP_SEND: return serve_send(tp, ep, hdr);
    case GS_TCP_OP_READ_RESP:
    case GS_TCP_OP_ATOMIC_RESP: return take_reply(ep, hdr);
    case GS_TCP_OP_NAK: take_nak(ep, hdr); return -1;
    case GS_TCP_OP_BYE: ep->bye_rcvd = true; return 1;
    case GS_TCP_OP_SWITCH: return take_switch(ep, hdr);
    default: return 1; /* ACK: only its ack field */
    }
}

void gs_tcp_frame_finish(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    const gs_tcp_hdr *hdr = &ep->rx.hdr;
    gs_wc wc = {.status = GS_OK, .peer = ep->base.peer, .len = (uint32_t)hdr->len};
    ep->rx.state = GS_TCP_RX_HDR;
    ep->rx.last_len = hdr->len;
    if (ep->rx.reserved) {
        tp->cq_reserved--;
        ep->rx.reserved = false;
    }
    if (hdr->op == GS_TCP_OP_READ_RESP) {
        gs_tcp_pend *e = pend_next_reply(ep);
        e->replied = true;
        ep->rd_out--;
        tp->progressed = true;
        return;
    }
    if (hdr->op == GS_TCP_OP_WRITE_IMM) {
        wc.opcode = GS_WC_RECV_IMM;
        wc.imm = hdr->imm;
        gs_tcp_cq_push(tp, &wc);
    } else if (hdr->op == GS_TCP_OP_SEND && ep->rx.unexp < 0) {
        wc.opcode = GS_WC_RECV;
        wc.wr_id = ep->recvs[ep->recv_head].wr_id;
        ep->recv_head = (ep->recv_head + 1) % GS_TCP_RECV_CAP;
        ep->recv_count--;
        gs_tcp_cq_push(tp, &wc);
    } else if (hdr->op == GS_TCP_OP_SEND) {
        ep->unexp_count++;
        gs_tcp_ep_match_unexp(tp, ep);
    }
    served(ep, hdr);
}

bool gs_tcp_pend_done(const gs_tcp_ep *ep, const gs_tcp_pend *e)
{
    return pend_is_read(e) ? e->replied : e->seq < ep->acked;
}
