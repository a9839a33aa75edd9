/* The tcp transport's ops table, and its open and close: listen on the
 * chosen interface, publish the address and a fresh nonce through the
 * bootstrap store, connect to every peer (proving the job token), then run
 * the progress engine from the caller's polls and, optionally, a thread. */
#include "transport/tcp/tcp.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

unsigned gs_tcp_caps(const gs_tp *tp)
{
    (void)tp;
    return GS_TP_CAP_USER_MEM | GS_TP_CAP_ATOMIC | GS_TP_CAP_ZCOPY_SEND;
}

static gs_status make_nonce(int rank, uint8_t nonce[GS_TCP_NONCE_BYTES])
{
    if (getrandom(nonce, GS_TCP_NONCE_BYTES, 0) != GS_TCP_NONCE_BYTES)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM, "rank %d: getrandom for the tcp nonce failed: %s", rank,
                       strerror(errno));
    return GS_OK;
}

/* Listens, publishes our address, learns everyone's (blobs: [size]). */
static gs_status exchange_addresses(gs_tcp_tp *tp, gs_ctx *ctx, int *lfd_p, gs_tcp_addr_blob *blobs)
{
    const gs_config *cfg = tp->base.cfg;
    gs_tcp_addr addr, bound;
    gs_tcp_addr_blob mine;
    uint8_t nonce[GS_TCP_NONCE_BYTES];
    char tag[64], text[80];
    gs_status status = gs_tcp_addr_choose(cfg, ctx->boot.store_host, ctx->boot.store_port, ctx->rank, &addr);
    if (status == GS_OK)
        status = gs_tcp_listen(&addr, 2 * ctx->size + 16, ctx->rank, lfd_p, &bound);
    if (status == GS_OK)
        status = make_nonce(ctx->rank, nonce);
    if (status != GS_OK)
        return status;
    gs_tcp_addr_format(&bound, text, sizeof(text));
    gs_log_info(TCP, "rank %d: tcp transport %u listening on %s", ctx->rank, tp->instance, text);
    gs_tcp_blob_pack(&bound, nonce, &mine);
    snprintf(tag, sizeof(tag), "tcp.%u.addr", tp->instance);
    return gs_store_allgather(ctx, tag, &mine, sizeof(mine), blobs);
}

static gs_status connect_peers(gs_tcp_tp *tp, int lfd, const gs_tcp_addr_blob *blobs)
{
    gs_tcp_setup setup = {.cfg = tp->base.cfg,
                          .rank = tp->base.rank,
                          .size = tp->base.size,
                          .instance = tp->instance,
                          .blobs = blobs,
                          .deadline_ns = gs_deadline_after_ms(tp->base.cfg->timeout_ms)};
    int *fds = gs_calloc(2 * (size_t)tp->base.size, sizeof(int)), *tx_fds = fds ? fds + tp->base.size : NULL;
    gs_status status = fds ? gs_tcp_connect_all(&setup, lfd, fds, tx_fds) : GS_ERR_NOMEM;
    for (int p = 0; status == GS_OK && p < tp->base.size; p++) {
        if (p == tp->base.rank)
            continue;
        status = gs_tcp_ep_attach_both(tp, p, fds[p], tx_fds[p]);
        if (status == GS_OK)
            fds[p] = tx_fds[p] = -1;
    }
    for (int p = 0; fds && p < tp->base.size; p++) {
        if (p == tp->base.rank)
            continue;
        if (fds[p] >= 0)
            close(fds[p]);
        if (tx_fds[p] >= 0)
            close(tx_fds[p]);
    }
    free(fds);
    return status;
}

