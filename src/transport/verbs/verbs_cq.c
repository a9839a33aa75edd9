/*
 * Completions: the completion queue drained into user completions, every
 * work-completion status mapped to a gradsync status with a hint, endpoint
 * failure (outstanding operations complete with the error, later ones
 * flush), liveness by heartbeat READs, and waiting by busy polling or on the
 * completion channel.
 */
#include "transport/verbs/verbs.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct wc_status_info {
    enum ibv_wc_status status;
    gs_status gs;
    const char *hint;
} wc_status_info;

static const wc_status_info wc_statuses[] = {
    {IBV_WC_SUCCESS, GS_OK, ""},
    {IBV_WC_LOC_LEN_ERR, GS_ERR_PROTOCOL,
     "a message longer than the receive buffer, or a local length beyond the device limit"},
    {IBV_WC_LOC_QP_OP_ERR, GS_ERR_INVALID,
     "the work request was malformed for this queue pair (e.g. too much inline data)"},
    {IBV_WC_LOC_EEC_OP_ERR, GS_ERR_SYSTEM, "local EE context error"},
    {IBV_WC_LOC_PROT_ERR, GS_ERR_INVALID,
     "the local buffer is not inside its registered region, or lacks local write for a READ/atomic result"},
    {IBV_WC_WR_FLUSH_ERR, GS_ERR_FLUSHED, "flushed: the queue pair had already failed"},
    {IBV_WC_MW_BIND_ERR, GS_ERR_INVALID, "memory window bind failed"},
    {IBV_WC_BAD_RESP_ERR, GS_ERR_PROTOCOL, "unexpected response from the peer"},
    {IBV_WC_LOC_ACCESS_ERR, GS_ERR_REMOTE_ACCESS,
     "an incoming WRITE_IMM was refused here: bad key, out of bounds or no permission"},
    {IBV_WC_REM_INV_REQ_ERR, GS_ERR_PROTOCOL,
     "the peer refused the request as invalid: unsupported opcode, misaligned atomic, or a message longer "
     "than its receive buffer"},
    {IBV_WC_REM_ACCESS_ERR, GS_ERR_REMOTE_ACCESS,
     "remote access error: bad key, bounds or permission (the target region must cover the range and be "
     "registered with REMOTE_WRITE/READ/ATOMIC); the target memory is untouched"},
    {IBV_WC_REM_OP_ERR, GS_ERR_PROTOCOL, "the peer could not complete the operation (its receive failed)"},
    {IBV_WC_RETRY_EXC_ERR, GS_ERR_PEER_LOST,
     "no acknowledgement after the retries: peer unreachable or dead, or a GID/MTU mismatch between the "
     "hosts (check GS_IB_GID_INDEX, that both use the same RoCE version, and the fabric with ib_write_lat)"},
    {IBV_WC_RNR_RETRY_EXC_ERR, GS_ERR_PEER_LOST,
     "receiver not ready after the retries: the peer stopped posting receives (raise GS_IB_RNR_RETRY if it "
     "is just slow)"},
    {IBV_WC_LOC_RDD_VIOL_ERR, GS_ERR_PROTOCOL, "local RD domain violation"},
    {IBV_WC_REM_INV_RD_REQ_ERR, GS_ERR_PROTOCOL, "remote invalid RD request"},
    {IBV_WC_REM_ABORT_ERR, GS_ERR_PROTOCOL, "the peer aborted the operation"},
    {IBV_WC_INV_EECN_ERR, GS_ERR_PROTOCOL, "invalid EE context number"},
    {IBV_WC_INV_EEC_STATE_ERR, GS_ERR_PROTOCOL, "invalid EE context state"},
    {IBV_WC_FATAL_ERR, GS_ERR_IO, "fatal device error: check dmesg and the port state"},
    {IBV_WC_RESP_TIMEOUT_ERR, GS_ERR_PEER_LOST, "response timeout: the peer stopped answering"},
    {IBV_WC_GENERAL_ERR, GS_ERR_IO, "general device error"},
    {IBV_WC_TM_ERR, GS_ERR_PROTOCOL, "tag matching error"},
    {IBV_WC_TM_RNDV_INCOMPLETE, GS_ERR_PROTOCOL, "tag matching rendezvous incomplete"},
};

gs_status gs_verbs_wc_status_map(enum ibv_wc_status status, const char **hint_p)
{
    for (size_t i = 0; i < sizeof(wc_statuses) / sizeof(wc_statuses[0]); i++) {
        if (wc_statuses[i].status == status) {
            *hint_p = wc_statuses[i].hint;
            return wc_statuses[i].gs;
        }
    }
    *hint_p = "unknown work completion status";
    return GS_ERR_IO;
}

