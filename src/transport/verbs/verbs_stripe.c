/*
 * Several RC queue pairs per peer (GS_IB_QPS_PER_PEER > 1): the lanes.
 *
 * Lane 0 is the endpoint's own queue pair and carries everything it carried
 * alone: SEND, atomics, small operations, the control operations and every
 * receive. A WRITE, WRITE_IMM or READ of GS_IB_STRIPE_MIN bytes or more is
 * cut into one stripe per lane (4 KiB multiples, stripe i on lane i), posted
 * at once on every lane. Nothing orders one queue pair against another, so
 * the transport contract is kept by three rules:
 *
 *  - Completion: every work request of a user operation is signaled and
 *    counted on the operation (the op ring); the operation completes when
 *    all of them did, and completions reach the user in post order, so a
 *    signaled completion still means every earlier operation on the
 *    endpoint is done (the buffers of unsignaled ones may be reused).
 *  - WRITE_IMM and SEND see every earlier WRITE: a lane-0 post that needs
 *    it (WRITE_IMM, SEND, and a fenced operation, which must start after
 *    earlier READs) is held until every side lane completed the work
 *    posted on it before (per-lane marks; a lane completes in order), and
 *    once one lane-0 piece is held, every later one waits behind it, so
 *    lane 0 keeps the caller's order (WRITE_IMMs arrive in order).
 *  - A striped WRITE_IMM: its stripes go as plain WRITEs on all lanes, and
 *    once all of them completed (acknowledged, hence in the target's
 *    memory) lane 0 sends the immediate's notice, a SEND_WITH_IMM of the
 *    user's immediate and the total length (gs_verbs_imm_notice), which
 *    the target reports as the one GS_WC_RECV_IMM. A WRITE_IMM of its own
 *    would report only its last stripe's length at the target, and posting
 *    the last stripe as a WRITE_IMM after the others would serialize a
 *    quarter of the data behind a round trip; the notice costs one small
 *    message after the data, the same receive credit as the WRITE_IMM.
 *
 * The cost: a held post waits for a round trip of the side lanes, and every
 * user work request is signaled (one completion each).
 */
#include "transport/verbs/verbs.h"

#include "util/log.h"

#include <string.h>

#define GS_VERBS_STRIPE_ALIGN 4096u

static gs_verbs_track *track_at(gs_verbs_ep *ep, uint64_t op)
{
    return &ep->ops[op % GS_VERBS_OPS_MAX];
}

static bool side_busy(const gs_verbs_ep *ep)
{
    for (uint32_t l = 1; l < ep->lanes; l++)
        if (ep->side[l - 1]->sq_posted > ep->side[l - 1]->sq_done)
            return true;
    return false;
}

static void mark_sides(const gs_verbs_ep *ep, gs_verbs_piece *piece)
{
    for (uint32_t l = 1; l < ep->lanes; l++)
        piece->mark[l] = ep->side[l - 1]->sq_posted;
}

static bool sides_reached(const gs_verbs_ep *ep, const gs_verbs_piece *piece)
{
    for (uint32_t l = 1; l < ep->lanes; l++)
        if (ep->side[l - 1]->sq_done < piece->mark[l])
            return false;
    return true;
}

static bool lane_room(const gs_verbs_ep *lane_ep, uint32_t n)
{
    const gs_verbs_tp *vt = (const gs_verbs_tp *)lane_ep->base.tp;
    return lane_ep->sq_posted - lane_ep->sq_done + n <= vt->sq_depth;
}

/* The stripe length for op on ep's lanes, or 0: not striped. */
static uint32_t stripe_len(const gs_verbs_tp *vt, const gs_verbs_ep *ep, const gs_verbs_op *op)
{
    uint64_t per;
    bool rdma = op->opcode == IBV_WR_RDMA_WRITE || op->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
                op->opcode == IBV_WR_RDMA_READ;
    if (!rdma || op->len < (uint64_t)vt->base.cfg->ib_stripe_min || (op->flags & GS_OP_FENCE))
        return 0;
    if (op->opcode == IBV_WR_RDMA_WRITE_WITH_IMM && vt->max_inline < sizeof(gs_verbs_imm_notice))
        return 0; /* the notice goes inline only */
    per = (op->len + ep->lanes - 1) / ep->lanes;
    per = (per + GS_VERBS_STRIPE_ALIGN - 1) / GS_VERBS_STRIPE_ALIGN * GS_VERBS_STRIPE_ALIGN;
    return per > vt->max_msg ? vt->max_msg : (uint32_t)per;
}

