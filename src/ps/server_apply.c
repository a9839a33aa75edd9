/*
 * The server's updates of a shard: aggregate the gradients (sum of the
 * workers' slots with the vectorized kernels, or the drained fixed-point
 * accumulator), apply the optimizer, bump the version, all inside the
 * seqlock; then owe every affected worker a notice.
 */
#include "ps/ps.h"

#include "kernel/reduce.h"
#include "ps/optim.h"
#include "ps/pool.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gs_ps_seq_begin(gs_ps_head *head)
{
    uint64_t seq = __atomic_load_n(&head->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&head->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* odd is visible before any byte of the region changes */
}

void gs_ps_seq_end(gs_ps_head *head)
{
    uint64_t seq = __atomic_load_n(&head->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&head->seq, seq + 1, __ATOMIC_RELEASE); /* even after every byte changed */
}

uint64_t gs_ps_min_step(const gs_ps *ps, const gs_ps_sshard *sh)
{
    const gs_ps_wstate *ws = gs_ps_wstate_of(sh);
    uint64_t min = UINT64_MAX;
    for (int w = 0; w < ps->nworkers; w++)
        if (!ps->srv.lost[w] && ws[w].applied < min)
            min = ws[w].applied;
    return min == UINT64_MAX ? gs_ps_head_of(sh)->version : min;
}

static float *slot_of(const gs_ps_sshard *sh, int w)
{
    return (float *)((char *)gs_mr_addr(sh->slots) + (size_t)w * gs_ps_slot_bytes(sh->count));
}

static float grad_scale(const gs_ps *ps, int counted)
{
    return ps->params.average ? 1.0f / (float)counted : 1.0f;
}

/* One optimizer step with grad, inside the seqlock. */
/* GS_TRACE: one "apply" event of a shard, from t0 (the call) with how long
 * the step's first gradient had waited for the last one (sync, atomic). */
static void trace_apply(const gs_ps *ps, const gs_ps_sshard *sh, const char *mode, uint64_t t0,
                        uint64_t first_ns)
{
    gs_trace_arg args[] = {
        GS_TARG_I("key", sh->key),
        GS_TARG_I("shard", sh->kindex),
        GS_TARG_I("count", sh->count),
        GS_TARG_I("bytes", sh->count * sizeof(float)),
        GS_TARG_S("mode", mode),
        GS_TARG_I("version", gs_ps_head_of(sh)->version),
        GS_TARG_I("workers", ps->nworkers),
        GS_TARG_D("gathered_us", first_ns && first_ns < t0 ? (double)(t0 - first_ns) / 1e3 : 0.0),
    };
    gs_trace_event("ps", "apply", false, GS_TRACE_PS_SHARD(sh->gid), "ps shard %llu", sh->gid, t0,
                   gs_now_ns(), args, (int)(sizeof(args) / sizeof(args[0])));
}

static void update(gs_ps *ps, gs_ps_sshard *sh, const float *grad, int counted)
{
    sh->opt_steps++;
    gs_ps_optim_apply(&ps->params.optim, gs_ps_params_of(sh), grad, grad_scale(ps, counted), sh->state,
                      sh->opt_steps, sh->count);
    gs_ps_head_of(sh)->version++;
}

gs_status gs_ps_apply_sync(gs_ps *ps, gs_ps_sshard *sh)
{
    gs_ps_head *h = gs_ps_head_of(sh);
    gs_ps_wstate *ws = gs_ps_wstate_of(sh);
    const float *grads[GS_PS_FUSE_MAX];
    uint64_t t0 = gs_trace_enabled() ? gs_now_ns() : 0, first_ns = sh->waiting_since_ns;
    int counted = 0, first = -1;
    /* Step 0: the pushes this round counts: those that arrived (every
     * worker's; elastic: a lost worker's only if its push of this round
     * came whole before the loss was known, and never after). */
    for (int w = 0; w < ps->nworkers; w++)
        if (ws[w].received > h->version) {
            if (counted < GS_PS_FUSE_MAX)
                grads[counted] = slot_of(sh, w);
            first = first < 0 ? w : first;
            counted++;
        }
    /* Step 1 and 2, fused block by block: the slots summed in worker order
     * (the same order every step), the optimizer on the mean over the
     * counted pushes, inside the seqlock; big shards shared with the apply
     * threads. */
    gs_ps_seq_begin(h);
    if (counted <= GS_PS_FUSE_MAX) {
        sh->opt_steps++;
        gs_ps_pool_apply_sum(ps->srv.pool, &ps->params.optim, gs_ps_params_of(sh), grads, counted,
                             grad_scale(ps, counted), sh->state, sh->opt_steps, sh->count);
        h->version++;
    } else {
        float *sum = slot_of(sh, first);
        for (int w = first + 1; w < ps->nworkers; w++)
            if (ws[w].received > h->version)
                gs_red_apply(GS_F32, GS_SUM, sum, sum, slot_of(sh, w), sh->count);
        update(ps, sh, sum, counted);
    }
    for (int w = 0; w < ps->nworkers; w++)
        ws[w].applied = h->version;
    h->min_step = gs_ps_min_step(ps, sh);
    h->counted = (uint32_t)counted;
    gs_ps_seq_end(h);
    /* Step 3: every worker may push the next step and pull this one. */
    sh->waiting_since_ns = 0;
    sh->status = GS_OK;
    gs_ps_notify_all(ps, sh);
    if (t0)
        trace_apply(ps, sh, "sync", t0, first_ns);
    return GS_OK;
}

gs_status gs_ps_apply_async(gs_ps *ps, gs_ps_sshard *sh, int w)
{
    gs_ps_head *h = gs_ps_head_of(sh);
    gs_ps_wstate *ws = gs_ps_wstate_of(sh);
    uint64_t old_min = h->min_step, t0 = gs_trace_enabled() ? gs_now_ns() : 0;
    gs_ps_seq_begin(h);
    update(ps, sh, slot_of(sh, w), ps->nworkers);
    ws[w].applied++;
    h->min_step = gs_ps_min_step(ps, sh);
    gs_ps_seq_end(h);
    /* The pusher may push again; everyone else only if the slowest moved (SSP). */
    if (h->min_step != old_min)
        gs_ps_notify_all(ps, sh);
    else
        gs_ps_notify(ps, sh, w);
    if (t0)
        trace_apply(ps, sh, "async", t0, 0);
    return GS_OK;
}

static gs_ps_acc_head *acc_head(const gs_ps_sshard *sh)
{
    return (gs_ps_acc_head *)gs_mr_addr(sh->acc);
}

static int64_t *acc_data(const gs_ps *ps, const gs_ps_sshard *sh)
{
    return (int64_t *)((char *)gs_mr_addr(sh->acc) + gs_ps_acc_data_off((uint32_t)ps->nworkers));
}

/* Empties the accumulator for the next step. */
static void acc_reset(gs_ps *ps, gs_ps_sshard *sh)
{
    memset(acc_data(ps, sh), 0, sh->count * sizeof(int64_t));
    acc_head(sh)->overflow = 0;
    __atomic_store_n(&acc_head(sh)->arrivals, 0, __ATOMIC_RELEASE);
}

static gs_status scratch_for(gs_ps *ps, size_t count)
{
    if (ps->srv.scratch_count >= count)
        return GS_OK;
    gs_pages_free(ps->srv.scratch, ps->srv.scratch_count * sizeof(float));
    ps->srv.scratch = NULL;
    ps->srv.scratch_count = 0;
    gs_status st = gs_pages_alloc(count * sizeof(float), (void **)&ps->srv.scratch);
    if (st == GS_OK)
        ps->srv.scratch_count = count;
    return st;
}

gs_status gs_ps_apply_atomic(gs_ps *ps, gs_ps_sshard *sh)
{
    gs_ps_head *h = gs_ps_head_of(sh);
    gs_ps_wstate *ws = gs_ps_wstate_of(sh);
    uint64_t overflow = acc_head(sh)->overflow;
    uint64_t t0 = gs_trace_enabled() ? gs_now_ns() : 0, first_ns = sh->waiting_since_ns;
    gs_status st = scratch_for(ps, sh->count);
    if (st != GS_OK)
        return st;
    /* Step 1: the sum, back to f32 (refused if any worker saw a wrap). */
    if (!overflow)
        gs_ps_fixed_decode(&ps->fixed, acc_data(ps, sh), ps->srv.scratch, sh->count);
    acc_reset(ps, sh);
    /* Step 2: the optimizer, or only the version when the step is refused. */
    gs_ps_seq_begin(h);
    if (!overflow)
        update(ps, sh, ps->srv.scratch, ps->nworkers);
    else
        h->version++;
    for (int w = 0; w < ps->nworkers; w++)
        ws[w].received = ws[w].applied = h->version;
    h->min_step = gs_ps_min_step(ps, sh);
    h->counted = (uint32_t)ps->nworkers;
    gs_ps_seq_end(h);
    sh->waiting_since_ns = 0;
    sh->status = overflow ? GS_ERR_OVERFLOW : GS_OK;
    if (overflow)
        gs_log_error(
            PS,
            "rank %d: key %llu shard %u: a worker's fixed-point add wrapped the accumulator at step %llu; "
            "the step was not applied (lower GS_PS_ATOMIC_FRAC_BITS)",
            ps->rank, (unsigned long long)sh->key, sh->kindex, (unsigned long long)(h->version - 1));
    gs_ps_notify_all(ps, sh);
    if (t0)
        trace_apply(ps, sh, "atomic", t0, first_ns);
    return GS_OK;
}

/* ---- notices ------------------------------------------------------------------- */

void gs_ps_notify(gs_ps *ps, gs_ps_sshard *sh, int w)
{
    gs_ps_server *srv = &ps->srv;
    if (sh->dirty[w] || srv->lost[w] || srv->bye[w])
        return;
    if (srv->ndirty == srv->dirty_cap) {
        size_t cap = srv->dirty_cap ? srv->dirty_cap * 2 : 256;
        uint64_t *p = realloc(srv->dirty_list, cap * sizeof(*p));
        if (!p) {
            gs_log_error(PS, "rank %d: no memory to queue a notice to worker %d", ps->rank, w);
            return;
        }
        srv->dirty_list = p;
        srv->dirty_cap = cap;
    }
    sh->dirty[w] = 1;
    srv->dirty_list[srv->ndirty++] = (uint64_t)(sh - srv->shards) << 32 | (uint32_t)w;
}

void gs_ps_notify_all(gs_ps *ps, gs_ps_sshard *sh)
{
    for (int w = 0; w < ps->nworkers; w++)
        gs_ps_notify(ps, sh, w);
}

static gs_status send_notice(gs_ps *ps, gs_ps_sshard *sh, int w)
{
    const gs_ps_head *h = gs_ps_head_of(sh);
    const gs_ps_wstate *ws = &gs_ps_wstate_of(sh)[w];
    gs_ps_notice n = {.version = h->version,
                      .min_step = h->min_step,
                      .received = ws->received,
                      .applied = ws->applied,
                      .saved = ws->saved,
                      .epoch = h->epoch,
                      .status = sh->status,
                      .worker = sh->status_about};
    return gs_ps_tx_send(ps, &ps->srv.tx, ps->worker_ranks[w], &n, &sh->notice[w], sh->kindex * sizeof(n),
                         gs_ps_imm_notice(sh->gid));
}

gs_status gs_ps_flush_notices(gs_ps *ps)
{
    gs_ps_server *srv = &ps->srv;
    size_t done = 0;
    gs_status st = GS_OK;
    while (done < srv->ndirty) {
        gs_ps_sshard *sh = &srv->shards[srv->dirty_list[done] >> 32];
        int w = (int)(uint32_t)srv->dirty_list[done];
        if (!srv->lost[w] && !srv->bye[w]) {
            st = send_notice(ps, sh, w);
            if (st == GS_ERR_AGAIN)
                break;
            if (st != GS_OK) {
                char why[96];
                snprintf(why, sizeof(why), "cannot be reached (a notice to it failed: %s)",
                         gs_status_name(st));
                gs_ps_server_worker_lost(ps, w, GS_ERR_PEER_LOST, why);
            }
            st = GS_OK;
        }
        sh->dirty[w] = 0;
        done++;
    }
    if (done > 0)
        memmove(srv->dirty_list, srv->dirty_list + done, (srv->ndirty - done) * sizeof(uint64_t));
    srv->ndirty -= done;
    return st == GS_ERR_AGAIN ? GS_OK : st;
}
