/*
 * The store server's connection engine: one thread, one poll() over the
 * listening socket, a wake pipe and every connection, each connection a
 * small state machine (HELLO, then one request at a time). A connection that
 * says nothing, closes at once, sends a wrong token or garbage is refused and
 * logged; it never holds up the others.
 */
#include "bootstrap/store_server.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONNS_MAX 4096

/* ---- replies ----------------------------------------------------------- */

void gs_boot_server_reply(gs_store_conn *conn, gs_status status, const void *value, size_t len)
{
    gs_store_hdr hdr = {
        .version = GS_STORE_PROTO_VERSION,
        .type = GS_STORE_REPLY,
        .status = status,
        .value_len = len,
    };
    uint8_t *tx = malloc(sizeof(hdr) + len);
    if (!tx) {
        gs_log_error(BOOT, "store: out of memory for a %zu-byte reply to rank %d; closing its connection",
                     len, conn->rank);
        conn->closing = true;
        return;
    }
    memcpy(tx, &hdr, sizeof(hdr));
    if (len)
        memcpy(tx + sizeof(hdr), value, len);
    free(conn->tx);
    conn->tx = tx;
    conn->tx_len = sizeof(hdr) + len;
    conn->tx_off = 0;
    conn->wait = GS_STORE_WAIT_NONE;
}

void gs_boot_server_reply_error(gs_store_conn *conn, gs_status status, const char *fmt, ...)
{
    char text[GS_STORE_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    gs_boot_server_reply(conn, status, text, strlen(text));
}

/* ---- connections ------------------------------------------------------- */

static void conn_refuse(gs_store_conn *conn, gs_status status, const char *why)
{
    gs_log_warn(BOOT, "store: refused connection from %s: %s", conn->peer, why);
    gs_boot_server_reply_error(conn, status, "the store refused this connection: %s", why);
    conn->closing = true;
}

static void conn_drop(gs_store_conn *conn, const char *why)
{
    if (conn->rank >= 0)
        gs_log_error(BOOT, "store: closing the connection of rank %d (%s): %s", conn->rank, conn->peer, why);
    else
        gs_log_warn(BOOT, "store: refused connection from %s: %s", conn->peer, why);
    conn->dead = true;
}

static void accept_all(gs_store_server *s)
{
    for (;;) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), one = 1;
        gs_store_conn *conn;
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                gs_log_warn(BOOT, "store: accept failed: %s", strerror(errno));
            return;
        }
        if (s->nconns == CONNS_MAX) {
            gs_log_warn(BOOT, "store: %d connections open; refusing one more", CONNS_MAX);
            close(fd);
            continue;
        }
        if (s->nconns == s->conns_cap) {
            size_t cap = s->conns_cap ? 2 * s->conns_cap : 16;
            gs_store_conn **conns = realloc(s->conns, cap * sizeof(*conns));
            if (!conns) {
                close(fd);
                continue;
            }
            s->conns = conns;
            s->conns_cap = cap;
        }
        conn = gs_calloc(1, sizeof(*conn));
        if (!conn) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn->fd = fd;
        conn->rank = -1;
        conn->hello_deadline_ns = gs_deadline_after_ms(s->hello_timeout_ms);
        gs_boot_sock_peer_name(fd, conn->peer, sizeof(conn->peer));
        s->conns[s->nconns++] = conn;
        gs_log_debug(BOOT, "store: connection from %s", conn->peer);
    }
}

