/*
 * Endpoints: one RC queue pair per peer, moved RESET -> INIT -> RTR -> RTS
 * with the peer's connection blob, and its receive buffers kept posted.
 */
#include "transport/verbs/verbs.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static uint32_t random_psn(void)
{
    uint32_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = (uint32_t)gs_now_ns();
    return v & 0xffffff;
}

/* Creates the RC queue pair, asking for inline data and settling for what the device gives. */
static gs_status create_qp(gs_verbs_tp *vt, gs_verbs_ep *ep)
{
    static const uint32_t inline_tries[] = {GS_VERBS_INLINE_WANT, 64, 0};
    int err = 0;

    for (size_t i = 0; i < sizeof(inline_tries) / sizeof(inline_tries[0]); i++) {
        struct ibv_qp_init_attr init = {
            .qp_context = ep,
            .send_cq = ep->rail ? vt->extra[ep->rail - 1].cq : vt->cq,
            .recv_cq = ep->rail ? vt->extra[ep->rail - 1].cq : vt->cq,
            .cap = {.max_send_wr = vt->sq_depth,
                    .max_recv_wr = ep->lane ? 1 : vt->rq_depth, /* side lanes take no SEND/WRITE_IMM */
                    .max_send_sge = 1,
                    .max_recv_sge = 1,
                    .max_inline_data = inline_tries[i]},
            .qp_type = IBV_QPT_RC,
            .sq_sig_all = 0,
        };
        ep->qp = ibv_create_qp(ep->rail ? vt->extra[ep->rail - 1].pd : vt->pd, &init);
        if (ep->qp) {
            if (vt->max_inline == UINT32_MAX || init.cap.max_inline_data < vt->max_inline)
                vt->max_inline = init.cap.max_inline_data;
            return GS_OK;
        }
        err = errno;
    }
    return gs_fail(
        GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
        "rank %d: ibv_create_qp (lane %u) for peer rank %d on %s failed: %s (asked %u send / %u receive WRs)",
        vt->base.rank, ep->lane, ep->base.peer, gs_verbs_ep_dev(vt, ep)->name, strerror(err), vt->sq_depth,
        vt->rq_depth);
}

static gs_status modify(gs_verbs_ep *ep, struct ibv_qp_attr *attr, int mask, const char *state)
{
    int rc = ibv_modify_qp(ep->qp, attr, mask);
    if (rc != 0)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
                       "rank %d: peer rank %d: ibv_modify_qp to %s failed: %s", ep->base.tp->rank,
                       ep->base.peer, state, strerror(rc));
    return GS_OK;
}

static gs_status to_init(gs_verbs_tp *vt, gs_verbs_ep *ep)
{
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = gs_verbs_ep_dev(vt, ep)->pkey_index,
        .port_num = gs_verbs_ep_dev(vt, ep)->port,
        .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
    };
    /* one attribute bit per line, as in rc_pingpong */
    /* clang-format off */
    int mask = IBV_QP_STATE
             | IBV_QP_PKEY_INDEX
             | IBV_QP_PORT
             | IBV_QP_ACCESS_FLAGS;
    /* clang-format on */
    return modify(ep, &attr, mask, "INIT");
}

/* A side lane of ep: its own queue pair and send-queue accounting, nothing else (lane 0 keeps the receives,
 * credits, control slot and liveness of the peer). */
static gs_status side_create(gs_verbs_tp *vt, gs_verbs_ep *ep, uint8_t lane)
{
    gs_verbs_ep *side = gs_calloc(1, sizeof(*side));
    gs_status status;

    if (!side)
        return GS_ERR_NOMEM;
    side->base = ep->base;
    side->lane = lane;
    side->rail = (uint8_t)(lane % (vt->rails ? vt->rails : 1));
    side->parent = ep;
    side->psn = ep->psn;
    side->lctrl = ep->lctrl;
    ep->side[lane - 1] = side;
    side->slots = gs_calloc(vt->sq_depth, sizeof(*side->slots));
    if (!side->slots)
        return GS_ERR_NOMEM;
    status = create_qp(vt, side);
    return status == GS_OK ? to_init(vt, side) : status;
}

