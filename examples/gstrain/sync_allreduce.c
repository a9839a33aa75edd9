/* Gradients summed by gradsync's allreduce (f32, sum, in place); every rank
 * then runs the optimizer on the same sum.
 *
 * With overlap, each segment the backward pass announces starts a
 * gs_iallreduce at once, and every later announcement drives the pending
 * ones (gs_req_test) before starting its own; finish waits for them in
 * order. Without overlap, finish reduces the whole vector in one call. */
#include "sync_impl.h"
#include "util.h"

static gs_status allreduce_open(gt_sync *sync)
{
    sync->rank = sync->comm ? gs_comm_rank(sync->comm) : gs_ctx_rank(sync->ctx);
    sync->size =
        sync->comm ? gs_comm_size(sync->comm) : gs_ctx_size(sync->ctx); /* a joiner: its communicator */
    return GS_OK;
}

static gs_status allreduce_start(gt_sync *sync, float *params)
{
    (void)sync;
    (void)params;
    return GS_OK;
}

/* Drives the pending reductions without blocking; drops completed ones. */
static gs_status drive(gt_sync *sync)
{
    for (size_t i = 0; i < sync->npending; i++) {
        if (!sync->pending[i])
            continue;
        gs_status st = gs_req_test(sync->pending[i]);
        if (st == GS_INPROGRESS)
            break; /* requests complete in order */
        sync->pending[i] = NULL;
        if (st != GS_OK)
            return gt_fail(st, "gradient allreduce failed: %s", gt_lib_error());
    }
    return GS_OK;
}

static gs_status allreduce_ready(gt_sync *sync, size_t i)
{
    const gt_segment *seg = &sync->p.segments[i];
    float *grad = sync->grads + seg->offset;
    gs_status st;
    if (!sync->comm || !sync->p.overlap)
        return GS_OK;
    if ((st = drive(sync)) != GS_OK)
        return st;
    st = gs_iallreduce(sync->comm, grad, grad, seg->count, GS_F32, GS_SUM, &sync->pending[sync->npending]);
    if (st != GS_OK)
        return gt_fail(st, "cannot start the allreduce of gradient segment [%zu, %zu): %s", seg->offset,
                       seg->offset + seg->count, gt_lib_error());
    sync->npending++;
    return GS_OK;
}

/* Waits for every pending reduction (all of them, even after a failure). */
static gs_status wait_pending(gt_sync *sync)
{
    gs_status st = GS_OK;
    for (size_t i = 0; i < sync->npending; i++) {
        if (!sync->pending[i])
            continue;
        gs_status one = gs_req_wait(sync->pending[i]);
        sync->pending[i] = NULL;
        if (one != GS_OK && st == GS_OK)
            st = gt_fail(one, "gradient allreduce failed: %s", gt_lib_error());
    }
    sync->npending = 0;
    return st;
}

static gs_status allreduce_finish(gt_sync *sync)
{
    gs_status st = GS_OK;
    if (!sync->comm)
        return GS_OK;
    if (sync->p.overlap)
        return wait_pending(sync);
    st = gs_allreduce(sync->comm, sync->grads, sync->grads, sync->p.count, GS_F32, GS_SUM);
    if (st != GS_OK)
        gt_fail(st, "gradient allreduce failed: %s", gt_lib_error());
    return st;
}

static gs_status allreduce_close(gt_sync *sync)
{
    return wait_pending(sync);
}

const gt_sync_ops gt_sync_allreduce_ops = {
    .name = "allreduce",
    .open = allreduce_open,
    .start = allreduce_start,
    .ready = allreduce_ready,
    .finish = allreduce_finish,
    .close = allreduce_close,
};
