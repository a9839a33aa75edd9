/*
 * Push of one shard, as a small state machine driven by the worker's
 * progress engine.
 *
 * WRITE path: wait until the server has applied our previous push of this
 * shard (our slot is free; in sync mode that also means the step is
 * complete), the staleness bound allows it (async SSP) and the replay log has
 * room; copy the gradient into the log; one WRITE_IMM into our slot carrying
 * the shard index and the step.
 *
 * Atomic path (sync only): the same wait; then FETCH_ADD every element, as
 * int64 fixed point, into the shard's accumulator, chunk by chunk, checking
 * each returned old value for a wrap; then FETCH_ADD our arrival word and
 * the shared arrival counter; the worker whose counter add returns W-1 is
 * the last and tells the server with a zero-length WRITE_IMM.
 */
#include "ps/ps.h"

#include "util/clock.h"
#include "util/log.h"

#include <string.h>

static gs_ps_wkey *key_of(gs_ps *ps, const gs_ps_wshard *ws)
{
    return &ps->wrk.keys[ws->keyi];
}

static char *log_entry(const gs_ps_wkey *wk, uint64_t step)
{
    return (char *)gs_mr_addr(wk->log) + (size_t)(step % wk->depth) * wk->entry_bytes;
}

static bool ready(const gs_ps *ps, const gs_ps_wkey *wk, const gs_ps_wshard *ws)
{
    uint64_t t = ws->pushed;
    if (ws->seen.applied < t)
        return false; /* our slot still holds the previous push (sync: the step is not complete) */
    if (ps->params.mode == GS_PS_MODE_ASYNC && ps->params.staleness >= 0 &&
        t > ws->seen.min_step + (uint64_t)ps->params.staleness)
        return false; /* SSP: too far ahead of the slowest worker */
    if (wk->depth > 1 && t >= wk->depth && ws->seen.saved <= t - wk->depth)
        return false; /* the log entry still holds a push no checkpoint covers */
    return true;
}

static gs_status reported_error(gs_ps *ps, gs_ps_wshard *ws, const char *during)
{
    return gs_ps_worker_take_error(ps, ws, during);
}

/* ---- WRITE path ------------------------------------------------------------------ */

static gs_status post_write(gs_ps *ps, gs_ps_wkey *wk, gs_ps_wshard *ws, const char *src, gs_mr *lmr)
{
    gs_log_trace(PS, "rank %d: worker %d: key %llu shard %u: push step %llu to rank %d", ps->rank, ps->index,
                 (unsigned long long)wk->key, ws->kindex, (unsigned long long)ws->pushed, ws->server_rank);
    uint64_t off = (uint64_t)ps->index * gs_ps_slot_bytes(ws->count);
    gs_status st = gs_ep_write_imm(gs_tp_ep(ps->tp, ws->server_rank), src, lmr, ws->count * sizeof(float),
                                   &ws->slots, off, gs_ps_imm_push(GS_PS_IMM_PUSH, ws->slot, ws->pushed),
                                   gs_ps_wr(GS_PS_WR_PUSH, ws->gid), GS_OP_SIGNALED | gs_ps_stream_flag(wk));
    if (st == GS_OK) {
        ws->pushed++;
        ws->phase = GS_PS_PUSH_POSTED;
    }
    return gs_ps_again(ps, st);
}

/* ---- atomic path ------------------------------------------------------------------- */

static int64_t *atomic_q(const gs_ps_wkey *wk, const gs_ps_wshard *ws)
{
    size_t per = (2 * GS_PS_ATOMIC_CHUNK_ELEMS + 8) * sizeof(int64_t);
    return (int64_t *)((char *)gs_mr_addr(wk->atomic) + ws->kindex * per);
}
static int64_t *atomic_old(const gs_ps_wkey *wk, const gs_ps_wshard *ws)
{
    return atomic_q(wk, ws) + GS_PS_ATOMIC_CHUNK_ELEMS;
}
static uint64_t *atomic_res(const gs_ps_wkey *wk, const gs_ps_wshard *ws)
{
    return (uint64_t *)(atomic_q(wk, ws) + 2 * GS_PS_ATOMIC_CHUNK_ELEMS);
}

gs_status gs_ps_atomic_check(gs_ps *ps, const gs_ps_wkey *wk, const float *grad)
{
    int64_t q[256];
    size_t bad = 0;
    for (size_t i = 0; i < wk->count; i += 256) {
        size_t n = wk->count - i < 256 ? wk->count - i : 256;
        if (gs_ps_fixed_encode(&ps->fixed, grad + i, q, n, &bad) != GS_OK)
            return gs_fail(
                GS_SUBSYS_PS, GS_ERR_OVERFLOW,
                "rank %d: worker %d: key %llu element %zu = %g is beyond what atomic aggregation can add "
                "without overflow (|g| <= %g with %d workers and GS_PS_ATOMIC_FRAC_BITS=%d); nothing was "
                "pushed",
                ps->rank, ps->index, (unsigned long long)wk->key, i + bad, (double)grad[i + bad],
                gs_ps_fixed_max_abs(&ps->fixed), ps->nworkers, ps->fixed.frac_bits);
    }
    return GS_OK;
}

