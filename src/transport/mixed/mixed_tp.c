/*
 * The mixed transport instance: open (shm for this host's ranks, the far
 * backend for every rank, then an endpoint per peer on the instance that
 * reaches it), close, completions from both, and the ops table.
 *
 * Waiting on two instances: neither backend can wake the other's sleep
 * (shm sleeps on a futex in its segment, tcp in poll(2), verbs on its
 * completion channel), so a wait first polls both for the spin budget
 * (GS_POLL, GS_SPIN_US), then sleeps on the instance that delivered the
 * last completion (a collective's next message mostly comes the way its
 * last one did: across hosts in a ring's network phase, over shm in a
 * host's phase) for a slice that doubles while nothing comes (from
 * MIXED_SLICE_MIN_NS to MIXED_SLICE_MAX_NS), polling both between slices.
 * A completion on the other instance is seen within one slice.
 */
#include "transport/mixed/mixed.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIXED_SLICE_MIN_NS 200000ull  /* 0.2 ms */
#define MIXED_SLICE_MAX_NS 2000000ull /* 2 ms */

static gs_mixed_tp *tp_of(gs_tp *base)
{
    return (gs_mixed_tp *)base;
}

gs_status gs_mixed_close(gs_tp *base)
{
    gs_mixed_tp *tp = tp_of(base);
    gs_status st = GS_OK, st2 = GS_OK;
    while (tp->mrs) /* what the caller left registered, as the backends do */
        gs_mixed_mr_dereg(&tp->mrs->base);
    if (tp->far)
        st = tp->far->ops->close(tp->far);
    if (tp->near)
        st2 = tp->near->ops->close(tp->near);
    free(tp->peers);
    free(base->eps);
    free(tp);
    return st != GS_OK ? st : st2;
}

gs_status gs_mixed_open(gs_ctx *ctx, const gs_tp_ops *far, gs_tp **tp_p)
{
    gs_mixed_tp *tp = gs_calloc(1, sizeof(*tp));
    gs_status st = GS_ERR_NOMEM;
    if (!tp)
        return st;
    tp->base =
        (gs_tp){.ops = &gs_mixed_ops, .ctx = ctx, .cfg = &ctx->cfg, .rank = ctx->rank, .size = ctx->size};
    tp->base.eps = gs_calloc((size_t)ctx->size, sizeof(*tp->base.eps));
    tp->peers = gs_calloc((size_t)ctx->size, sizeof(*tp->peers));
    if (!tp->base.eps || !tp->peers)
        goto fail;
    /* far first: when it fails with the ranks' common verdict (verbs' probe),
     * auto tries the next far backend, and shm's store keys are still unused */
    st = far->open(ctx, &ctx->cfg, &tp->far);
    if (st == GS_OK)
        st = gs_shm_open_host(ctx, &ctx->cfg, &tp->near);
    if (st != GS_OK)
        goto fail;
    tp->local = 1;
    for (int p = 0; p < ctx->size; p++) {
        gs_mixed_ep *ep = &tp->peers[p];
        if (p == ctx->rank)
            continue;
        ep->base = (gs_ep){.tp = &tp->base, .peer = p};
        ep->near = tp->near->eps[p] != NULL;
        ep->sub = ep->near ? tp->near->eps[p] : tp->far->eps[p];
        tp->local += ep->near;
        tp->base.eps[p] = &ep->base;
    }
    gs_log_info(
        TP, "rank %d: mixed transport: shm to the %d other rank%s of this host, %s to the %d of other hosts",
        ctx->rank, tp->local - 1, tp->local == 2 ? "" : "s", far->name, ctx->size - tp->local);
    *tp_p = &tp->base;
    return GS_OK;
fail:
    gs_mixed_close(&tp->base);
    return st;
}

unsigned gs_mixed_caps(const gs_tp *base)
{
    const gs_mixed_tp *tp = (const gs_mixed_tp *)base;
    /* per peer, not for every peer: no LOCAL_MAP; the far backend's zero-copy sends are not offered */
    return gs_tp_caps(tp->near) & gs_tp_caps(tp->far) & (GS_TP_CAP_USER_MEM | GS_TP_CAP_ATOMIC);
}

/* The peer's backend's: shm's on this host, the far one's elsewhere. */
static gs_tp_reach mixed_peer_reach(const gs_tp *base, int peer)
{
    const gs_mixed_tp *tp = (const gs_mixed_tp *)base;
    const gs_tp *via = peer >= 0 && peer < base->size && tp->near->eps[peer] ? tp->near : tp->far;
    return gs_tp_reach_of(via, peer);
}

