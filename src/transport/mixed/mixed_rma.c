/*
 * The mixed transport's regions and posts: a region is one registration in
 * each instance; a post goes to the endpoint's instance with the local
 * region and the peer's descriptor of that instance (rebuilt from the
 * mixed one). The arguments were checked by tp.c; each backend checks the
 * rest again as it always does.
 */
#include "transport/mixed/mixed.h"

#include "util/alloc.h"
#include "util/list.h"
#include "util/log.h"

#include <stdlib.h>
#include <string.h>

static gs_mixed_tp *tp_of(gs_tp *base)
{
    return (gs_mixed_tp *)base;
}

/* ---- regions -------------------------------------------------------------------- */

static gs_status wrap(gs_tp *base, gs_mr *near, gs_mr *far, bool owned, gs_mr **mr_p)
{
    gs_mixed_tp *tp = tp_of(base);
    gs_mixed_mr *mr = gs_calloc(1, sizeof(*mr));
    if (!mr) {
        far->tp->ops->mr_dereg(far);
        near->tp->ops->mr_dereg(near);
        return GS_ERR_NOMEM;
    }
    mr->base =
        (gs_mr){.tp = base, .addr = near->addr, .len = near->len, .access = near->access, .owned = owned};
    mr->near = near;
    mr->far = far;
    GS_LIST_PUSH(tp->mrs, mr);
    *mr_p = &mr->base;
    return GS_OK;
}

/* Memory shm can map (a memfd), registered with the far backend as well. */
gs_status gs_mixed_buf_alloc(gs_tp *base, size_t len, unsigned access, gs_mr **mr_p)
{
    gs_mixed_tp *tp = tp_of(base);
    gs_mr *near = NULL, *far = NULL;
    gs_status st = tp->near->ops->buf_alloc(tp->near, len, access, &near);
    if (st != GS_OK)
        return st;
    st = tp->far->ops->mr_reg(tp->far, near->addr, near->len, access, &far);
    if (st != GS_OK) {
        tp->near->ops->mr_dereg(near);
        return st;
    }
    return wrap(base, near, far, true, mr_p);
}

gs_status gs_mixed_mr_reg(gs_tp *base, void *addr, size_t len, unsigned access, gs_mr **mr_p)
{
    gs_mixed_tp *tp = tp_of(base);
    gs_mr *near = NULL, *far = NULL;
    gs_status st = tp->near->ops->mr_reg(tp->near, addr, len, access, &near);
    if (st != GS_OK)
        return st;
    st = tp->far->ops->mr_reg(tp->far, addr, len, access, &far);
    if (st != GS_OK) {
        tp->near->ops->mr_dereg(near);
        return st;
    }
    return wrap(base, near, far, false, mr_p);
}

/* The far registration first: it points into memory the near one may own. */
gs_status gs_mixed_mr_dereg(gs_mr *base)
{
    gs_mixed_mr *mr = (gs_mixed_mr *)base;
    gs_mixed_tp *tp = tp_of(base->tp);
    gs_status st = mr->far->tp->ops->mr_dereg(mr->far);
    gs_status st2 = mr->near->tp->ops->mr_dereg(mr->near);
    GS_LIST_UNLINK(tp->mrs, mr);
    free(mr);
    return st != GS_OK ? st : st2;
}

/* The descriptor sub's backend would make of its part of mr. */
static void pack_part(const gs_mr *sub, gs_rmr_head *head)
{
    memset(head, 0, sizeof(*head));
    head->version = GS_RMR_VERSION;
    head->transport = (uint8_t)sub->tp->ops->id;
    head->access = (uint8_t)sub->access;
    head->owner = (uint32_t)sub->tp->rank;
    head->addr = (uint64_t)(uintptr_t)sub->addr;
    head->len = sub->len;
    sub->tp->ops->mr_pack(sub, head);
}

void gs_mixed_mr_pack(const gs_mr *base, gs_rmr_head *head)
{
    const gs_mixed_mr *mr = (const gs_mixed_mr *)base;
    gs_rmr_head near, far;
    pack_part(mr->near, &near);
    pack_part(mr->far, &far);
    head->key = far.key;
    memcpy(head->tail + MIXED_TAIL_NEAR_KEY, &near.key, sizeof(near.key));
    memcpy(head->tail + MIXED_TAIL_NEAR_TAIL, near.tail, MIXED_TAIL_NEAR_BYTES);
    memcpy(head->tail + MIXED_TAIL_FAR_TAIL, far.tail, MIXED_TAIL_FAR_BYTES);
}

