/*
 * The verbs transport: open (device, protection domain, completion queue
 * with its channel, control region, receive pool, one RC queue pair per
 * peer connected through the bootstrap store) and close, and the ops table.
 */
#include "transport/verbs/verbs.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static gs_status fork_setup(const gs_config *cfg, int rank)
{
    int rc;
    if (!cfg->ib_fork_safe)
        return GS_OK;
    rc = ibv_fork_init();
    if (rc != 0)
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
            "rank %d: ibv_fork_init failed: %s (GS_IB_FORK_SAFE=1 must take effect before any other "
            "verbs call of the process)",
            rank, strerror(rc));
    gs_log_info(VERBS, "rank %d: fork safety: %s", rank, gs_verbs_fork_state());
    return GS_OK;
}

static void check_memlock(gs_verbs_tp *vt)
{
    char text[128];
    if (getrlimit(RLIMIT_MEMLOCK, &vt->memlock) != 0) {
        vt->memlock.rlim_cur = vt->memlock.rlim_max = RLIM_INFINITY;
        return;
    }
    gs_verbs_memlock_describe(&vt->memlock, text, sizeof(text));
    if (vt->memlock.rlim_cur != RLIM_INFINITY && vt->memlock.rlim_cur < (64u << 20) && geteuid() != 0)
        gs_log_warn(VERBS,
                    "rank %d: %s: registering gradient buffers may fail; raise it (ulimit -l unlimited)",
                    vt->base.rank, text);
    else
        gs_log_debug(VERBS, "rank %d: %s", vt->base.rank, text);
}

static uint32_t pow2_floor(uint32_t v)
{
    uint32_t p = 1;
    while (p * 2 <= v)
        p *= 2;
    return p;
}

/* Queue depths within the device limits, shrunk until one CQ holds every completion. */
static void size_queues(gs_verbs_tp *vt)
{
    const struct ibv_device_attr *a = &vt->dev.attr;
    uint32_t max_wr = a->max_qp_wr > 0 ? (uint32_t)a->max_qp_wr : 16;
    uint32_t peers = vt->base.size > 1 ? (uint32_t)vt->base.size - 1 : 1;
    uint64_t max_msg = vt->dev.port_attr.max_msg_sz;

    vt->sq_depth = pow2_floor(max_wr < GS_VERBS_SQ_DEPTH ? max_wr : GS_VERBS_SQ_DEPTH);
    vt->rq_depth = max_wr < GS_VERBS_RQ_DEPTH ? max_wr : GS_VERBS_RQ_DEPTH;
    while ((uint64_t)peers * (vt->lanes * vt->sq_depth + vt->rq_depth + vt->lanes) + 16 >
               (uint64_t)a->max_cqe &&
           vt->sq_depth > 8) {
        vt->sq_depth /= 2;
        vt->rq_depth = vt->rq_depth > 8 ? vt->rq_depth / 2 : vt->rq_depth;
    }
    vt->credit_batch = vt->rq_depth / 4 ? vt->rq_depth / 4 : 1;
    vt->max_msg = max_msg == 0 || max_msg > (1u << 30) ? 1u << 30 : (uint32_t)max_msg;
    vt->rd_atomic =
        (uint8_t)(a->max_qp_rd_atom < GS_VERBS_RD_ATOMIC_MAX ? a->max_qp_rd_atom : GS_VERBS_RD_ATOMIC_MAX);
    vt->init_rd_atomic = (uint8_t)(a->max_qp_init_rd_atom < GS_VERBS_RD_ATOMIC_MAX ? a->max_qp_init_rd_atom
                                                                                   : GS_VERBS_RD_ATOMIC_MAX);
    vt->max_inline = UINT32_MAX; /* lowered to what the first queue pair gets */
}

