/* Sending on a tcp endpoint: frames queue in a ring and go out with one
 * sendmsg per batch (header and payload straight from their memory, up to
 * 64 pieces), resumed where a partial write stopped. A frame that has not
 * started yet carries the newest acknowledgement. Callers hold tp->lock. */
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

void gs_tcp_tx_drop(gs_tcp_ep *ep, bool all)
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

void gs_tcp_ack_send(gs_tcp_ep *ep)
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
            gs_tcp_ack_send(ep);
    }
}
