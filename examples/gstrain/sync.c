/* The sync module's common part: joining the job, the gradient vector,
 * time accounting, metrics and the weight check; the method does the rest. */
#include "sync_impl.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

float *gt_sync_alloc_floats(size_t count)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = (count * sizeof(float) + page - 1) / page * page;
    float *v = aligned_alloc(page, bytes ? bytes : page);
    if (v)
        memset(v, 0, bytes ? bytes : page); /* touch every page before the first step */
    return v;
}

/* The context and, with more than one rank, the communicator. */
static gs_status join(gt_sync *sync)
{
    gs_status st = gs_ctx_create(&sync->ctx);
    if (st != GS_OK)
        return gt_fail(st, "cannot join the job: %s", gt_lib_error());
    gt_rank = gs_ctx_rank(sync->ctx);
    if (sync->p.join) {
        if ((st = gs_comm_grow(sync->ctx, NULL, &sync->comm)) != GS_OK) {
            gt_fail(st, "cannot join the running job: %s", gt_lib_error());
            gs_ctx_destroy(sync->ctx);
        }
        return st;
    }
    if (gs_ctx_size(sync->ctx) > 1 && (st = gs_comm_create(sync->ctx, NULL, &sync->comm)) != GS_OK) {
        gt_fail(st, "cannot create the communicator over %d ranks: %s", gs_ctx_size(sync->ctx),
                gt_lib_error());
        gs_ctx_destroy(sync->ctx);
    }
    return st;
}

gs_status gt_sync_create(const gt_sync_params *params, gt_sync **sync_p)
{
    gt_sync *sync = calloc(1, sizeof(*sync));
    gs_status st;
    if (!sync)
        return gt_fail(GS_ERR_NOMEM, "no memory for the sync state");
    sync->p = *params;
    sync->ops = params->method == GT_SYNC_PS ? &gt_sync_ps_ops : &gt_sync_allreduce_ops;
    if ((st = join(sync)) != GS_OK) {
        free(sync);
        return st;
    }
    st = sync->ops->open(sync);
    if (st == GS_OK && !(sync->grads = gt_sync_alloc_floats(params->count)))
        st = gt_fail(GS_ERR_NOMEM, "no memory for a gradient of %zu floats", params->count);
    if (st != GS_OK) {
        gt_sync_destroy(sync);
        return st;
    }
    *sync_p = sync;
    return GS_OK;
}

gs_status gt_sync_destroy(gt_sync *sync)
{
    gs_status st = GS_OK, one;
    if (!sync)
        return GS_OK;
    st = sync->ops->close(sync);
    if (sync->comm && (one = gs_comm_destroy(sync->comm)) != GS_OK) {
        gt_fail(one, "leaving the communicator failed: %s", gt_lib_error());
        st = st == GS_OK ? one : st;
    }
    if ((one = gs_ctx_destroy(sync->ctx)) != GS_OK) {
        gt_fail(one, "leaving the job failed: %s", gt_lib_error());
        st = st == GS_OK ? one : st;
    }
    free(sync->grads);
    free(sync);
    return st;
}

int gt_sync_is_server(const gt_sync *sync)
{
    return sync->server;
}

int gt_sync_rank(const gt_sync *sync)
{
    return sync->rank;
}

int gt_sync_size(const gt_sync *sync)
{
    return sync->size;
}

int gt_sync_servers(const gt_sync *sync)
{
    return sync->servers;
}

const char *gt_sync_transport(const gt_sync *sync)
{
    return sync->comm ? gs_tp_name(gs_comm_tp(sync->comm)) : "local";
}

gs_status gt_sync_start(gt_sync *sync, float *params)
{
    return sync->ops->start(sync, params);
}

int gt_sync_updates_weights(const gt_sync *sync)
{
    return sync->ops == &gt_sync_ps_ops;
}