/* Heartbeats often enough that a dead peer surfaces well within GS_TIMEOUT_MS. */
static void plan_heartbeat(gs_verbs_tp *vt)
{
    const gs_config *cfg = vt->base.cfg;
    int64_t interval_ms = gs_verbs_heartbeat_ms(cfg);
    double ack_s = 4.096e-6 * (double)(1ull << gs_verbs_ack_timeout(cfg));
    double retry_s = ack_s * (double)(cfg->ib_retry_cnt + 1);

    vt->hb_interval_ns = (uint64_t)interval_ms * 1000000ull;
    vt->next_hb_ns = gs_now_ns() + vt->hb_interval_ns;
    vt->port_grace_ns =
        (uint64_t)(retry_s * 1e9); /* a port down no longer than the QP retries is ridden out */
    if (cfg->timeout_ms > 0 && (retry_s + 2.0 * (double)interval_ms / 1e3) * 1e3 > (double)cfg->timeout_ms)
        gs_log_warn(
            VERBS,
            "rank %d: a dead peer is detected after about %.0f ms (GS_IB_TIMEOUT=%lld, "
            "GS_IB_RETRY_CNT=%lld), longer than GS_TIMEOUT_MS=%lld: waits may end in GS_ERR_TIMEOUT first",
            vt->base.rank, (retry_s + 2.0 * (double)interval_ms / 1e3) * 1e3,
            (long long)gs_verbs_ack_timeout(cfg), (long long)cfg->ib_retry_cnt, (long long)cfg->timeout_ms);
}

static gs_status set_nonblocking(int fd, int rank, const char *what)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: making the %s fd non-blocking failed: %s",
                       rank, what, strerror(errno));
    return GS_OK;
}

static gs_status create_cq(gs_verbs_tp *vt)
{
    int rank = vt->base.rank;
    uint32_t peers = vt->base.size > 1 ? (uint32_t)vt->base.size - 1 : 1;
    int cqe = (int)(peers * (vt->lanes * vt->sq_depth + vt->rq_depth + vt->lanes) + 16); /* + side receives */
    gs_status status;

    vt->chan = ibv_create_comp_channel(vt->dev.ctx);
    if (!vt->chan)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_create_comp_channel failed: %s", rank,
                       strerror(errno));
    status = set_nonblocking(vt->chan->fd, rank, "completion channel");
    if (status == GS_OK)
        status = set_nonblocking(vt->dev.ctx->async_fd, rank, "async event");
    if (status != GS_OK)
        return status;
    vt->cq = ibv_create_cq(vt->dev.ctx, cqe, vt, vt->chan, 0);
    if (!vt->cq)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_create_cq of %d entries failed: %s",
                       rank, cqe, strerror(errno));
    return GS_OK;
}

/* The control slots and the receive pool, each one registered region. */
static gs_status create_regions(gs_verbs_tp *vt)
{
    size_t peers = vt->base.size > 1 ? (size_t)vt->base.size - 1 : 1;
    gs_status status;

    vt->ctrl_len = (size_t)vt->base.size * sizeof(gs_verbs_ctrl);
    status = gs_pages_alloc(vt->ctrl_len, (void **)&vt->ctrl);
    if (status != GS_OK)
        return status;
    status =
        gs_verbs_reg_raw(vt, vt->ctrl, vt->ctrl_len, IBV_ACCESS_LOCAL_WRITE, "control slots", &vt->ctrl_mr);
    if (status != GS_OK)
        return status;
    vt->ctrl_peer_mr = gs_calloc((size_t)vt->base.size, sizeof(*vt->ctrl_peer_mr));
    if (!vt->ctrl_peer_mr)
        return GS_ERR_NOMEM;
    for (int peer = 0; peer < vt->base.size; peer++) {
        if (peer == vt->base.rank)
            continue;
        status = gs_verbs_reg_raw(vt, &vt->ctrl[peer], sizeof(gs_verbs_ctrl),
                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                                  "a peer's control slot", &vt->ctrl_peer_mr[peer]);
        if (status != GS_OK)
            return status;
    }
    vt->rbuf_len = peers * vt->rq_depth * GS_SEND_MAX;
    status = gs_pages_alloc(vt->rbuf_len, (void **)&vt->rbuf);
    if (status != GS_OK)
        return status;
    return gs_verbs_reg_raw(vt, vt->rbuf, vt->rbuf_len, IBV_ACCESS_LOCAL_WRITE, "receive buffers",
                            &vt->rbuf_mr);
}

