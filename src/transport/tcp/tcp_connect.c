/* Connection setup: every rank dials every other rank and accepts every
 * other rank (two connections per pair, see tcp_tx.c), all in one poll()
 * loop with the open's deadline. Each side
 * proves the job token and echoes the other's listener nonce (published only
 * through the job's store); a connection that fails the check is dropped with
 * a logged reason and setup goes on waiting for the real peer. */
#include "transport/tcp/tcp.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { C_FREE, C_CONNECTING, C_RETRY, C_WAIT_ACK, C_WAIT_HELLO };

typedef struct setup_conn {
    int fd;
    int peer; /* dialled peer, or -1 for an accepted, unidentified connection */
    int phase;
    uint64_t retry_at;
    size_t got;
    gs_tcp_hello in;
    char from[80];
} setup_conn;

typedef struct setup_state {
    const gs_tcp_setup *s;
    int lfd;
    int *fds;    /* accepted: dialled by the peer */
    int *tx_fds; /* dialled by this rank */
    int missing;
    setup_conn *conns;
    int nconns;
    gs_tcp_addr *peer_addrs;
} setup_state;

#define RETRY_NS 20000000ull

static void conn_drop(setup_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->phase = C_FREE;
}

static gs_status send_hello(const setup_state *st, int fd, int kind, int to_peer)
{
    gs_tcp_hello hello;
    const uint8_t *p = (const uint8_t *)&hello;
    size_t done = 0;
    gs_tcp_hello_fill(&hello, kind, st->s->rank, st->s->size, st->s->instance, st->s->blobs[to_peer].nonce,
                      st->s->cfg->job_token);
    while (done < sizeof(hello)) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        ssize_t n = send(fd, p + done, sizeof(hello) - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return gs_fail(GS_SUBSYS_TCP, GS_ERR_PEER_LOST,
                           "rank %d: sending the tcp hello to rank %d failed: %s", st->s->rank, to_peer,
                           strerror(errno));
        if (gs_deadline_passed(st->s->deadline_ns) ||
            poll(&pfd, 1, gs_deadline_left_ms(st->s->deadline_ns)) < 0)
            return gs_fail(GS_SUBSYS_TCP, GS_ERR_TIMEOUT,
                           "rank %d: sending the tcp hello to rank %d timed out", st->s->rank, to_peer);
    }
    return GS_OK;
}

static void dial(setup_state *st, setup_conn *c)
{
    const gs_tcp_addr *addr = &st->peer_addrs[c->peer];
    c->fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c->got = 0;
    if (c->fd >= 0 &&
        (connect(c->fd, (const struct sockaddr *)&addr->sa, addr->len) == 0 || errno == EINPROGRESS)) {
        c->phase = C_CONNECTING;
        return;
    }
    gs_log_debug(TCP, "rank %d: connect to rank %d at %s failed (%s); retrying", st->s->rank, c->peer,
                 c->from, strerror(errno));
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->phase = C_RETRY;
    c->retry_at = gs_now_ns() + RETRY_NS;
}

/* The dialled socket became writable: connected (send our hello) or failed (retry). */
static gs_status on_connected(setup_state *st, setup_conn *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err) {
        gs_log_debug(TCP, "rank %d: connect to rank %d at %s: %s; retrying", st->s->rank, c->peer, c->from,
                     strerror(err));
        close(c->fd);
        c->fd = -1;
        c->phase = C_RETRY;
        c->retry_at = gs_now_ns() + RETRY_NS;
        return GS_OK;
    }
    c->phase = C_WAIT_ACK;
    return send_hello(st, c->fd, GS_TCP_HELLO, c->peer);
}

/* A complete hello arrived on an accepted connection. */
static gs_status on_hello(setup_state *st, setup_conn *c)
{
    const char *why = NULL;
    int peer = (int)c->in.rank;
    gs_status status = gs_tcp_hello_check(&c->in, GS_TCP_HELLO, st->s->size, st->s->instance,
                                          st->s->blobs[st->s->rank].nonce, st->s->cfg->job_token, &why);
    if (status == GS_OK && peer == st->s->rank)
        why = "a rank never dials itself";
    else if (status == GS_OK && st->fds[peer] >= 0)
        why = "that rank is already connected";
    if (status != GS_OK || why) {
        gs_log_warn(TCP, "rank %d: dropped a tcp connection from %s claiming rank %d: %s", st->s->rank,
                    c->from, peer, why);
        conn_drop(c);
        return GS_OK;
    }
    status = send_hello(st, c->fd, GS_TCP_HELLO_ACK, peer);
    if (status == GS_OK) {
        st->fds[peer] = c->fd;
        st->missing--;
        c->fd = -1;
    }
    conn_drop(c);
    return status;
}

