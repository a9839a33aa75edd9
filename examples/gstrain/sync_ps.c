/* Gradients through gradsync's parameter server: the trainers (its workers)
 * push their gradient segments, the servers sum them (the trainers' parts are
 * already scaled by 1 / global batch, so the sum is the batch mean), run
 * SGD with momentum and weight decay (the same update as gt_sgd), and the
 * trainers pull the new weights. One key per segment (layer).
 *
 * With overlap, each announced segment starts a push-pull at once; later
 * announcements drive the requests (gs_req_test). Pulls land in a staging
 * vector, copied into the weights at finish: the backward pass still reads
 * a layer's weights after announcing its gradient. */
#include "sync_impl.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* --elastic: the metrics and the weight check run among the trainers only
 * (a communicator split from the job's), so that a lost trainer is shrunk
 * away by the trainers while the servers only serve. */
static gs_status trainers_only(gt_sync *sync)
{
    gs_comm *sub = NULL;
    gs_status st = gs_comm_split(sync->comm, sync->server ? GS_COMM_NO_COLOR : 0, sync->rank, &sub);
    if (st != GS_OK)
        return gt_fail(st, "cannot make the trainers' communicator: %s", gt_lib_error());
    if ((st = gs_comm_destroy(sync->comm)) != GS_OK)
        gt_fail(st, "leaving the job's communicator failed: %s", gt_lib_error());
    sync->comm = sub;
    return st;
}

/* The parameter server's parameters for this run. */
static void ps_params(gt_sync *sync, gs_ps_params *pp)
{
    gs_ps_params_init(sync->ctx, pp);
    pp->optim.kind = sync->p.momentum > 0 ? GS_PS_MOMENTUM : GS_PS_SGD;
    pp->optim.lr = sync->p.lr;
    pp->optim.momentum = sync->p.momentum;
    pp->optim.weight_decay = sync->p.weight_decay;
    pp->average = 0; /* sum: each trainer's part is already divided by the global batch */
    if (sync->p.elastic) {
        pp->elastic = 1; /* a lost trainer leaves; the rounds go on with the others */
        pp->average =
            1; /* the mean over the live trainers: each part is its rows' share (gt_sync_grad_scale) */
    }
}

/* A trainer joining (GS_REJOIN=1): the trainers' communicator came from the
 * grow; the parameter server is joined in ps_start, after the running
 * trainers' state arrived (the servers readmit it in a recovery the others
 * join from their next step). */
static gs_status ps_open_joiner(gt_sync *sync)
{
    sync->rank = gs_comm_rank(sync->comm);
    sync->size = gs_comm_size(sync->comm);
    return GS_OK;
}

static gs_status ps_open(gt_sync *sync)
{
    gs_ps_params pp;
    gs_status st;
    if (gs_ctx_size(sync->ctx) < 2)
        return gt_fail(GS_ERR_INVALID,
                       "--sync ps needs at least 2 ranks (trainers and GS_PS_SERVERS servers); "
                       "run it under gsrun -n 2 or more");
    if (sync->p.join)
        return ps_open_joiner(sync);
    ps_params(sync, &pp);
    st = gs_ps_create(sync->ctx, &pp, &sync->ps);
    if (st != GS_OK)
        return gt_fail(st, "cannot set up the parameter server: %s", gt_lib_error());
    sync->server = gs_ps_is_server(sync->ps);
    sync->rank = sync->server ? -1 : gs_ps_index(sync->ps);
    sync->size = gs_ps_num_workers(sync->ps);
    sync->servers = gs_ps_num_servers(sync->ps);
    return sync->p.elastic ? trainers_only(sync) : GS_OK;
}

static gs_status ps_start(gt_sync *sync, float *params)
{
    gs_status st = GS_OK;
    sync->params = params;
    if (sync->p.join) {
        gs_ps_params pp;
        ps_params(sync, &pp);
        if ((st = gs_ps_create(sync->ctx, &pp, &sync->ps)) != GS_OK)
            return gt_fail(st, "cannot rejoin the parameter server: %s", gt_lib_error());
        sync->servers = gs_ps_num_servers(sync->ps);
    }
    if (!sync->server && !(sync->pulled = gt_sync_alloc_floats(sync->p.count)))
        return gt_fail(GS_ERR_NOMEM, "no memory for pulling %zu weights", sync->p.count);
    for (size_t i = 0; i < sync->p.nsegments && st == GS_OK; i++) {
        const gt_segment *seg = &sync->p.segments[i];
        st = gs_ps_register(sync->ps, i, seg->count, params ? params + seg->offset : NULL);
        if (st != GS_OK)
            gt_fail(st, "cannot register layer %zu (%zu weights) with the parameter server: %s", i,
                    seg->count, gt_lib_error());
    }
    if (st == GS_OK && sync->server && (st = gs_ps_serve_start(sync->ps)) != GS_OK)
        gt_fail(st, "cannot start serving: %s", gt_lib_error());
    return st;
}

/* --elastic: a request that failed because the servers started a recovery
 * (a trainer rejoins) is repeated once every request is in (ps_finish). */
static int repeat_later(gt_sync *sync, size_t i, gs_status st)
{
    if (!sync->p.elastic || st != GS_ERR_PEER_LOST)
        return 0;
    sync->ps_failed[i] = true;
    return 1;
}

static gs_status push_pull(gt_sync *sync, size_t i)
{
    const gt_segment *seg = &sync->p.segments[i];
    gs_status st = gs_ps_ipush_pull(sync->ps, i, sync->grads + seg->offset, sync->pulled + seg->offset,
                                    &sync->ps_pending[i]);
    if (st != GS_OK && repeat_later(sync, i, st))
        return GS_OK;
    if (st != GS_OK)
        gt_fail(st, "cannot push layer %zu to the parameter server: %s", i, gt_lib_error());
    return st;
}

/* Drives every pending request without blocking (a test progresses them
 * all): tests the oldest; one that finished is released and marked pulled. */
static gs_status drive(gt_sync *sync)
{
    for (size_t i = 0; i < sync->p.nsegments; i++) {
        if (!sync->ps_pending[i])
            continue;
        gs_status st = gs_req_test(sync->ps_pending[i]);
        if (st == GS_INPROGRESS)
            return GS_OK;
        sync->ps_pending[i] = NULL;
        if (st != GS_OK && repeat_later(sync, i, st))
            return GS_OK;
        if (st != GS_OK)
            return gt_fail(st, "push-pull of layer %zu failed: %s", i, gt_lib_error());
        sync->ps_pulled[i] = true;
        return GS_OK;
    }
    return GS_OK;
}

static gs_status ps_ready(gt_sync *sync, size_t i)
{
    gs_status st;
    if (!sync->p.overlap)
        return GS_OK;
    if ((st = drive(sync)) != GS_OK)
        return st;
    return push_pull(sync, i);
}

/* Waits for every pending request (all of them, even after a failure) and
 * moves what was pulled into the weights. */
static gs_status wait_pending(gt_sync *sync, int keep)
{
    gs_status st = GS_OK;
    for (size_t i = 0; i < sync->p.nsegments; i++) {
        const gt_segment *seg = &sync->p.segments[i];
        gs_status one = GS_OK;
        if (sync->ps_pending[i])
            one = gs_req_wait(sync->ps_pending[i]);
        else if (!sync->ps_pulled[i])
            continue;
        sync->ps_pending[i] = NULL;
        sync->ps_pulled[i] = false;
        if (one != GS_OK && keep && repeat_later(sync, i, one))
            continue;
        if (one != GS_OK && st == GS_OK)
            st = gt_fail(one, "push-pull of layer %zu failed: %s", i, gt_lib_error());
        if (one == GS_OK && keep)
            memcpy(sync->params + seg->offset, sync->pulled + seg->offset, seg->count * sizeof(float));
    }
    return st;
}

/* Requests that failed for a recovery: join it, then repeat them (a shard
 * that already had the push skips it). */
static gs_status repeat_failed(gt_sync *sync)
{
    gs_status st = GS_OK;
    for (int attempt = 0; st == GS_OK; attempt++) {
        bool any = false;
        for (size_t i = 0; i < sync->p.nsegments; i++)
            any |= sync->ps_failed[i];
        if (!any)
            return GS_OK;
        if (attempt == 3)
            return gt_fail(GS_ERR_PEER_LOST, "the parameter server kept recovering (3 times in one step)");
        if ((st = gs_ps_recover(sync->ps)) != GS_OK)
            return gt_fail(st, "joining the parameter server's recovery failed: %s", gt_lib_error());
        for (size_t i = 0; i < sync->p.nsegments && st == GS_OK; i++)
            if (sync->ps_failed[i]) {
                sync->ps_failed[i] = false;
                st = push_pull(sync, i);
            }
        if (st == GS_OK)
            st = wait_pending(sync, 1);
    }
    return st;
}

static gs_status ps_finish(gt_sync *sync)
{
    gs_status st = GS_OK;
    for (size_t i = 0; !sync->p.overlap && i < sync->p.nsegments && st == GS_OK; i++)
        st = push_pull(sync, i);
    gs_status waited = wait_pending(sync, 1);
    if (st == GS_OK && waited == GS_OK)
        waited = repeat_failed(sync);
    return st != GS_OK ? st : waited;
}

static gs_status ps_close(gt_sync *sync)
{
    gs_status st = GS_OK;
    if (!sync->ps)
        return GS_OK;
    if (!sync->server)
        st = wait_pending(sync, 0);
    gs_status st2 = gs_ps_destroy(sync->ps);
    if (st2 != GS_OK)
        gt_fail(st2, "leaving the parameter server failed: %s", gt_lib_error());
    free(sync->pulled);
    return st != GS_OK ? st : st2;
}

const gt_sync_ops gt_sync_ps_ops = {
    .name = "ps",
    .open = ps_open,
    .start = ps_start,
    .ready = ps_ready,
    .finish = ps_finish,
    .close = ps_close,
};
