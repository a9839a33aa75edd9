/* Completions of the tcp transport. What arrives (WRITE_IMM, SEND) waits in
 * the completion queue; the initiator's operations complete from each
 * endpoint's ring in posting order once acknowledged or answered; a failed
 * endpoint completes what it still holds with its error, then FLUSHED.
 * poll never blocks; wait spins, blocks in poll() on the sockets and an
 * eventfd, or spins GS_SPIN_US and then blocks (GS_POLL). */
#include "transport/tcp/tcp.h"

#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool gs_tcp_cq_full(const gs_tcp_tp *tp)
{
    return tp->cq_count + tp->cq_reserved >= GS_TCP_CQ_CAP;
}

void gs_tcp_cq_push(gs_tcp_tp *tp, const gs_wc *wc)
{
    tp->cq[(tp->cq_head + tp->cq_count) % GS_TCP_CQ_CAP] = *wc;
    tp->cq_count++;
    tp->progressed = true;
}

void gs_tcp_wake(gs_tcp_tp *tp)
{
    uint64_t one = 1;
    if (tp->waiters > 0 && write(tp->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        gs_log_warn(TCP, "rank %d: waking a waiter failed: %s", tp->base.rank, strerror(errno));
}

static int harvest_cq(gs_tcp_tp *tp, gs_wc *wcs, int max)
{
    int n = 0;
    while (n < max && tp->cq_count) {
        wcs[n++] = tp->cq[tp->cq_head];
        tp->cq_head = (tp->cq_head + 1) % GS_TCP_CQ_CAP;
        tp->cq_count--;
    }
    return n;
}

/* The status an unanswered operation of a failed endpoint completes with. */
static gs_status failed_status(gs_tcp_ep *ep)
{
    gs_status status = ep->err_reported ? GS_ERR_FLUSHED : ep->err;
    ep->err_reported = true;
    return status;
}

/* Completes ep's outstanding operations in order, as far as they are answered
 * (all of them if the endpoint failed). */
static int harvest_pending(gs_tcp_ep *ep, gs_wc *wcs, int max)
{
    int n = 0;
    while (n < max && ep->pend_count) {
        gs_tcp_pend *e = &ep->pend[ep->pend_head];
        bool done = gs_tcp_pend_done(ep, e);
        gs_status status = GS_OK;
        if (!done && !ep->dead)
            break;
        if (!done && e->signaled)
            status = failed_status(ep);
        ep->pend_head = (ep->pend_head + 1) % GS_TCP_PEND_CAP;
        ep->pend_count--;
        if (!done && e->opcode != GS_WC_WRITE && e->opcode != GS_WC_WRITE_IMM && e->opcode != GS_WC_SEND)
            ep->rd_out--;
        if (e->signaled)
            wcs[n++] =
                (gs_wc){.wr_id = e->wr_id, .status = status, .opcode = e->opcode, .peer = ep->base.peer};
    }
    return n;
}

/* A dead endpoint flushes its posted receives. */
static int harvest_failed(gs_tcp_ep *ep, gs_wc *wcs, int max)
{
    int n = 0;
    while (n < max && ep->recv_count) {
        gs_tcp_posted *r = &ep->recvs[ep->recv_head];
        wcs[n++] =
            (gs_wc){.wr_id = r->wr_id, .status = GS_ERR_FLUSHED, .opcode = GS_WC_RECV, .peer = ep->base.peer};
        ep->recv_head = (ep->recv_head + 1) % GS_TCP_RECV_CAP;
        ep->recv_count--;
    }
    return n;
}

/* With nothing to return, a lost peer is the answer (every time). */
static gs_status lost_status(gs_tcp_tp *tp)
{
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (ep && ep->dead && ep->lost)
            return gs_tcp_ep_report(ep, GS_ERR_PEER_LOST, "%s", ep->why);
    }
    return GS_OK;
}

static int harvest(gs_tcp_tp *tp, gs_wc *wcs, int max)
{
    int n = harvest_cq(tp, wcs, max), size = tp->base.size;
    for (int i = 0; i < size && n < max; i++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, (int)((tp->ep_cursor + (uint32_t)i) % (uint32_t)size));
        if (!ep)
            continue;
        n += harvest_pending(ep, wcs + n, max - n);
        if (ep->dead && n < max)
            n += harvest_failed(ep, wcs + n, max - n);
    }
    tp->ep_cursor++;
    return n;
}

