/*
 * Posting: WRITE, WRITE_WITH_IMM, READ, the two atomics and SEND as work
 * requests on the peer's RC queue pair, plus the transport's own control
 * operations (credit return, heartbeat, close notice).
 *
 * Send-queue accounting is exact: slots [sq_done, sq_posted) are
 * outstanding, a signaled completion retires every slot up to it (RC
 * completes in order), and a post that would exceed sq_depth returns
 * GS_ERR_AGAIN. Unsignaled work requests are made signaled every
 * sq_depth/2 so the queue always drains; such completions stay internal.
 *
 * WRITE_IMM and SEND consume a receive at the peer: a sender spends one
 * credit each, and gets them back when the peer re-posts the receives and
 * RDMA-writes its running total into our control slot. So the receiver is
 * never asked to take more than it has posted (no RNR in normal operation).
 */
#include "transport/verbs/verbs.h"

#include "util/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define GS_VERBS_CHAIN_MAX 16 /* work requests one call may post */

/* Work requests built for one ibv_post_send. */
typedef struct gs_verbs_chain {
    struct ibv_send_wr wr[GS_VERBS_CHAIN_MAX];
    struct ibv_sge sge[GS_VERBS_CHAIN_MAX];
    uint32_t n;
    uint32_t run[GS_VERBS_CHAIN_MAX]; /* unsignaled run after wr[i] */
    bool track;                       /* several lanes: user work requests signaled, counted on op */
    uint32_t op;
} gs_verbs_chain;

static uint64_t credits_available(const gs_verbs_ep *ep)
{
    uint64_t returned = __atomic_load_n(&ep->lctrl->credits, __ATOMIC_ACQUIRE);
    uint64_t limit = ep->peer_rq_depth + returned;
    return limit > ep->imm_sent ? limit - ep->imm_sent : 0;
}

/* The peer's credit total can only count receives it consumed, so never exceeds what we sent: a larger
 * value was not written by the peer's transport. Fails the endpoint then. A smaller one than seen
 * before is a stale write landing late (seen on Soft-RoCE: the peer's credit writes share one
 * source word), harmless: it only holds credits back until the next. */
static bool credits_forged(gs_verbs_ep *ep)
{
    uint64_t returned = __atomic_load_n(&ep->lctrl->credits, __ATOMIC_ACQUIRE);
    if (returned <= ep->imm_sent) {
        if (returned > ep->credits_seen)
            ep->credits_seen = returned;
        return false;
    }
    snprintf(ep->why, sizeof(ep->why),
             "rank %d: the credit word of rank %d reads %llu after %llu, but this rank sent it only %llu "
             "WRITE_IMM/SEND: written by something other than that rank's transport",
             ep->base.tp->rank, ep->base.peer, (unsigned long long)returned,
             (unsigned long long)ep->credits_seen, (unsigned long long)ep->imm_sent);
    gs_verbs_ep_fail(ep, GS_ERR_PROTOCOL, UINT64_MAX);
    return true;
}

static bool sq_has_room(const gs_verbs_ep *ep, uint32_t n)
{
    const gs_verbs_tp *vt = (const gs_verbs_tp *)ep->base.tp;
    return ep->sq_posted - ep->sq_done + n <= vt->sq_depth;
}

/* Appends one work request for a new send-queue slot; returns it to fill. */
static struct ibv_send_wr *chain_add(gs_verbs_ep *ep, gs_verbs_chain *ch, gs_verbs_slot_kind kind,
                                     bool deliver, gs_wc_opcode opcode, uint64_t user_wr_id, bool signal)
{
    const gs_verbs_tp *vt = (const gs_verbs_tp *)ep->base.tp;
    uint32_t i = ch->n++;
    uint64_t seq = ep->sq_posted + i;
    uint32_t run = i ? ch->run[i - 1] : ep->unsignaled_run;
    struct ibv_send_wr *wr = &ch->wr[i];

    if (ch->track && kind == GS_VERBS_SLOT_USER) {
        signal = true; /* every one counted on its operation, delivered from the op ring */
        deliver = false;
    }
    ep->slots[seq & (vt->sq_depth - 1)] = (gs_verbs_slot){.wr_id = user_wr_id,
                                                          .kind = (uint8_t)kind,
                                                          .deliver = deliver,
                                                          .opcode = (uint8_t)opcode,
                                                          .op = ch->op};
    if (!signal && run + 1 >= vt->sq_depth / 2)
        signal = true; /* retire the unsignaled run before the queue fills */
    ch->run[i] = signal ? 0 : run + 1;
    ep->slots[seq & (vt->sq_depth - 1)].flags = signal ? GS_VERBS_SLOT_SIGNALED : 0;
    memset(wr, 0, sizeof(*wr));
    wr->wr_id = gs_verbs_wr_id(GS_VERBS_WR_SQ, ep->lane, ep->base.peer, (uint32_t)seq);
    wr->send_flags = signal ? IBV_SEND_SIGNALED : 0;
    wr->sg_list = &ch->sge[i];
    if (i > 0)
        ch->wr[i - 1].next = wr;
    return wr;
}