static void handle_hello(gs_store_server *s, gs_store_conn *conn)
{
    char token[GS_STORE_TOKEN_MAX + 1], why[160];
    int rank = (int)conn->hdr.rank, size = (int)conn->hdr.arg;
    bool rejoin;

    memcpy(token, conn->body, conn->body_len);
    token[conn->body_len] = '\0';
    if (!gs_boot_token_equal(token, s->token)) {
        conn_refuse(conn, GS_ERR_AUTH, "wrong job token (every rank needs the GS_JOB_TOKEN of this job)");
        return;
    }
    if (size != s->size || conn->hdr.rank >= (uint32_t)s->size) {
        snprintf(why, sizeof(why), "rank %" PRIu32 " of %" PRIu32 " announced, but this job has %d ranks",
                 conn->hdr.rank, conn->hdr.arg, s->size);
        conn_refuse(conn, GS_ERR_CONFIG, why);
        return;
    }
    rejoin = (conn->hdr.status & GS_STORE_HELLO_REJOIN) && s->rank_state[rank] == GS_STORE_RANK_LOST;
    if (s->rank_state[rank] != GS_STORE_RANK_NEVER && !rejoin) {
        snprintf(why, sizeof(why),
                 "rank %d already joined this job; two processes were given the same rank%s", rank,
                 (conn->hdr.status & GS_STORE_HELLO_REJOIN) ? " (a rank may rejoin only once it is lost)"
                                                            : "");
        conn_refuse(conn, GS_ERR_CONFIG, why);
        return;
    }
    conn->rank = rank;
    conn->joining = rejoin;
    s->by_rank[rank] = conn;
    s->rank_state[rank] = GS_STORE_RANK_CONNECTED;
    gs_log_debug(BOOT, "store: rank %d of %d %s from %s", rank, size, rejoin ? "rejoined" : "joined",
                 conn->peer);
    gs_boot_server_reply(conn, GS_OK, NULL, 0);
}

static void dispatch(gs_store_server *s, gs_store_conn *conn)
{
    char key[GS_STORE_KEY_MAX + 1];
    const uint8_t *value = conn->body + conn->hdr.key_len;
    size_t len = (size_t)conn->hdr.value_len;

    if (conn->hdr.type == GS_STORE_HELLO) {
        handle_hello(s, conn);
        return;
    }
    memcpy(key, conn->body, conn->hdr.key_len);
    key[conn->hdr.key_len] = '\0';
    switch (conn->hdr.type) {
    case GS_STORE_PUT: gs_boot_table_put(s, conn, key, value, len); break;
    case GS_STORE_GET: gs_boot_table_get(s, conn, key, conn->hdr.arg); break;
    case GS_STORE_ALLGATHER:
    case GS_STORE_BARRIER: gs_boot_table_join(s, conn, conn->hdr.type, key, value, len, conn->hdr.arg); break;
    case GS_STORE_SURVIVORS:
        gs_boot_agree_ask(s, conn, key, value, len, conn->hdr.arg, conn->hdr.status);
        break;
    case GS_STORE_BYE: conn->bye = true; break;
    case GS_STORE_TIME: { /* the clock, then the host id: a rank on the same host needs no offset */
        uint8_t reply[8 + 128];
        uint64_t now = gs_now_ns();
        memcpy(reply, &now, sizeof(now));
        gs_boot_host_id((char *)reply + 8, sizeof(reply) - 8);
        gs_boot_server_reply(conn, GS_OK, reply, 8 + strlen((char *)reply + 8));
        break;
    }
    default: break;
    }
}

/* Checks a header before anything is allocated for its body; NULL if fine. */
static const char *header_problem(const gs_store_conn *conn)
{
    const gs_store_hdr *h = &conn->hdr;
    if (h->version != GS_STORE_PROTO_VERSION)
        return "not a gradsync store message (or another protocol version)";
    if (conn->rank < 0)
        return h->type != GS_STORE_HELLO                              ? "the first message was not a HELLO"
               : h->key_len != 0 || h->value_len > GS_STORE_TOKEN_MAX ? "malformed HELLO"
                                                                      : NULL;
    switch (h->type) {
    case GS_STORE_PUT:
    case GS_STORE_ALLGATHER:
    case GS_STORE_SURVIVORS:
        if (h->value_len > GS_STORE_VALUE_MAX)
            return "value longer than GS_STORE_VALUE_MAX";
        break;
    case GS_STORE_GET:
    case GS_STORE_BARRIER:
    case GS_STORE_BYE:
    case GS_STORE_TIME:
        if (h->value_len != 0)
            return "unexpected value";
        break;
    default: return "unknown message type";
    }
    if (h->type == GS_STORE_TIME && h->key_len != 0)
        return "TIME carries no key";
    if (h->key_len > GS_STORE_KEY_MAX ||
        (h->type != GS_STORE_BYE && h->type != GS_STORE_TIME && h->key_len == 0))
        return "key empty or longer than GS_STORE_KEY_MAX";
    return NULL;
}

