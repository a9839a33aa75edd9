/*
 * The tcp progress engine: one pass over every endpoint reads what arrived
 * (through a prefetch buffer for headers, straight into place for payloads),
 * checks each header before acting on it (tcp_serve.c acts), writes what is
 * queued (tcp_tx.c), sends owed acknowledgements and checks deadlines; and
 * the endpoint's error states. Driven by gs_tp_poll/gs_tp_wait and by the
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
#include <unistd.h>

#define HDR_BYTES ((uint64_t)sizeof(gs_tcp_hdr))
#define RX_ROUNDS 64

/* ------------------------------------------------------------------------ */
/* Endpoint errors                                                           */
/* ------------------------------------------------------------------------ */

static void ep_stop(gs_tcp_ep *ep)
{
    gs_tcp_tp *tp = gs_tcp_tp_of(ep->base.tp);
    ep->dead = true;
    gs_tcp_tx_drop(ep, true);
    gs_tcp_tx_pipe_close(ep); /* lets go of the pages still referenced in it */
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
    if (ep->side_fd != ep->fd)
        shutdown(ep->side_fd, SHUT_RDWR);
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
    ep->err_logged = true; /* here: later reports only repeat it */
    gs_fail(GS_SUBSYS_TCP, status, "%s", ep->why);
    ep_stop(ep);
}

void gs_tcp_ep_lost(gs_tcp_ep *ep, const char *cause_fmt, ...)
{
    char cause[192], text[sizeof(ep->why)];
    va_list ap;
    va_start(ap, cause_fmt);
    vsnprintf(cause, sizeof(cause), cause_fmt, ap);
    va_end(ap);
    gs_error_peer_lost_text(text, sizeof(text), ep->base.tp->rank, ep->base.peer, cause);
    gs_tcp_ep_fail(ep, GS_ERR_PEER_LOST, "%s", text);
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

/* ------------------------------------------------------------------------ */
/* Receiving                                                                 */
/* ------------------------------------------------------------------------ */

static bool rx_closed(gs_tcp_ep *ep, ssize_t got);

/* Checks the buffered header and acts on it. Returns false to stop reading. */
static bool rx_header(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    gs_tcp_rx_expect expect = {.next_seq = ep->rx_seq, .sent_reqs = ep->next_seq, .acked = ep->acked};
    gs_tcp_hdr hdr;
    const char *why;
    int taken;

    memcpy(&hdr, ep->rx.buf + ep->rx.rpos, sizeof(hdr));
    if (ep->bye_rcvd) {
        gs_tcp_ep_fail(ep, GS_ERR_PROTOCOL,
                       "rank %d: dropping the connection from rank %d: a frame after its goodbye",
                       tp->base.rank, ep->base.peer);
        return false;
    }
    if (gs_tcp_hdr_check(&hdr, &expect, &why) != GS_OK) {
        gs_tcp_refuse(ep, &hdr, GS_ERR_PROTOCOL, why);
        return false;
    }
    ep->rx.hdr = hdr;
    ep->rx.unexp = -1;
    ep->rx.left = 0;
    taken = gs_tcp_frame_start(tp, ep, &hdr);
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
            gs_tcp_frame_finish(tp, ep);
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
    if (rx->left && rx->drained)
        return false;
    if (rx->left) {
        ssize_t got = recv(ep->rx_fd, rx->dst, rx->left, MSG_DONTWAIT);
        if (got <= 0)
            return rx_closed(ep, got);
        rx->drained = (uint64_t)got < rx->left;
        rx->dst += got;
        rx->left -= (uint64_t)got;
        tp->rx_bytes = true;
        __atomic_fetch_add(&tp->rx_reads, 1, __ATOMIC_RELAXED);
    }
    if (rx->left == 0)
        gs_tcp_frame_finish(tp, ep);
    return true;
}

/* Reads more bytes into the prefetch buffer. After a large payload, only
 * the next header is read, so that the payload after it lands in place. */
static bool rx_fill(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    gs_tcp_rx *rx = &ep->rx;
    uint32_t want;
    ssize_t got;
    if (rx->drained)
        return false;
    if (rx->rpos) {
        memmove(rx->buf, rx->buf + rx->rpos, rx->rlen - rx->rpos);
        rx->rlen -= rx->rpos;
        rx->rpos = 0;
    }
    want = GS_TCP_RBUF - rx->rlen;
    if (rx->last_len >= GS_TCP_RBUF && rx->rlen < HDR_BYTES) /* (less than a header is buffered here) */
        want = (uint32_t)HDR_BYTES - rx->rlen;
    got = recv(ep->rx_fd, rx->buf + rx->rlen, want, MSG_DONTWAIT);
    if (got <= 0)
        return rx_closed(ep, got);
    rx->drained = (uint32_t)got < want;
    rx->rlen += (uint32_t)got;
    tp->rx_bytes = true;
    __atomic_fetch_add(&tp->rx_reads, 1, __ATOMIC_RELAXED);
    return true;
}

/* recv returned got <= 0: nothing yet (false, keep the endpoint), or the
 * stream ended or broke (the endpoint fails or closes). */
static bool rx_closed(gs_tcp_ep *ep, ssize_t got)
{
    bool mid_frame = ep->rx.state == GS_TCP_RX_PAYLOAD || ep->rx.rlen > ep->rx.rpos;
    if (got < 0 && errno == EINTR)
        return true;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return false;
    if (mid_frame)
        gs_tcp_ep_lost(ep, "its connection ended inside a %s%s, truncated: %s",
                       ep->rx.state == GS_TCP_RX_PAYLOAD ? gs_tcp_op_name(ep->rx.hdr.op) : "partial header",
                       ep->rx.state == GS_TCP_RX_PAYLOAD ? " frame" : " of a frame",
                       got == 0 ? "end of stream" : strerror(errno));
    else if (ep->bye_rcvd)
        gs_tcp_ep_close_quiet(ep, "closed its transport");
    else
        gs_tcp_ep_lost(ep, "%s", got == 0 ? "connection closed by the peer" : strerror(errno));
    return false;
}

/* Reads and serves what arrived on ep, within a bounded number of rounds
 * and without asking the socket again once a read came back short. */
static void rx_progress(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    ep->rx.drained = false;
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

static void check_deadlines(gs_tcp_tp *tp, gs_tcp_ep *ep, uint64_t now)
{
    int64_t timeout_ms = tp->base.cfg->timeout_ms;
    uint64_t limit = (uint64_t)timeout_ms * 1000000ull;
    if (timeout_ms < 0 || ep->dead)
        return;
    for (uint32_t i = 0; i < ep->pend_count; i++) {
        const gs_tcp_pend *e = &ep->pend[(ep->pend_head + i) % GS_TCP_PEND_CAP];
        if (gs_tcp_pend_done(ep, e))
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
            gs_tcp_ack_send(ep);
        check_deadlines(tp, ep, now);
    }
    if (tp->progressed) {
        tp->progressed = false;
        gs_tcp_wake(tp);
    }
}