static void wr_set_local(struct ibv_send_wr *wr, uint64_t addr, uint32_t len, uint32_t lkey)
{
    struct ibv_sge *sge = wr->sg_list;
    *sge = (struct ibv_sge){.addr = addr, .length = len, .lkey = lkey};
    wr->num_sge = len ? 1 : 0;
}

/* Posts the chain; user_first is the index of the caller's first work request. */
static gs_status chain_post(gs_verbs_ep *ep, gs_verbs_chain *ch, uint32_t user_first, const char *what)
{
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(ep->qp, &ch->wr[0], &bad);
    uint32_t posted;

    if (rc == 0) {
        ep->sq_posted += ch->n;
        ep->unsignaled_run = ch->run[ch->n - 1];
        return GS_OK;
    }
    posted = bad ? (uint32_t)(bad - ch->wr) : 0;
    if (posted > ch->n)
        posted = 0;
    if (posted > 0)
        ep->unsignaled_run = ch->run[posted - 1];
    for (uint32_t i = user_first; i < posted; i++)
        ep->slots[(ep->sq_posted + i) & (((gs_verbs_tp *)ep->base.tp)->sq_depth - 1)].deliver = 0;
    ep->sq_posted += posted;
    gs_status status =
        gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
                "rank %d: %s to peer rank %d: ibv_post_send (lane %u) failed: %s (%u of %u work requests "
                "posted)",
                ep->base.tp->rank, what, ep->base.peer, ep->lane, strerror(rc), posted, ch->n);
    if (posted > user_first || ch->track) { /* half an operation is on the wire */
        snprintf(ep->parent->why, sizeof(ep->parent->why), "%s", gs_last_error());
        gs_verbs_ep_fail(ep->parent, GS_ERR_SYSTEM, UINT64_MAX);
    }
    return status;
}

static const char *ctrl_name(gs_verbs_slot_kind kind)
{
    switch (kind) {
    case GS_VERBS_SLOT_CREDIT: return "credit return";
    case GS_VERBS_SLOT_HEARTBEAT: return "heartbeat";
    case GS_VERBS_SLOT_PROBE: return "data-path probe";
    default: return "close notice";
    }
}

/* A control operation the device refused: without heartbeats or credits the endpoint would hang, not fail. */
static gs_status ctrl_post_failed(gs_verbs_ep *ep, gs_verbs_slot_kind kind)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    int writer;
    snprintf(ep->why, sizeof(ep->why),
             "rank %d: the endpoint to rank %d on %s port %u failed: its %s could not be posted (%s)",
             vt->base.rank, ep->base.peer, vt->dev.name, vt->dev.port, ctrl_name(kind),
             gs_error_skip_rank(gs_last_error(), &writer));
    gs_fail(GS_SUBSYS_VERBS, GS_ERR_IO, "%s", ep->why);
    ep->err_logged = true;
    gs_verbs_ep_fail(ep, GS_ERR_IO, UINT64_MAX);
    return GS_ERR_IO;
}

/* A credit return, when the peer is owed enough of them, rides in front of the next post. */
static void chain_add_credit(gs_verbs_ep *ep, gs_verbs_chain *ch)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    struct ibv_send_wr *wr = chain_add(ep, ch, GS_VERBS_SLOT_CREDIT, false, 0, 0, false);

    ep->lctrl->credits_out = ep->reposted;
    wr->opcode = IBV_WR_RDMA_WRITE;
    wr->wr.rdma.remote_addr = ep->rctrl_addr + offsetof(gs_verbs_ctrl, credits);
    wr->wr.rdma.rkey = ep->rctrl_rkey;
    wr_set_local(wr, (uint64_t)(uintptr_t)&ep->lctrl->credits_out, sizeof(uint64_t), vt->ctrl_mr->lkey);
    if (vt->max_inline >= sizeof(uint64_t))
        wr->send_flags |= IBV_SEND_INLINE;
}

