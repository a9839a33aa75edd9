/*
 * The tcp progress engine: writes queued frames (header and payload in one
 * sendmsg, straight from registered memory, partial writes resumed later)
 * and reads what arrived, checks every frame before acting on it, lands
 * payloads straight in the target region, and serves READs and atomics.
 * Driven by gs_tp_poll/gs_tp_wait and, with GS_PROGRESS_THREAD=1, by the
 * progress thread. Callers hold tp->lock.
 *
 * Anything malformed or not allowed (bad version, unknown op, a length or
 * offset outside the region, a missing permission, a truncated frame) drops
 * the connection with a logged reason before any byte outside a registered
 * region could change; the process and its other connections go on.
 */
#include "transport/tcp/tcp.h"

#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define HDR_BYTES ((uint64_t)sizeof(gs_tcp_hdr))
#define IOV_BATCH 64
#define RX_ROUNDS 64

/* ------------------------------------------------------------------------ */
/* Sending                                                                   */
/* ------------------------------------------------------------------------ */

gs_tcp_tx *gs_tcp_tx_push(gs_tcp_ep *ep, const gs_tcp_hdr *hdr, const void *payload, bool user)
{
    gs_tcp_tx *t;
    if (ep->tx_count == GS_TCP_TX_CAP)
        return NULL;
    t = &ep->tx[(ep->tx_head + ep->tx_count) % GS_TCP_TX_CAP];
    *t = (gs_tcp_tx){.hdr = *hdr, .payload = payload, .total = HDR_BYTES + hdr->len, .user = user};
    if (ep->tx_count == 0)
        ep->tx_stuck_since = gs_now_ns();
    ep->tx_count++;
    ep->tx_user += user;
    return t;
}

static void tx_pop(gs_tcp_ep *ep)
{
    gs_tcp_tx *t = &ep->tx[ep->tx_head];
    if (t->ref)
        t->ref->tx_refs--;
    ep->tx_user -= t->user;
    ep->tx_head = (ep->tx_head + 1) % GS_TCP_TX_CAP;
    ep->tx_count--;
}

/* Drops every queued frame that has not started (all of them if all). */
static void tx_drop(gs_tcp_ep *ep, bool all)
{
    uint32_t keep = (!all && ep->tx_count && ep->tx[ep->tx_head].done) ? 1 : 0;
    while (ep->tx_count > keep) {
        uint32_t last = (ep->tx_head + ep->tx_count - 1) % GS_TCP_TX_CAP;
        gs_tcp_tx *t = &ep->tx[last];
        if (t->ref)
            t->ref->tx_refs--;
        ep->tx_user -= t->user;
        ep->tx_count--;
    }
}

/* Gathers the queue into iov; a frame not yet started carries the newest ack. */
static int tx_gather(gs_tcp_ep *ep, struct iovec *iov)
{
    int n = 0;
    for (uint32_t i = 0; i < ep->tx_count && n + 2 <= IOV_BATCH; i++) {
        gs_tcp_tx *t = &ep->tx[(ep->tx_head + i) % GS_TCP_TX_CAP];
        if (t->done == 0) {
            t->hdr.ack = ep->rx_seq;
            ep->ack_sent = ep->rx_seq;
            ep->ack_owed = false;
        }
        if (t->done < HDR_BYTES)
            iov[n++] = (struct iovec){(uint8_t *)&t->hdr + t->done, HDR_BYTES - t->done};
        if (t->hdr.len) {
            uint64_t from = t->done > HDR_BYTES ? t->done - HDR_BYTES : 0;
            iov[n++] = (struct iovec){(void *)(t->payload + from), t->hdr.len - from};
        }
    }
    return n;
}

/* Marks n written bytes done; returns whether the socket took everything offered. */
static void tx_advance(gs_tcp_ep *ep, uint64_t n)
{
    while (n > 0 && ep->tx_count) {
        gs_tcp_tx *t = &ep->tx[ep->tx_head];
        uint64_t take = t->total - t->done < n ? t->total - t->done : n;
        t->done += take;
        n -= take;
        if (t->done == t->total)
            tx_pop(ep);
    }
}

void gs_tcp_tx_flush(gs_tcp_ep *ep)
{
    struct iovec iov[IOV_BATCH];
    while (ep->tx_count && !ep->dead) {
        int n = tx_gather(ep, iov);
        uint64_t offered = 0;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t sent;
        for (int i = 0; i < n; i++)
            offered += iov[i].iov_len;
        sent = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ep->tx_blocked = true;
            return;
        }
        if (sent < 0) {
            gs_tcp_ep_fail(ep, GS_ERR_PEER_LOST, "rank %d: sending to rank %d failed: %s; connection lost",
                           ep->base.tp->rank, ep->base.peer, strerror(errno));
            return;
        }
        ep->tx_stuck_since = gs_now_ns();
        tx_advance(ep, (uint64_t)sent);
        ep->tx_blocked = (uint64_t)sent < offered;
        if (ep->tx_blocked)
            return;
    }
}