/* The piece [off, off + len) of op for a lane on rail `rail` (its keys are that device's). */
static gs_verbs_piece piece_of(const gs_verbs_op *op, uint64_t off, uint64_t len, uint32_t op_index,
                               uint8_t rail)
{
    gs_verbs_mr *lmr = (gs_verbs_mr *)op->lmr;
    struct ibv_mr *mr = !lmr ? NULL : rail ? lmr->reg->rail_mr[rail - 1] : lmr->reg->mr;
    return (gs_verbs_piece){.laddr = op->laddr + off,
                            .raddr = op->raddr + off,
                            .compare_add = op->compare_add,
                            .swap = op->swap,
                            .len = (uint32_t)len,
                            .lkey = mr ? mr->lkey : 0,
                            .rkey = rail ? op->rail_rkey : op->rkey,
                            .imm = op->imm,
                            .op = op_index,
                            .opcode = (uint8_t)op->opcode,
                            .wc_opcode = (uint8_t)op->wc_opcode};
}

static void defer_push(gs_verbs_ep *ep, const gs_verbs_piece *piece)
{
    ep->defer[(ep->defer_head + ep->defer_count) % GS_VERBS_DEFER_MAX] = *piece;
    ep->defer_count++;
}

/* A lane-0 piece: posted now if nothing is held and it needs no side lane done, else held. */
static gs_status lane0_place(gs_verbs_ep *ep, gs_verbs_piece *piece, bool barrier)
{
    if (barrier)
        mark_sides(ep, piece);
    if (ep->defer_count == 0 && (!barrier || !side_busy(ep)))
        return gs_verbs_piece_post(ep, piece);
    defer_push(ep, piece);
    return GS_OK;
}

/* The room op needs, checked before anything is posted (a call that returns an error never completes). */
static bool room_for(gs_verbs_tp *vt, gs_verbs_ep *ep, const gs_verbs_op *op, uint32_t per, uint32_t n)
{
    uint32_t held = per && op->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? 2 : 1;
    if (ep->op_tail - ep->op_head >= GS_VERBS_OPS_MAX || ep->defer_count + held > GS_VERBS_DEFER_MAX)
        return false;
    for (uint32_t l = 0; l < n; l++) {
        uint64_t off = (uint64_t)l * per, len = per ? (op->len - off < per ? op->len - off : per) : op->len;
        gs_verbs_ep *lane_ep = l ? ep->side[l - 1] : ep;
        gs_verbs_piece p = piece_of(op, off, len, 0, lane_ep->rail);
        if (!lane_room(lane_ep, gs_verbs_piece_wrs(vt, &p) + (l == 0 ? 1 : 0)))
            return false;
    }
    return true;
}