gs_status gs_verbs_outq_push(gs_verbs_tp *vt, const gs_wc *wc)
{
    if (vt->out_count == vt->out_cap) {
        size_t cap = vt->out_cap ? vt->out_cap * 2 : 64;
        gs_wc *q = gs_calloc(cap, sizeof(*q));
        if (!q)
            return GS_ERR_NOMEM;
        for (size_t i = 0; i < vt->out_count; i++)
            q[i] = vt->outq[(vt->out_head + i) % vt->out_cap];
        free(vt->outq);
        vt->outq = q;
        vt->out_cap = cap;
        vt->out_head = 0;
    }
    vt->outq[(vt->out_head + vt->out_count) % vt->out_cap] = *wc;
    vt->out_count++;
    return GS_OK;
}

static int outq_take(gs_verbs_tp *vt, gs_wc *wcs, int max)
{
    int n = 0;
    while (n < max && vt->out_count > 0) {
        wcs[n++] = vt->outq[vt->out_head];
        vt->out_head = (vt->out_head + 1) % vt->out_cap;
        vt->out_count--;
    }
    return n;
}

static const char *slot_name(const gs_verbs_slot *slot)
{
    static const char *const names[] = {
        [GS_WC_WRITE] = "WRITE",         [GS_WC_WRITE_IMM] = "WRITE_IMM", [GS_WC_READ] = "READ",
        [GS_WC_FETCH_ADD] = "FETCH_ADD", [GS_WC_CMP_SWAP] = "CMP_SWAP",   [GS_WC_SEND] = "SEND"};
    switch (slot->kind) {
    case GS_VERBS_SLOT_CREDIT: return "credit return";
    case GS_VERBS_SLOT_HEARTBEAT: return "heartbeat READ";
    case GS_VERBS_SLOT_PROBE: return "data-path probe (an 8-byte READ of its control slot)";
    case GS_VERBS_SLOT_CLOSE: return "close notice";
    default:
        return slot->opcode < sizeof(names) / sizeof(names[0]) && names[slot->opcode] ? names[slot->opcode]
                                                                                      : "operation";
    }
}

/* Completes the user receives that will never be filled. */
static void fail_user_recvs(gs_verbs_tp *vt, gs_verbs_ep *ep)
{
    gs_verbs_match_recvs(vt, ep); /* what arrived before the failure is still delivered */
    while (ep->urecv_count > 0) {
        gs_verbs_urecv *u = &ep->urecv[ep->urecv_head];
        gs_wc wc = {.wr_id = u->wr_id, .status = GS_ERR_FLUSHED, .opcode = GS_WC_RECV, .peer = ep->base.peer};
        gs_verbs_outq_push(vt, &wc);
        ep->urecv_head = (ep->urecv_head + 1) % GS_VERBS_URECV_MAX;
        ep->urecv_count--;
    }
    ep->held_count = 0;
}

void gs_verbs_ep_fail(gs_verbs_ep *ep, gs_status status, uint64_t failed_seq)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};

    if (ep->state == GS_VERBS_EP_FAILED || ep->state == GS_VERBS_EP_CLOSED)
        return;
    ep->state = GS_VERBS_EP_FAILED;
    ep->err = status;
    ep->err_reported = false;
    if (!ep->why[0])
        snprintf(ep->why, sizeof(ep->why), "rank %d: the endpoint to rank %d failed: %s", vt->base.rank,
                 ep->base.peer, gs_strerror(status));
    /* The hardware stops too (no more retries to a dead peer); what it still reports is stale. */
    if (ep->qp && ibv_modify_qp(ep->qp, &attr, IBV_QP_STATE) != 0)
        gs_log_debug(VERBS, "rank %d: moving the queue pair to rank %d to ERR failed", vt->base.rank,
                     ep->base.peer);
    /* Outstanding slots before failed_seq completed (RC is in order); the rest never will. */
    for (uint64_t seq = ep->sq_done; seq < ep->sq_posted; seq++) {
        gs_verbs_slot *slot = &ep->slots[seq & (vt->sq_depth - 1)];
        gs_wc wc = {.wr_id = slot->wr_id, .opcode = slot->opcode, .peer = ep->base.peer};
        if (slot->kind != GS_VERBS_SLOT_USER || !slot->deliver ||
            (failed_seq != UINT64_MAX && seq < failed_seq))
            continue;
        wc.status = ep->err_reported ? GS_ERR_FLUSHED : status;
        ep->err_reported = true;
        gs_verbs_outq_push(vt, &wc);
    }
    ep->sq_done = ep->sq_posted;
    ep->hb_outstanding = false;
    ep->probe_outstanding = false;
    if (ep->lanes > 1)
        gs_verbs_lanes_fail(ep, status);
    fail_user_recvs(vt, ep);
}