static void begin_chunk(gs_ps *ps, gs_ps_wkey *wk, gs_ps_wshard *ws, size_t start)
{
    const float *g = (const float *)(log_entry(wk, ws->pushed - 1) + ws->offset * sizeof(float));
    size_t bad;
    ws->chunk_start = ws->next = start;
    ws->chunk_end =
        start + GS_PS_ATOMIC_CHUNK_ELEMS < ws->count ? start + GS_PS_ATOMIC_CHUNK_ELEMS : ws->count;
    /* checked at the start of the request: cannot fail here */
    gs_ps_fixed_encode(&ps->fixed, g + start, atomic_q(wk, ws), ws->chunk_end - start, &bad);
}

static gs_status post_chunk(gs_ps *ps, gs_ps_wkey *wk, gs_ps_wshard *ws)
{
    gs_ep *ep = gs_tp_ep(ps->tp, ws->server_rank);
    uint64_t data_off = gs_ps_acc_data_off((uint32_t)ps->nworkers);
    const int64_t *q = atomic_q(wk, ws);
    int64_t *old = atomic_old(wk, ws);
    while (ws->next < ws->chunk_end) {
        size_t j = ws->next - ws->chunk_start;
        unsigned flags = ws->next + 1 == ws->chunk_end ? GS_OP_SIGNALED : 0;
        gs_status st = gs_ep_fetch_add(ep, (uint64_t *)&old[j], wk->atomic, &ws->acc, data_off + ws->next * 8,
                                       (uint64_t)q[j], gs_ps_wr(GS_PS_WR_ATOMIC, ws->gid), flags);
        if (st != GS_OK)
            return gs_ps_again(ps, st);
        ws->next++;
    }
    return GS_OK;
}

/* The arrival: our own word (who arrived, for the server's deadline report),
 * then the shared counter, fenced behind every add of ours. */
static gs_status post_arrive(gs_ps *ps, gs_ps_wkey *wk, gs_ps_wshard *ws)
{
    gs_ep *ep = gs_tp_ep(ps->tp, ws->server_rank);
    uint64_t *res = atomic_res(wk, ws);
    gs_status st = gs_ep_fetch_add(ep, &res[0], wk->atomic, &ws->acc,
                                   sizeof(gs_ps_acc_head) + (uint64_t)ps->index * 8, 1, 0, GS_OP_FENCE);
    if (st == GS_OK)
        st = gs_ep_fetch_add(ep, &res[1], wk->atomic, &ws->acc, offsetof(gs_ps_acc_head, arrivals), 1,
                             gs_ps_wr(GS_PS_WR_ARRIVE, ws->gid), GS_OP_SIGNALED | GS_OP_FENCE);
    if (st == GS_OK)
        ws->posted = true;
    return gs_ps_again(ps, st);
}

static gs_status post_notify(gs_ps *ps, gs_ps_wkey *wk, gs_ps_wshard *ws)
{
    gs_status st = gs_ep_write_imm(gs_tp_ep(ps->tp, ws->server_rank), NULL, wk->atomic, 0, &ws->slots, 0,
                                   gs_ps_imm_push(GS_PS_IMM_ATOMIC, ws->slot, ws->pushed - 1),
                                   gs_ps_wr(GS_PS_WR_NOTIFY, ws->gid), GS_OP_SIGNALED);
    if (st == GS_OK)
        ws->posted = true;
    return gs_ps_again(ps, st);
}

/* Every old value returned: did any add wrap the accumulator? Then flag
 * the step to the server (which refuses it) and fail our request. */
static gs_status check_chunk(gs_ps *ps, gs_ps_wkey *wk, gs_ps_wshard *ws)
{
    const int64_t *q = atomic_q(wk, ws), *old = atomic_old(wk, ws);
    for (size_t j = 0; j < ws->chunk_end - ws->chunk_start; j++) {
        if (!gs_ps_fixed_wrapped(old[j], q[j]))
            continue;
        gs_ep_fetch_add(gs_tp_ep(ps->tp, ws->server_rank), &atomic_res(wk, ws)[2], wk->atomic, &ws->acc,
                        offsetof(gs_ps_acc_head, overflow), 1, 0, 0);
        ws->error_version = ws->pushed + 1; /* the server's refusal of this step is no news to us */
        return gs_fail(
            GS_SUBSYS_PS, GS_ERR_OVERFLOW,
            "rank %d: worker %d: key %llu element %zu: adding %lld to the accumulator's %lld wrapped "
            "around int64; the server refuses the step",
            ps->rank, ps->index, (unsigned long long)wk->key, ws->offset + ws->chunk_start + j,
            (long long)q[j], (long long)old[j]);
    }
    return GS_OK;
}