/* Reads what is available; dispatches at most one complete message. */
static void conn_read(gs_store_server *s, gs_store_conn *conn)
{
    for (;;) {
        ssize_t n;
        if (conn->hdr_got < sizeof(conn->hdr))
            n = recv(conn->fd, (char *)&conn->hdr + conn->hdr_got, sizeof(conn->hdr) - conn->hdr_got, 0);
        else
            n = recv(conn->fd, conn->body + conn->body_got, conn->body_len - conn->body_got, 0);
        if (n == 0) {
            if (conn->rank < 0 && conn->hdr_got == 0)
                conn_drop(conn, "closed before saying HELLO");
            else if (conn->rank < 0 || !conn->bye)
                conn_drop(conn, "closed without saying BYE");
            else
                conn->dead = true;
            return;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                conn_drop(conn, strerror(errno));
            return;
        }
        if (conn->hdr_got < sizeof(conn->hdr)) {
            const char *problem;
            conn->hdr_got += (size_t)n;
            if (conn->hdr_got < sizeof(conn->hdr))
                continue;
            problem = header_problem(conn);
            if (problem) {
                conn_drop(conn, problem);
                return;
            }
            conn->body_len = conn->hdr.key_len + (size_t)conn->hdr.value_len;
            conn->body_got = 0;
            conn->body = malloc(conn->body_len ? conn->body_len : 1);
            if (!conn->body) {
                conn_drop(conn, "out of memory for its message");
                return;
            }
        } else {
            conn->body_got += (size_t)n;
        }
        if (conn->hdr_got == sizeof(conn->hdr) && conn->body_got == conn->body_len) {
            dispatch(s, conn);
            free(conn->body);
            conn->body = NULL;
            conn->hdr_got = 0;
            return;
        }
    }
}

static void conn_write(gs_store_conn *conn)
{
    while (conn->tx_off < conn->tx_len) {
        ssize_t n = send(conn->fd, conn->tx + conn->tx_off, conn->tx_len - conn->tx_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                conn_drop(conn, strerror(errno));
            return;
        }
        conn->tx_off += (size_t)n;
    }
    free(conn->tx);
    conn->tx = NULL;
    conn->tx_len = conn->tx_off = 0;
    if (conn->closing)
        conn->dead = true;
}

/* A connection waiting for an answer is not read (one request at a time);
 * POLLRDHUP still tells when its peer went away. */
static short conn_events(const gs_store_conn *conn)
{
    short events = POLLRDHUP;
    if (conn->tx)
        events |= POLLOUT;
    else if (conn->wait == GS_STORE_WAIT_NONE && !conn->closing)
        events |= POLLIN;
    return events;
}

static void conn_event(gs_store_server *s, gs_store_conn *conn, short revents)
{
    if (revents & POLLOUT)
        conn_write(conn);
    if (conn->dead)
        return;
    if (revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) {
        if (conn_events(conn) & POLLIN)
            conn_read(s, conn);
        else if (revents & (POLLRDHUP | POLLHUP | POLLERR))
            conn_drop(conn, conn->wait != GS_STORE_WAIT_NONE ? "closed while waiting for an answer"
                                                             : "closed before reading its answer");
    }
    if (!conn->dead && conn->tx)
        conn_write(conn);
}