static void ep_mark_closed(gs_verbs_ep *ep)
{
    snprintf(ep->why, sizeof(ep->why), "rank %d: rank %d closed its transport", ep->base.tp->rank,
             ep->base.peer);
    gs_log_debug(VERBS, "%s", ep->why);
    gs_verbs_ep_fail(ep, GS_ERR_PEER_LOST, UINT64_MAX);
    ep->state = GS_VERBS_EP_CLOSED;
    ep->err_reported = true;
}

static void drain_async(gs_verbs_tp *vt);

/* While our port is down, any failed work request is the port's fault, not the peer's. */
static bool blame_port(gs_verbs_tp *vt, gs_verbs_ep *ep, const char *what, const char *id,
                       const struct ibv_wc *wc)
{
    if (!vt->port_down_ns)
        return false;
    snprintf(ep->why, sizeof(ep->why),
             "rank %d: %s%s to rank %d failed (%s) while device %s port %u is down (IBV_EVENT_PORT_ERR %.0f "
             "ms ago): check the link (ibv_devinfo, ip link, the cable or switch port)",
             vt->base.rank, what, id, ep->base.peer, ibv_wc_status_str(wc->status), vt->dev.name,
             vt->dev.port, (double)(gs_now_ns() - vt->port_down_ns) / 1e6);
    return true;
}

/* lane_ep: the queue pair the failed work request was on (seq its slot; UINT64_MAX: a receive). */
static void wc_error(gs_verbs_tp *vt, gs_verbs_ep *lane_ep, const struct ibv_wc *wc, uint64_t seq)
{
    const char *hint;
    gs_status status = gs_verbs_wc_status_map(wc->status, &hint);
    const char *what = seq == UINT64_MAX ? "receive" : slot_name(&lane_ep->slots[seq & (vt->sq_depth - 1)]);
    gs_verbs_ep *ep = lane_ep->parent;
    const gs_verbs_slot *slot = seq == UINT64_MAX ? NULL : &lane_ep->slots[seq & (vt->sq_depth - 1)];

    if (ep->state != GS_VERBS_EP_READY)
        return;      /* the flush that follows the first error */
    drain_async(vt); /* the device's own news first: a port that went down explains this error */
    if (ep->state != GS_VERBS_EP_READY)
        return;
    if (gs_verbs_peer_closed(ep)) {
        ep_mark_closed(ep);
        return;
    }
    if (wc->status == IBV_WC_WR_FLUSH_ERR)
        hint = "the queue pair failed without an error of its own: the peer's side broke the connection "
               "(e.g. one of its requests was refused here) or the device reported a fatal error";
    char id[64] = "";
    if (slot && slot->kind == GS_VERBS_SLOT_USER)
        snprintf(id, sizeof(id), lane_ep->lane ? " (wr_id %llu, lane %u)" : " (wr_id %llu)",
                 (unsigned long long)slot->wr_id, lane_ep->lane);
    if (blame_port(vt, ep, what, id, wc)) {
        status = GS_ERR_IO;
    } else if (slot && slot->kind == GS_VERBS_SLOT_PROBE) {
        snprintf(
            ep->why, sizeof(ep->why),
            "rank %d: the data-path probe (an 8-byte READ of peer rank %d's control slot) over %s port %u "
            "failed: %s, vendor error %#x: %s",
            vt->base.rank, ep->base.peer, vt->dev.name, vt->dev.port, ibv_wc_status_str(wc->status),
            wc->vendor_err, hint);
    } else if (status == GS_ERR_PEER_LOST) {
        char cause[384];
        snprintf(cause, sizeof(cause), "%s%s to it failed: %s, vendor error %#x: %s", what, id,
                 ibv_wc_status_str(wc->status), wc->vendor_err, hint);
        gs_error_peer_lost_text(ep->why, sizeof(ep->why), vt->base.rank, ep->base.peer, cause);
    } else {
        snprintf(ep->why, sizeof(ep->why), "rank %d: %s%s to rank %d failed: %s, vendor error %#x: %s",
                 vt->base.rank, what, id, ep->base.peer, ibv_wc_status_str(wc->status), wc->vendor_err, hint);
    }
    gs_fail(GS_SUBSYS_VERBS, status, "%s", ep->why);
    ep->err_logged = true;
    gs_verbs_ep_fail(ep, status, lane_ep == ep ? seq : UINT64_MAX);
}

