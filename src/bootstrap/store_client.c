/*
 * The store client: one TCP connection per rank, one request at a time
 * (a mutex serializes threads). The server answers waits itself when their
 * deadline passes; the client allows a little longer for that answer and
 * treats silence beyond it, or a closed connection, as the store being lost.
 */
#include "bootstrap/store_client.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Extra time the client gives the server to report its own timeout. */
#define REPLY_GRACE_MS 2000

struct gs_store_client {
    int fd;
    int rank;
    int size;
    int timeout_ms; /* deadline of requests that do not carry their own */
    char addr[GS_BOOT_HOST_MAX + 16];
    pthread_mutex_t lock;
    bool broken; /* the connection lost its framing or the server; every later call fails */
};

/* What an exchange ended with: the server's answer or the connection's fate. */
typedef struct exchange_result {
    bool answered;                     /* status came from the server */
    char text[GS_STORE_ERROR_MAX + 1]; /* the server's error text, or what went wrong */
} exchange_result;

static const char *const msg_names[] = {
    [GS_STORE_HELLO] = "hello",     [GS_STORE_PUT] = "put",
    [GS_STORE_GET] = "get",         [GS_STORE_ALLGATHER] = "allgather",
    [GS_STORE_BARRIER] = "barrier", [GS_STORE_BYE] = "bye",
    [GS_STORE_TIME] = "time",       [GS_STORE_SURVIVORS] = "survivors",
};

int gs_boot_client_rank(const gs_store_client *c)
{
    return c->rank;
}

static gs_status send_request(gs_store_client *c, const gs_store_request *req, uint64_t deadline_ns)
{
    size_t key_len = req->key ? strlen(req->key) : 0;
    gs_store_hdr hdr = {
        .version = GS_STORE_PROTO_VERSION,
        .type = (uint8_t)req->type,
        .key_len = (uint16_t)key_len,
        .status = req->type == GS_STORE_HELLO || req->type == GS_STORE_SURVIVORS ? req->flags : 0,
        .rank = req->type == GS_STORE_HELLO ? (uint32_t)c->rank : 0,
        .arg = req->arg,
        .value_len = req->len,
    };
    gs_status status = gs_boot_sock_send(c->fd, &hdr, sizeof(hdr), deadline_ns);
    if (status == GS_OK && key_len)
        status = gs_boot_sock_send(c->fd, req->key, key_len, deadline_ns);
    if (status == GS_OK && req->len)
        status = gs_boot_sock_send(c->fd, req->value, req->len, deadline_ns);
    return status;
}

/* Receives len bytes, keeping the first cap in buf and dropping the rest. */
static gs_status recv_capped(int fd, void *buf, size_t cap, uint64_t len, uint64_t deadline_ns)
{
    char sink[4096];
    size_t keep = len < cap ? (size_t)len : cap;
    gs_status status = keep ? gs_boot_sock_recv(fd, buf, keep, deadline_ns) : GS_OK;
    for (uint64_t left = len - keep; status == GS_OK && left > 0;) {
        size_t n = left < sizeof(sink) ? (size_t)left : sizeof(sink);
        status = gs_boot_sock_recv(fd, sink, n, deadline_ns);
        left -= n;
    }
    return status;
}

static gs_status connection_failed(const gs_store_client *c, gs_status status, exchange_result *res)
{
    if (status == GS_ERR_TIMEOUT)
        snprintf(res->text, sizeof(res->text), "the store at %s did not answer in time", c->addr);
    else if (status == GS_ERR_PEER_LOST)
        snprintf(res->text, sizeof(res->text),
                 "lost the connection to the store at %s (closed by the other side)", c->addr);
    else
        snprintf(res->text, sizeof(res->text), "lost the connection to the store at %s (%s)", c->addr,
                 strerror(errno));
    return status == GS_ERR_TIMEOUT ? GS_ERR_TIMEOUT : GS_ERR_PEER_LOST;
}

/* Sends req and receives its answer; reports nothing (see res). */
static gs_status exchange(gs_store_client *c, const gs_store_request *req, gs_store_reply *reply,
                          uint64_t deadline_ns, exchange_result *res)
{
    gs_store_hdr hdr;
    gs_status status = send_request(c, req, deadline_ns);

    res->answered = false;
    if (status == GS_OK)
        status = gs_boot_sock_recv(c->fd, &hdr, sizeof(hdr), deadline_ns);
    if (status != GS_OK)
        return connection_failed(c, status, res);
    if (hdr.version != GS_STORE_PROTO_VERSION || hdr.type != GS_STORE_REPLY ||
        (hdr.status < 0 && hdr.value_len > GS_STORE_ERROR_MAX)) {
        snprintf(res->text, sizeof(res->text),
                 "malformed answer (version %u, type %u): is that address a gradsync store?", hdr.version,
                 hdr.type);
        return GS_ERR_PROTOCOL;
    }
    if (hdr.status < 0) {
        status = gs_boot_sock_recv(c->fd, res->text, (size_t)hdr.value_len, deadline_ns);
        if (status != GS_OK)
            return connection_failed(c, status, res);
        res->text[hdr.value_len] = '\0';
        res->answered = true;
        return (gs_status)hdr.status;
    }
    status =
        recv_capped(c->fd, reply ? reply->buf : NULL, reply ? reply->cap : 0, hdr.value_len, deadline_ns);
    if (status != GS_OK)
        return connection_failed(c, status, res);
    if (reply)
        reply->len = (size_t)hdr.value_len;
    return GS_OK;
}