static void conn_free(gs_store_server *s, gs_store_conn *conn)
{
    if (conn->rank >= 0) {
        s->by_rank[conn->rank] = NULL;
        s->rank_state[conn->rank] = conn->bye ? GS_STORE_RANK_DEPARTED : GS_STORE_RANK_LOST;
        gs_boot_table_rank_gone(s, conn->rank);
        gs_boot_agree_rank_gone(s);
    }
    close(conn->fd);
    free(conn->body);
    free(conn->tx);
    free(conn);
}

static void remove_dead(gs_store_server *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        if (s->conns[i]->dead)
            conn_free(s, s->conns[i]);
        else
            s->conns[kept++] = s->conns[i];
    }
    s->nconns = kept;
}

/* ---- the loop ----------------------------------------------------------- */

static bool all_ranks_left(const gs_store_server *s)
{
    for (int r = 0; r < s->size; r++)
        if (s->rank_state[r] == GS_STORE_RANK_NEVER || s->rank_state[r] == GS_STORE_RANK_CONNECTED)
            return false;
    return true;
}

static uint64_t expire_hellos(gs_store_server *s, uint64_t now, uint64_t next)
{
    for (size_t i = 0; i < s->nconns; i++) {
        gs_store_conn *conn = s->conns[i];
        if (conn->rank >= 0 || conn->closing || conn->dead)
            continue;
        if (now >= conn->hello_deadline_ns)
            conn_drop(conn, "no HELLO within the deadline");
        else if (conn->hello_deadline_ns < next)
            next = conn->hello_deadline_ns;
    }
    return next;
}

static bool should_stop(gs_store_server *s)
{
    if (!atomic_load(&s->stop))
        return false;
    if (all_ranks_left(s))
        return true;
    return gs_deadline_passed(atomic_load(&s->drain_deadline_ns));
}

