/* Sending on a tcp endpoint: frames queue in a ring and go out with one
 * sendmsg per batch (header and payload straight from their memory, up to
 * 64 pieces), resumed where a partial write stopped. A frame that has not
 * started yet carries the newest acknowledgement. Callers hold tp->lock.
 *
 * Large payloads of operations posted with GS_OP_ZCOPY are not copied
 * into the socket: vmsplice puts references to their pages in a pipe and
 * splice moves them into the socket, so the kernel's copy on the sending
 * side, the larger part of the cost of a stream, is gone (the receiver
 * copies straight from the sender's pages). The pages are read when the
 * peer receives, not when the frame leaves: a source is reusable once its
 * operation completes (the peer acknowledged it) or the peer answered a
 * later message, as on a verbs queue pair (the hint says the caller keeps
 * that rule). Whether it pays depends on the machine: on loopback between
 * cores that share a cache the copy is cheap and the page references cost
 * more; the collectives measure both (coll/zcopy.c). */
/* vmsplice, splice, F_SETPIPE_SZ: _GNU_SOURCE (set for the whole build) */
#include "transport/tcp/tcp.h"

#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
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
    if (t->hdr.op == GS_TCP_OP_SWITCH) /* it is out: what follows takes the other connection */
        ep->tx_fd = ep->tx_fd == ep->fd ? ep->side_fd : ep->fd;
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

/* ---- zero-copy payloads ------------------------------------------------- */

#define PIPE_BYTES (1u << 20) /* wanted; the system's pipe-max-size may give less */

static bool pipe_open(gs_tcp_ep *ep)
{
    int size;
    if (pipe2(ep->pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        gs_log_info(TCP, "rank %d: no pipe for zero-copy sends to rank %d (%s): copying", ep->base.tp->rank,
                    ep->base.peer, strerror(errno));
        ep->pipe[0] = ep->pipe[1] = -1;
        return false;
    }
    for (unsigned want = PIPE_BYTES; want >= 65536; want /= 2)
        if (fcntl(ep->pipe[1], F_SETPIPE_SZ, (int)want) >= 0)
            break;
    size = fcntl(ep->pipe[1], F_GETPIPE_SZ);
    ep->pipe_cap = size > 0 ? (uint32_t)size : 65536;
    return true;
}

void gs_tcp_tx_pipe_close(gs_tcp_ep *ep)
{
    for (int i = 0; i < 2; i++)
        if (ep->pipe[i] >= 0)
            close(ep->pipe[i]);
    ep->pipe[0] = ep->pipe[1] = -1;
    ep->pipe_bytes = 0;
}

void gs_tcp_tx_zcopy(gs_tcp_ep *ep, gs_tcp_tx *t)
{
    if (!t || !t->payload || t->hdr.len < GS_TCP_ZCOPY_MIN || ep->zcopy_off)
        return;
    if (ep->pipe[0] < 0 && !pipe_open(ep)) {
        ep->zcopy_off = true;
        return;
    }
    t->splice = true;
}

/* splice into a socket has no MSG_NOSIGNAL: into a connection the peer
 * reset it raises SIGPIPE (at this thread), which would kill a process
 * that keeps the default action. The signal is held blocked for the call
 * and one the call raised is taken back; one already pending stays. Four
 * system calls beside a splice of up to a pipe's load (1 MiB). */
static ssize_t splice_quiet(int from, int to, size_t len, unsigned flags)
{
    static const struct timespec zero = {0, 0};
    sigset_t pipe_set, old, pending;
    bool was_pending;
    ssize_t n;
    int err;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    n = splice(from, NULL, to, NULL, len, flags);
    err = errno;
    /* (it may come with a partial count, not only with EPIPE) */
    if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
            ;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = err;
    return n;
}

/* Sends the head frame's payload through the pipe, its header already sent.
 * Returns true when the frame is done or goes on by copying, false when the
 * socket is full or the endpoint failed. */
static bool tx_splice(gs_tcp_ep *ep, gs_tcp_tx *t)
{
    uint64_t len = t->hdr.len;
    for (;;) {
        if (!ep->zcopy_off && t->piped < len && ep->pipe_bytes < ep->pipe_cap) {
            uint64_t room = ep->pipe_cap - ep->pipe_bytes,
                     want = len - t->piped < room ? len - t->piped : room;
            struct iovec iov = {(void *)(t->payload + t->piped), want};
            ssize_t got = vmsplice(ep->pipe[1], &iov, 1, SPLICE_F_NONBLOCK);
            if (got > 0) {
                t->piped += (uint64_t)got;
                ep->pipe_bytes += (uint64_t)got;
            } else if (got < 0 && errno != EAGAIN && errno != EINTR) {
                gs_log_info(TCP, "rank %d: vmsplice to rank %d failed (%s): copying from now on",
                            ep->base.tp->rank, ep->base.peer, strerror(errno));
                ep->zcopy_off = true;
            }
        }
        if (ep->pipe_bytes == 0) { /* (only after a failed vmsplice) the rest goes by copy */
            t->splice = false;
            return true;
        }
        bool more = t->piped < len || ep->tx_count > 1;
        ssize_t sent = splice_quiet(ep->pipe[0], ep->tx_fd, ep->pipe_bytes,
                                    SPLICE_F_NONBLOCK | SPLICE_F_MOVE | (more ? SPLICE_F_MORE : 0));
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ep->tx_blocked = true;
            return false;
        }
        if (sent <= 0) {
            gs_tcp_ep_lost(ep, "sending to it by splice failed: %s",
                           sent < 0 ? strerror(errno) : "nothing sent");
            return false;
        }
        ep->tx_stuck_since = gs_now_ns();
        ep->pipe_bytes -= (uint64_t)sent;
        t->done += (uint64_t)sent;
        if (t->done == t->total) {
            tx_pop(ep);
            return true;
        }
    }
}