static void ack_send(gs_tcp_ep *ep)
{
    gs_tcp_hdr hdr = {.version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_ACK};
    /* a queued frame that has not started will carry the ack */
    for (uint32_t i = 0; i < ep->tx_count; i++)
        if (ep->tx[(ep->tx_head + i) % GS_TCP_TX_CAP].done == 0)
            return;
    if (gs_tcp_tx_push(ep, &hdr, NULL, false))
        gs_tcp_tx_flush(ep);
}

void gs_tcp_ack_flush(gs_tcp_tp *tp)
{
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (ep && !ep->dead && ep->ack_owed)
            ack_send(ep);
    }
}

/* ------------------------------------------------------------------------ */
/* Endpoint errors                                                           */
/* ------------------------------------------------------------------------ */

static void ep_stop(gs_tcp_ep *ep)
{
    gs_tcp_tp *tp = gs_tcp_tp_of(ep->base.tp);
    ep->dead = true;
    tx_drop(ep, true);
    if (ep->rx.state == GS_TCP_RX_PAYLOAD && ep->rx.reserved) {
        tp->cq_reserved--;
        ep->rx.reserved = false;
    }
    if (ep->rx.state == GS_TCP_RX_PAYLOAD && ep->rx.unexp >= 0) {
        free(ep->unexp[ep->rx.unexp].buf);
        ep->unexp[ep->rx.unexp].buf = NULL;
    }
    ep->rx.state = GS_TCP_RX_HDR;
    shutdown(ep->fd, SHUT_RDWR);
    tp->progressed = true;
}

void gs_tcp_ep_fail(gs_tcp_ep *ep, gs_status status, const char *fmt, ...)
{
    va_list ap;
    if (ep->dead)
        return;
    va_start(ap, fmt);
    vsnprintf(ep->why, sizeof(ep->why), fmt, ap);
    va_end(ap);
    ep->err = status;
    ep->err_reported = false;
    ep->lost = true;
    gs_fail(GS_SUBSYS_TCP, status, "%s", ep->why);
    ep_stop(ep);
}

void gs_tcp_ep_close_quiet(gs_tcp_ep *ep, const char *why)
{
    if (ep->dead)
        return;
    snprintf(ep->why, sizeof(ep->why), "rank %d: rank %d %s", ep->base.tp->rank, ep->base.peer, why);
    gs_log_info(TCP, "%s", ep->why);
    ep->err = GS_ERR_PEER_LOST;
    ep->err_reported = false;
    ep_stop(ep);
}

/* The peer broke the protocol or asked for memory it may not touch: tell it
 * why (best effort, when no frame of ours is half written) and drop it. */
static void refuse(gs_tcp_ep *ep, const gs_tcp_hdr *hdr, gs_status status, const char *why)
{
    gs_tcp_hdr nak = {.version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_NAK, .status = (uint8_t)-status,
                      .seq = ep->rx_seq}; /* the number the refused request should have had */
    tx_drop(ep, false);
    if (ep->tx_count == 0 && gs_tcp_op_is_request(hdr->op) && gs_tcp_tx_push(ep, &nak, NULL, false))
        gs_tcp_tx_flush(ep);
    gs_tcp_ep_fail(ep, status,
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
        refuse(ep, hdr, GS_ERR_REMOTE_ACCESS, why);
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
    gs_tcp_hdr resp = {.version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_READ_RESP, .len = hdr->arg0, .seq = hdr->seq};
    gs_tcp_tx *t;
    if (gs_tcp_mr_check(mr, hdr->off, hdr->arg0, GS_ACCESS_REMOTE_READ, &why) != GS_OK) {
        refuse(ep, hdr, GS_ERR_REMOTE_ACCESS, why);
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
        refuse(ep, hdr, GS_ERR_REMOTE_ACCESS, why);
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
                       ep->base.tp->rank, ep->base.peer, gs_tcp_op_name(hdr->op), (unsigned long long)hdr->seq);
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
            what = e->opcode == GS_WC_READ ? "READ" : e->opcode == GS_WC_FETCH_ADD ? "FETCH_ADD"
                   : e->opcode == GS_WC_CMP_SWAP ? "CMP_SWAP" : e->opcode == GS_WC_SEND ? "SEND" : "WRITE";
            snprintf(detail, sizeof(detail), " (wr_id %llu)", (unsigned long long)e->wr_id);
        }
    }
    if (hdr->seq > ep->acked)
        ep->acked = hdr->seq; /* everything before the refused request was served */
    gs_tcp_ep_fail(ep, status, "rank %d: rank %d refused our %s%s: %s (its log says why); the endpoint is now in error",
                   ep->base.tp->rank, ep->base.peer, what, detail, gs_strerror(status));
    ep->lost = false; /* the peer is alive: it refused an access of ours */
}