gs_status gs_tcp_poll(gs_tp *base, gs_wc *wcs, int max, int *n_p)
{
    gs_tcp_tp *tp = gs_tcp_tp_of(base);
    gs_status status = GS_OK;
    int n;
    pthread_mutex_lock(&tp->lock);
    tp->user_ns = gs_now_ns();
    gs_tcp_progress(tp);
    n = harvest(tp, wcs, max);
    if (n == 0)
        status = lost_status(tp);
    pthread_mutex_unlock(&tp->lock);
    if (status == GS_OK)
        *n_p = n;
    return status;
}

/* The descriptors a blocked waiter watches: the eventfd (another thread
 * made progress) and the sockets with work in either direction. */
static int waiter_fds(gs_tcp_tp *tp, struct pollfd *pfds)
{
    int n = 0;
    pfds[n++] = (struct pollfd){.fd = tp->wake_fd, .events = POLLIN};
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = gs_tcp_ep_at(tp, p);
        if (ep && !ep->dead)
            n += gs_tcp_ep_pollfds(ep, pfds + n);
    }
    return n;
}

/* Sleeps until a socket or the eventfd is ready, or up to the deadline
 * (at most 100 ms, so that operation deadlines are checked). */
static gs_status block_once(gs_tcp_tp *tp, uint64_t deadline_ns)
{
    struct pollfd *pfds = tp->wait_fds;
    int n, left = gs_deadline_left_ms(deadline_ns);
    uint64_t drain;
    pthread_mutex_lock(&tp->lock);
    gs_tcp_ack_flush(tp); /* a peer may be waiting for it while we sleep */
    n = waiter_fds(tp, pfds);
    tp->waiters++;
    pthread_mutex_unlock(&tp->lock);
    if (poll(pfds, (nfds_t)n, left < 0 || left > 100 ? 100 : left) > 0 && (pfds[0].revents & POLLIN) &&
        read(tp->wake_fd, &drain, sizeof(drain)) < 0 && errno != EAGAIN)
        gs_log_warn(TCP, "rank %d: reading the wake eventfd failed: %s", tp->base.rank, strerror(errno));
    pthread_mutex_lock(&tp->lock);
    tp->waiters--;
    pthread_mutex_unlock(&tp->lock);
    return GS_OK;
}

/* Hybrid waits spin GS_SPIN_US after the last bytes that arrived (a target
 * serving a stream of READs stays awake), then block. */
static uint64_t spin_end(const gs_tcp_tp *tp, uint64_t now)
{
    int mode = tp->base.cfg->poll;
    if (mode == GS_POLL_SPIN)
        return UINT64_MAX;
    return mode == GS_POLL_HYBRID ? now + (uint64_t)tp->base.cfg->spin_us * 1000ull : 0;
}

gs_status gs_tcp_wait(gs_tp *base, gs_wc *wcs, int max, int *n_p, uint64_t deadline_ns)
{
    gs_tcp_tp *tp = gs_tcp_tp_of(base);
    int n = 0;
    uint64_t spin_until = spin_end(tp, gs_now_ns()), reads = __atomic_load_n(&tp->rx_reads, __ATOMIC_RELAXED);
    gs_status status = GS_OK;
    for (unsigned idle = 0; status == GS_OK; idle++) {
        uint64_t now;
        status = gs_tcp_poll(base, wcs, max, &n);
        if (status != GS_OK || n > 0)
            break;
        if (gs_deadline_passed(deadline_ns))
            return gs_fail_quiet(GS_SUBSYS_TCP, GS_ERR_TIMEOUT,
                                 "rank %d: no tcp completion before the deadline", base->rank);
        now = gs_now_ns();
        if (reads != __atomic_load_n(&tp->rx_reads, __ATOMIC_RELAXED)) { /* activity: stay awake longer */
            reads = __atomic_load_n(&tp->rx_reads, __ATOMIC_RELAXED);
            spin_until = spin_end(tp, now);
        }
        if (now < spin_until) {
            if (idle % 64 == 63)
                sched_yield(); /* more ranks than cores: let the others run */
            continue;
        }
        status = block_once(tp, deadline_ns);
    }
    if (status == GS_OK)
        *n_p = n;
    return status;
}