static bool credit_owed(const gs_verbs_ep *ep)
{
    const gs_verbs_tp *vt = (const gs_verbs_tp *)ep->base.tp;
    return ep->reposted - ep->credits_returned >= vt->credit_batch;
}

gs_status gs_verbs_post_ctrl(gs_verbs_ep *ep, gs_verbs_slot_kind kind)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    gs_verbs_chain ch = {.n = 0};
    struct ibv_send_wr *wr;
    uint64_t reposted = ep->reposted;
    gs_status status;

    if (ep->state != GS_VERBS_EP_READY)
        return GS_ERR_FLUSHED;
    if (!sq_has_room(ep, 1))
        return GS_ERR_AGAIN;
    if (kind == GS_VERBS_SLOT_CREDIT) {
        chain_add_credit(ep, &ch);
        status = chain_post(ep, &ch, 1, ctrl_name(kind));
        if (status == GS_OK)
            ep->credits_returned = reposted;
        return status == GS_OK ? GS_OK : ctrl_post_failed(ep, kind);
    }
    wr = chain_add(ep, &ch, kind, false, 0, 0, true);
    if (kind == GS_VERBS_SLOT_HEARTBEAT || kind == GS_VERBS_SLOT_PROBE) {
        wr->opcode = IBV_WR_RDMA_READ;
        wr->wr.rdma.remote_addr = ep->rctrl_addr + offsetof(gs_verbs_ctrl, hb_target);
        wr_set_local(wr, (uint64_t)(uintptr_t)&ep->lctrl->hb_result, sizeof(uint64_t), vt->ctrl_mr->lkey);
    } else {
        ep->lctrl->closed_out = GS_VERBS_CLOSED_MAGIC;
        wr->opcode = IBV_WR_RDMA_WRITE;
        wr->wr.rdma.remote_addr = ep->rctrl_addr + offsetof(gs_verbs_ctrl, closed);
        wr_set_local(wr, (uint64_t)(uintptr_t)&ep->lctrl->closed_out, sizeof(uint64_t), vt->ctrl_mr->lkey);
    }
    wr->wr.rdma.rkey = ep->rctrl_rkey;
    status = chain_post(ep, &ch, 1, ctrl_name(kind));
    if (status != GS_OK)
        return ctrl_post_failed(ep, kind);
    ep->hb_outstanding |= kind == GS_VERBS_SLOT_HEARTBEAT;
    ep->probe_outstanding |= kind == GS_VERBS_SLOT_PROBE;
    return GS_OK;
}

/* Room for n work requests: if the queue is full, retire what completed and look again. */
static gs_status sq_reserve(gs_verbs_ep *ep, uint32_t n)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    if (sq_has_room(ep, n))
        return GS_OK;
    gs_verbs_progress(vt);
    if (ep->state != GS_VERBS_EP_READY)
        return gs_verbs_ep_usable(ep, "post");
    return sq_has_room(ep, n) ? GS_OK : GS_ERR_AGAIN;
}

static bool consumes_receive(enum ibv_wr_opcode opcode)
{
    return opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_SEND;
}

static bool is_rdma(enum ibv_wr_opcode opcode)
{
    return opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_RDMA_READ;
}

