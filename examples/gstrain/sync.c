/* The sync module's common part: joining the job, the gradient vector,
 * time accounting, metrics and the weight check; the method does the rest. */
#include "sync_impl.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static float *alloc_grads(size_t count)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = (count * sizeof(float) + page - 1) / page * page;
    float *grads = aligned_alloc(page, bytes ? bytes : page);
    if (grads)
        memset(grads, 0, bytes ? bytes : page); /* touch every page before the first step */
    return grads;
}

gs_status gt_sync_create(const gt_sync_params *params, gt_sync **sync_p)
{
    gt_sync *sync = calloc(1, sizeof(*sync));
    gs_status st;
    if (!sync)
        return gt_fail(GS_ERR_NOMEM, "no memory for the sync state");
    sync->p = *params;
    sync->ops = &gt_sync_allreduce_ops;
    /* Between two reductions every rank computes; a waiting rank that spins
     * takes the core of a rank still computing when ranks share cores. So
     * gstrain waits on events unless told otherwise (docs/gstrain.md). */
    setenv("GS_POLL", "event", 0);
    st = gs_ctx_create(&sync->ctx);
    if (st != GS_OK) {
        gt_fail(st, "cannot join the job: %s", gs_last_error());
        goto out_free;
    }
    sync->rank = gt_rank = gs_ctx_rank(sync->ctx);
    sync->size = gs_ctx_size(sync->ctx);
    if (params->method == GT_SYNC_PS) {
        st = gt_fail(GS_ERR_UNSUPPORTED, "--sync ps: this build has no parameter server yet; use --sync allreduce");
        goto out_ctx;
    }
    if (sync->size > 1 && (st = gs_comm_create(sync->ctx, NULL, &sync->comm)) != GS_OK) {
        gt_fail(st, "cannot create the communicator over %d ranks: %s", sync->size, gs_last_error());
        goto out_ctx;
    }
    if (!(sync->grads = alloc_grads(params->count))) {
        st = gt_fail(GS_ERR_NOMEM, "no memory for a gradient of %zu floats", params->count);
        goto out_comm;
    }
    *sync_p = sync;
    return GS_OK;
out_comm:
    if (sync->comm)
        gs_comm_destroy(sync->comm);
out_ctx:
    gs_ctx_destroy(sync->ctx);
out_free:
    free(sync);
    return st;
}

gs_status gt_sync_destroy(gt_sync *sync)
{
    gs_status st = GS_OK, st2;
    if (!sync)
        return GS_OK;
    if (sync->comm && (st = gs_comm_destroy(sync->comm)) != GS_OK)
        gt_fail(st, "leaving the communicator failed: %s", gs_last_error());
    if ((st2 = gs_ctx_destroy(sync->ctx)) != GS_OK) {
        gt_fail(st2, "leaving the job failed: %s", gs_last_error());
        st = st == GS_OK ? st2 : st;
    }
    free(sync->grads);
    free(sync);
    return st;
}

int gt_sync_rank(const gt_sync *sync)
{
    return sync->rank;
}

int gt_sync_size(const gt_sync *sync)
{
    return sync->size;
}

const char *gt_sync_transport(const gt_sync *sync)
{
    return sync->comm ? gs_tp_name(gs_comm_tp(sync->comm)) : "local";
}

float *gt_sync_grads(gt_sync *sync)
{
    return sync->grads;
}

void gt_sync_times(const gt_sync *sync, double *wait_s, double *sync_s)
{
    *wait_s = sync->wait_s;
    *sync_s = sync->sync_s;
}

/* split_wait: a barrier just before this step's first communication, so the
 * time spent waiting for the slowest rank is counted apart. */
static gs_status wait_for_all(gt_sync *sync)
{
    double start = gt_now_s();
    gs_status st;
    if (!sync->p.split_wait || sync->waited || !sync->comm)
        return GS_OK;
    sync->waited = 1;
    st = gs_barrier(sync->comm);
    sync->wait_s += gt_now_s() - start;
    if (st != GS_OK)
        gt_fail(st, "barrier before the gradient synchronization failed: %s", gs_last_error());
    return st;
}

gs_status gt_sync_ready(gt_sync *sync, size_t offset, size_t count)
{
    gs_status st = GS_OK;
    double start;
    sync->announced += count;
    if (sync->p.overlap)
        st = wait_for_all(sync);
    start = gt_now_s();
    if (st == GS_OK)
        st = sync->ops->ready(sync, offset, count);
    sync->sync_s += gt_now_s() - start;
    return st;
}

gs_status gt_sync_finish(gt_sync *sync)
{
    gs_status st = wait_for_all(sync);
    double start = gt_now_s();
    if (st == GS_OK)
        st = sync->ops->finish(sync);
    if (st == GS_OK && sync->p.overlap && sync->announced != sync->p.count)
        st = gt_fail(GS_ERR_INVALID, "the backward pass announced %zu of %zu gradient floats", sync->announced,
                     sync->p.count);
    sync->announced = 0;
    sync->waited = 0;
    sync->sync_s += gt_now_s() - start;
    return st;
}

gs_status gt_sync_sum(gt_sync *sync, double *values, size_t count)
{
    gs_status st = GS_OK;
    if (sync->comm && (st = gs_allreduce(sync->comm, values, values, count, GS_F64, GS_SUM)) != GS_OK)
        gt_fail(st, "allreduce of %zu metrics failed: %s", count, gs_last_error());
    return st;
}

gs_status gt_sync_same(gt_sync *sync, uint64_t hash, uint64_t *hashes_out, int *same_p)
{
    uint64_t *all = calloc((size_t)sync->size, sizeof(uint64_t));
    gs_status st = GS_OK;
    int same = 1;
    if (!all)
        return gt_fail(GS_ERR_NOMEM, "no memory for %d hashes", sync->size);
    all[0] = hash;
    if (sync->comm && (st = gs_allgather(sync->comm, &hash, all, 1, GS_I64)) != GS_OK)
        gt_fail(st, "allgather of the weight hashes failed: %s", gs_last_error());
    for (int r = 1; st == GS_OK && r < sync->size; r++)
        same &= all[r] == all[0];
    if (st == GS_OK) {
        if (hashes_out)
            memcpy(hashes_out, all, (size_t)sync->size * sizeof(uint64_t));
        *same_p = same;
    }
    free(all);
    return st;
}