/* GS_IB_QPS_PER_PEER > 1: the side lanes, the op ring and the held posts of lane 0. */
static gs_status lanes_create(gs_verbs_tp *vt, gs_verbs_ep *ep)
{
    gs_status status = GS_OK;
    ep->side = gs_calloc(ep->lanes - 1, sizeof(*ep->side));
    ep->ops = gs_calloc(GS_VERBS_OPS_MAX, sizeof(*ep->ops));
    ep->defer = gs_calloc(GS_VERBS_DEFER_MAX, sizeof(*ep->defer));
    if (!ep->side || !ep->ops || !ep->defer)
        return GS_ERR_NOMEM;
    for (uint32_t lane = 1; lane < ep->lanes && status == GS_OK; lane++)
        status = side_create(vt, ep, (uint8_t)lane);
    return status;
}

gs_status gs_verbs_ep_create(gs_verbs_tp *vt, int peer, gs_verbs_ep **ep_p)
{
    gs_status status = GS_ERR_NOMEM;
    gs_verbs_ep *ep = gs_calloc(1, sizeof(*ep));
    uint32_t *bufs = NULL;

    if (!ep)
        return GS_ERR_NOMEM;
    ep->base.tp = &vt->base;
    ep->base.peer = peer;
    ep->psn = random_psn();
    ep->parent = ep;
    ep->lanes = vt->lanes ? vt->lanes : 1;
    ep->lctrl = &vt->ctrl[peer];
    ep->rbuf_first = (uint32_t)(peer < vt->base.rank ? peer : peer - 1) * vt->rq_depth;
    ep->slots = gs_calloc(vt->sq_depth, sizeof(*ep->slots));
    ep->repost = gs_calloc(vt->rq_depth, sizeof(*ep->repost));
    ep->held = gs_calloc(vt->rq_depth, sizeof(*ep->held));
    ep->urecv = gs_calloc(GS_VERBS_URECV_MAX, sizeof(*ep->urecv));
    bufs = gs_calloc(vt->rq_depth, sizeof(*bufs));
    if (!ep->slots || !ep->repost || !ep->held || !ep->urecv || !bufs)
        goto fail;
    status = create_qp(vt, ep);
    if (status == GS_OK)
        status = to_init(vt, ep);
    if (status == GS_OK && ep->lanes > 1)
        status = lanes_create(vt, ep);
    for (uint32_t i = 0; i < vt->rq_depth; i++)
        bufs[i] = ep->rbuf_first + i;
    if (status == GS_OK)
        status = gs_verbs_post_recv_bufs(ep, bufs, vt->rq_depth);
    if (status != GS_OK)
        goto fail;
    free(bufs);
    *ep_p = ep;
    return GS_OK;
fail:
    free(bufs);
    gs_verbs_ep_destroy(ep);
    return status;
}

void gs_verbs_ep_destroy(gs_verbs_ep *ep)
{
    if (!ep)
        return;
    for (uint32_t lane = 1; ep->side && lane < ep->lanes; lane++)
        gs_verbs_ep_destroy(ep->side[lane - 1]);
    if (ep->qp) {
        int rc = ibv_destroy_qp(ep->qp);
        if (rc != 0)
            gs_log_warn(VERBS, "rank %d: ibv_destroy_qp (lane %u) for peer rank %d failed: %s",
                        ep->base.tp->rank, ep->lane, ep->base.peer, strerror(rc));
    }
    free(ep->side);
    free(ep->ops);
    free(ep->defer);
    free(ep->slots);
    free(ep->repost);
    free(ep->held);
    free(ep->urecv);
    free(ep);
}