/* ---- two connections ----------------------------------------------------- */

/* Two connections per pair (the tcp transport's own setup makes them; a
 * test's single socket gives fd == side_fd and none of this happens). Both
 * ranks' frames travel on the one the lower rank dialled, so each carries
 * the acknowledgement of what came the other way and small messages cost
 * one segment each way. Streams of large frames both ways on one
 * connection are slower: the two directions contend for the socket (16
 * MiB allreduce over loopback: a connection per direction 9% faster, 64
 * MiB 8%; an 8 B allreduce 37% slower). So the higher rank moves its
 * frames to its own connection when it posts a large one, and back when
 * it posts a small one after a small one with nothing queued: a SWITCH
 * frame, the last on the old connection, tells the peer where to read
 * next. Order holds: the peer reads one connection at a time. */
void gs_tcp_tx_route(gs_tcp_ep *ep, uint64_t len)
{
    bool big = len >= GS_TCP_SIDE_MIN;
    /* only once the peer has served every earlier request (the one being
     * posted has next_seq - 1): each SWITCH is followed by a request on the
     * new connection, so the peer has then read past every earlier SWITCH.
     * Else frames written on a connection after switching back to it could
     * reach a peer that has not yet read the SWITCH that left it, and it
     * would find bytes after that SWITCH (seen with 3-rank alltoall-like
     * traffic, large and small frames to each peer in turn) */
    bool drained = ep->acked + 1 >= ep->next_seq;
    if (!ep->switcher)
        return;
    if (drained && (big ? !ep->tx_side : ep->tx_side && ep->tx_last_small && ep->tx_count == 0)) {
        gs_tcp_hdr sw = {.version = GS_TCP_PROTO_VERSION, .op = GS_TCP_OP_SWITCH};
        if (gs_tcp_tx_push(ep, &sw, NULL, false))
            ep->tx_side = !ep->tx_side;
    }
    ep->tx_last_small = !big;
}

/* ---- the queue ------------------------------------------------------------ */

/* Gathers the queue into iov; a frame not yet started carries the newest ack.
 * A zero-copy frame ends the batch after its header (*more: its payload
 * follows at once). */
static int tx_gather(gs_tcp_ep *ep, struct iovec *iov, bool *more)
{
    int n = 0;
    *more = false;
    for (uint32_t i = 0; i < ep->tx_count && n + 2 <= IOV_BATCH; i++) {
        gs_tcp_tx *t = &ep->tx[(ep->tx_head + i) % GS_TCP_TX_CAP];
        if (t->done == 0) {
            t->hdr.ack = ep->rx_seq;
            ep->ack_sent = ep->rx_seq;
            ep->ack_owed = false;
        }
        if (t->done < HDR_BYTES)
            iov[n++] = (struct iovec){(uint8_t *)&t->hdr + t->done, HDR_BYTES - t->done};
        if (t->hdr.op == GS_TCP_OP_SWITCH)
            break; /* the next frame goes on the other connection */
        if (t->splice) {
            *more = true;
            break;
        }
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
        gs_tcp_tx *head = &ep->tx[ep->tx_head];
        bool more;
        if (head->splice && head->done >= HDR_BYTES) {
            if (!tx_splice(ep, head))
                return;
            continue;
        }
        int n = tx_gather(ep, iov, &more);
        uint64_t offered = 0;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t sent;
        for (int i = 0; i < n; i++)
            offered += iov[i].iov_len;
        sent = sendmsg(ep->tx_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ep->tx_blocked = true;
            return;
        }
        if (sent < 0) {
            gs_tcp_ep_lost(ep, "sending to it failed: %s", strerror(errno));
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