static gs_status tcp_open(gs_ctx *ctx, const gs_config *cfg, gs_tp **tp_p)
{
    gs_tcp_tp *tp = NULL;
    gs_tcp_addr_blob *blobs = gs_calloc((size_t)ctx->size, sizeof(*blobs));
    int lfd = -1, saved_ns = -1;
    gs_status status = blobs ? gs_tcp_tp_create(cfg, ctx->rank, ctx->size, &tp) : GS_ERR_NOMEM;

    if (status == GS_OK) {
        tp->base.ops = &gs_tcp_ops;
        tp->base.ctx = ctx;
        tp->instance = ctx->tp_open; /* the same on every rank for this open (see gs_ctx) */
        status = gs_tcp_netns_enter(cfg, gs_boot_world_rank(ctx, ctx->rank), &saved_ns);
    }
    if (status == GS_OK)
        status = exchange_addresses(tp, ctx, &lfd, blobs);
    if (status == GS_OK)
        status = connect_peers(tp, lfd, blobs);
    gs_tcp_netns_leave(saved_ns, gs_boot_world_rank(ctx, ctx->rank));
    if (lfd >= 0)
        close(lfd);
    if (status == GS_OK)
        status = gs_tcp_thread_start(tp);
    free(blobs);
    if (status != GS_OK) {
        gs_tcp_tp_destroy(tp);
        return status;
    }
    gs_log_info(TCP, "rank %d: tcp transport %u connected to %d peer(s), progress thread %s", ctx->rank,
                tp->instance, ctx->size - 1,
                cfg->progress_thread ? "serving always" : "serving when the caller is away");
    *tp_p = &tp->base;
    return GS_OK;
}

gs_status gs_tcp_close(gs_tp *tp)
{
    gs_tcp_tp_destroy(gs_tcp_tp_of(tp));
    return GS_OK;
}

gs_status gs_tcp_ep_error(gs_ep *base, char *buf, size_t cap)
{
    gs_tcp_tp *tp = gs_tcp_tp_of(base->tp);
    gs_tcp_ep *ep = (gs_tcp_ep *)base;
    gs_status status = GS_OK;
    pthread_mutex_lock(&tp->lock); /* the progress thread may be failing it */
    if (ep->dead) {
        status = ep->err;
        snprintf(buf, cap, "%s", ep->why);
    }
    pthread_mutex_unlock(&tp->lock);
    return status;
}

/* Large calls only (smaller ones copy: references cost more there,
 * measured); GS_TCP_ZCOPY=auto leaves the choice to the caller's timing. */
static gs_tp_zcopy_mode tcp_zcopy_mode(const gs_tp *tp, size_t bytes)
{
    if (bytes < GS_TCP_ZCOPY_TIMED_MIN || tp->cfg->tcp_zcopy == GS_TCP_ZCOPY_OFF)
        return GS_TP_ZCOPY_NEVER;
    return tp->cfg->tcp_zcopy == GS_TCP_ZCOPY_ON ? GS_TP_ZCOPY_ALWAYS : GS_TP_ZCOPY_TIMED;
}

void gs_tcp_describe(const gs_tp *tp, char *buf, size_t cap)
{
    const gs_config *cfg = tp->cfg;
    static const char *const zcopy[] = {"auto", "on", "off"};
    snprintf(buf, cap, "tcp (interface %s%s, GS_TCP_ZCOPY=%s)",
             cfg->tcp_ifname[0] ? cfg->tcp_ifname : "of the store's route",
             cfg->tcp_netns[0] ? ", in network namespaces" : "",
             cfg->tcp_zcopy >= 0 && cfg->tcp_zcopy < 3 ? zcopy[cfg->tcp_zcopy] : "?");
}

const gs_tp_ops gs_tcp_ops = {
    .name = "tcp",
    .id = GS_TRANSPORT_TCP,
    .reach = {GS_TP_LAT_KERNEL, GS_TP_BW_NETWORK},
    .zcopy_mode = tcp_zcopy_mode,
    .open = tcp_open,
    GS_TP_CONTROL_OPS(gs_tcp),
    GS_TP_DATA_OPS(gs_tcp),
};