/* Fills the chunks of op (one unless an RDMA op is longer than the port's message size). */
static void chain_add_op(gs_verbs_ep *ep, gs_verbs_chain *ch, const gs_verbs_op *op, uint32_t chunks)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    uint32_t lkey = op->lmr ? ((gs_verbs_mr *)op->lmr)->reg->mr->lkey : 0;
    bool inline_ok = op->len <= vt->max_inline && op->opcode != IBV_WR_RDMA_READ &&
                     op->wc_opcode != GS_WC_FETCH_ADD && op->wc_opcode != GS_WC_CMP_SWAP;
    size_t done = 0;

    for (uint32_t c = 0; c < chunks; c++) {
        bool last = c + 1 == chunks;
        size_t piece = last ? op->len - done : vt->max_msg;
        bool signal = last && (op->flags & GS_OP_SIGNALED);
        struct ibv_send_wr *wr =
            chain_add(ep, ch, GS_VERBS_SLOT_USER, signal, op->wc_opcode, op->wr_id, signal);

        /* Every chunk but the last of a WRITE_IMM is a plain WRITE; the immediate comes last. */
        wr->opcode = op->opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !last ? IBV_WR_RDMA_WRITE : op->opcode;
        if (c == 0 && (op->flags & GS_OP_FENCE) && !vt->dev.fence_unneeded) {
            wr->send_flags |= IBV_SEND_FENCE;
            ep->slots[(ep->sq_posted + ch->n - 1) & (vt->sq_depth - 1)].flags |= GS_VERBS_SLOT_FENCED;
        }
        if (inline_ok)
            wr->send_flags |= IBV_SEND_INLINE;
        if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
            wr->imm_data = htobe32(op->imm);
        if (is_rdma(op->opcode)) {
            wr->wr.rdma.remote_addr = op->raddr + done;
            wr->wr.rdma.rkey = op->rkey;
        } else if (op->opcode != IBV_WR_SEND) {
            wr->wr.atomic.remote_addr = op->raddr;
            wr->wr.atomic.rkey = op->rkey;
            wr->wr.atomic.compare_add = op->compare_add;
            wr->wr.atomic.swap = op->swap;
        }
        wr_set_local(wr, op->laddr + done, (uint32_t)piece, lkey);
        done += piece;
    }
}

/* Several lanes: the same checks of credits, then verbs_stripe.c places the pieces. */
static gs_status post_on_lanes(gs_verbs_ep *ep, const gs_verbs_op *op)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    gs_status status;
    if (consumes_receive(op->opcode) && credits_forged(ep))
        return gs_verbs_ep_usable(ep, op->name);
    if (consumes_receive(op->opcode) && credits_available(ep) == 0) {
        gs_verbs_progress(vt);
        if (credits_available(ep) == 0)
            return GS_ERR_AGAIN;
    }
    status = gs_verbs_lanes_post(ep, op);
    if (status == GS_OK && consumes_receive(op->opcode))
        ep->imm_sent++;
    return status;
}

uint32_t gs_verbs_piece_wrs(const gs_verbs_tp *vt, const gs_verbs_piece *piece)
{
    if (!is_rdma((enum ibv_wr_opcode)piece->opcode) || piece->len <= vt->max_msg)
        return 1;
    return (piece->len + vt->max_msg - 1) / vt->max_msg;
}

gs_status gs_verbs_piece_post(gs_verbs_ep *lane_ep, const gs_verbs_piece *piece)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)lane_ep->base.tp;
    gs_verbs_chain ch = {.n = 0, .track = true, .op = piece->op};
    enum ibv_wr_opcode opcode = (enum ibv_wr_opcode)piece->opcode;
    uint32_t chunks = gs_verbs_piece_wrs(vt, piece);
    gs_verbs_imm_notice notice = {.magic = GS_VERBS_NOTICE_MAGIC, .len = piece->total};
    uint64_t done = 0;

    if (!sq_has_room(lane_ep, chunks))
        return GS_ERR_AGAIN;
    for (uint32_t c = 0; c < chunks; c++) {
        bool last = c + 1 == chunks;
        uint32_t len = last ? piece->len - (uint32_t)done : vt->max_msg;
        struct ibv_send_wr *wr =
            chain_add(lane_ep, &ch, GS_VERBS_SLOT_USER, false, (gs_wc_opcode)piece->wc_opcode,
                      lane_ep->parent->ops[piece->op % GS_VERBS_OPS_MAX].wr_id, true);
        wr->opcode = opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !last ? IBV_WR_RDMA_WRITE : opcode;
        if (c == 0 && piece->fence && !vt->dev.fence_unneeded)
            wr->send_flags |= IBV_SEND_FENCE;
        if (piece->inline_ok)
            wr->send_flags |= IBV_SEND_INLINE;
        if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM)
            wr->imm_data = htobe32(piece->imm);
        if (opcode == IBV_WR_SEND_WITH_IMM) { /* the notice: inline, so the stack copy may go */
            wr_set_local(wr, (uint64_t)(uintptr_t)&notice, sizeof(notice), 0);
            wr->send_flags |= IBV_SEND_INLINE;
        } else if (is_rdma(opcode)) {
            wr->wr.rdma.remote_addr = piece->raddr + done;
            wr->wr.rdma.rkey = piece->rkey;
            wr_set_local(wr, piece->laddr + done, len, piece->lkey);
        } else {
            if (opcode != IBV_WR_SEND) {
                wr->wr.atomic.remote_addr = piece->raddr;
                wr->wr.atomic.rkey = piece->rkey;
                wr->wr.atomic.compare_add = piece->compare_add;
                wr->wr.atomic.swap = piece->swap;
            }
            wr_set_local(wr, piece->laddr, len, piece->lkey);
        }
        done += len;
    }
    return chain_post(lane_ep, &ch, 0, "striped operation");
}