/* ------------------------------------------------------------------------ */
/* Receiving                                                                 */
/* ------------------------------------------------------------------------ */

static bool rx_closed(gs_tcp_tp *tp, gs_tcp_ep *ep, ssize_t got);

/* Acts on a checked header: 1 taken, 0 stall, -1 endpoint failed. */
static int frame_start(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr)
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
    default: return 1; /* ACK: only its ack field */
    }
}

/* The whole payload has landed. */
static void frame_finish(gs_tcp_tp *tp, gs_tcp_ep *ep)
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

/* Checks the buffered header and acts on it. Returns false to stop reading. */
static bool rx_header(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    gs_tcp_rx_expect expect = {.next_seq = ep->rx_seq, .sent_reqs = ep->next_seq, .acked = ep->acked};
    gs_tcp_hdr hdr;
    const char *why;
    int taken;

    memcpy(&hdr, ep->rx.buf + ep->rx.rpos, sizeof(hdr));
    if (ep->bye_rcvd) {
        gs_tcp_ep_fail(ep, GS_ERR_PROTOCOL, "rank %d: dropping the connection from rank %d: a frame after its goodbye",
                       tp->base.rank, ep->base.peer);
        return false;
    }
    if (gs_tcp_hdr_check(&hdr, &expect, &why) != GS_OK) {
        refuse(ep, &hdr, GS_ERR_PROTOCOL, why);
        return false;
    }
    ep->rx.hdr = hdr;
    ep->rx.unexp = -1;
    ep->rx.left = 0;
    taken = frame_start(tp, ep, &hdr);
    ep->rx.stalled = taken == 0;
    if (taken <= 0)
        return false;
    if (hdr.ack > ep->acked) {
        ep->acked = hdr.ack;
        tp->progressed = true;
    }
    ep->rx.rpos += (uint32_t)HDR_BYTES;
    if (hdr.len == 0) {
        if (hdr.op == GS_TCP_OP_WRITE || hdr.op == GS_TCP_OP_WRITE_IMM || hdr.op == GS_TCP_OP_SEND ||
            hdr.op == GS_TCP_OP_READ_RESP)
            frame_finish(tp, ep);
        return true;
    }
    ep->rx.state = GS_TCP_RX_PAYLOAD;
    return true;
}

/* Places payload bytes: first those already buffered, then straight from the
 * socket into their destination. Returns false to stop reading. */
static bool rx_payload(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    gs_tcp_rx *rx = &ep->rx;
    uint64_t avail = rx->rlen - rx->rpos, n = avail < rx->left ? avail : rx->left;
    if (n) {
        memcpy(rx->dst, rx->buf + rx->rpos, n);
        rx->rpos += (uint32_t)n;
        rx->dst += n;
        rx->left -= n;
    }
    if (rx->left) {
        ssize_t got = recv(ep->fd, rx->dst, rx->left, MSG_DONTWAIT);
        if (got <= 0)
            return rx_closed(tp, ep, got);
        rx->dst += got;
        rx->left -= (uint64_t)got;
        tp->rx_bytes = true;
    }
    if (rx->left == 0)
        frame_finish(tp, ep);
    return true;
}

/* Reads more bytes into the prefetch buffer. After a large payload, only
 * the next header is read, so that the payload after it lands in place. */
static bool rx_fill(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    gs_tcp_rx *rx = &ep->rx;
    uint32_t want;
    ssize_t got;
    if (rx->rpos) {
        memmove(rx->buf, rx->buf + rx->rpos, rx->rlen - rx->rpos);
        rx->rlen -= rx->rpos;
        rx->rpos = 0;
    }
    want = GS_TCP_RBUF - rx->rlen;
    if (rx->last_len >= GS_TCP_RBUF)
        want = (uint32_t)HDR_BYTES - rx->rlen;
    got = recv(ep->fd, rx->buf + rx->rlen, want, MSG_DONTWAIT);
    if (got <= 0)
        return rx_closed(tp, ep, got);
    rx->rlen += (uint32_t)got;
    tp->rx_bytes = true;
    return true;
}

