/* The tcp transport object and its endpoints, apart from how the sockets
 * were obtained (tcp_tp.c gets them through the store; tests hand in their
 * own). Teardown says goodbye to every live peer: the queued frames and a
 * BYE go out, then end of stream, and the socket is closed once the peer's
 * kernel holds everything we sent. */
#include "transport/tcp/tcp.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <linux/sockios.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define GOODBYE_MS 2000

gs_status gs_tcp_tp_create(const gs_config *cfg, int rank, int size, gs_tcp_tp **tp_p)
{
    gs_tcp_tp *tp = gs_calloc(1, sizeof(*tp));
    if (!tp)
        return GS_ERR_NOMEM;
    tp->base = (gs_tp){.cfg = cfg, .rank = rank, .size = size};
    tp->wake_fd = -1;
    tp->thread_wake_fd = -1;
    pthread_mutex_init(&tp->lock, NULL);
    tp->base.eps = gs_calloc((size_t)size, sizeof(gs_ep *));
    tp->cq = gs_calloc(GS_TCP_CQ_CAP, sizeof(gs_wc));
    tp->wait_fds = gs_calloc(2 * (size_t)size + 1, sizeof(struct pollfd)); /* two sockets per peer */
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!tp->base.eps || !tp->cq || !tp->wait_fds || tp->wake_fd < 0) {
        gs_status status = tp->wake_fd < 0 ? gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM,
                                                     "rank %d: eventfd failed: %s", rank, strerror(errno))
                                           : GS_ERR_NOMEM;
        gs_tcp_tp_destroy(tp);
        return status;
    }
    *tp_p = tp;
    return GS_OK;
}

gs_status gs_tcp_ep_attach(gs_tcp_tp *tp, int peer, int fd)
{
    return gs_tcp_ep_attach2(tp, peer, fd, fd);
}

gs_status gs_tcp_ep_attach_both(gs_tcp_tp *tp, int peer, int accepted, int dialled)
{
    bool lower = tp->base.rank < peer; /* the shared connection is the one the lower rank dialled */
    return gs_tcp_ep_attach2(tp, peer, lower ? dialled : accepted, lower ? accepted : dialled);
}

gs_status gs_tcp_ep_attach2(gs_tcp_tp *tp, int peer, int fd, int side_fd)
{
    gs_tcp_ep *ep;
    gs_status status = gs_tcp_sock_tune(fd, tp->base.cfg, tp->base.rank, peer);
    if (status == GS_OK && side_fd != fd)
        status = gs_tcp_sock_tune(side_fd, tp->base.cfg, tp->base.rank, peer);
    if (status != GS_OK)
        return status;
    ep = gs_calloc(1, sizeof(*ep));
    if (!ep)
        return GS_ERR_NOMEM;
    ep->base = (gs_ep){.tp = &tp->base, .peer = peer};
    ep->fd = ep->rx_fd = ep->tx_fd = fd;
    ep->side_fd = side_fd;
    ep->switcher = side_fd != fd && tp->base.rank > peer;
    ep->pipe[0] = ep->pipe[1] = -1;
    ep->rx.unexp = -1;
    ep->tx = gs_calloc(GS_TCP_TX_CAP, sizeof(gs_tcp_tx));
    ep->pend = gs_calloc(GS_TCP_PEND_CAP, sizeof(gs_tcp_pend));
    if (!ep->tx || !ep->pend) {
        free(ep->tx);
        free(ep->pend);
        free(ep);
        return GS_ERR_NOMEM;
    }
    pthread_mutex_lock(&tp->lock);
    tp->base.eps[peer] = &ep->base;
    pthread_mutex_unlock(&tp->lock);
    return GS_OK;
}

/* Flushes ep's queue and a BYE, then ends our direction of the stream. */
static void goodbye_send(gs_tcp_ep *ep, uint64_t deadline)
{
    gs_tcp_hdr bye = {.version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_BYE};
    bool bye_queued = false;
    while (!ep->dead && !gs_deadline_passed(deadline)) {
        struct pollfd pfd = {.fd = ep->tx_fd, .events = POLLOUT};
        if (!bye_queued)
            bye_queued = gs_tcp_tx_push(ep, &bye, NULL, false) != NULL; /* after what is queued */
        gs_tcp_tx_flush(ep);
        if (bye_queued && ep->tx_count == 0)
            break;
        if (!ep->dead)
            poll(&pfd, 1, 10);
    }
    if (!ep->dead) {
        shutdown(ep->fd, SHUT_WR);
        if (ep->side_fd != ep->fd)
            shutdown(ep->side_fd, SHUT_WR);
    }
}