gs_status gs_verbs_lanes_post(gs_verbs_ep *ep, const gs_verbs_op *op)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    uint32_t per = stripe_len(vt, ep, op);
    uint32_t n = per ? (uint32_t)((op->len + per - 1) / per) : 1;
    bool imm = op->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    uint32_t wrs = 0, index = (uint32_t)(ep->op_tail % GS_VERBS_OPS_MAX);
    gs_status status = GS_OK;
    gs_verbs_piece pieces[GS_VERBS_QPS_MAX];

    if (!room_for(vt, ep, op, per, n)) {
        gs_verbs_progress(vt);
        if (ep->state != GS_VERBS_EP_READY)
            return gs_verbs_ep_usable(ep, op->name);
        if (!room_for(vt, ep, op, per, n))
            return GS_ERR_AGAIN;
    }
    for (uint32_t l = 0; l < n; l++) {
        uint64_t off = (uint64_t)l * per, len = per ? (op->len - off < per ? op->len - off : per) : op->len;
        pieces[l] = piece_of(op, off, len, index, l ? ep->side[l - 1]->rail : 0);
        if (per && imm)
            pieces[l].opcode = IBV_WR_RDMA_WRITE; /* the immediate follows in the notice */
        pieces[l].inline_ok = !per && op->len <= vt->max_inline && op->opcode != IBV_WR_RDMA_READ &&
                              op->wc_opcode != GS_WC_FETCH_ADD && op->wc_opcode != GS_WC_CMP_SWAP;
        pieces[l].fence = (op->flags & GS_OP_FENCE) != 0;
        wrs += gs_verbs_piece_wrs(vt, &pieces[l]);
    }
    *track_at(ep, ep->op_tail) = (gs_verbs_track){.wr_id = op->wr_id,
                                                  .remaining = wrs + (per && imm ? 1 : 0),
                                                  .opcode = (uint8_t)op->wc_opcode,
                                                  .deliver = 0}; /* set once the call succeeded */
    ep->op_tail++;
    /* side stripes first: the notice's marks must include them */
    for (uint32_t l = 1; l < n && status == GS_OK; l++)
        status = gs_verbs_piece_post(ep->side[l - 1], &pieces[l]);
    if (status == GS_OK) {
        bool barrier = !per && (imm || op->opcode == IBV_WR_SEND || (op->flags & GS_OP_FENCE));
        status = lane0_place(ep, &pieces[0], barrier);
    }
    if (status == GS_OK && per && imm) {
        gs_verbs_piece notice = {.total = op->len,
                                 .imm = op->imm,
                                 .op = index,
                                 .opcode = IBV_WR_SEND_WITH_IMM,
                                 .wc_opcode = GS_WC_WRITE_IMM,
                                 .len = sizeof(gs_verbs_imm_notice)};
        status = lane0_place(ep, &notice, true);
    }
    /* A refused post failed the endpoint on the way: the call returns the error, no completion follows. */
    if (status == GS_OK)
        track_at(ep, index)->deliver = (op->flags & GS_OP_SIGNALED) != 0;
    return status;
}

void gs_verbs_lanes_flush(gs_verbs_ep *ep)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    while (ep->defer_count > 0 && ep->state == GS_VERBS_EP_READY) {
        gs_verbs_piece *piece = &ep->defer[ep->defer_head];
        if (!sides_reached(ep, piece) || !lane_room(ep, gs_verbs_piece_wrs(vt, piece)))
            return;
        if (gs_verbs_piece_post(ep, piece) != GS_OK)
            return; /* the endpoint failed: gs_verbs_lanes_fail dropped the rest */
        ep->defer_head = (ep->defer_head + 1) % GS_VERBS_DEFER_MAX;
        ep->defer_count--;
    }
}

void gs_verbs_lanes_done(gs_verbs_ep *ep, uint32_t op)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    gs_verbs_track *t = &ep->ops[op % GS_VERBS_OPS_MAX];
    if (t->remaining > 0)
        t->remaining--;
    while (ep->op_head < ep->op_tail && track_at(ep, ep->op_head)->remaining == 0) {
        gs_verbs_track *head = track_at(ep, ep->op_head);
        gs_wc wc = {.wr_id = head->wr_id, .status = GS_OK, .opcode = head->opcode, .peer = ep->base.peer};
        if (head->deliver)
            gs_verbs_outq_push(vt, &wc);
        ep->op_head++;
    }
}

void gs_verbs_lanes_fail(gs_verbs_ep *ep, gs_status status)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)ep->base.tp;
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
    bool reported = ep->err_reported;

    for (uint32_t l = 1; l < ep->lanes; l++) {
        gs_verbs_ep *side = ep->side[l - 1];
        if (side->qp && ibv_modify_qp(side->qp, &attr, IBV_QP_STATE) != 0)
            gs_log_debug(VERBS, "rank %d: moving lane %u to rank %d to ERR failed", vt->base.rank, l,
                         ep->base.peer);
        side->sq_done = side->sq_posted;
    }
    ep->defer_count = 0;
    for (; ep->op_head < ep->op_tail; ep->op_head++) {
        gs_verbs_track *t = track_at(ep, ep->op_head);
        gs_wc wc = {.wr_id = t->wr_id, .opcode = t->opcode, .peer = ep->base.peer, .status = GS_OK};
        if (!t->deliver)
            continue;
        if (t->remaining > 0) {
            wc.status = reported ? GS_ERR_FLUSHED : status;
            reported = true;
        }
        gs_verbs_outq_push(vt, &wc);
    }
    ep->err_reported = reported;
}