/* Rail r >= 1: its protection domain and completion queue (side lanes only: no receives beyond one each). */
static gs_status create_rail(gs_verbs_tp *vt, gs_verbs_rail *rail)
{
    int rank = vt->base.rank;
    uint32_t peers = vt->base.size > 1 ? (uint32_t)vt->base.size - 1 : 1;
    int cqe = (int)(peers * (vt->lanes * (vt->sq_depth + 1)) + 16);
    gs_status status;

    rail->pd = ibv_alloc_pd(rail->dev.ctx);
    if (!rail->pd)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_alloc_pd on %s failed: %s", rank,
                       rail->dev.name, strerror(errno));
    rail->chan = ibv_create_comp_channel(rail->dev.ctx);
    if (!rail->chan)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_create_comp_channel on %s failed: %s",
                       rank, rail->dev.name, strerror(errno));
    status = set_nonblocking(rail->chan->fd, rank, "completion channel");
    if (status == GS_OK)
        status = set_nonblocking(rail->dev.ctx->async_fd, rank, "async event");
    if (status != GS_OK)
        return status;
    rail->cq = ibv_create_cq(rail->dev.ctx, cqe, vt, rail->chan, 0);
    if (!rail->cq)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
                       "rank %d: ibv_create_cq of %d entries on %s failed: %s", rank, cqe, rail->dev.name,
                       strerror(errno));
    return GS_OK;
}

static void close_rail(gs_verbs_tp *vt, gs_verbs_rail *rail)
{
    int rc;
    if (rail->cq) {
        if (rail->cq_events_unacked)
            ibv_ack_cq_events(rail->cq, rail->cq_events_unacked);
        if ((rc = ibv_destroy_cq(rail->cq)) != 0)
            gs_log_warn(VERBS, "rank %d: ibv_destroy_cq on %s failed: %s", vt->base.rank, rail->dev.name,
                        strerror(rc));
    }
    if (rail->chan && (rc = ibv_destroy_comp_channel(rail->chan)) != 0)
        gs_log_warn(VERBS, "rank %d: ibv_destroy_comp_channel on %s failed: %s", vt->base.rank,
                    rail->dev.name, strerror(rc));
    if (rail->pd && (rc = ibv_dealloc_pd(rail->pd)) != 0)
        gs_log_warn(VERBS, "rank %d: ibv_dealloc_pd on %s failed: %s", vt->base.rank, rail->dev.name,
                    strerror(rc));
    gs_verbs_dev_close(&rail->dev);
}

static gs_status create_resources(gs_verbs_tp *vt)
{
    int rank = vt->base.rank;
    gs_status status = GS_OK;

    for (uint32_t r = 1; r < vt->rails && status == GS_OK; r++)
        status = create_rail(vt, &vt->extra[r - 1]);
    if (status != GS_OK)
        return status;

    vt->pd = ibv_alloc_pd(vt->dev.ctx);
    if (!vt->pd)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_alloc_pd on %s failed: %s", rank,
                       vt->dev.name, strerror(errno));
    status = create_cq(vt);
    if (status == GS_OK)
        status = create_regions(vt);
    if (status != GS_OK)
        return status;
    vt->dirty = gs_calloc((size_t)vt->base.size, sizeof(*vt->dirty));
    vt->base.eps = gs_calloc((size_t)vt->base.size, sizeof(*vt->base.eps));
    if (!vt->dirty || !vt->base.eps)
        return GS_ERR_NOMEM;
    for (int peer = 0; peer < vt->base.size && status == GS_OK; peer++) {
        gs_verbs_ep *ep = NULL;
        if (peer == rank)
            continue;
        status = gs_verbs_ep_create(vt, peer, &ep);
        if (status == GS_OK)
            vt->base.eps[peer] = &ep->base;
    }
    return status;
}

