/*
 * Pull of one shard: RDMA READs only, the server's CPU takes no part.
 *
 * Once the server has applied every push of ours to the shard (a notice says
 * so), read the shard's head, then the whole param region, then the head
 * again, each READ fenced behind the ones before. The copy is consistent if
 * both heads carry the same even seq: the server made seq odd before it
 * touched the region and even again after, so an unchanged even seq means no
 * update overlapped the middle READ. Otherwise retry, backing off a little.
 */
#include "ps/ps.h"

#include "util/clock.h"
#include "util/log.h"

#include <string.h>

#define RETRY_MAX_NS 1000000ull /* back-off cap between torn reads: 1 ms */

static char *staging(const gs_ps_wkey *wk, size_t i)
{
    return (char *)gs_mr_addr(wk->pull) + wk->pull_off[i];
}

static size_t region_bytes(const gs_ps *ps, const gs_ps_wshard *ws)
{
    return gs_ps_param_region_bytes((uint32_t)ps->nworkers, ws->count);
}

const gs_ps_head *gs_ps_pull_head(const gs_ps_wkey *wk, size_t i)
{
    return (const gs_ps_head *)(staging(wk, i) + GS_PS_ALIGN);
}

const gs_ps_wstate *gs_ps_pull_wstate(const gs_ps_wkey *wk, size_t i, int w)
{
    return (const gs_ps_wstate *)(staging(wk, i) + GS_PS_ALIGN + sizeof(gs_ps_head)) + w;
}

bool gs_ps_pull_consistent(const gs_ps_wkey *wk, size_t i)
{
    const gs_ps_head *before = (const gs_ps_head *)staging(wk, i);
    const gs_ps_head *copy = gs_ps_pull_head(wk, i);
    const gs_ps_head *after = (const gs_ps_head *)((const char *)copy + gs_ps_param_region_bytes(copy->workers, copy->count));
    return before->seq == after->seq && (before->seq & 1) == 0 && copy->seq == before->seq &&
           copy->layout == GS_PS_LAYOUT_VERSION;
}

gs_status gs_ps_pull_post(gs_ps *ps, gs_ps_wkey *wk, size_t i, unsigned last_flags, uint64_t wr_id)
{
    gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
    gs_ep *ep = gs_tp_ep(ps->tp, ws->server_rank);
    char *base = staging(wk, i);
    size_t len = region_bytes(ps, ws);
    gs_status st = gs_ep_read(ep, base, wk->pull, GS_PS_ALIGN, &ws->param, 0, 0, 0);
    if (st == GS_OK)
        st = gs_ep_read(ep, base + GS_PS_ALIGN, wk->pull, len, &ws->param, 0, 0, GS_OP_FENCE);
    if (st == GS_OK)
        st = gs_ep_read(ep, base + GS_PS_ALIGN + len, wk->pull, GS_PS_ALIGN, &ws->param, 0, wr_id,
                        GS_OP_FENCE | last_flags);
    return st;
}

gs_status gs_ps_pull_advance(gs_ps *ps, gs_ps_req *req, size_t i)
{
    gs_ps_wkey *wk = req->key;
    gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
    gs_status st;
    if (ws->error != GS_OK)
        return gs_ps_worker_take_error(ps, ws, "pull");
    if (ws->seen.applied < ws->pushed)
        return GS_OK; /* read-your-writes: our last push is not applied yet */
    if (ws->retry_at_ns && gs_now_ns() < ws->retry_at_ns)
        return GS_OK;
    st = gs_ps_pull_post(ps, wk, i, GS_OP_SIGNALED, gs_ps_wr(GS_PS_WR_PULL, ws->gid));
    if (st == GS_OK)
        ws->phase = GS_PS_PULL_POSTED;
    return st == GS_ERR_AGAIN ? GS_OK : st;
}

/* Torn (or older than our own pushes): try again after a short back-off. */
static void retry_later(gs_ps_wshard *ws)
{
    uint64_t wait = 1000ull << (ws->pull_tries < 10 ? ws->pull_tries : 10);
    ws->pull_tries++;
    ws->retry_at_ns = gs_now_ns() + (wait < RETRY_MAX_NS ? wait : RETRY_MAX_NS);
    ws->phase = GS_PS_PULL_WAIT;
}

gs_status gs_ps_pull_completed(gs_ps *ps, gs_ps_wkey *wk, size_t i, const gs_wc *wc)
{
    gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
    const gs_ps_head *h;
    const gs_ps_wstate *mine;
    gs_ps_notice seen;
    if (wc->status != GS_OK) {
        gs_status st = gs_fail(GS_SUBSYS_PS, wc->status, "rank %d: worker %d: pull of key %llu shard %u from rank %d failed",
                               ps->rank, ps->index, (unsigned long long)wk->key, ws->kindex, ws->server_rank);
        if (wk->head && wk->head->status == GS_OK)
            wk->head->status = st;
        gs_ps_worker_shard_done(ps, ws);
        return st;
    }
    h = gs_ps_pull_head(wk, i);
    mine = gs_ps_pull_wstate(wk, i, ps->index);
    if (!gs_ps_pull_consistent(wk, i) || mine->applied < ws->pushed) {
        ps->wrk.pull_retries++;
        retry_later(ws);
        return GS_OK;
    }
    seen = (gs_ps_notice){.version = h->version, .min_step = h->min_step, .received = mine->received,
                          .applied = mine->applied, .saved = mine->saved, .epoch = h->epoch};
    gs_ps_worker_merge_notice(ws, &seen);
    if (wk->head && wk->head->out)
        memcpy(wk->head->out + ws->offset, (const char *)h + h->data_off, ws->count * sizeof(float));
    gs_ps_worker_shard_done(ps, ws);
    return GS_OK;
}