void gs_verbs_ep_fill_blob(const gs_verbs_tp *vt, const gs_verbs_ep *ep, gs_verbs_conn_blob *blob)
{
    *blob = (gs_verbs_conn_blob){
        .version = GS_VERBS_PROTO_VERSION,
        .link_layer = vt->dev.link_layer,
        .mtu = (uint8_t)vt->dev.port_attr.active_mtu,
        .gid_type = (uint8_t)vt->dev.gid_type,
        .magic = GS_VERBS_CONN_MAGIC,
        .src_rank = (uint32_t)vt->base.rank,
        .dst_rank = (uint32_t)ep->base.peer,
        .qpn = ep->qp->qp_num,
        .psn = ep->psn,
        .lid = vt->dev.lid,
        .gid_index = (uint8_t)(vt->dev.gid_index < 0 ? 0 : vt->dev.gid_index),
        .rd_atomic = vt->rd_atomic,
        .rq_depth = vt->rq_depth,
        .ctrl_addr = (uint64_t)(uintptr_t)ep->lctrl,
        .ctrl_rkey = vt->ctrl_peer_mr[ep->base.peer]->rkey,
        .pkey = vt->dev.pkey,
        .lanes = (uint8_t)ep->lanes,
        .rails = (uint8_t)(vt->rails ? vt->rails : 1),
    };
    if (vt->rails > 1) {
        const gs_verbs_dev *d = &vt->extra[0].dev;
        memcpy(blob->rail_gid, d->gid.raw, sizeof(blob->rail_gid));
        blob->rail_lid = d->lid;
        blob->rail_mtu = (uint8_t)d->port_attr.active_mtu;
        blob->rail_gid_type = (uint8_t)d->gid_type;
    }
    memcpy(blob->gid, vt->dev.gid.raw, sizeof(blob->gid));
    for (uint32_t lane = 1; lane < ep->lanes; lane++)
        blob->lane_qpn[lane - 1] = ep->side[lane - 1]->qp->qp_num;
}

static bool raw_is_zero(const uint8_t *raw, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (raw[i])
            return false;
    return true;
}

static bool valid_qpn(uint32_t qpn)
{
    return qpn >= 2 && qpn <= 0xffffff;
}

/* The lanes and their queue pairs: 1-16, each side lane's QP valid, distinct from the others on its device
 * (lane l is on rail l mod rails; two devices number their QPs apart), none past the count. */
static const char *lanes_field_error(const gs_verbs_conn_blob *b)
{
    uint32_t rails = b->rails ? b->rails : 1;
    if (b->lanes == 0 || b->lanes > GS_VERBS_QPS_MAX)
        return "queue pairs per peer outside 1-16";
    for (uint32_t i = 0; i < GS_VERBS_QPS_MAX - 1; i++) {
        if (i + 1 >= b->lanes) {
            if (b->lane_qpn[i] != 0)
                return "a side lane's QP number past the lane count";
            continue;
        }
        if (!valid_qpn(b->lane_qpn[i]))
            return "a side lane's QP number outside 2-0xffffff";
        if ((i + 1) % rails == 0 && b->lane_qpn[i] == b->qpn)
            return "a side lane's QP number equal to lane 0's";
        for (uint32_t j = 0; j < i; j++)
            if ((j + 1) % rails == (i + 1) % rails && b->lane_qpn[j] == b->lane_qpn[i])
                return "two side lanes with one QP number";
    }
    return NULL;
}

/* Rail 1's address: all zero with one rail, else as valid as rail 0's (same link layer). */
static const char *rail_field_error(const gs_verbs_conn_blob *b, bool grh)
{
    bool ib = b->link_layer == IBV_LINK_LAYER_INFINIBAND;
    if (b->rails == 0 || b->rails > GS_VERBS_RAILS_MAX)
        return "devices (rails) outside 1-2";
    if (b->rails == 1)
        return raw_is_zero(b->rail_gid, sizeof(b->rail_gid)) && b->rail_lid == 0 && b->rail_mtu == 0 &&
                       b->rail_gid_type == 0
                   ? NULL
                   : "a second rail's address with one rail";
    if (gs_verbs_mtu_bytes((enum ibv_mtu)b->rail_mtu) == 0)
        return "rail 1's MTU code outside 1-5 (256-4096 bytes)";
    if (b->rail_gid_type > GS_VERBS_GID_TYPE_ROCE_V2)
        return "rail 1's GID type unknown";
    if (ib && (b->rail_lid == 0 || b->rail_lid >= 0xc000))
        return "rail 1's LID outside the unicast range 0x0001-0xbfff";
    if (!ib && b->rail_lid != 0)
        return "rail 1 with a LID on an Ethernet (RoCE) port";
    if (grh && (raw_is_zero(b->rail_gid, sizeof(b->rail_gid)) || b->rail_gid[0] == 0xff))
        return "rail 1's GID empty or multicast";
    return NULL;
}

/* What is wrong with the blob's own fields (one phrase), or NULL. grh: this rank addresses the peer by GID.
 */