/* ---- posts ---------------------------------------------------------------------- */

/* The peer's descriptor as ep's instance knows it. */
static void unpack_part(const gs_mixed_ep *ep, const gs_rmr_head *mixed, gs_rmr_head *head)
{
    *head = (gs_rmr_head){.version = mixed->version,
                          .transport = (uint8_t)ep->sub->tp->ops->id,
                          .access = mixed->access,
                          .owner = mixed->owner,
                          .addr = mixed->addr,
                          .len = mixed->len};
    if (ep->near) {
        memcpy(&head->key, mixed->tail + MIXED_TAIL_NEAR_KEY, sizeof(head->key));
        memcpy(head->tail, mixed->tail + MIXED_TAIL_NEAR_TAIL, MIXED_TAIL_NEAR_BYTES);
    } else {
        head->key = mixed->key;
        memcpy(head->tail, mixed->tail + MIXED_TAIL_FAR_TAIL, MIXED_TAIL_FAR_BYTES);
    }
}

static gs_mr *part(const gs_mixed_ep *ep, gs_mr *lmr)
{
    if (!lmr)
        return NULL;
    return ep->near ? ((gs_mixed_mr *)lmr)->near : ((gs_mixed_mr *)lmr)->far;
}

#define EP(base)    ((gs_mixed_ep *)(base))
#define SUB_OPS(ep) ((ep)->sub->tp->ops)

gs_status gs_mixed_write(gs_ep *base, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                         uint64_t off, uint64_t wr_id, unsigned flags)
{
    gs_mixed_ep *ep = EP(base);
    gs_rmr_head head;
    unpack_part(ep, dst, &head);
    return SUB_OPS(ep)->write(ep->sub, src, part(ep, lmr), len, &head, off, wr_id, flags);
}

gs_status gs_mixed_write_imm(gs_ep *base, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                             uint64_t off, uint32_t imm, uint64_t wr_id, unsigned flags)
{
    gs_mixed_ep *ep = EP(base);
    gs_rmr_head head;
    unpack_part(ep, dst, &head);
    return SUB_OPS(ep)->write_imm(ep->sub, src, part(ep, lmr), len, &head, off, imm, wr_id, flags);
}

gs_status gs_mixed_read(gs_ep *base, void *dst, gs_mr *lmr, size_t len, const gs_rmr_head *src, uint64_t off,
                        uint64_t wr_id, unsigned flags)
{
    gs_mixed_ep *ep = EP(base);
    gs_rmr_head head;
    unpack_part(ep, src, &head);
    return SUB_OPS(ep)->read(ep->sub, dst, part(ep, lmr), len, &head, off, wr_id, flags);
}

gs_status gs_mixed_fetch_add(gs_ep *base, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                             uint64_t add, uint64_t wr_id, unsigned flags)
{
    gs_mixed_ep *ep = EP(base);
    gs_rmr_head head;
    unpack_part(ep, dst, &head);
    return SUB_OPS(ep)->fetch_add(ep->sub, result, part(ep, lmr), &head, off, add, wr_id, flags);
}

gs_status gs_mixed_cmp_swap(gs_ep *base, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                            uint64_t compare, uint64_t swap, uint64_t wr_id, unsigned flags)
{
    gs_mixed_ep *ep = EP(base);
    gs_rmr_head head;
    unpack_part(ep, dst, &head);
    return SUB_OPS(ep)->cmp_swap(ep->sub, result, part(ep, lmr), &head, off, compare, swap, wr_id, flags);
}

gs_status gs_mixed_send(gs_ep *base, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id, unsigned flags)
{
    gs_mixed_ep *ep = EP(base);
    return SUB_OPS(ep)->send(ep->sub, src, part(ep, lmr), len, wr_id, flags);
}

gs_status gs_mixed_recv(gs_ep *base, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id)
{
    gs_mixed_ep *ep = EP(base);
    return SUB_OPS(ep)->recv(ep->sub, dst, part(ep, lmr), cap, wr_id);
}