static gs_status post_op(gs_verbs_ep *ep, const gs_verbs_op *op)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    gs_verbs_chain ch = {.n = 0};
    uint64_t reposted;
    uint32_t chunks = 1, user_first;
    bool credit;
    gs_status status = gs_verbs_ep_usable(ep, op->name);

    if (status != GS_OK)
        return status;
    if (ep->lanes > 1)
        return post_on_lanes(ep, op);
    if (is_rdma(op->opcode) && op->len > vt->max_msg)
        chunks = (uint32_t)((op->len + vt->max_msg - 1) / vt->max_msg);
    if (chunks >= GS_VERBS_CHAIN_MAX)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_INVALID,
                       "rank %d: %s of %zu bytes to peer rank %d: more than %u x %u bytes", vt->base.rank,
                       op->name, op->len, ep->base.peer, GS_VERBS_CHAIN_MAX - 1, vt->max_msg);
    if (consumes_receive(op->opcode) && credits_forged(ep))
        return gs_verbs_ep_usable(ep, op->name);
    if (consumes_receive(op->opcode) && credits_available(ep) == 0) {
        gs_verbs_progress(vt);
        if (credits_available(ep) == 0)
            return GS_ERR_AGAIN; /* the peer has not re-posted yet: poll and retry */
    }
    status = sq_reserve(ep, chunks);
    if (status != GS_OK)
        return status;
    /* A credit return still owed (its own post found the queue full) rides along if there is room. */
    credit = credit_owed(ep) && sq_has_room(ep, chunks + 1);
    reposted = ep->reposted;
    if (credit)
        chain_add_credit(ep, &ch);
    user_first = ch.n;
    chain_add_op(ep, &ch, op, chunks);
    status = chain_post(ep, &ch, user_first, op->name);
    if (status != GS_OK)
        return status;
    if (credit)
        ep->credits_returned = reposted;
    if (consumes_receive(op->opcode))
        ep->imm_sent++;
    return GS_OK;
}

/* A one-sided op on byte off of the region rmr describes (rail 1's key in
 * the descriptor key's high half), from or to local (len bytes in lmr). */
static gs_verbs_op rdma_op(const char *name, enum ibv_wr_opcode opcode, gs_wc_opcode wc_opcode,
                           const void *local, size_t len, gs_mr *lmr, const gs_rmr_head *rmr, uint64_t off,
                           uint64_t wr_id, unsigned flags)
{
    return (gs_verbs_op){.name = name,
                         .opcode = opcode,
                         .wc_opcode = wc_opcode,
                         .laddr = (uint64_t)(uintptr_t)local,
                         .len = len,
                         .lmr = lmr,
                         .raddr = rmr->addr + off,
                         .rkey = (uint32_t)rmr->key,
                         .rail_rkey = (uint32_t)(rmr->key >> 32),
                         .wr_id = wr_id,
                         .flags = flags};
}

/* READ and atomics land in local memory: the region needs local write. */
static gs_status check_local_write(gs_ep *ep, gs_mr *lmr, const char *op)
{
    if (lmr && !(((gs_verbs_mr *)lmr)->reg->ibv_access & IBV_ACCESS_LOCAL_WRITE))
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_INVALID,
                       "rank %d: %s from peer rank %d into a region registered without GS_ACCESS_LOCAL_WRITE",
                       ep->tp->rank, op, ep->peer);
    return GS_OK;
}

