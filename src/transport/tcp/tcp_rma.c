/* Posting operations on a tcp endpoint: each becomes one frame queued on the
 * endpoint (its payload sent later straight from the caller's buffer) and,
 * when the caller wants a completion or a result, an entry in the
 * endpoint's ring of outstanding operations. Never blocks: the frame is
 * written at once if the socket takes it, else by later progress. */
#include "transport/tcp/tcp.h"

#include "util/clock.h"
#include "util/log.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the caller posts, beside the frame itself. */
typedef struct post_args {
    gs_wc_opcode opcode;
    void *local; /* READ destination / atomic result */
    uint64_t len;
    uint64_t wr_id;
    unsigned flags;
} post_args;

static bool opcode_has_reply(gs_wc_opcode opcode)
{
    return opcode == GS_WC_READ || opcode == GS_WC_FETCH_ADD || opcode == GS_WC_CMP_SWAP;
}

/* The status a post on a dead endpoint returns: PEER_LOST if the peer died
 * or closed; after a refusal of ours, that error once, then FLUSHED. */
static gs_status dead_status(gs_tcp_ep *ep)
{
    gs_status status;
    int rank;
    if (ep->lost || ep->bye_rcvd)
        return gs_tcp_ep_report(ep, GS_ERR_PEER_LOST, "%s", ep->why);
    status = ep->err_reported ? GS_ERR_FLUSHED : ep->err;
    ep->err_reported = true;
    return gs_tcp_ep_report(ep, status, "rank %d: the endpoint to rank %d is in error after: %s",
                            ep->base.tp->rank, ep->base.peer, gs_error_skip_rank(ep->why, &rank));
}

static gs_status post_room(const gs_tcp_ep *ep, const post_args *a)
{
    bool tracked = (a->flags & GS_OP_SIGNALED) || opcode_has_reply(a->opcode);
    if (ep->tx_user >= GS_TCP_SQ_DEPTH || (tracked && ep->pend_count >= GS_TCP_PEND_CAP) ||
        (opcode_has_reply(a->opcode) && ep->rd_out >= GS_TCP_MAX_RD))
        return GS_ERR_AGAIN;
    return GS_OK;
}

static void pend_push(gs_tcp_ep *ep, const post_args *a, uint64_t seq)
{
    gs_tcp_pend *e = &ep->pend[(ep->pend_head + ep->pend_count) % GS_TCP_PEND_CAP];
    *e = (gs_tcp_pend){.seq = seq,
                       .wr_id = a->wr_id,
                       .posted_ns = gs_now_ns(),
                       .local = a->local,
                       .len = a->len,
                       .opcode = a->opcode,
                       .signaled = (a->flags & GS_OP_SIGNALED) != 0};
    ep->pend_count++;
    if (opcode_has_reply(a->opcode))
        ep->rd_out++;
}

/* Numbers the request, queues it and tries to write it now. */
static gs_status post(gs_ep *base, gs_tcp_hdr *hdr, const void *payload, const post_args *a)
{
    gs_tcp_ep *ep = (gs_tcp_ep *)base;
    gs_tcp_tp *tp = gs_tcp_tp_of(base->tp);
    gs_status status;

    pthread_mutex_lock(&tp->lock);
    status = ep->dead ? dead_status(ep) : post_room(ep, a);
    if (status == GS_OK) {
        hdr->version = GS_TCP_PROTO_VERSION;
        hdr->seq = ep->next_seq++;
        if ((a->flags & GS_OP_SIGNALED) && !opcode_has_reply(a->opcode))
            hdr->flags |= GS_TCP_F_ACK_REQ;
        gs_tcp_tx_route(ep, hdr->len);
        gs_tcp_tx *t = gs_tcp_tx_push(ep, hdr, payload, true);
        if (a->flags & GS_OP_ZCOPY)
            gs_tcp_tx_zcopy(ep, t);
        if ((a->flags & GS_OP_SIGNALED) || opcode_has_reply(a->opcode))
            pend_push(ep, a, hdr->seq);
        if (!ep->tx_blocked) {
            gs_tcp_tx_flush(ep);
            if (ep->tx_blocked)
                gs_tcp_wake_thread(tp); /* so a serving progress thread watches for room */
        }
    }
    pthread_mutex_unlock(&tp->lock);
    return status;
}

static gs_status check_target(const gs_ep *ep, const gs_rmr_head *rmr, uint64_t len)
{
    if (rmr->owner != (uint32_t)ep->peer)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_INVALID,
                       "rank %d: a region of rank %u used on the endpoint to rank %d", ep->tp->rank,
                       rmr->owner, ep->peer);
    if (len > GS_TCP_MAX_PAYLOAD)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_INVALID,
                       "rank %d: %llu bytes to rank %d exceed one tcp operation", ep->tp->rank,
                       (unsigned long long)len, ep->peer);
    return GS_OK;
}

gs_status gs_tcp_write(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                       uint64_t off, uint64_t wr_id, unsigned flags)
{
    gs_tcp_hdr hdr = {.op = GS_TCP_OP_WRITE, .len = len, .key = dst->key, .off = off};
    post_args a = {.opcode = GS_WC_WRITE, .wr_id = wr_id, .flags = flags};
    gs_status status = check_target(ep, dst, len);
    (void)lmr;
    return status != GS_OK ? status : post(ep, &hdr, src, &a);
}