float gt_sync_grad_scale(const gt_sync *sync, size_t global)
{
    float parts = sync->ps && sync->p.elastic ? (float)sync->size : 1.0f;
    return parts / (float)global;
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

/* split_wait: a barrier just before this step's first exchange, so the time
 * spent waiting for the slowest rank is counted apart. With a parameter
 * server the servers take no part: there the wait is not split. */
static gs_status wait_for_all(gt_sync *sync)
{
    double start = gt_now_s();
    gs_status st;
    if (!sync->p.split_wait || sync->waited || !sync->comm || sync->ps)
        return GS_OK;
    sync->waited = 1;
    st = gs_barrier(sync->comm);
    sync->wait_s += gt_now_s() - start;
    if (st != GS_OK)
        gt_fail(st, "barrier before the gradient synchronization failed: %s", gt_lib_error());
    return st;
}

static int find_segment(const gt_sync *sync, size_t offset, size_t count, size_t *i_p)
{
    for (size_t i = 0; i < sync->p.nsegments; i++)
        if (sync->p.segments[i].offset == offset && sync->p.segments[i].count == count) {
            *i_p = i;
            return 1;
        }
    return 0;
}

gs_status gt_sync_ready(gt_sync *sync, size_t offset, size_t count)
{
    gs_status st = GS_OK;
    double start;
    size_t i = 0;
    if (!find_segment(sync, offset, count, &i))
        return gt_fail(GS_ERR_INVALID, "gradient segment [%zu, %zu) was not declared", offset,
                       offset + count);
    sync->announced += count;
    if (sync->p.overlap)
        st = wait_for_all(sync);
    start = gt_now_s();
    if (st == GS_OK)
        st = sync->ops->ready(sync, i);
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
        st = gt_fail(GS_ERR_INVALID, "the backward pass announced %zu of %zu gradient floats",
                     sync->announced, sync->p.count);
    sync->announced = 0;
    sync->waited = 0;
    sync->sync_s += gt_now_s() - start;
    return st;
}

gs_status gt_sync_sum(gt_sync *sync, double *values, size_t count)
{
    gs_status st = GS_OK;
    if (sync->comm && (st = gs_allreduce(sync->comm, values, values, count, GS_F64, GS_SUM)) != GS_OK)
        gt_fail(st, "allreduce of %zu metrics failed: %s", count, gt_lib_error());
    return st;
}

gs_status gt_sync_same(gt_sync *sync, uint64_t hash, int has_weights, int *same_p)
{
    int n = sync->comm ? gs_comm_size(sync->comm) : 1, same = 1;
    uint64_t mine[2] = {(uint64_t)(has_weights != 0), hash}, *all = calloc((size_t)n, sizeof(mine));
    const uint64_t *first = NULL;
    gs_status st = GS_OK;
    if (!all)
        return gt_fail(GS_ERR_NOMEM, "no memory for %d hashes", n);
    memcpy(all, mine, sizeof(mine));
    if (sync->comm && (st = gs_allgather(sync->comm, mine, all, 2, GS_I64)) != GS_OK)
        gt_fail(st, "allgather of the weight hashes failed: %s", gt_lib_error());
    for (int r = 0; st == GS_OK && r < n; r++) {
        const uint64_t *pair = all + 2 * r;
        if (!pair[0])
            continue;
        if (!first)
            first = pair;
        same &= pair[1] == first[1];
    }
    if (st == GS_OK)
        *same_p = same;
    free(all);
    return st;
}

gs_status gt_sync_shrink(gt_sync *sync, double *agree_s, double *rebuild_s)
{
    uint64_t agree_ns = 0, rebuild_ns = 0;
    gs_comm *next = NULL;
    gs_status st;
    if (!sync->comm || (sync->ps && !sync->p.elastic))
        return gt_fail(GS_ERR_UNSUPPORTED, "--elastic needs more than one rank");
    st = gs_comm_shrink(sync->comm, &next);
    if (st != GS_OK)
        return gt_fail(st, "shrinking to the surviving ranks failed: %s", gt_lib_error());
    gs_comm_abort(sync->comm); /* frees the requests still pending on it */
    for (size_t i = 0; i < sync->npending; i++)
        sync->pending[i] = NULL;
    sync->npending = 0;
    sync->announced = 0;
    sync->waited = 0;
    sync->comm = next;
    sync->rank = gs_comm_rank(next);
    sync->size = gs_comm_size(next);
    gs_comm_shrink_times(next, &agree_ns, &rebuild_ns);
    *agree_s = (double)agree_ns * 1e-9;
    *rebuild_s = (double)rebuild_ns * 1e-9;
    return GS_OK;
}

int gt_sync_live(gt_sync *sync)
{
    int live = -1;
    for (size_t i = 0; sync->ps && !sync->server && i < sync->p.nsegments; i++) {
        int n = gs_ps_key_workers(sync->ps, i);
        live = n > 0 && (live < 0 || n < live) ? n : live;
    }
    return live;
}

int64_t gt_sync_round(gt_sync *sync)
{
    return sync->ps && !sync->server && sync->p.nsegments ? gs_ps_key_round(sync->ps, 0) : -1;
}

gs_status gt_sync_grow(gt_sync *sync, int *grown_p)
{
    gs_comm *next = NULL;
    gs_status st;
    *grown_p = 0;
    if (!sync->comm)
        return GS_OK;
    if ((st = gs_comm_grow(NULL, sync->comm, &next)) != GS_OK)
        return gt_fail(st, "grow point failed: %s", gt_lib_error());
    if (!next)
        return GS_OK;
    if ((st = gs_comm_destroy(sync->comm)) != GS_OK)
        gt_fail(st, "leaving the communicator before the grow failed: %s", gt_lib_error());
    sync->comm = next;
    sync->rank = gs_comm_rank(next);
    sync->size = gs_comm_size(next);
    *grown_p = 1;
    return GS_OK;
}

gs_status gt_sync_bcast(gt_sync *sync, void *values, size_t count, gs_dtype dtype)
{
    gs_status st = GS_OK;
    if (sync->comm && (st = gs_broadcast(sync->comm, values, values, count, dtype, 0)) != GS_OK)
        gt_fail(st, "broadcast of %zu values failed: %s", count, gt_lib_error());
    return st;
}

gs_status gt_sync_gather(gt_sync *sync, const int64_t *mine, int64_t *all, size_t count)
{
    gs_status st = GS_OK;
    if (!sync->comm) {
        memcpy(all, mine, count * sizeof(*mine));
        return GS_OK;
    }
    if ((st = gs_allgather(sync->comm, mine, all, count, GS_I64)) != GS_OK)
        gt_fail(st, "allgather of %zu values failed: %s", count, gt_lib_error());
    return st;
}

gs_ctx *gt_sync_ctx(gt_sync *sync)
{
    return sync->ctx;
}