static gs_status check_atomics(gs_ep *ep, const char *op)
{
    gs_verbs_tp *vt = gs_verbs_tp_of(ep->tp);
    if (vt->dev.attr.atomic_cap == IBV_ATOMIC_NONE)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
                       "rank %d: %s to peer rank %d: device %s has no atomics", vt->base.rank, op, ep->peer,
                       vt->dev.name);
    return GS_OK;
}

gs_status gs_verbs_write(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                         uint64_t off, uint64_t wr_id, unsigned flags)
{
    gs_verbs_op op = rdma_op("WRITE", IBV_WR_RDMA_WRITE, GS_WC_WRITE, src, len, lmr, dst, off, wr_id, flags);
    return post_op((gs_verbs_ep *)ep, &op);
}

gs_status gs_verbs_write_imm(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                             uint64_t off, uint32_t imm, uint64_t wr_id, unsigned flags)
{
    gs_verbs_op op = rdma_op("WRITE_IMM", IBV_WR_RDMA_WRITE_WITH_IMM, GS_WC_WRITE_IMM, src, len, lmr, dst,
                             off, wr_id, flags);
    op.imm = imm;
    return post_op((gs_verbs_ep *)ep, &op);
}

gs_status gs_verbs_read(gs_ep *ep, void *dst, gs_mr *lmr, size_t len, const gs_rmr_head *src, uint64_t off,
                        uint64_t wr_id, unsigned flags)
{
    gs_verbs_op op = rdma_op("READ", IBV_WR_RDMA_READ, GS_WC_READ, dst, len, lmr, src, off, wr_id, flags);
    gs_status status = check_local_write(ep, lmr, op.name);
    return status == GS_OK ? post_op((gs_verbs_ep *)ep, &op) : status;
}

/* FETCH_ADD and CMP_SWAP: the device must do atomics, the result word must be writable. */
static gs_status post_atomic(gs_ep *ep, gs_mr *lmr, const gs_verbs_op *op)
{
    gs_status status = check_atomics(ep, op->name);
    if (status == GS_OK)
        status = check_local_write(ep, lmr, op->name);
    return status == GS_OK ? post_op((gs_verbs_ep *)ep, op) : status;
}

gs_status gs_verbs_fetch_add(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                             uint64_t add, uint64_t wr_id, unsigned flags)
{
    gs_verbs_op op = rdma_op("FETCH_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD, GS_WC_FETCH_ADD, result,
                             sizeof(uint64_t), lmr, dst, off, wr_id, flags);
    op.compare_add = add;
    return post_atomic(ep, lmr, &op);
}

gs_status gs_verbs_cmp_swap(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                            uint64_t compare, uint64_t swap, uint64_t wr_id, unsigned flags)
{
    gs_verbs_op op = rdma_op("CMP_SWAP", IBV_WR_ATOMIC_CMP_AND_SWP, GS_WC_CMP_SWAP, result, sizeof(uint64_t),
                             lmr, dst, off, wr_id, flags);
    op.compare_add = compare;
    op.swap = swap;
    return post_atomic(ep, lmr, &op);
}

gs_status gs_verbs_send(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id, unsigned flags)
{
    gs_verbs_op op = {.name = "SEND",
                      .opcode = IBV_WR_SEND,
                      .wc_opcode = GS_WC_SEND,
                      .laddr = (uint64_t)(uintptr_t)src,
                      .len = len,
                      .lmr = lmr,
                      .wr_id = wr_id,
                      .flags = flags};
    if (len > GS_SEND_MAX)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_INVALID,
                       "rank %d: SEND of %zu bytes to peer rank %d: the limit is %d", ep->tp->rank, len,
                       ep->peer, GS_SEND_MAX);
    return post_op((gs_verbs_ep *)ep, &op);
}