/*
 * Collective: every rank tells the others how its part of step went (mine) and
 * learns how theirs went. GS_OK when every part went well; else every rank
 * returns the same verdict, recorded (not logged: gs_tp_open decides whether it
 * is an error or auto's reason to fall back) as the first failed rank's own
 * words: GS_ERR_CONFIG when that rank's failure was a setting (fix it), else
 * GS_ERR_UNSUPPORTED (verbs cannot be used by this job). An error of the store
 * itself is returned as it is: then the ranks could not agree.
 */
static gs_status agree(gs_ctx *ctx, const char *step, gs_status mine)
{
    gs_verbs_open_note note = {.status = mine, .rank = (uint32_t)ctx->rank};
    gs_verbs_open_note *all = gs_calloc((size_t)ctx->size, sizeof(*all));
    char tag[64];
    gs_status status;

    if (!all)
        return GS_ERR_NOMEM;
    if (mine != GS_OK)
        snprintf(note.why, sizeof(note.why), "%s", gs_last_error());
    snprintf(tag, sizeof(tag), "gs.verbs.%u.%s", ctx->tp_open, step);
    status = gs_store_allgather(ctx, tag, &note, sizeof(note), all);
    for (int r = 0; status == GS_OK && r < ctx->size; r++) {
        if (all[r].status == GS_OK)
            continue;
        all[r].why[sizeof(all[r].why) - 1] = '\0';
        status = all[r].status == GS_ERR_CONFIG ? GS_ERR_CONFIG : GS_ERR_UNSUPPORTED;
        if (r == ctx->rank)
            gs_fail_quiet(GS_SUBSYS_VERBS, status, "%s", all[r].why);
        else
            gs_fail_quiet(GS_SUBSYS_VERBS, status, "rank %d: verbs cannot be used: %s", ctx->rank,
                          all[r].why[0] ? all[r].why : "(another rank failed without saying why)");
    }
    free(all);
    return status;
}

/* Every rank publishes one blob per peer, then reads the one each peer published for it. */
static gs_status connect_all(gs_verbs_tp *vt)
{
    gs_ctx *ctx = vt->base.ctx;
    int rank = vt->base.rank;
    unsigned serial = ctx->tp_open; /* the same on every rank for this open (see gs_ctx) */
    char key[96];
    gs_status status = GS_OK;

    for (int peer = 0; peer < vt->base.size && status == GS_OK; peer++) {
        gs_verbs_conn_blob blob;
        if (peer == rank)
            continue;
        gs_verbs_ep_fill_blob(vt, gs_verbs_ep_at(vt, peer), &blob);
        snprintf(key, sizeof(key), "gs.verbs.%u.%d.%d", serial, rank, peer);
        status = gs_store_put(ctx, key, &blob, sizeof(blob));
    }
    for (int peer = 0; peer < vt->base.size && status == GS_OK; peer++) {
        gs_verbs_conn_blob blob;
        size_t len = 0;
        if (peer == rank)
            continue;
        snprintf(key, sizeof(key), "gs.verbs.%u.%d.%d", serial, peer, rank);
        status = gs_store_get(ctx, key, &blob, sizeof(blob), &len);
        if (status == GS_OK && len != sizeof(blob))
            status = gs_fail(
                GS_SUBSYS_VERBS, GS_ERR_PROTOCOL,
                "rank %d: peer rank %d's verbs connection blob has %zu bytes, expected %zu: run the same "
                "gradsync build on every rank",
                rank, peer, len, sizeof(blob));
        if (status == GS_OK)
            status = gs_verbs_ep_check_blob(vt, peer, &blob);
        if (status == GS_OK)
            status = gs_verbs_ep_connect(vt, gs_verbs_ep_at(vt, peer), &blob);
    }
    return status;
}

/*
 * The data-path probe: one signaled 8-byte READ of each peer's control slot,
 * waited for. A port can be ACTIVE and the store reachable while RDMA between
 * the hosts does not work (a GID, VLAN or MTU mismatch, a firewall on RoCE's
 * UDP port 4791, two fabrics that do not meet); this finds out at open, where
 * auto can still choose tcp, instead of at the first collective.
 */