gs_status gs_tcp_write_imm(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                           uint64_t off, uint32_t imm, uint64_t wr_id, unsigned flags)
{
    gs_tcp_hdr hdr = {.op = GS_TCP_OP_WRITE_IMM, .imm = imm, .len = len, .key = dst->key, .off = off};
    post_args a = {.opcode = GS_WC_WRITE_IMM, .wr_id = wr_id, .flags = flags};
    gs_status status = check_target(ep, dst, len);
    (void)lmr;
    return status != GS_OK ? status : post(ep, &hdr, src, &a);
}

gs_status gs_tcp_read(gs_ep *ep, void *dst, gs_mr *lmr, size_t len, const gs_rmr_head *src, uint64_t off,
                      uint64_t wr_id, unsigned flags)
{
    gs_tcp_hdr hdr = {.op = GS_TCP_OP_READ_REQ, .key = src->key, .off = off, .arg0 = len};
    post_args a = {.opcode = GS_WC_READ, .local = dst, .len = len, .wr_id = wr_id, .flags = flags};
    gs_status status = check_target(ep, src, len);
    (void)lmr;
    return status != GS_OK ? status : post(ep, &hdr, NULL, &a);
}

gs_status gs_tcp_fetch_add(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                           uint64_t add, uint64_t wr_id, unsigned flags)
{
    gs_tcp_hdr hdr = {.op = GS_TCP_OP_FETCH_ADD, .key = dst->key, .off = off, .arg0 = add};
    post_args a = {.opcode = GS_WC_FETCH_ADD, .local = result, .len = 8, .wr_id = wr_id, .flags = flags};
    gs_status status = check_target(ep, dst, 8);
    (void)lmr;
    return status != GS_OK ? status : post(ep, &hdr, NULL, &a);
}

gs_status gs_tcp_cmp_swap(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                          uint64_t compare, uint64_t swap, uint64_t wr_id, unsigned flags)
{
    gs_tcp_hdr hdr = {.op = GS_TCP_OP_CMP_SWAP, .key = dst->key, .off = off, .arg0 = compare, .arg1 = swap};
    post_args a = {.opcode = GS_WC_CMP_SWAP, .local = result, .len = 8, .wr_id = wr_id, .flags = flags};
    gs_status status = check_target(ep, dst, 8);
    (void)lmr;
    return status != GS_OK ? status : post(ep, &hdr, NULL, &a);
}

gs_status gs_tcp_send(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id, unsigned flags)
{
    gs_tcp_hdr hdr = {.op = GS_TCP_OP_SEND, .len = len};
    post_args a = {.opcode = GS_WC_SEND, .wr_id = wr_id, .flags = flags};
    (void)lmr;
    if (len > GS_SEND_MAX)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_INVALID,
                       "rank %d: SEND of %zu bytes to rank %d exceeds GS_SEND_MAX (%d)", ep->tp->rank, len,
                       ep->peer, GS_SEND_MAX);
    return post(ep, &hdr, src, &a);
}

void gs_tcp_ep_match_unexp(gs_tcp_tp *tp, gs_tcp_ep *ep)
{
    while (ep->recv_count && ep->unexp_count && !gs_tcp_cq_full(tp)) {
        gs_tcp_posted *r = &ep->recvs[ep->recv_head];
        gs_tcp_unexp *u = &ep->unexp[ep->unexp_head];
        gs_wc wc = {.wr_id = r->wr_id,
                    .status = GS_OK,
                    .opcode = GS_WC_RECV,
                    .len = (uint32_t)u->len,
                    .peer = ep->base.peer};
        if (u->len <= r->cap) {
            if (u->len)
                memcpy(r->buf, u->buf, u->len);
        } else {
            wc.status = GS_ERR_INVALID;
            gs_log_error(
                TCP,
                "rank %d: a SEND of %llu bytes from rank %d does not fit the posted receive of %llu bytes "
                "(wr_id %llu); message dropped",
                tp->base.rank, (unsigned long long)u->len, ep->base.peer, (unsigned long long)r->cap,
                (unsigned long long)r->wr_id);
        }
        free(u->buf);
        u->buf = NULL;
        ep->unexp_head = (ep->unexp_head + 1) % GS_TCP_UNEXP_CAP;
        ep->unexp_count--;
        ep->recv_head = (ep->recv_head + 1) % GS_TCP_RECV_CAP;
        ep->recv_count--;
        gs_tcp_cq_push(tp, &wc);
    }
}

gs_status gs_tcp_recv(gs_ep *base, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id)
{
    gs_tcp_ep *ep = (gs_tcp_ep *)base;
    gs_tcp_tp *tp = gs_tcp_tp_of(base->tp);
    gs_status status = GS_OK;
    (void)lmr;

    pthread_mutex_lock(&tp->lock);
    if (ep->dead)
        status = dead_status(ep);
    else if (ep->recv_count == GS_TCP_RECV_CAP)
        status = GS_ERR_AGAIN;
    if (status == GS_OK) {
        ep->recvs[(ep->recv_head + ep->recv_count) % GS_TCP_RECV_CAP] =
            (gs_tcp_posted){.buf = dst, .cap = cap, .wr_id = wr_id};
        ep->recv_count++;
        gs_tcp_ep_match_unexp(tp, ep);
    }
    pthread_mutex_unlock(&tp->lock);
    return status;
}