gs_status gs_verbs_post_recv_bufs(gs_verbs_ep *ep, const uint32_t *bufs, uint32_t count)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    struct ibv_recv_wr wr[GS_VERBS_CQ_BATCH];
    struct ibv_sge sge[GS_VERBS_CQ_BATCH];

    for (uint32_t first = 0; first < count; first += GS_VERBS_CQ_BATCH) {
        uint32_t n = count - first < GS_VERBS_CQ_BATCH ? count - first : GS_VERBS_CQ_BATCH;
        struct ibv_recv_wr *bad = NULL;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t buf = bufs[first + i];
            sge[i] = (struct ibv_sge){.addr = (uint64_t)(uintptr_t)gs_verbs_rbuf_addr(vt, buf),
                                      .length = GS_SEND_MAX,
                                      .lkey = vt->rbuf_mr->lkey};
            wr[i] = (struct ibv_recv_wr){.wr_id = gs_verbs_wr_id(GS_VERBS_WR_RQ, 0, ep->base.peer, buf),
                                         .next = i + 1 < n ? &wr[i + 1] : NULL,
                                         .sg_list = &sge[i],
                                         .num_sge = 1};
        }
        int rc = ibv_post_recv(ep->qp, wr, &bad);
        if (rc != 0)
            return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
                           "rank %d: ibv_post_recv of %u receives for peer rank %d failed: %s", vt->base.rank,
                           n, ep->base.peer, strerror(rc));
    }
    return GS_OK;
}

void gs_verbs_queue_repost(gs_verbs_tp *vt, gs_verbs_ep *ep, uint32_t buf)
{
    ep->repost[ep->repost_count++] = buf;
    if (!ep->dirty) {
        ep->dirty = true;
        vt->dirty[vt->dirty_count++] = ep;
    }
}

void gs_verbs_match_recvs(gs_verbs_tp *vt, gs_verbs_ep *ep)
{
    while (ep->held_count > 0 && ep->urecv_count > 0) {
        gs_verbs_held h = ep->held[ep->held_head];
        gs_verbs_urecv u = ep->urecv[ep->urecv_head];
        gs_wc wc = {
            .wr_id = u.wr_id, .status = GS_OK, .opcode = GS_WC_RECV, .len = h.len, .peer = ep->base.peer};

        ep->held_head = (ep->held_head + 1) % vt->rq_depth;
        ep->held_count--;
        ep->urecv_head = (ep->urecv_head + 1) % GS_VERBS_URECV_MAX;
        ep->urecv_count--;
        if (h.len > u.cap)
            wc.status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_OVERFLOW,
                                "rank %d: a SEND of %u bytes from rank %d does not fit the posted receive "
                                "(wr_id %llu, %zu bytes); the message is dropped",
                                vt->base.rank, h.len, ep->base.peer, (unsigned long long)u.wr_id, u.cap);
        else if (h.len > 0)
            memcpy(u.dst, gs_verbs_rbuf_addr(vt, h.buf), h.len);
        gs_verbs_outq_push(vt, &wc);
        gs_verbs_queue_repost(vt, ep, h.buf);
    }
}

/* Re-posts the buffers queued this pass (one chained post per endpoint) and returns credits. */
void gs_verbs_flush_reposts(gs_verbs_tp *vt)
{
    uint32_t keep = 0;

    for (uint32_t i = 0; i < vt->dirty_count; i++) {
        gs_verbs_ep *ep = vt->dirty[i];
        if (ep->state != GS_VERBS_EP_READY) {
            ep->repost_count = 0;
            ep->dirty = false;
            continue;
        }
        if (ep->repost_count > 0 && gs_verbs_post_recv_bufs(ep, ep->repost, ep->repost_count) == GS_OK) {
            ep->reposted += ep->repost_count;
            ep->repost_count = 0;
        }
        if (credit_owed(ep))
            gs_verbs_post_ctrl(ep, GS_VERBS_SLOT_CREDIT);
        if (ep->repost_count > 0 || credit_owed(ep))
            vt->dirty[keep++] = ep; /* try again on the next pass */
        else
            ep->dirty = false;
    }
    vt->dirty_count = keep;
}

gs_status gs_verbs_recv(gs_ep *ep, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id)
{
    gs_verbs_ep *vep = (gs_verbs_ep *)ep;
    gs_verbs_tp *vt = gs_verbs_tp_of(ep->tp);
    gs_status status = gs_verbs_ep_usable(vep, "RECV");

    (void)lmr; /* the transport copies into dst; no HCA access to it */
    if (status != GS_OK)
        return status;
    if (vep->urecv_count == GS_VERBS_URECV_MAX)
        return GS_ERR_AGAIN;
    vep->urecv[(vep->urecv_head + vep->urecv_count) % GS_VERBS_URECV_MAX] =
        (gs_verbs_urecv){.dst = dst, .cap = cap, .wr_id = wr_id};
    vep->urecv_count++;
    gs_verbs_match_recvs(vt, vep);
    gs_verbs_flush_reposts(vt);
    return GS_OK;
}