static gs_status probe_peers(gs_verbs_tp *vt)
{
    uint64_t start = gs_now_ns(), deadline = gs_deadline_after_ms(vt->base.cfg->timeout_ms);
    gs_status status = GS_OK;
    bool pending = true;

    for (int peer = 0; peer < vt->base.size && status == GS_OK; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (ep)
            status = gs_verbs_post_ctrl(ep, GS_VERBS_SLOT_PROBE);
    }
    while (status == GS_OK && pending) {
        status = gs_verbs_progress(vt);
        pending = false;
        for (int peer = 0; peer < vt->base.size && status == GS_OK; peer++) {
            gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
            if (!ep)
                continue;
            if (ep->state != GS_VERBS_EP_READY)
                status = gs_verbs_ep_report(ep, ep->state == GS_VERBS_EP_CLOSED ? GS_ERR_PEER_LOST : ep->err,
                                            "%s", ep->why);
            else if (ep->probe_outstanding && gs_deadline_passed(deadline))
                status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_TIMEOUT,
                                 "rank %d: the data-path probe (an 8-byte READ of peer rank %d's control "
                                 "slot) over %s port %u got no completion in %.0f ms",
                                 vt->base.rank, peer, vt->dev.name, vt->dev.port,
                                 (double)(gs_now_ns() - start) / 1e6);
            else
                pending |= ep->probe_outstanding;
        }
        if (status == GS_OK &&
            pending) /* sleep: more ranks than cores, and rxe's kernel work, need the CPU */
            status = gs_verbs_block_once(vt, deadline);
    }
    if (status == GS_OK)
        gs_log_debug(VERBS, "rank %d: data-path probe of %d peers over %s port %u passed in %.1f ms",
                     vt->base.rank, vt->base.size - 1, vt->dev.name, vt->dev.port,
                     (double)(gs_now_ns() - start) / 1e6);
    return status;
}

/* Tells every connected peer we are leaving, so its heartbeat failing on us is not an error. */
static void notify_close(gs_verbs_tp *vt)
{
    int64_t ms = vt->base.cfg->timeout_ms < 3000 ? vt->base.cfg->timeout_ms : 3000;
    uint64_t deadline = gs_deadline_after_ms(ms);
    bool pending = false;

    for (int peer = 0; peer < vt->base.size; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (ep && ep->state == GS_VERBS_EP_READY && !gs_verbs_peer_closed(ep))
            pending |= gs_verbs_post_ctrl(ep, GS_VERBS_SLOT_CLOSE) == GS_OK;
    }
    while (pending && !gs_deadline_passed(deadline)) {
        pending = false;
        if (gs_verbs_progress(vt) != GS_OK)
            break;
        /* A peer that is closing as well does not need to hear from us. */
        for (int peer = 0; peer < vt->base.size; peer++) {
            gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
            if (ep && ep->state == GS_VERBS_EP_READY && ep->sq_posted > ep->sq_done &&
                !gs_verbs_peer_closed(ep))
                pending = true;
        }
    }
}

