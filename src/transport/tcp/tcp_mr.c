/* Registered regions of the tcp transport: a table indexed by the low half
 * of the key, whose high half is random so that a stale or guessed key
 * names nothing. The target checks every remote access here before a byte
 * moves. */
#include "transport/tcp/tcp.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static uint32_t random_u32(void)
{
    uint32_t r = 0;
    while (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r) || r == 0)
        ;
    return r;
}

/* Gives mr a free slot and a fresh key (caller holds the lock). */
static gs_status region_add(gs_tcp_tp *tp, gs_tcp_mr *mr)
{
    uint32_t slot = 0;
    while (slot < tp->region_cap && tp->regions[slot])
        slot++;
    if (slot == tp->region_cap) {
        uint32_t cap = tp->region_cap ? tp->region_cap * 2 : 64;
        gs_tcp_mr **grown = realloc(tp->regions, cap * sizeof(*grown));
        if (!grown)
            return gs_fail(GS_SUBSYS_TCP, GS_ERR_NOMEM, "rank %d: no memory for %u region slots",
                           tp->base.rank, cap);
        memset(grown + tp->region_cap, 0, (cap - tp->region_cap) * sizeof(*grown));
        tp->regions = grown;
        tp->region_cap = cap;
    }
    mr->key = (uint64_t)random_u32() << 32 | slot;
    tp->regions[slot] = mr;
    return GS_OK;
}

static gs_status region_register(gs_tp *base, void *addr, size_t len, unsigned access, bool owned,
                                 gs_mr **mr_p)
{
    gs_tcp_tp *tp = gs_tcp_tp_of(base);
    gs_tcp_mr *mr = gs_calloc(1, sizeof(*mr));
    gs_status status;
    if (!mr)
        return GS_ERR_NOMEM;
    mr->base = (gs_mr){.tp = base, .addr = addr, .len = len, .access = access, .owned = owned};
    pthread_mutex_lock(&tp->lock);
    status = region_add(tp, mr);
    pthread_mutex_unlock(&tp->lock);
    if (status != GS_OK) {
        free(mr);
        return status;
    }
    *mr_p = &mr->base;
    return GS_OK;
}

gs_status gs_tcp_buf_alloc(gs_tp *tp, size_t len, unsigned access, gs_mr **mr_p)
{
    void *addr;
    gs_status status = gs_pages_alloc(len, &addr);
    if (status != GS_OK)
        return status;
    status = region_register(tp, addr, len, access, true, mr_p);
    if (status != GS_OK)
        gs_pages_free(addr, len);
    return status;
}

gs_status gs_tcp_mr_reg(gs_tp *tp, void *addr, size_t len, unsigned access, gs_mr **mr_p)
{
    return region_register(tp, addr, len, access, false, mr_p);
}

/* Whether an endpoint is receiving a payload into mr or has a reply queued
 * that reads from it. */
static bool ep_uses(const gs_tcp_ep *ep, const gs_tcp_mr *mr)
{
    const uint8_t *lo = mr->base.addr, *hi = lo + mr->base.len;
    if (ep->dead)
        return false;
    if (ep->rx.state == GS_TCP_RX_PAYLOAD && ep->rx.dst >= lo && ep->rx.dst < hi && ep->rx.unexp < 0 &&
        gs_tcp_op_is_request(ep->rx.hdr.op))
        return true;
    for (uint32_t i = 0; i < ep->tx_count; i++)
        if (ep->tx[(ep->tx_head + i) % GS_TCP_TX_CAP].ref == mr)
            return true;
    return false;
}

/* Lets queued READ replies from mr go out (up to the deadline); an endpoint
 * still using the region after that loses its connection. */
static void region_quiesce(gs_tcp_tp *tp, gs_tcp_mr *mr)
{
    uint64_t deadline = gs_deadline_after_ms(tp->base.cfg->timeout_ms);
    while (mr->tx_refs > 0 && !gs_deadline_passed(deadline)) {
        gs_tcp_progress(tp);
        if (mr->tx_refs > 0)
            usleep(100); /* the peer is reading the replies */
    }
    for (int p = 0; p < tp->base.size; p++) {
        gs_tcp_ep *ep = tp->base.eps ? gs_tcp_ep_at(tp, p) : NULL;
        if (ep && ep_uses(ep, mr))
            gs_tcp_ep_fail(ep, GS_ERR_REMOTE_ACCESS,
                           "rank %d: region key %#llx deregistered while rank %d was still accessing it; "
                           "dropping the connection",
                           tp->base.rank, (unsigned long long)mr->key, p);
    }
}

gs_status gs_tcp_mr_dereg(gs_mr *base)
{
    gs_tcp_mr *mr = (gs_tcp_mr *)base;
    gs_tcp_tp *tp = gs_tcp_tp_of(base->tp);
    uint32_t slot = (uint32_t)mr->key;

    pthread_mutex_lock(&tp->lock);
    region_quiesce(tp, mr);
    if (slot < tp->region_cap && tp->regions[slot] == mr)
        tp->regions[slot] = NULL;
    pthread_mutex_unlock(&tp->lock);
    if (base->owned)
        gs_pages_free(base->addr, base->len);
    free(mr);
    return GS_OK;
}

void gs_tcp_mr_pack(const gs_mr *base, gs_rmr_head *head)
{
    const gs_tcp_mr *mr = (const gs_tcp_mr *)base;
    memset(head, 0, sizeof(*head));
    head->version = GS_RMR_VERSION;
    head->transport = GS_TRANSPORT_TCP;
    head->access = (uint8_t)base->access;
    head->owner = (uint32_t)base->tp->rank;
    head->addr = (uint64_t)(uintptr_t)base->addr;
    head->len = base->len;
    head->key = mr->key;
}

gs_tcp_mr *gs_tcp_mr_find(gs_tcp_tp *tp, uint64_t key)
{
    uint32_t slot = (uint32_t)key;
    if (slot >= tp->region_cap || !tp->regions[slot] || tp->regions[slot]->key != key)
        return NULL;
    return tp->regions[slot];
}

gs_status gs_tcp_mr_check(const gs_tcp_mr *mr, uint64_t off, uint64_t len, unsigned access,
                          const char **why_p)
{
    const char *why = NULL;
    if (!mr)
        why = "no region has this key (never registered, or deregistered)";
    else if (!gs_tp_in_bounds(off, len, mr->base.len))
        why = "access beyond the end of the region";
    else if ((mr->base.access & access) != access)
        why = access == GS_ACCESS_REMOTE_WRITE  ? "region not registered for remote write"
              : access == GS_ACCESS_REMOTE_READ ? "region not registered for remote read"
                                                : "region not registered for remote atomics";
    if (why) {
        *why_p = why;
        return GS_ERR_REMOTE_ACCESS;
    }
    return GS_OK;
}
