/*
 * shm completions and receives: the local completion queue (initiator-side
 * completions, queued at post time), posted receives, and SENDs that
 * arrived before a receive was posted (copied out of the ring so that the
 * WRITE_IMM notifications behind them keep flowing, up to GS_SHM_UNEXP_MAX).
 */
#include "transport/shm/shm.h"

#include "util/log.h"

#include <stdlib.h>
#include <string.h>

/* ---- local completion queue (capacities are powers of two) ------------------ */

gs_status gs_shm_cq_reserve(gs_shm_tp *tp)
{
    gs_shm_cq *cq = &tp->cq;
    size_t cap;
    gs_wc *wcs;

    if (cq->count < cq->cap)
        return GS_OK;
    cap = cq->cap ? cq->cap * 2 : 256;
    wcs = malloc(cap * sizeof(*wcs));
    if (!wcs)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM,
                       "rank %d: growing the completion queue to %zu entries failed; poll completions sooner",
                       tp->base.rank, cap);
    for (size_t i = 0; i < cq->count; i++)
        wcs[i] = cq->wcs[(cq->first + i) & (cq->cap - 1)];
    free(cq->wcs);
    *cq = (gs_shm_cq){.wcs = wcs, .cap = cap, .first = 0, .count = cq->count};
    return GS_OK;
}

void gs_shm_cq_push(gs_shm_tp *tp, const gs_wc *wc)
{
    gs_shm_cq *cq = &tp->cq;
    cq->wcs[(cq->first + cq->count) & (cq->cap - 1)] = *wc;
    cq->count++;
}

int gs_shm_cq_take(gs_shm_tp *tp, gs_wc *wcs, int max)
{
    gs_shm_cq *cq = &tp->cq;
    int n = 0;
    while (n < max && cq->count > 0) {
        wcs[n++] = cq->wcs[cq->first];
        cq->first = (cq->first + 1) & (cq->cap - 1);
        cq->count--;
    }
    return n;
}

void gs_shm_cq_free(gs_shm_cq *cq)
{
    free(cq->wcs);
    *cq = (gs_shm_cq){0};
}

/* ---- posted receives -------------------------------------------------------- */

static gs_status recvs_grow(gs_shm_ep *ep)
{
    size_t cap = ep->recv_cap ? ep->recv_cap * 2 : 64;
    gs_shm_rbuf *recvs = malloc(cap * sizeof(*recvs));
    if (!recvs)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM, "rank %d: growing the receive queue for rank %d failed",
                       ep->tp->base.rank, ep->base.peer);
    for (size_t i = 0; i < ep->recv_count; i++)
        recvs[i] = ep->recvs[(ep->recv_first + i) & (ep->recv_cap - 1)];
    free(ep->recvs);
    ep->recvs = recvs;
    ep->recv_cap = cap;
    ep->recv_first = 0;
    return GS_OK;
}

/* Completes a receive with the oldest buffered SEND. */
static void recv_from_unexp(gs_shm_ep *ep, void *dst, size_t cap, uint64_t wr_id)
{
    gs_shm_unexp *u = &ep->unexp[ep->unexp_first];
    gs_wc wc = {.wr_id = wr_id, .status = GS_OK, .opcode = GS_WC_RECV, .len = u->len, .peer = ep->base.peer};

    if (u->len > cap)
        wc.status = gs_fail(GS_SUBSYS_SHM, GS_ERR_OVERFLOW,
                            "rank %d: a %u-byte SEND from rank %d does not fit the %zu-byte receive",
                            ep->tp->base.rank, u->len, ep->base.peer, cap);
    else if (u->len > 0)
        memcpy(dst, u->data, u->len);
    free(u->data);
    ep->unexp_first = (ep->unexp_first + 1) % GS_SHM_UNEXP_MAX;
    ep->unexp_count--;
    ep->stalled = false; /* room again: a SEND waiting in the ring can move */
    gs_shm_cq_push(ep->tp, &wc);
}

gs_status gs_shm_recv(gs_ep *base, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    gs_status st = gs_shm_ep_check(ep, "recv");
    (void)lmr;
    if (st != GS_OK)
        return st;
    if (ep->unexp_count > 0) {
        st = gs_shm_cq_reserve(ep->tp);
        if (st == GS_OK)
            recv_from_unexp(ep, dst, cap, wr_id);
        return st;
    }
    if (ep->recv_count == ep->recv_cap) {
        st = recvs_grow(ep);
        if (st != GS_OK)
            return st;
    }
    ep->recvs[(ep->recv_first + ep->recv_count) & (ep->recv_cap - 1)] = (gs_shm_rbuf){dst, cap, wr_id};
    ep->recv_count++;
    ep->stalled = false;
    return GS_OK;
}

gs_shm_rbuf *gs_shm_recv_front(gs_shm_ep *ep)
{
    return ep->recv_count ? &ep->recvs[ep->recv_first] : NULL;
}

void gs_shm_recv_pop(gs_shm_ep *ep)
{
    ep->recv_first = (ep->recv_first + 1) & (ep->recv_cap - 1);
    ep->recv_count--;
}

bool gs_shm_unexp_push(gs_shm_ep *ep, uint8_t *data, uint32_t len)
{
    if (ep->unexp_count == GS_SHM_UNEXP_MAX)
        return false;
    ep->unexp[(ep->unexp_first + ep->unexp_count) % GS_SHM_UNEXP_MAX] = (gs_shm_unexp){data, len};
    ep->unexp_count++;
    return true;
}

void gs_shm_flush_recvs(gs_shm_ep *ep)
{
    while (ep->recv_count > 0 && gs_shm_cq_reserve(ep->tp) == GS_OK) {
        gs_shm_rbuf *r = gs_shm_recv_front(ep);
        gs_shm_cq_push(ep->tp, &(gs_wc){.wr_id = r->wr_id,
                                        .status = GS_ERR_FLUSHED,
                                        .opcode = GS_WC_RECV,
                                        .peer = ep->base.peer});
        gs_shm_recv_pop(ep);
    }
}

void gs_shm_ep_queues_free(gs_shm_ep *ep)
{
    while (ep->unexp_count > 0) {
        free(ep->unexp[ep->unexp_first].data);
        ep->unexp_first = (ep->unexp_first + 1) % GS_SHM_UNEXP_MAX;
        ep->unexp_count--;
    }
    free(ep->recvs);
    ep->recvs = NULL;
    ep->recv_cap = ep->recv_count = ep->recv_first = 0;
}