gs_status gs_verbs_close(gs_tp *tp)
{
    gs_verbs_tp *vt = gs_verbs_tp_of(tp);
    int rc;

    if (!vt)
        return GS_OK;
    if (vt->up)
        notify_close(vt);
    for (int peer = 0; vt->base.eps && peer < vt->base.size; peer++)
        gs_verbs_ep_destroy(gs_verbs_ep_at(vt, peer));
    gs_verbs_mr_release_all(vt); /* before the rails' protection domains go */
    for (int peer = 0; vt->ctrl_peer_mr && peer < vt->base.size; peer++)
        if (vt->ctrl_peer_mr[peer] && (rc = ibv_dereg_mr(vt->ctrl_peer_mr[peer])) != 0)
            gs_log_warn(VERBS, "rank %d: deregistering the control slot of rank %d failed: %s", vt->base.rank,
                        peer, strerror(rc));
    free(vt->ctrl_peer_mr);
    if (vt->ctrl_mr && (rc = ibv_dereg_mr(vt->ctrl_mr)) != 0)
        gs_log_warn(VERBS, "rank %d: deregistering the control slots failed: %s", vt->base.rank,
                    strerror(rc));
    if (vt->rbuf_mr && (rc = ibv_dereg_mr(vt->rbuf_mr)) != 0)
        gs_log_warn(VERBS, "rank %d: deregistering the receive buffers failed: %s", vt->base.rank,
                    strerror(rc));
    gs_pages_free(vt->ctrl, vt->ctrl_len);
    gs_pages_free(vt->rbuf, vt->rbuf_len);
    if (vt->cq) {
        if (vt->cq_events_unacked)
            ibv_ack_cq_events(vt->cq, vt->cq_events_unacked);
        if ((rc = ibv_destroy_cq(vt->cq)) != 0)
            gs_log_warn(VERBS, "rank %d: ibv_destroy_cq failed: %s", vt->base.rank, strerror(rc));
    }
    if (vt->chan && (rc = ibv_destroy_comp_channel(vt->chan)) != 0)
        gs_log_warn(VERBS, "rank %d: ibv_destroy_comp_channel failed: %s", vt->base.rank, strerror(rc));
    if (vt->pd && (rc = ibv_dealloc_pd(vt->pd)) != 0)
        gs_log_warn(VERBS, "rank %d: ibv_dealloc_pd failed: %s", vt->base.rank, strerror(rc));
    gs_verbs_dev_close(&vt->dev);
    for (uint32_t r = 1; r < vt->rails; r++)
        close_rail(vt, &vt->extra[r - 1]);
    free(vt->outq);
    free(vt->dirty);
    free(vt->base.eps);
    free(vt);
    return GS_OK;
}

/* This rank's own part: settings, device, queues and regions (nothing another rank needs yet). */
static gs_status open_local(gs_ctx *ctx, const gs_config *cfg, gs_verbs_tp **vt_p)
{
    gs_verbs_tp *vt;
    gs_status status = gs_verbs_config_check(cfg);

    if (status == GS_OK)
        status = fork_setup(cfg, ctx->rank);
    if (status != GS_OK)
        return status;
    vt = gs_calloc(1, sizeof(*vt));
    if (!vt)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_NOMEM, "rank %d: no memory for the verbs transport",
                       ctx->rank);
    vt->base = (gs_tp){.ops = &gs_verbs_ops, .ctx = ctx, .cfg = cfg, .rank = ctx->rank, .size = ctx->size};
    vt->lanes = (uint32_t)cfg->ib_qps_per_peer;
    vt->rails = (uint32_t)cfg->ib_rails;
    *vt_p = vt;
    {
        gs_verbs_dev devs[GS_VERBS_RAILS_MAX] = {{0}};
        status = gs_verbs_devs_open(cfg, ctx->rank, devs, (int)vt->rails);
        if (status != GS_OK) {
            vt->rails = 1; /* nothing of the others to close */
            return status;
        }
        vt->dev = devs[0];
        for (uint32_t r = 1; r < vt->rails; r++)
            vt->extra[r - 1].dev = devs[r];
    }
    check_memlock(vt);
    size_queues(vt);
    plan_heartbeat(vt);
    return create_resources(vt);
}

/*
 * Three steps, each ended by an agreement of all ranks (agree), so a rank
 * whose part failed never leaves the others waiting for its blobs, and either
 * every rank uses verbs or none does: this rank's own setup; the connection of
 * every queue pair (after which every one is ready to receive); the data-path
 * probe.
 */