static const char *blob_field_error(const gs_verbs_conn_blob *b, bool grh)
{
    bool ib = b->link_layer == IBV_LINK_LAYER_INFINIBAND;
    const char *wrong;
    if (!ib && b->link_layer != IBV_LINK_LAYER_ETHERNET)
        return "link layer neither InfiniBand nor Ethernet";
    if (gs_verbs_mtu_bytes((enum ibv_mtu)b->mtu) == 0)
        return "MTU code outside 1-5 (256-4096 bytes)";
    if (b->gid_type > GS_VERBS_GID_TYPE_ROCE_V2)
        return "unknown GID type";
    if (!valid_qpn(b->qpn))
        return "QP number outside 2-0xffffff (24 bits; 0 and 1 are the management QPs)";
    if (b->psn > 0xffffff)
        return "PSN wider than 24 bits";
    if (ib && (b->lid == 0 || b->lid >= 0xc000))
        return "LID outside the unicast range 0x0001-0xbfff";
    if (!ib && b->lid != 0)
        return "a LID on an Ethernet (RoCE) port, where there is none";
    if (b->rd_atomic == 0 || b->rd_atomic > GS_VERBS_RD_ATOMIC_MAX)
        return "READ/atomic depth outside 1-16 (0: it could not serve the heartbeat READ)";
    if (b->rq_depth == 0 || b->rq_depth > GS_VERBS_RQ_DEPTH)
        return "receive depth outside 1-64";
    if (grh && raw_is_zero(b->gid, sizeof(b->gid)))
        return "empty GID";
    if (grh && b->gid[0] == 0xff)
        return "a multicast GID (ff00::/8) for a reliable connection";
    if (b->ctrl_addr == 0 || (b->ctrl_addr & 7u))
        return "control slot address zero or not 8-byte aligned";
    if ((b->pkey & 0x7fff) == 0)
        return "partition key with base 0 (the invalid partition)";
    if (b->reserved2 != 0 || b->reserved3 != 0 || b->reserved4 != 0)
        return "reserved bytes not zero";
    wrong = lanes_field_error(b);
    return wrong ? wrong : rail_field_error(b, grh);
}

/* Addressed by GID, both sides must have chosen the same GID type and address family: a RoCE v1 frame or
 * an IPv6 packet does not reach a queue pair bound to a RoCE v2 IPv4 GID. */
static gs_status check_same_address_kind(const gs_verbs_tp *vt, int peer, const gs_verbs_conn_blob *blob)
{
    const union ibv_gid *theirs = (const union ibv_gid *)(const void *)blob->gid;
    int their_family = gs_verbs_gid_family(theirs), our_family = gs_verbs_gid_family(&vt->dev.gid);
    char their_text[64], our_text[64];

    if (vt->dev.gid_index < 0 || (blob->gid_type == vt->dev.gid_type && their_family == our_family))
        return GS_OK;
    gs_verbs_gid_format(theirs, their_text, sizeof(their_text));
    gs_verbs_gid_format(&vt->dev.gid, our_text, sizeof(our_text));
    return gs_fail(GS_SUBSYS_VERBS, GS_ERR_PROTOCOL,
                   "rank %d: peer rank %d chose a %s %s GID (index %u, %s), this rank a %s %s GID (index %d, "
                   "%s): both sides need the same GID type and address family; set GS_IB_ADDR_FAMILY (or "
                   "GS_IB_GID_INDEX) to the same kind of entry on every host",
                   vt->base.rank, peer, gs_verbs_gid_type_name(blob->gid_type),
                   their_family == AF_INET ? "IPv4" : "IPv6", blob->gid_index, their_text,
                   gs_verbs_gid_type_name(vt->dev.gid_type), our_family == AF_INET ? "IPv4" : "IPv6",
                   vt->dev.gid_index, our_text);
}