/* lane_ep: the endpoint itself (lane 0) or one of its side lanes. */
static void sq_completion(gs_verbs_tp *vt, gs_verbs_ep *lane_ep, const struct ibv_wc *wc, uint64_t now)
{
    uint64_t seq = lane_ep->sq_done + (uint32_t)((uint32_t)wc->wr_id - (uint32_t)lane_ep->sq_done);
    gs_verbs_ep *ep = lane_ep->parent;
    gs_verbs_slot *slot;

    if (seq >= lane_ep->sq_posted)
        return; /* already completed by a failure of the endpoint */
    if (wc->status != IBV_WC_SUCCESS) {
        wc_error(vt, lane_ep, wc, seq);
        return;
    }
    slot = &lane_ep->slots[seq & (vt->sq_depth - 1)];
    lane_ep->sq_done = seq + 1;
    ep->last_alive_ns = now;
    if (ep->lanes > 1 && slot->kind == GS_VERBS_SLOT_USER) {
        gs_verbs_lanes_done(ep, slot->op);
        return;
    }
    if (slot->kind == GS_VERBS_SLOT_HEARTBEAT)
        ep->hb_outstanding = false;
    if (slot->kind == GS_VERBS_SLOT_PROBE)
        ep->probe_outstanding = false;
    if (slot->kind == GS_VERBS_SLOT_USER && slot->deliver) {
        gs_wc out = {.wr_id = slot->wr_id, .status = GS_OK, .opcode = slot->opcode, .peer = ep->base.peer};
        gs_verbs_outq_push(vt, &out);
    }
}

/* The immediate's notice of a striped WRITE_IMM (verbs_stripe.c): its GS_WC_RECV_IMM, with the whole length.
 */
static void imm_notice(gs_verbs_tp *vt, gs_verbs_ep *ep, const struct ibv_wc *wc, uint32_t buf)
{
    gs_verbs_imm_notice notice = {0};
    gs_wc out = {
        .status = GS_OK, .opcode = GS_WC_RECV_IMM, .imm = be32toh(wc->imm_data), .peer = ep->base.peer};

    if (wc->byte_len == sizeof(notice))
        memcpy(&notice, gs_verbs_rbuf_addr(vt, buf), sizeof(notice));
    if (notice.magic != GS_VERBS_NOTICE_MAGIC || notice.reserved != 0 || notice.len > UINT32_MAX) {
        snprintf(ep->why, sizeof(ep->why),
                 "rank %d: rank %d sent a SEND with an immediate that is no striped WRITE_IMM's notice (%u "
                 "bytes, magic %#x, length %llu): run the same gradsync build on every rank",
                 vt->base.rank, ep->base.peer, wc->byte_len, notice.magic, (unsigned long long)notice.len);
        gs_fail(GS_SUBSYS_VERBS, GS_ERR_PROTOCOL, "%s", ep->why);
        ep->err_logged = true;
        gs_verbs_ep_fail(ep, GS_ERR_PROTOCOL, UINT64_MAX);
        return;
    }
    out.len = (uint32_t)notice.len;
    gs_verbs_outq_push(vt, &out);
    gs_verbs_queue_repost(vt, ep, buf);
}

static void rq_completion(gs_verbs_tp *vt, gs_verbs_ep *ep, const struct ibv_wc *wc, uint64_t now)
{
    uint32_t buf = (uint32_t)wc->wr_id;

    if (wc->status != IBV_WC_SUCCESS) {
        wc_error(vt, ep, wc, UINT64_MAX);
        return;
    }
    ep->last_alive_ns = now;
    if (wc->opcode == IBV_WC_RECV && (wc->wc_flags & IBV_WC_WITH_IMM)) {
        imm_notice(vt, ep, wc, buf);
        return;
    }
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        gs_wc out = {.wr_id = 0,
                     .status = GS_OK,
                     .opcode = GS_WC_RECV_IMM,
                     .imm = be32toh(wc->imm_data),
                     .len = wc->byte_len,
                     .peer = ep->base.peer};
        gs_verbs_outq_push(vt, &out);
        gs_verbs_queue_repost(vt, ep, buf);
        return;
    }
    /* A SEND: held in its buffer until a user receive takes it. */
    ep->held[(ep->held_head + ep->held_count) % vt->rq_depth] =
        (gs_verbs_held){.buf = buf, .len = wc->byte_len};
    ep->held_count++;
    gs_verbs_match_recvs(vt, ep);
}