static gs_status verbs_open(gs_ctx *ctx, const gs_config *cfg, gs_tp **tp_p)
{
    gs_verbs_tp *vt = NULL;
    gs_status status = agree(ctx, "local", open_local(ctx, cfg, &vt));

    if (status == GS_OK)
        status = agree(ctx, "up", connect_all(vt));
    if (status == GS_OK)
        status = agree(ctx, "probe", probe_peers(vt));
    if (status != GS_OK) {
        gs_verbs_close(vt ? &vt->base : NULL);
        return status;
    }
    vt->up = true;
    char stripes[160] = "no striping";
    if (vt->lanes > 1)
        snprintf(stripes, sizeof(stripes), "WRITE/READ of %llu bytes or more striped across them%s%s%s",
                 (unsigned long long)cfg->ib_stripe_min, vt->rails > 1 ? ", over rails " : "",
                 vt->rails > 1 ? vt->dev.name : "", vt->rails > 1 ? " and " : "");
    if (vt->rails > 1)
        snprintf(stripes + strlen(stripes), sizeof(stripes) - strlen(stripes), "%s", vt->extra[0].dev.name);
    gs_log_info(VERBS,
                "rank %d: verbs up on %s: %d peers, %u QP%s per peer (%s), %u send / %u receive WRs per QP, "
                "inline %u bytes; libibverbs calls: %s",
                ctx->rank, vt->dev.name, ctx->size - 1, vt->lanes, vt->lanes == 1 ? "" : "s", stripes,
                vt->sq_depth, vt->rq_depth, vt->max_inline, gs_verbs_compat_summary());
    *tp_p = &vt->base;
    return GS_OK;
}

unsigned gs_verbs_caps(const gs_tp *tp)
{
    const gs_verbs_tp *vt = (const gs_verbs_tp *)tp;
    unsigned caps = GS_TP_CAP_USER_MEM;
    if (vt->dev.attr.atomic_cap != IBV_ATOMIC_NONE)
        caps |= GS_TP_CAP_ATOMIC;
    return caps;
}

gs_status gs_verbs_ep_error(gs_ep *base, char *buf, size_t cap)
{
    const gs_verbs_ep *ep = (const gs_verbs_ep *)base;
    if (ep->state != GS_VERBS_EP_FAILED && ep->state != GS_VERBS_EP_CLOSED)
        return GS_OK;
    snprintf(buf, cap, "%s", ep->why);
    return ep->state == GS_VERBS_EP_CLOSED ? GS_ERR_PEER_LOST : ep->err;
}

void gs_verbs_describe(const gs_tp *tp, char *buf, size_t cap)
{
    const gs_verbs_dev *d = &((const gs_verbs_tp *)tp)->dev;
    char gid[INET6_ADDRSTRLEN] = "-";
    if (d->gid_index >= 0)
        inet_ntop(AF_INET6, d->gid.raw, gid, sizeof(gid));
    snprintf(
        buf, cap,
        "verbs (device %s port %u, %s, LID %u, GID[%d] %s%s, active MTU %d, SL %lld, traffic class %lld, "
        "pkey %#06x (index %u), GS_IB_TIMEOUT=%lld, GS_IB_RETRY_CNT=%lld, %lld QP%s per peer, stripes from "
        "%llu bytes)",
        d->name, d->port, d->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", d->lid,
        d->gid_index, gid, d->gid_type == GS_VERBS_GID_TYPE_ROCE_V2 ? " (RoCE v2)" : "",
        128 << d->port_attr.active_mtu, (long long)tp->cfg->ib_sl, (long long)tp->cfg->ib_tc, d->pkey,
        d->pkey_index, (long long)gs_verbs_ack_timeout(tp->cfg), (long long)tp->cfg->ib_retry_cnt,
        (long long)tp->cfg->ib_qps_per_peer, tp->cfg->ib_qps_per_peer == 1 ? "" : "s",
        (unsigned long long)tp->cfg->ib_stripe_min);
    if (((const gs_verbs_tp *)tp)->rails > 1) {
        const gs_verbs_dev *r = &((const gs_verbs_tp *)tp)->extra[0].dev;
        size_t used = strlen(buf);
        snprintf(buf + used, cap > used ? cap - used : 0, "; rail 1: device %s port %u (NUMA node %d)",
                 r->name, r->port, r->numa_node);
    }
}

const gs_tp_ops gs_verbs_ops = {
    .name = "verbs",
    .id = GS_TRANSPORT_VERBS,
    .open_agrees = true,
    .available = gs_verbs_available,
    .devices = gs_verbs_devices_text,
    .reach = {GS_TP_LAT_RDMA, GS_TP_BW_NETWORK},
    .open = verbs_open,
    GS_TP_CONTROL_OPS(gs_verbs),
    GS_TP_DATA_OPS(gs_verbs),
};