gs_status gs_boot_client_request(gs_store_client *c, const gs_store_request *req, gs_store_reply *reply_p)
{
    gs_store_reply reply = {0};
    exchange_result res;
    const char *key = req->key ? req->key : "";
    uint32_t wait_ms;
    gs_status status;

    if (reply_p)
        reply = *reply_p;
    pthread_mutex_lock(&c->lock);
    if (c->broken) {
        status = gs_fail(GS_SUBSYS_BOOT, GS_ERR_PEER_LOST,
                         "rank %d: store %s '%s': the connection to the store at %s failed earlier; the job "
                         "cannot continue",
                         c->rank, msg_names[req->type], key, c->addr);
        goto out;
    }
    wait_ms = req->type == GS_STORE_PUT ? (uint32_t)c->timeout_ms : req->arg;
    status = exchange(c, req, &reply, gs_deadline_after_ms((int64_t)wait_ms + REPLY_GRACE_MS), &res);
    if (status == GS_OK)
        goto out;
    if (res.answered) {
        if (req->quiet && status == GS_ERR_TIMEOUT)
            status = gs_fail_quiet(GS_SUBSYS_BOOT, status, "rank %d: %s", c->rank, res.text);
        else
            status = gs_fail(GS_SUBSYS_BOOT, status, "rank %d: %s", c->rank, res.text);
        goto out;
    }
    c->broken = true;
    status = gs_fail(GS_SUBSYS_BOOT, status, "rank %d: store %s '%s': %s; did rank 0 or the launcher exit?",
                     c->rank, msg_names[req->type], key, res.text);
out:
    pthread_mutex_unlock(&c->lock);
    if (status == GS_OK && reply_p)
        *reply_p = reply;
    return status;
}

/* Connects and says HELLO until the server accepts, refuses, or the
 * deadline passes. */
static gs_status hello_until(gs_store_client *c, const char *host, int port, const char *token, int flags,
                             uint64_t deadline_ns, exchange_result *res)
{
    gs_store_request req = {.type = GS_STORE_HELLO,
                            .value = token,
                            .len = strlen(token),
                            .arg = (uint32_t)c->size,
                            .flags = flags};
    gs_status status;

    for (;;) {
        status = gs_boot_sock_connect(host, port, deadline_ns, &c->fd);
        if (status != GS_OK) {
            snprintf(res->text, sizeof(res->text), "%s",
                     status == GS_ERR_TIMEOUT  ? "nothing accepted the connection"
                     : status == GS_ERR_CONFIG ? "the host name does not resolve"
                                               : strerror(errno));
            res->answered = false;
            return status == GS_ERR_CONFIG ? GS_ERR_CONFIG : GS_ERR_TIMEOUT;
        }
        status = exchange(c, &req, NULL, deadline_ns, res);
        if (status == GS_OK || res->answered || gs_deadline_passed(deadline_ns))
            return status;
        close(c->fd); /* dropped before answering: the server may be restarting; retry */
        c->fd = -1;
        usleep(20000);
    }
}

gs_status gs_boot_client_connect(const char *host, int port, int rank, int size, const char *token,
                                 int timeout_ms, gs_store_client **client_p)
{
    return gs_boot_client_join(host, port, rank, size, token, timeout_ms, 0, client_p);
}

gs_status gs_boot_client_join(const char *host, int port, int rank, int size, const char *token,
                              int timeout_ms, int flags, gs_store_client **client_p)
{
    gs_store_client *c = gs_calloc(1, sizeof(*c));
    exchange_result res;
    gs_status status;

    if (!c)
        return GS_ERR_NOMEM;
    c->fd = -1;
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms;
    snprintf(c->addr, sizeof(c->addr), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    pthread_mutex_init(&c->lock, NULL);
    status = hello_until(c, host, port, token, flags, gs_deadline_after_ms(timeout_ms), &res);
    if (status == GS_OK) {
        gs_log_debug(BOOT, "rank %d: connected to the store at %s", rank, c->addr);
        *client_p = c;
        return GS_OK;
    }
    if (res.answered)
        status = gs_fail(GS_SUBSYS_BOOT, status, "rank %d: %s (store at %s)", rank, res.text, c->addr);
    else
        status =
            gs_fail(GS_SUBSYS_BOOT, status,
                    "rank %d: cannot join the store at %s within %d ms: %s; is rank 0 (or gsrun) running, "
                    "and is GS_STORE (or MASTER_ADDR/MASTER_PORT) right?",
                    rank, c->addr, timeout_ms, res.text);
    if (c->fd >= 0)
        close(c->fd);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return status;
}

void gs_boot_client_close(gs_store_client *c)
{
    gs_store_hdr bye = {.version = GS_STORE_PROTO_VERSION, .type = GS_STORE_BYE};
    if (!c)
        return;
    if (!c->broken && gs_boot_sock_send(c->fd, &bye, sizeof(bye), gs_deadline_after_ms(1000)) != GS_OK)
        gs_log_debug(BOOT, "rank %d: could not say BYE to the store at %s", c->rank, c->addr);
    close(c->fd);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