static void handle_wc(gs_verbs_tp *vt, const struct ibv_wc *wc, uint64_t now)
{
    unsigned kind = (unsigned)(wc->wr_id >> 60);
    unsigned lane = (unsigned)((wc->wr_id >> 56) & 0xfu);
    int peer = (int)((wc->wr_id >> 32) & 0xffffff);
    gs_verbs_ep *ep = peer < vt->base.size ? gs_verbs_ep_at(vt, peer) : NULL;

    if (ep && lane > 0)
        ep = lane < ep->lanes ? ep->side[lane - 1] : NULL;
    if (!ep) {
        gs_log_warn(VERBS, "rank %d: completion with unknown wr_id %#llx ignored", vt->base.rank,
                    (unsigned long long)wc->wr_id);
        return;
    }
    if (kind == GS_VERBS_WR_SQ)
        sq_completion(vt, ep, wc, now);
    else
        rq_completion(vt, ep, wc, now);
}

/* Fails every endpoint still up with GS_ERR_IO for cause (the device or its port carries nothing more). */
static void fail_all(gs_verbs_tp *vt, const char *cause)
{
    int failed = 0;
    for (int peer = 0; peer < vt->base.size; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (!ep || ep->state != GS_VERBS_EP_READY)
            continue;
        if (gs_verbs_peer_closed(ep)) {
            ep_mark_closed(ep);
            continue;
        }
        snprintf(ep->why, sizeof(ep->why), "rank %d: the endpoint to rank %d failed: %s", vt->base.rank, peer,
                 cause);
        ep->err_logged = true; /* logged once below, for all of them */
        gs_verbs_ep_fail(ep, GS_ERR_IO, UINT64_MAX);
        failed++;
    }
    if (failed > 0)
        gs_fail(GS_SUBSYS_VERBS, GS_ERR_IO, "rank %d: %s (%d endpoint%s failed)", vt->base.rank, cause,
                failed, failed == 1 ? "" : "s");
}

/* fail_all for an event of the whole device: what it did, after its name and port. */
static void fail_device(gs_verbs_tp *vt, const char *what)
{
    char cause[256];
    snprintf(cause, sizeof(cause), "device %s port %u %s", vt->dev.name, vt->dev.port, what);
    fail_all(vt, cause);
}

/* Gives up on a port that went down and did not come back within the grace (the QP's retry budget). */
static void check_port(gs_verbs_tp *vt, uint64_t now)
{
    char cause[256];
    if (!vt->port_down_ns || now - vt->port_down_ns < vt->port_grace_ns)
        return;
    snprintf(
        cause, sizeof(cause),
        "device %s port %u went down (IBV_EVENT_PORT_ERR) and was not ACTIVE again within %.0f ms: check "
        "the link (ibv_devinfo, ip link, the cable or switch port)",
        vt->dev.name, vt->dev.port, (double)vt->port_grace_ns / 1e6);
    fail_all(vt, cause);
}

static void port_event(gs_verbs_tp *vt, const struct ibv_async_event *ev)
{
    uint64_t now = gs_now_ns();
    if ((uint8_t)ev->element.port_num != vt->dev.port) {
        gs_log_debug(VERBS, "rank %d: device %s: %s on port %d, not ours", vt->base.rank, vt->dev.name,
                     ibv_event_type_str(ev->event_type), ev->element.port_num);
    } else if (ev->event_type == IBV_EVENT_PORT_ERR && !vt->port_down_ns) {
        vt->port_down_ns = now ? now : 1;
        gs_log_warn(VERBS,
                    "rank %d: device %s port %u went down (IBV_EVENT_PORT_ERR): its endpoints fail with "
                    "GS_ERR_IO unless it is ACTIVE again within %.0f ms",
                    vt->base.rank, vt->dev.name, vt->dev.port, (double)vt->port_grace_ns / 1e6);
    } else if (ev->event_type == IBV_EVENT_PORT_ACTIVE && vt->port_down_ns) {
        gs_log_warn(VERBS,
                    "rank %d: device %s port %u is ACTIVE again (IBV_EVENT_PORT_ACTIVE read %.0f ms after "
                    "the PORT_ERR)",
                    vt->base.rank, vt->dev.name, vt->dev.port, (double)(now - vt->port_down_ns) / 1e6);
        vt->port_down_ns = 0;
    }
}

/* The status an affiliated error of a queue pair means for its endpoint. */
static gs_status qp_event_status(int type, const char **hint_p)
{
    switch (type) {
    case IBV_EVENT_QP_REQ_ERR:
        *hint_p = "the peer sent a request this queue pair could not take (invalid request)";
        return GS_ERR_PROTOCOL;
    case IBV_EVENT_QP_ACCESS_ERR:
        *hint_p = "a request of the peer violated the access rights here (bad key, bounds or permission)";
        return GS_ERR_REMOTE_ACCESS;
    default: *hint_p = "the queue pair hit a fatal error (check dmesg)"; return GS_ERR_IO;
    }
}

