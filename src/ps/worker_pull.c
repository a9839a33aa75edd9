/*
 * Pull of one shard: RDMA READs only, the server's CPU takes no part.
 *
 * Once the server has applied every push of ours to the shard (a notice says
 * so), read the shard's head (with the workers' progress after it), then its
 * parameters (straight into the caller's buffer for big keys, else into our
 * staging), then the head again, each READ fenced behind the ones before.
 * The copy is consistent if both heads carry the same even seq: the server
 * makes seq odd before it touches the region and even again after, so an
 * unchanged even seq means no update overlapped the middle READ. Otherwise
 * read again, backing off a little.
 *
 * Staging of shard i: [head + wstate[W]] [parameters, when staged] [head].
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

static const gs_ps_head *head_before(const gs_ps_wkey *wk, size_t i)
{
    return (const gs_ps_head *)staging(wk, i);
}

static const gs_ps_head *head_after(const gs_ps_wkey *wk, size_t i)
{
    const gs_ps_head *h = head_before(wk, i);
    return (const gs_ps_head *)(staging(wk, i) + gs_ps_param_region_bytes(h->workers, h->count));
}

bool gs_ps_pull_consistent(const gs_ps_wkey *wk, size_t i)
{
    const gs_ps_head *before = head_before(wk, i), *after;
    if (before->layout != GS_PS_LAYOUT_VERSION)
        return false;
    after = head_after(wk, i);
    return before->seq == after->seq && (before->seq & 1) == 0;
}

/* Where the parameters land: the caller's buffer, or our staging. */
static void destination(gs_ps *ps, const gs_ps_req *req, gs_ps_wkey *wk, size_t i, void **dst_p, gs_mr **mr_p)
{
    const gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
    if (req && req->out_mr) {
        *dst_p = req->out + ws->offset;
        *mr_p = req->out_mr;
    } else {
        *dst_p = staging(wk, i) + gs_ps_param_data_off((uint32_t)ps->nworkers);
        *mr_p = wk->pull;
    }
}

gs_status gs_ps_pull_post(gs_ps *ps, gs_ps_wkey *wk, size_t i, unsigned last_flags, uint64_t wr_id)
{
    gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
    gs_ep *ep = gs_tp_ep(ps->tp, ws->server_rank);
    uint64_t data_off = gs_ps_param_data_off((uint32_t)ps->nworkers);
    char *base = staging(wk, i);
    void *dst;
    gs_mr *dst_mr;
    gs_status st;
    destination(ps, wk->head, wk, i, &dst, &dst_mr);
    st = gs_ep_read(ep, base, wk->pull, data_off, &ws->param, 0, 0, 0);
    if (st == GS_OK)
        st = gs_ep_read(ep, dst, dst_mr, ws->count * sizeof(float), &ws->param, data_off, 0,
                        GS_OP_FENCE | gs_ps_stream_flag(wk));
    if (st == GS_OK)
        st = gs_ep_read(ep, base + gs_ps_param_region_bytes((uint32_t)ps->nworkers, ws->count), wk->pull,
                        GS_PS_ALIGN, &ws->param, 0, wr_id, GS_OP_FENCE | last_flags);
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
    return gs_ps_again(ps, st);
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
    const gs_ps_head *h = head_before(wk, i);
    const gs_ps_wstate *mine = (const gs_ps_wstate *)(h + 1) + ps->index;
    gs_ps_req *req = wk->head;
    void *dst;
    gs_mr *dst_mr;
    if (wc->status != GS_OK) {
        gs_status st = gs_fail(GS_SUBSYS_PS, wc->status,
                               "rank %d: worker %d: pull of key %llu shard %u from rank %d failed", ps->rank,
                               ps->index, (unsigned long long)wk->key, ws->kindex, ws->server_rank);
        if (req && req->status == GS_OK)
            req->status = st;
        gs_ps_worker_shard_done(ps, ws);
        return st;
    }
    if (!gs_ps_pull_consistent(wk, i) || mine->applied < ws->pushed) {
        ps->wrk.pull_retries++;
        retry_later(ws);
        return GS_OK;
    }
    ws->counted = h->counted;
    gs_ps_worker_merge_notice(ws, &(gs_ps_notice){.version = h->version,
                                                  .min_step = h->min_step,
                                                  .received = mine->received,
                                                  .applied = mine->applied,
                                                  .saved = mine->saved,
                                                  .epoch = h->epoch});
    destination(ps, req, wk, i, &dst, &dst_mr);
    if (req && req->out && !req->out_mr)
        memcpy(req->out + ws->offset, dst, ws->count * sizeof(float));
    gs_ps_worker_shard_done(ps, ws);
    return GS_OK;
}