/* recv returned got <= 0: nothing yet (false, keep the endpoint), or the
 * stream ended or broke (the endpoint fails or closes). */
static bool rx_closed(gs_tcp_tp *tp, gs_tcp_ep *ep, ssize_t got)
{
    bool mid_frame = ep->rx.state == GS_TCP_RX_PAYLOAD || ep->rx.rlen > ep->rx.rpos;
    if (got < 0 && errno == EINTR)
        return true;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return false;
    if (mid_frame)
        gs_tcp_ep_fail(ep, GS_ERR_PEER_LOST,
                       "rank %d: connection from rank %d ended inside a %s frame (truncated; %s); dropped",
                       tp->base.rank, ep->base.peer,
                       ep->rx.state == GS_TCP_RX_PAYLOAD ? gs_tcp_op_name(ep->rx.hdr.op) : "partial header",
                       got == 0 ? "end of stream" : strerror(errno));
    else if (ep->bye_rcvd)
        gs_tcp_ep_close_quiet(ep, "closed its transport");
    else
        gs_tcp_ep_fail(ep, GS_ERR_PEER_LOST, "rank %d: connection to rank %d lost (%s): did it exit or crash?",
                       tp->base.rank, ep->base.peer, got == 0 ? "closed by the peer" : strerror(errno));
    return false;
}

/* Reads and serves what arrived on ep, within a bounded number of rounds. */
static void rx_progress(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    for (int round = 0; round < RX_ROUNDS && !ep->dead; round++) {
        bool more;
        if (ep->rx.state == GS_TCP_RX_PAYLOAD)
            more = rx_payload(tp, ep);
        else if (ep->rx.rlen - ep->rx.rpos >= HDR_BYTES)
            more = rx_header(tp, ep);
        else
            more = rx_fill(tp, ep);
        if (!more)
            return;
    }
}

/* ------------------------------------------------------------------------ */
/* Deadlines and the pass over all endpoints                                 */
/* ------------------------------------------------------------------------ */

static bool pend_done(const gs_tcp_ep *ep, const gs_tcp_pend *e)
{
    return pend_is_read(e) ? e->replied : e->seq < ep->acked;
}

static void check_deadlines(gs_tcp_tp *tp, gs_tcp_ep *ep, uint64_t now)
{
    int64_t timeout_ms = tp->base.cfg->timeout_ms;
    uint64_t limit = (uint64_t)timeout_ms * 1000000ull;
    if (timeout_ms < 0 || ep->dead)
        return;
    for (uint32_t i = 0; i < ep->pend_count; i++) {
        const gs_tcp_pend *e = &ep->pend[(ep->pend_head + i) % GS_TCP_PEND_CAP];
        if (pend_done(ep, e))
            continue;
        if (now > e->posted_ns && now - e->posted_ns > limit)
            gs_tcp_ep_fail(ep, GS_ERR_TIMEOUT,
                           "rank %d: no answer from rank %d to operation wr_id %llu within %lld ms "
                           "(is it polling? GS_PROGRESS_THREAD=1 serves peers while computing)",
                           tp->base.rank, ep->base.peer, (unsigned long long)e->wr_id, (long long)timeout_ms);
        break; /* later operations were posted later */
    }
    if (!ep->dead && ep->tx_count && now > ep->tx_stuck_since && now - ep->tx_stuck_since > limit)
        gs_tcp_ep_fail(ep, GS_ERR_TIMEOUT, "rank %d: rank %d has taken no data for %lld ms; giving up",
                       tp->base.rank, ep->base.peer, (long long)timeout_ms);
}

bool gs_tcp_pend_done(const gs_tcp_ep *ep, const gs_tcp_pend *e)
{
    return pend_done(ep, e);
}

void gs_tcp_progress(gs_tcp_tp *tp)
{
    uint64_t now = gs_now_ns();
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (!ep || ep->dead)
            continue;
        tp->rx_bytes = false;
        rx_progress(tp, ep);
        if (ep->recv_count && ep->unexp_count)
            gs_tcp_ep_match_unexp(tp, ep);
        if (ep->tx_count && !ep->dead)
            gs_tcp_tx_flush(ep);
        /* an ack is owed and this pass brought nothing new: send it alone */
        if (ep->ack_owed && !tp->rx_bytes && !ep->dead)
            ack_send(ep);
        check_deadlines(tp, ep, now);
    }
    if (tp->progressed) {
        tp->progressed = false;
        gs_tcp_wake(tp);
    }
}