static void serve_turn(gs_store_server *s, struct pollfd *pfds)
{
    uint64_t now = gs_now_ns(),
             next = atomic_load(&s->stop) ? atomic_load(&s->drain_deadline_ns) : UINT64_MAX;
    size_t n = 2;
    int rc;

    next = expire_hellos(s, now, next);
    uint64_t table_next = gs_boot_table_expire(s, now), agree_next = gs_boot_agree_expire(s, now);
    if (table_next < next)
        next = table_next;
    if (agree_next < next)
        next = agree_next;
    remove_dead(s);
    pfds[0] = (struct pollfd){.fd = s->wake_fd[0], .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
    for (size_t i = 0; i < s->nconns; i++)
        pfds[n++] = (struct pollfd){.fd = s->conns[i]->fd, .events = conn_events(s->conns[i])};
    rc = poll(pfds, n, gs_deadline_left_ms(next));
    if (rc < 0 && errno != EINTR) {
        gs_log_error(BOOT, "store: poll failed: %s", strerror(errno));
        usleep(1000);
        return;
    }
    if (rc <= 0)
        return;
    if (pfds[0].revents & POLLIN) {
        char drain[64];
        while (read(s->wake_fd[0], drain, sizeof(drain)) > 0)
            ;
    }
    if (pfds[1].revents & POLLIN)
        accept_all(s);
    for (size_t i = 2; i < n; i++)
        if (pfds[i].revents)
            conn_event(s, s->conns[i - 2], pfds[i].revents);
    remove_dead(s);
}

static void *serve(void *arg)
{
    gs_store_server *s = arg;
    struct pollfd *pfds = malloc((CONNS_MAX + 2) * sizeof(*pfds));
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals belong to the application's threads */
    if (!pfds) {
        gs_log_error(BOOT, "store: out of memory for the poll set; the store is not served");
        return NULL;
    }
    while (!should_stop(s))
        serve_turn(s, pfds);
    free(pfds);
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

gs_status gs_boot_server_listen(const gs_boot_server_params *params, gs_store_server **server_p)
{
    gs_store_server *s = gs_calloc(1, sizeof(*s));
    gs_status status;

    if (!s)
        return GS_ERR_NOMEM;
    s->size = params->size;
    snprintf(s->token, sizeof(s->token), "%s", params->token ? params->token : "");
    s->hello_timeout_ms = params->hello_timeout_ms > 0 ? params->hello_timeout_ms : 30000;
    s->listen_fd = s->wake_fd[0] = s->wake_fd[1] = -1;
    s->by_rank = gs_calloc((size_t)s->size, sizeof(*s->by_rank));
    s->rank_state = gs_calloc((size_t)s->size, 1);
    if (!s->by_rank || !s->rank_state) {
        status = GS_ERR_NOMEM;
        goto fail;
    }
    if (pipe2(s->wake_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        status = gs_fail(GS_SUBSYS_BOOT, GS_ERR_SYSTEM, "store: pipe failed: %s", strerror(errno));
        goto fail;
    }
    status = gs_boot_sock_listen(params->host, params->port, &s->listen_fd, &s->port);
    if (status != GS_OK) {
        status =
            gs_fail(GS_SUBSYS_BOOT, status,
                    "cannot serve the store on %s:%d: %s; choose another address or port (GS_STORE)",
                    params->host, params->port, status == GS_ERR_CONFIG ? "unknown host" : strerror(errno));
        goto fail;
    }
    gs_log_info(BOOT, "store: listening on %s:%d for %d ranks", params->host, s->port, s->size);
    *server_p = s;
    return GS_OK;
fail:
    gs_boot_server_stop(s, 0);
    return status;
}

int gs_boot_server_port(const gs_store_server *server)
{
    return server->port;
}

gs_status gs_boot_server_start(gs_store_server *server)
{
    int rc = pthread_create(&server->thread, NULL, serve, server);
    if (rc != 0)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_SYSTEM, "cannot start the store thread: %s", strerror(rc));
    server->started = true;
    return GS_OK;
}

/* After a drain that ran out: who never left. */
static void warn_stayed(const gs_store_server *s, int drain_ms)
{
    uint8_t *left = malloc((size_t)s->size);
    char ranks[256];
    if (!left)
        return;
    for (int r = 0; r < s->size; r++)
        left[r] = s->rank_state[r] == GS_STORE_RANK_DEPARTED || s->rank_state[r] == GS_STORE_RANK_LOST;
    int count = gs_boot_format_ranks(left, s->size, ranks, sizeof(ranks));
    if (count > 0)
        gs_log_warn(
            BOOT,
            "store: stopped serving after waiting %d ms for %s %s to leave (still running, or never joined)",
            drain_ms, count == 1 ? "rank" : "ranks", ranks);
    free(left);
}

void gs_boot_server_stop(gs_store_server *server, int drain_ms)
{
    if (!server)
        return;
    if (server->started) {
        atomic_store(&server->drain_deadline_ns, gs_deadline_after_ms(drain_ms > 0 ? drain_ms : 0));
        atomic_store(&server->stop, true);
        if (write(server->wake_fd[1], "x", 1) < 0)
            gs_log_debug(BOOT, "store: wake write failed: %s", strerror(errno));
        pthread_join(server->thread, NULL);
        if (drain_ms > 0)
            warn_stayed(server, drain_ms);
    }
    for (size_t i = 0; i < server->nconns; i++) {
        server->conns[i]->rank = -1; /* no departures to report now */
        conn_free(server, server->conns[i]);
    }
    gs_boot_table_free(server);
    gs_boot_agree_free(server);
    if (server->listen_fd >= 0)
        close(server->listen_fd);
    for (int i = 0; i < 2; i++)
        if (server->wake_fd[i] >= 0)
            close(server->wake_fd[i]);
    free(server->conns);
    free(server->by_rank);
    free(server->rank_state);
    free(server);
}