gs_status gs_verbs_ep_check_blob(const gs_verbs_tp *vt, int peer, const gs_verbs_conn_blob *blob)
{
    int rank = vt->base.rank;
    const char *wrong;
    char gid[64];
    if (blob->version != GS_VERBS_PROTO_VERSION || blob->magic != GS_VERBS_CONN_MAGIC)
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_PROTOCOL,
            "rank %d: peer rank %d sent a verbs connection blob of version %u (magic %#x), this rank "
            "speaks version %u: run the same gradsync build on every rank",
            rank, peer, blob->version, blob->magic, GS_VERBS_PROTO_VERSION);
    if (blob->src_rank != (uint32_t)peer || blob->dst_rank != (uint32_t)rank)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_PROTOCOL,
                       "rank %d: connection blob for peer rank %d names %u -> %u instead", rank, peer,
                       blob->src_rank, blob->dst_rank);
    wrong = blob_field_error(blob, vt->dev.gid_index >= 0);
    if (wrong) {
        gs_verbs_gid_format((const union ibv_gid *)(const void *)blob->gid, gid, sizeof(gid));
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_PROTOCOL,
            "rank %d: peer rank %d's verbs connection blob is malformed: %s (link layer %u, MTU code "
            "%u, GID type %u, QP %#x, PSN %#x, LID %#x, READ depth %u, %u receives, GID %s, control "
            "slot %#llx, partition key %#06x, %u lanes, %u rails)",
            rank, peer, wrong, blob->link_layer, blob->mtu, blob->gid_type, blob->qpn, blob->psn, blob->lid,
            blob->rd_atomic, blob->rq_depth, gid, (unsigned long long)blob->ctrl_addr, blob->pkey,
            blob->lanes, blob->rails);
    }
    if ((blob->link_layer == IBV_LINK_LAYER_ETHERNET) != (vt->dev.link_layer == IBV_LINK_LAYER_ETHERNET))
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "rank %d: peer rank %d's port is %s but this rank's is %s: both need the same fabric",
                       rank, peer, blob->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
                       vt->dev.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
    if (blob->lanes != (vt->lanes ? vt->lanes : 1))
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_CONFIG,
            "rank %d: peer rank %d opened %u queue pairs per peer (GS_IB_QPS_PER_PEER), this rank %u: "
            "set the same GS_IB_QPS_PER_PEER on every rank",
            rank, peer, blob->lanes, vt->lanes ? vt->lanes : 1);
    if (blob->rails != (vt->rails ? vt->rails : 1))
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "rank %d: peer rank %d uses %u devices (GS_IB_RAILS), this rank %u: set the same "
                       "GS_IB_RAILS on every rank",
                       rank, peer, blob->rails, vt->rails ? vt->rails : 1);
    if ((blob->pkey & 0x7fff) != (vt->dev.pkey & 0x7fff))
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_CONFIG,
            "rank %d: peer rank %d's queue pair is in partition %#06x, this rank's in %#06x: packets "
            "between two partitions are dropped; set the same GS_IB_PKEY on every rank",
            rank, peer, blob->pkey, vt->dev.pkey);
    return check_same_address_kind(vt, peer, blob);
}

static gs_status to_rtr(gs_verbs_tp *vt, gs_verbs_ep *ep, const gs_verbs_conn_blob *remote, enum ibv_mtu mtu)
{
    const gs_verbs_dev *dev = gs_verbs_ep_dev(vt, ep);
    bool grh = dev->gid_index >= 0;
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = remote->qpn,
        .rq_psn = remote->psn,
        .max_dest_rd_atomic = vt->rd_atomic,
        .min_rnr_timer = (uint8_t)vt->base.cfg->ib_rnr_timer,
        .ah_attr =
            {
                .dlid = remote->lid,
                .sl = (uint8_t)vt->base.cfg->ib_sl,
                .src_path_bits = 0,
                .is_global = grh,
                .port_num = dev->port,
            },
    };
    /* one attribute bit per line, as in rc_pingpong */
    /* clang-format off */
    int mask = IBV_QP_STATE
             | IBV_QP_AV
             | IBV_QP_PATH_MTU
             | IBV_QP_DEST_QPN
             | IBV_QP_RQ_PSN
             | IBV_QP_MAX_DEST_RD_ATOMIC
             | IBV_QP_MIN_RNR_TIMER;
    /* clang-format on */
    if (grh) {
        memcpy(attr.ah_attr.grh.dgid.raw, remote->gid, sizeof(remote->gid));
        attr.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
        attr.ah_attr.grh.hop_limit = 64;
        attr.ah_attr.grh.traffic_class = (uint8_t)vt->base.cfg->ib_tc;
        attr.ah_attr.grh.flow_label = 0;
    }
    return modify(ep, &attr, mask, "RTR");
}