/* The answer to our hello arrived: the peer must be who the store says. */
static gs_status on_hello_ack(setup_state *st, setup_conn *c)
{
    const char *why = NULL;
    gs_status status = gs_tcp_hello_check(&c->in, GS_TCP_HELLO_ACK, st->s->size, st->s->instance,
                                          st->s->blobs[st->s->rank].nonce, st->s->cfg->job_token, &why);
    if (status == GS_OK && c->in.rank != (uint32_t)c->peer) {
        status = GS_ERR_AUTH;
        why = "the answer came from another rank";
    }
    if (status != GS_OK)
        return gs_fail(GS_SUBSYS_TCP, status, "rank %d: tcp hello answer from rank %d at %s refused: %s",
                       st->s->rank, c->peer, c->from, why);
    st->tx_fds[c->peer] = c->fd;
    st->missing--;
    c->fd = -1;
    conn_drop(c);
    return GS_OK;
}

static gs_status on_readable(setup_state *st, setup_conn *c)
{
    ssize_t n = recv(c->fd, (uint8_t *)&c->in + c->got, sizeof(c->in) - c->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return GS_OK;
    if (n <= 0) {
        if (c->phase == C_WAIT_ACK)
            return gs_fail(GS_SUBSYS_TCP, GS_ERR_AUTH,
                           "rank %d: rank %d at %s closed the connection during the tcp hello (%s): "
                           "does its GS_JOB_TOKEN match? see its log",
                           st->s->rank, c->peer, c->from, n == 0 ? "end of stream" : strerror(errno));
        gs_log_warn(TCP, "rank %d: dropped a tcp connection from %s: it closed after %zu of %zu hello bytes",
                    st->s->rank, c->from, c->got, sizeof(c->in));
        conn_drop(c);
        return GS_OK;
    }
    c->got += (size_t)n;
    if (c->got < sizeof(c->in))
        return GS_OK;
    return c->phase == C_WAIT_ACK ? on_hello_ack(st, c) : on_hello(st, c);
}

static void on_accept(setup_state *st)
{
    gs_tcp_addr from;
    setup_conn *slot = NULL;
    int fd;
    from.len = sizeof(from.sa);
    fd = accept4(st->lfd, (struct sockaddr *)&from.sa, &from.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    for (int i = 0; i < st->nconns && !slot; i++)
        if (st->conns[i].phase == C_FREE)
            slot = &st->conns[i];
    if (!slot) {
        gs_log_warn(TCP, "rank %d: dropped a tcp connection: too many unidentified connections", st->s->rank);
        close(fd);
        return;
    }
    slot->fd = fd;
    slot->peer = -1;
    slot->phase = C_WAIT_HELLO;
    slot->got = 0;
    gs_tcp_addr_format(&from, slot->from, sizeof(slot->from));
}

static short events_of(const setup_conn *c)
{
    return c->phase == C_CONNECTING                               ? POLLOUT
           : (c->phase == C_WAIT_ACK || c->phase == C_WAIT_HELLO) ? POLLIN
                                                                  : 0;
}

/* One poll() round over the listener and every connection in progress. */
static gs_status setup_round(setup_state *st, struct pollfd *pfds)
{
    int n = 0, timeout = gs_deadline_left_ms(st->s->deadline_ns);
    gs_status status = GS_OK;
    if (timeout < 0 || timeout > 20)
        timeout = 20; /* wake up for retries */
    pfds[n++] = (struct pollfd){.fd = st->lfd, .events = POLLIN};
    for (int i = 0; i < st->nconns; i++)
        pfds[n++] = (struct pollfd){.fd = events_of(&st->conns[i]) ? st->conns[i].fd : -1,
                                    .events = events_of(&st->conns[i])};
    if (poll(pfds, (nfds_t)n, timeout) < 0 && errno != EINTR)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM, "rank %d: poll during tcp setup failed: %s", st->s->rank,
                       strerror(errno));
    for (int i = 0; i < st->nconns && status == GS_OK; i++) {
        setup_conn *c = &st->conns[i];
        short re = pfds[i + 1].revents;
        if (c->phase == C_RETRY && gs_now_ns() >= c->retry_at)
            dial(st, c);
        else if (c->phase == C_CONNECTING && re)
            status = on_connected(st, c);
        else if ((c->phase == C_WAIT_ACK || c->phase == C_WAIT_HELLO) && re)
            status = on_readable(st, c);
    }
    if (status == GS_OK && (pfds[0].revents & POLLIN))
        on_accept(st);
    return status;
}

static gs_status setup_timed_out(const setup_state *st)
{
    char list[256] = "";
    size_t n = 0;
    for (int p = 0; p < st->s->size && n + 12 < sizeof(list); p++)
        if (p != st->s->rank && (st->fds[p] < 0 || st->tx_fds[p] < 0))
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%d", n ? "," : "", p);
    return gs_fail(GS_SUBSYS_TCP, GS_ERR_TIMEOUT,
                   "rank %d: tcp setup timed out after %lld ms: no connection with peer(s) %s "
                   "(are they running and reachable? raise GS_TIMEOUT_MS or set GS_TCP_IFNAME)",
                   st->s->rank, (long long)st->s->cfg->timeout_ms, list);
}

static gs_status setup_init(setup_state *st)
{
    const gs_tcp_setup *s = st->s;
    gs_status status = GS_OK;
    st->nconns = 2 * s->size + 8; /* dialled peers + room for unidentified callers */
    st->conns = gs_calloc((size_t)st->nconns, sizeof(setup_conn));
    st->peer_addrs = gs_calloc((size_t)s->size, sizeof(gs_tcp_addr));
    if (!st->conns || !st->peer_addrs)
        return GS_ERR_NOMEM;
    for (int i = 0; i < st->nconns; i++)
        st->conns[i] = (setup_conn){.fd = -1, .peer = -1, .phase = C_FREE};
    for (int p = 0; p < s->size && status == GS_OK; p++) {
        if (p == s->rank)
            continue;
        status = gs_tcp_blob_unpack(&s->blobs[p], p, &st->peer_addrs[p]);
        if (status == GS_OK && st->peer_addrs[p].sa.ss_family == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)&st->peer_addrs[p].sa)->sin6_addr))
            ((struct sockaddr_in6 *)&st->peer_addrs[p].sa)->sin6_scope_id = s->blobs[s->rank].scope_id;
        st->conns[p].peer = p;
        gs_tcp_addr_format(&st->peer_addrs[p], st->conns[p].from, sizeof(st->conns[p].from));
    }
    return status;
}