/* Waits until the peer's kernel has acknowledged all we sent (so closing,
 * even with a reset, loses nothing) or the peer ended its stream too. */
static void goodbye_wait(gs_tcp_ep *ep, uint64_t deadline)
{
    uint8_t sink[4096];
    for (;;) {
        int unacked = 0;
        ssize_t got = recv(ep->rx_fd, sink, sizeof(sink), MSG_DONTWAIT);
        struct pollfd pfd = {.fd = ep->rx_fd, .events = POLLIN};
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
            return;
        if (got > 0)
            continue;
        int side = 0;
        if (ioctl(ep->fd, SIOCOUTQ, &unacked) == 0 && ioctl(ep->side_fd, SIOCOUTQ, &side) == 0 &&
            unacked + side == 0)
            return;
        if (gs_deadline_passed(deadline))
            return;
        poll(&pfd, 1, 5);
    }
}

static void ep_free(gs_tcp_ep *ep)
{
    for (uint32_t i = 0; i < ep->unexp_count; i++)
        free(ep->unexp[(ep->unexp_head + i) % GS_TCP_UNEXP_CAP].buf);
    if (ep->rx.unexp >= 0 && ep->rx.state == GS_TCP_RX_PAYLOAD)
        free(ep->unexp[ep->rx.unexp].buf); /* a SEND still arriving */
    if (ep->side_fd >= 0 && ep->side_fd != ep->fd)
        close(ep->side_fd);
    if (ep->fd >= 0)
        close(ep->fd);
    gs_tcp_tx_pipe_close(ep);
    free(ep->tx);
    free(ep->pend);
    free(ep);
}

static void goodbye_all(gs_tcp_tp *tp)
{
    uint64_t deadline = gs_deadline_after_ms(
        tp->base.cfg->timeout_ms < GOODBYE_MS && tp->base.cfg->timeout_ms >= 0 ? tp->base.cfg->timeout_ms
                                                                               : GOODBYE_MS);
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (ep && !ep->dead)
            goodbye_send(ep, deadline);
    }
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (ep && !ep->dead)
            goodbye_wait(ep, deadline);
    }
}

void gs_tcp_tp_destroy(gs_tcp_tp *tp)
{
    if (!tp)
        return;
    gs_tcp_thread_stop(tp);
    pthread_mutex_lock(&tp->lock);
    if (tp->base.eps) {
        goodbye_all(tp);
        for (int p = 0; p < tp->base.size; p++)
            if (tp->base.eps[p])
                ep_free(gs_tcp_ep_at(tp, p));
    }
    for (uint32_t i = 0; i < tp->region_cap; i++) {
        gs_tcp_mr *mr = tp->regions[i];
        if (mr && mr->base.owned)
            gs_pages_free(mr->base.addr, mr->base.len);
        free(mr);
    }
    pthread_mutex_unlock(&tp->lock);
    if (tp->wake_fd >= 0)
        close(tp->wake_fd);
    pthread_mutex_destroy(&tp->lock);
    free(tp->regions);
    free(tp->cq);
    free(tp->wait_fds);
    free(tp->base.eps);
    free(tp);
}

int gs_tcp_ep_pollfds(const gs_tcp_ep *ep, struct pollfd *pfds)
{
    short rx = ep->rx.stalled ? 0 : POLLIN, tx = ep->tx_count ? POLLOUT : 0;
    int n = 0;
    if (ep->tx_fd == ep->rx_fd) {
        if (rx | tx)
            pfds[n++] = (struct pollfd){.fd = ep->rx_fd, .events = (short)(rx | tx)};
        return n;
    }
    if (rx)
        pfds[n++] = (struct pollfd){.fd = ep->rx_fd, .events = rx};
    if (tx)
        pfds[n++] = (struct pollfd){.fd = ep->tx_fd, .events = tx};
    return n;
}