/* ---- the machine --------------------------------------------------------------------- */

static void push_done(gs_ps *ps, gs_ps_wshard *ws);

gs_status gs_ps_push_advance(gs_ps *ps, gs_ps_req *req, size_t i)
{
    gs_ps_wkey *wk = req->key;
    gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
    char *entry;
    if (ws->phase == GS_PS_ATOMIC_CHUNK)
        return post_chunk(ps, wk, ws);
    if (ws->error != GS_OK)
        return reported_error(ps, ws, "push");
    if (ws->pushed > req->step) {
        push_done(ps, ws); /* the server has this step already (sent before a recovery) */
        return GS_OK;
    }
    if (ws->pushed < req->step || !ready(ps, wk, ws))
        return GS_OK; /* an earlier step (a replay) goes first; or the server is not ready */
    if (req->grad_mr) /* zero copy: straight from the caller's gradient */
        return post_write(ps, wk, ws, (const char *)(req->grad + ws->offset), req->grad_mr);
    /* The gradient goes into the log entry of its step: the source of the
     * transfer, and what a replay re-sends after a server restart. */
    entry = log_entry(wk, ws->pushed);
    if (!req->replay)
        memcpy(entry + ws->offset * sizeof(float), req->grad + ws->offset, ws->count * sizeof(float));
    if (ps->params.agg == GS_PS_AGG_WRITE_SLOTS)
        return post_write(ps, wk, ws, entry + ws->offset * sizeof(float), wk->log);
    ws->pushed++;
    ws->phase = GS_PS_ATOMIC_CHUNK;
    begin_chunk(ps, wk, ws, 0);
    return post_chunk(ps, wk, ws);
}

/* The push part of the shard is done: on to the pull, or finished. */
static void push_done(gs_ps *ps, gs_ps_wshard *ws)
{
    gs_ps_req *req = key_of(ps, ws)->head;
    if (req && req->pull)
        ws->phase = GS_PS_PULL_WAIT;
    else
        gs_ps_worker_shard_done(ps, ws);
}

static void push_failed(gs_ps *ps, gs_ps_wshard *ws, gs_status st)
{
    gs_ps_req *req = key_of(ps, ws)->head;
    if (req && req->status == GS_OK)
        req->status = st;
    gs_ps_worker_shard_done(ps, ws);
}

gs_status gs_ps_push_completed(gs_ps *ps, gs_ps_wshard *ws, int kind, const gs_wc *wc)
{
    gs_ps_wkey *wk = key_of(ps, ws);
    gs_status st = wc->status;
    if (st != GS_OK) {
        push_failed(ps, ws,
                    gs_fail(GS_SUBSYS_PS, st,
                            "rank %d: worker %d: push of key %llu shard %u to rank %d failed", ps->rank,
                            ps->index, (unsigned long long)wk->key, ws->kindex, ws->server_rank));
        return st;
    }
    switch (kind) {
    case GS_PS_WR_PUSH: push_done(ps, ws); break;
    case GS_PS_WR_ATOMIC:
        st = check_chunk(ps, wk, ws);
        if (st != GS_OK && wk->head && wk->head->status == GS_OK)
            wk->head->status = st;
        if (ws->chunk_end < ws->count) {
            begin_chunk(ps, wk, ws, ws->chunk_end);
            st = post_chunk(ps, wk, ws);
        } else {
            ws->phase = GS_PS_ATOMIC_ARRIVE;
            ws->posted = false;
            st = post_arrive(ps, wk, ws);
        }
        break;
    case GS_PS_WR_ARRIVE:
        if (atomic_res(wk, ws)[1] + 1 < (uint64_t)ps->nworkers) {
            /* the first to arrive starts the server's clock for the step (best effort) */
            if (atomic_res(wk, ws)[1] == 0)
                gs_ps_ctrl_send(ps, ws->server_rank, GS_PS_CTRL_FIRST, ws->slot);
            push_done(ps, ws);
            break;
        }
        ws->phase = GS_PS_ATOMIC_NOTIFY; /* we are the last: tell the server */
        ws->posted = false;
        st = post_notify(ps, wk, ws);
        break;
    case GS_PS_WR_NOTIFY: push_done(ps, ws); break;
    default: break;
    }
    if (st != GS_OK)
        push_failed(ps, ws, st);
    return st;
}

/* Arrive and notify posts that met a full send queue are retried here. */
gs_status gs_ps_push_retry(gs_ps *ps, gs_ps_wshard *ws)
{
    gs_ps_wkey *wk = key_of(ps, ws);
    if (ws->posted)
        return GS_OK;
    if (ws->phase == GS_PS_ATOMIC_ARRIVE)
        return post_arrive(ps, wk, ws);
    if (ws->phase == GS_PS_ATOMIC_NOTIFY)
        return post_notify(ps, wk, ws);
    return GS_OK;
}