/* The QP events recorded by gs_verbs_async_event, once the CQ has been polled after them. */
static void apply_qp_events(gs_verbs_tp *vt)
{
    vt->qp_events = false;
    for (int peer = 0; peer < vt->base.size; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        const char *hint;
        gs_status status;
        if (!ep || !ep->qp_event)
            continue;
        status = qp_event_status(ep->qp_event, &hint);
        if (ep->state == GS_VERBS_EP_READY && gs_verbs_peer_closed(ep)) {
            ep_mark_closed(ep);
        } else if (ep->state == GS_VERBS_EP_READY) {
            snprintf(ep->why, sizeof(ep->why),
                     "rank %d: the queue pair to rank %d on %s port %u failed: %s: %s", vt->base.rank, peer,
                     vt->dev.name, vt->dev.port, ibv_event_type_str((enum ibv_event_type)ep->qp_event), hint);
            gs_fail(GS_SUBSYS_VERBS, status, "%s", ep->why);
            ep->err_logged = true;
            gs_verbs_ep_fail(ep, status, UINT64_MAX);
        }
        ep->qp_event = 0;
    }
}

void gs_verbs_async_event(gs_verbs_tp *vt, const struct ibv_async_event *ev)
{
    gs_verbs_ep *ep = NULL;

    switch (ev->event_type) {
    case IBV_EVENT_DEVICE_FATAL:
        fail_device(vt, "reported a fatal error (IBV_EVENT_DEVICE_FATAL): every queue pair on it is lost; "
                        "check dmesg, the device must be reset");
        break;
    case IBV_EVENT_CQ_ERR:
        fail_device(vt, "lost completions: its completion queue failed (IBV_EVENT_CQ_ERR, e.g. an overrun)");
        break;
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE: port_event(vt, ev); break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
        ep = ev->element.qp ? ev->element.qp->qp_context : NULL;
        ep = ep ? ep->parent : NULL; /* a side lane's error fails its endpoint */
        if (ep && !ep->qp_event) {
            ep->qp_event = ev->event_type;
            vt->qp_events = true;
        }
        gs_log_info(VERBS, "rank %d: peer rank %d: device event %s", vt->base.rank, ep ? ep->base.peer : -1,
                    ibv_event_type_str(ev->event_type));
        break;
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
        ep = ev->element.qp ? ev->element.qp->qp_context : NULL;
        gs_log_debug(VERBS, "rank %d: peer rank %d: device event %s", vt->base.rank, ep ? ep->base.peer : -1,
                     ibv_event_type_str(ev->event_type));
        break;
    default:
        gs_log_warn(VERBS, "rank %d: device %s: event %s", vt->base.rank, vt->dev.name,
                    ibv_event_type_str(ev->event_type));
    }
}

/* Reads the devices' asynchronous events (the fds are non-blocking) and acts on each. A second rail's
 * port events are only logged: its queue pairs' own errors (retries exhausted) fail the endpoints. */
static void drain_async(gs_verbs_tp *vt)
{
    struct ibv_async_event ev;
    while (ibv_get_async_event(vt->dev.ctx, &ev) == 0) {
        gs_verbs_async_event(vt, &ev);
        ibv_ack_async_event(&ev);
    }
    for (uint32_t r = 1; r < vt->rails; r++) {
        while (ibv_get_async_event(vt->extra[r - 1].dev.ctx, &ev) == 0) {
            if (ev.event_type == IBV_EVENT_PORT_ERR || ev.event_type == IBV_EVENT_PORT_ACTIVE)
                gs_log_warn(VERBS, "rank %d: rail %u device %s: %s on port %d", vt->base.rank, r,
                            vt->extra[r - 1].dev.name, ibv_event_type_str(ev.event_type),
                            ev.element.port_num);
            else
                gs_verbs_async_event(vt, &ev);
            ibv_ack_async_event(&ev);
        }
    }
}

/* Every hb_interval, a READ of the peer's control slot proves an idle peer alive. */
static void heartbeat(gs_verbs_tp *vt, uint64_t now)
{
    if (now < vt->next_hb_ns)
        return;
    vt->next_hb_ns = now + vt->hb_interval_ns / 2;
    drain_async(vt);
    check_port(vt, now);
    for (int peer = 0; peer < vt->base.size; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (!ep || ep->state != GS_VERBS_EP_READY)
            continue;
        if (gs_verbs_peer_closed(ep))
            ep_mark_closed(ep);
        else if (!ep->hb_outstanding && now - ep->last_alive_ns >= vt->hb_interval_ns)
            gs_verbs_post_ctrl(ep, GS_VERBS_SLOT_HEARTBEAT);
    }
}