static gs_status to_rts(gs_verbs_tp *vt, gs_verbs_ep *ep, const gs_verbs_conn_blob *remote)
{
    const gs_config *cfg = vt->base.cfg;
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTS,
        .sq_psn = ep->psn,
        .timeout = (uint8_t)gs_verbs_ack_timeout(cfg),
        .retry_cnt = (uint8_t)cfg->ib_retry_cnt,
        .rnr_retry = (uint8_t)cfg->ib_rnr_retry,
        .max_rd_atomic = remote->rd_atomic < vt->init_rd_atomic ? remote->rd_atomic : vt->init_rd_atomic,
    };
    /* one attribute bit per line, as in rc_pingpong */
    /* clang-format off */
    int mask = IBV_QP_STATE
             | IBV_QP_SQ_PSN
             | IBV_QP_TIMEOUT
             | IBV_QP_RETRY_CNT
             | IBV_QP_RNR_RETRY
             | IBV_QP_MAX_QP_RD_ATOMIC;
    /* clang-format on */
    return modify(ep, &attr, mask, "RTS");
}

/* Lane `lane` of ep (0: ep itself) to RTR and RTS against the peer's queue pair of the same lane. */
static gs_status lane_connect(gs_verbs_tp *vt, gs_verbs_ep *lane_ep, const gs_verbs_conn_blob *remote,
                              enum ibv_mtu mtu)
{
    gs_verbs_conn_blob peer_lane = *remote;
    gs_status status;
    if (lane_ep->lane)
        peer_lane.qpn = remote->lane_qpn[lane_ep->lane - 1];
    if (lane_ep->rail) { /* the peer's queue pair of this lane is on its rail 1 too */
        memcpy(peer_lane.gid, remote->rail_gid, sizeof(peer_lane.gid));
        peer_lane.lid = remote->rail_lid;
        mtu = gs_verbs_mtu_min(vt->extra[0].dev.port_attr.active_mtu, (enum ibv_mtu)remote->rail_mtu);
    }
    status = to_rtr(vt, lane_ep, &peer_lane, mtu);
    return status == GS_OK ? to_rts(vt, lane_ep, &peer_lane) : status;
}

gs_status gs_verbs_ep_connect(gs_verbs_tp *vt, gs_verbs_ep *ep, const gs_verbs_conn_blob *remote)
{
    enum ibv_mtu mtu = gs_verbs_mtu_min(vt->dev.port_attr.active_mtu, (enum ibv_mtu)remote->mtu);
    gs_status status = lane_connect(vt, ep, remote, mtu);
    for (uint32_t lane = 1; lane < ep->lanes && status == GS_OK; lane++)
        status = lane_connect(vt, ep->side[lane - 1], remote, mtu);
    if (status != GS_OK)
        return status;
    ep->peer_rq_depth = remote->rq_depth;
    ep->rctrl_addr = remote->ctrl_addr;
    ep->rctrl_rkey = remote->ctrl_rkey;
    ep->state = GS_VERBS_EP_READY;
    ep->last_alive_ns = gs_now_ns();
    gs_log_debug(VERBS,
                 "rank %d: peer rank %d connected: QP %u -> %u (%u lanes), path MTU %d, PSN %#x -> %#x",
                 vt->base.rank, ep->base.peer, ep->qp->qp_num, remote->qpn, ep->lanes,
                 gs_verbs_mtu_bytes(mtu), ep->psn, remote->psn);
    return GS_OK;
}

gs_status gs_verbs_ep_usable(gs_verbs_ep *ep, const char *op)
{
    int rank = ep->base.tp->rank, peer = ep->base.peer;
    gs_status err = ep->err;

    switch (ep->state) {
    case GS_VERBS_EP_READY: return GS_OK;
    case GS_VERBS_EP_CLOSED:
        return gs_verbs_ep_report(ep, GS_ERR_PEER_LOST,
                                  "rank %d: %s to rank %d: that rank closed its transport", rank, op, peer);
    case GS_VERBS_EP_FAILED: {
        int writer; /* the rank that wrote why: this one */
        /* A lost peer stays lost; any other error is reported once, then the endpoint flushes. */
        if (err != GS_ERR_PEER_LOST && ep->err_reported)
            err = GS_ERR_FLUSHED;
        ep->err_reported = true;
        if (err == GS_ERR_PEER_LOST)
            return gs_verbs_ep_report(ep, err, "%s", ep->why);
        return gs_verbs_ep_report(ep, err, "rank %d: %s to rank %d: the endpoint failed earlier: %s", rank,
                                  op, peer, gs_error_skip_rank(ep->why, &writer));
    }
    default:
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_INVALID, "rank %d: %s to rank %d: endpoint not connected",
                       rank, op, peer);
    }
}