gs_status gs_tcp_connect_all(const gs_tcp_setup *setup, int lfd, int *fds, int *tx_fds)
{
    setup_state st = {.s = setup, .lfd = lfd, .fds = fds, .tx_fds = tx_fds, .missing = 2 * (setup->size - 1)};
    struct pollfd *pfds = NULL;
    gs_status status;

    for (int p = 0; p < setup->size; p++)
        fds[p] = tx_fds[p] = -1;
    status = setup_init(&st);
    if (status == GS_OK && !(pfds = gs_calloc((size_t)st.nconns + 1, sizeof(*pfds))))
        status = GS_ERR_NOMEM;
    for (int p = 0; p < setup->size && status == GS_OK; p++)
        if (p != setup->rank)
            dial(&st, &st.conns[p]);
    while (status == GS_OK && st.missing > 0) {
        if (gs_deadline_passed(setup->deadline_ns))
            status = setup_timed_out(&st);
        else
            status = setup_round(&st, pfds);
    }
    for (int i = 0; st.conns && i < st.nconns; i++)
        conn_drop(&st.conns[i]);
    if (status != GS_OK) {
        for (int p = 0; p < setup->size; p++) {
            if (fds[p] >= 0)
                close(fds[p]);
            fds[p] = -1;
            if (tx_fds[p] >= 0)
                close(tx_fds[p]);
            tx_fds[p] = -1;
        }
    }
    free(pfds);
    free(st.conns);
    free(st.peer_addrs);
    return status;
}