/* Drains one completion queue. */
static gs_status drain_cq(gs_verbs_tp *vt, struct ibv_cq *cq, const char *dev_name, uint64_t now)
{
    struct ibv_wc wcs[GS_VERBS_CQ_BATCH];
    int n;
    do {
        n = ibv_poll_cq(cq, GS_VERBS_CQ_BATCH, wcs);
        if (n < 0)
            return gs_fail(GS_SUBSYS_VERBS, GS_ERR_IO, "rank %d: ibv_poll_cq on %s failed (%d)",
                           vt->base.rank, dev_name, n);
        for (int i = 0; i < n; i++)
            handle_wc(vt, &wcs[i], now);
    } while (n == GS_VERBS_CQ_BATCH);
    return GS_OK;
}

gs_status gs_verbs_progress(gs_verbs_tp *vt)
{
    uint64_t now = gs_now_ns();
    gs_status status = GS_OK;

    for (uint32_t r = 1; r < vt->rails && status == GS_OK;
         r++) /* side lanes first: held posts wait on them */
        status = drain_cq(vt, vt->extra[r - 1].cq, vt->extra[r - 1].dev.name, now);
    if (status == GS_OK)
        status = drain_cq(vt, vt->cq, vt->dev.name, now);
    if (status != GS_OK)
        return status;
    if (vt->qp_events)
        apply_qp_events(vt); /* recorded before this pass's poll of the CQ */
    for (int peer = 0; vt->lanes > 1 && peer < vt->base.size; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (ep && ep->defer_count > 0)
            gs_verbs_lanes_flush(ep);
    }
    gs_verbs_flush_reposts(vt);
    heartbeat(vt, now);
    return GS_OK;
}

/*
 * With no completion to return, a lost peer is the answer, every time (a
 * peer that closed cleanly is not lost); another endpoint error that no
 * completion carried is reported once.
 */
static gs_status endpoint_news(gs_verbs_tp *vt)
{
    for (int peer = 0; peer < vt->base.size; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (!ep || ep->state != GS_VERBS_EP_FAILED || (ep->err != GS_ERR_PEER_LOST && ep->err_reported))
            continue;
        ep->err_reported = true;
        return gs_verbs_ep_report(ep, ep->err, "%s", ep->why);
    }
    return GS_OK;
}

gs_status gs_verbs_poll(gs_tp *tp, gs_wc *wcs, int max, int *n_p)
{
    gs_verbs_tp *vt = gs_verbs_tp_of(tp);
    gs_status status = gs_verbs_progress(vt);

    if (status != GS_OK)
        return status;
    if (vt->out_count == 0) {
        status = endpoint_news(vt);
        if (status != GS_OK)
            return status;
    }
    *n_p = outq_take(vt, wcs, max);
    return GS_OK;
}

static gs_status arm_cq(gs_verbs_tp *vt)
{
    int rc = ibv_req_notify_cq(vt->cq, 0);
    for (uint32_t r = 1; rc == 0 && r < vt->rails; r++) {
        rc = ibv_req_notify_cq(vt->extra[r - 1].cq, 0);
        vt->extra[r - 1].cq_armed = rc == 0;
    }
    if (rc != 0)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_req_notify_cq failed: %s", vt->base.rank,
                       strerror(rc));
    vt->cq_armed = true;
    return GS_OK;
}

/* A second rail's completion event: taken, acked in batches; any such event re-arms every queue. */
static void take_rail_event(gs_verbs_tp *vt, gs_verbs_rail *rail)
{
    struct ibv_cq *cq;
    void *cq_ctx;
    if (ibv_get_cq_event(rail->chan, &cq, &cq_ctx) != 0)
        return;
    rail->cq_armed = false;
    vt->cq_armed = false; /* arm_cq arms them all again */
    if (++rail->cq_events_unacked >= 64) {
        ibv_ack_cq_events(rail->cq, rail->cq_events_unacked);
        rail->cq_events_unacked = 0;
    }
}

static void take_cq_event(gs_verbs_tp *vt)
{
    struct ibv_cq *cq;
    void *cq_ctx;
    if (ibv_get_cq_event(vt->chan, &cq, &cq_ctx) != 0)
        return; /* spurious wakeup: the fd is non-blocking */
    vt->cq_armed = false;
    if (++vt->cq_events_unacked >= 64) {
        ibv_ack_cq_events(vt->cq, vt->cq_events_unacked);
        vt->cq_events_unacked = 0;
    }
}