gs_status gs_mixed_ep_error(gs_ep *base, char *buf, size_t cap)
{
    gs_ep *sub = ((gs_mixed_ep *)base)->sub;
    return sub->tp->ops->ep_error(sub, buf, cap);
}

void gs_mixed_describe(const gs_tp *base, char *buf, size_t cap)
{
    const gs_mixed_tp *tp = (const gs_mixed_tp *)base;
    char near[320], far[320];
    gs_tp_describe(tp->near, near, sizeof(near));
    gs_tp_describe(tp->far, far, sizeof(far));
    snprintf(buf, cap, "on this host %s; to other hosts %s", near, far);
}

/* ---- completions ------------------------------------------------------------------ */

/* Both instances, in turns; a failure of one (a lost peer) is returned
 * only when neither has a completion to return. */
gs_status gs_mixed_poll(gs_tp *base, gs_wc *wcs, int max, int *n_p)
{
    gs_mixed_tp *tp = tp_of(base);
    gs_tp *a = tp->far_first ? tp->far : tp->near, *b = tp->far_first ? tp->near : tp->far;
    char why[1024];
    int na = 0, nb = 0;
    gs_status sa, sb;

    tp->far_first = !tp->far_first;
    sa = a->ops->poll(a, wcs, max, &na);
    if (sa != GS_OK)
        na = 0;
    if (sa == GS_OK && na == max) {
        tp->sleep_far = a == tp->far;
        *n_p = na;
        return GS_OK;
    }
    if (__builtin_expect(sa != GS_OK, 0))
        snprintf(why, sizeof(why), "%s", gs_last_error());
    sb = b->ops->poll(b, wcs + na, max - na, &nb);
    if (sb != GS_OK)
        nb = 0;
    if (na + nb > 0 || (sa == GS_OK && sb == GS_OK)) {
        if (na + nb > 0) /* where the next wait sleeps */
            tp->sleep_far = (a == tp->far) == (na > 0);
        *n_p = na + nb;
        return GS_OK;
    }
    if (sa != GS_OK) {
        gs_error_restore(why);
        return sa;
    }
    return sb;
}

static uint64_t spin_budget_ns(const gs_config *cfg)
{
    if (cfg->poll == GS_POLL_SPIN)
        return UINT64_MAX;
    if (cfg->poll == GS_POLL_EVENT)
        return 0;
    return (uint64_t)(cfg->spin_us > 0 ? cfg->spin_us : 0) * 1000ull;
}

gs_status gs_mixed_wait(gs_tp *base, gs_wc *wcs, int max, int *n_p, uint64_t deadline_ns)
{
    gs_mixed_tp *tp = tp_of(base);
    uint64_t start = gs_now_ns(), slice = MIXED_SLICE_MIN_NS;
    uint64_t spin = spin_budget_ns(base->cfg);

    for (unsigned idle = 0;; idle++) {
        uint64_t now, until;
        gs_tp *sub;
        gs_status st = gs_mixed_poll(base, wcs, max, n_p);
        if (st != GS_OK || *n_p > 0)
            return st;
        now = gs_now_ns();
        if (now >= deadline_ns)
            return gs_fail_quiet(GS_SUBSYS_TP, GS_ERR_TIMEOUT,
                                 "rank %d: no completion arrived within %llu ms (mixed wait: shm and %s)",
                                 base->rank, (unsigned long long)((now - start) / 1000000ull),
                                 tp->far->ops->name);
        if (spin == UINT64_MAX || now - start < spin) {
            if (idle % 64 == 63)
                sched_yield(); /* more ranks than cores: let the others run */
            else
                gs_cpu_relax();
            continue;
        }
        sub = tp->sleep_far ? tp->far : tp->near;
        until = deadline_ns - now > slice ? now + slice : deadline_ns;
        st = sub->ops->wait(sub, wcs, max, n_p, until);
        if (st == GS_OK && *n_p > 0)
            return GS_OK;
        if (st != GS_OK && st != GS_ERR_TIMEOUT)
            return gs_mixed_poll(base, wcs, max, n_p); /* the other's completions first, then the failure */
        if (slice < MIXED_SLICE_MAX_NS)
            slice *= 2; /* idle for longer */
    }
}

const gs_tp_ops gs_mixed_ops = {
    .name = "mixed",
    .id = GS_TRANSPORT_MIXED,
    .reach = {GS_TP_LAT_KERNEL, GS_TP_BW_NETWORK}, /* not read: peer_reach answers per peer */
    .peer_reach = mixed_peer_reach,
    .open = NULL, /* gs_tp_open calls gs_mixed_open with the far backend it chose */
    GS_TP_CONTROL_OPS(gs_mixed),
    GS_TP_DATA_OPS(gs_mixed),
};