gs_status gs_verbs_block_once(gs_verbs_tp *vt, uint64_t deadline_ns)
{
    uint64_t wake = deadline_ns < vt->next_hb_ns ? deadline_ns : vt->next_hb_ns;
    struct pollfd fds[2 + 2 * (GS_VERBS_RAILS_MAX - 1)] = {{.fd = vt->chan->fd, .events = POLLIN},
                                                           {.fd = vt->dev.ctx->async_fd, .events = POLLIN}};
    nfds_t nfds = 2;
    int rc;

    if (!vt->cq_armed)
        return arm_cq(vt); /* the caller polls once more before sleeping */
    for (uint32_t r = 1; r < vt->rails; r++) {
        fds[nfds++] = (struct pollfd){.fd = vt->extra[r - 1].chan->fd, .events = POLLIN};
        fds[nfds++] = (struct pollfd){.fd = vt->extra[r - 1].dev.ctx->async_fd, .events = POLLIN};
    }
    rc = poll(fds, nfds, gs_deadline_left_ms(wake));
    if (rc < 0 && errno != EINTR)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: poll on the completion channel failed: %s",
                       vt->base.rank, strerror(errno));
    if (rc > 0 && (fds[0].revents & POLLIN))
        take_cq_event(vt);
    for (uint32_t r = 1; rc > 0 && r < vt->rails; r++)
        if (fds[2 * r].revents & POLLIN)
            take_rail_event(vt, &vt->extra[r - 1]);
    if (rc > 0)
        for (nfds_t i = 1; i < nfds; i += 2)
            if (fds[i].revents & POLLIN) {
                drain_async(vt);
                break;
            }
    return GS_OK;
}

/* The outstanding slots of ep, oldest first, as "READ/F, heartbeat READ/S, ..." (/S signaled, /F fenced). */
static size_t describe_outstanding(const gs_verbs_tp *vt, const gs_verbs_ep *ep, char *buf, size_t cap)
{
    size_t used = 0;
    for (uint64_t seq = ep->sq_done; seq < ep->sq_posted && used + 40 < cap; seq++) {
        const gs_verbs_slot *slot = &ep->slots[seq & (vt->sq_depth - 1)];
        used += (size_t)snprintf(buf + used, cap - used, "%s%s%s%s%s", seq == ep->sq_done ? "" : ", ",
                                 slot_name(slot), slot->flags ? "/" : "",
                                 (slot->flags & GS_VERBS_SLOT_SIGNALED) ? "S" : "",
                                 (slot->flags & GS_VERBS_SLOT_FENCED) ? "F" : "");
    }
    return used;
}

static gs_status timeout_error(gs_verbs_tp *vt, uint64_t start_ns)
{
    char busy[768] = "";
    size_t used = 0;
    for (int peer = 0; peer < vt->base.size && used < sizeof(busy) - 96; peer++) {
        gs_verbs_ep *ep = gs_verbs_ep_at(vt, peer);
        if (!ep || ep->sq_posted <= ep->sq_done)
            continue;
        used += (size_t)snprintf(busy + used, sizeof(busy) - used,
                                 " to rank %d: %llu work requests outstanding (", peer,
                                 (unsigned long long)(ep->sq_posted - ep->sq_done));
        used += describe_outstanding(vt, ep, busy + used, sizeof(busy) - used - 8);
        used += (size_t)snprintf(busy + used, sizeof(busy) - used, ");");
    }
    return gs_fail_quiet(GS_SUBSYS_VERBS, GS_ERR_TIMEOUT,
                         "rank %d: no verbs completion arrived in %.0f ms of waiting;%s", vt->base.rank,
                         (double)(gs_now_ns() - start_ns) / 1e6, used ? busy : " nothing outstanding here");
}

gs_status gs_verbs_wait(gs_tp *tp, gs_wc *wcs, int max, int *n_p, uint64_t deadline_ns)
{
    gs_verbs_tp *vt = gs_verbs_tp_of(tp);
    int mode = vt->base.cfg->poll;
    uint64_t start = gs_now_ns(), spins = 0;
    uint64_t spin_end = mode == GS_POLL_SPIN     ? UINT64_MAX
                        : mode == GS_POLL_HYBRID ? start + (uint64_t)vt->base.cfg->spin_us * 1000u
                                                 : 0;

    for (;;) {
        int n = 0;
        gs_status status = gs_verbs_poll(tp, wcs, max, &n);
        uint64_t now;
        if (status != GS_OK)
            return status;
        if (n > 0) {
            *n_p = n;
            return GS_OK;
        }
        now = gs_now_ns();
        if (now >= deadline_ns)
            return timeout_error(vt, start);
        if (now < spin_end) {
            /* More ranks than cores (or Soft-RoCE's kernel work) need the CPU now and then. */
            if (++spins % 256 == 0)
                sched_yield();
            else
                gs_cpu_relax();
            continue;
        }
        status = gs_verbs_block_once(vt, deadline_ns);
        if (status != GS_OK)
            return status;
    }
}
