/* Gradient synchronization between the data-parallel ranks.
 *
 * The trainer sees one small interface whatever the method:
 *   grads = gt_sync_grads(sync)         the flat gradient vector
 *   backward pass -> gt_sync_ready()    a layer's segment is final: a method
 *                                       may start exchanging it while the
 *                                       backward pass goes on (overlap)
 *   gt_sync_finish()                    allreduce: every segment now holds
 *                                       the sum over the trainers, bitwise
 *                                       the same on each; ps: params hold
 *                                       the weights the servers computed
 * plus small reductions for metrics and the end-of-run weight check.
 * With one rank (no launcher) every call is local.
 * Methods: sync_allreduce.c, sync_ps.c. */
#ifndef GT_SYNC_H
#define GT_SYNC_H

#include "gradsync.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

typedef enum gt_sync_method {
    GT_SYNC_ALLREDUCE, /* gradients summed by gradsync's allreduce; every rank runs the optimizer */
    GT_SYNC_PS,        /* gradients pushed to gradsync's parameter server, which runs the
                          optimizer; the trainers pull the new weights */
} gt_sync_method;

#define GT_SYNC_MAX_SEGMENTS 64

typedef struct gt_sync_params {
    gt_sync_method method;
    int overlap;                               /* exchange each segment as soon as backward produced it */
    int split_wait;                            /* a barrier before each step's synchronization, to time the
                                                  wait for the slowest rank apart from the data exchange */
    size_t count;                              /* floats in the gradient vector */
    gt_segment segments[GT_SYNC_MAX_SEGMENTS]; /* what gt_sync_ready announces (buckets) */
    size_t nsegments;
    float lr, momentum, weight_decay; /* ps: the servers' optimizer (as gt_sgd) */
    int join;                         /* a process joining a running job (allreduce): the communicator
                                         comes from gs_comm_grow, at the running ranks' next grow point */
    int elastic;                      /* --elastic; ps: the servers go on without a lost trainer (mean
                                         over the live ones), the metrics' communicator holds the
                                         trainers only */
} gt_sync_params;

typedef struct gt_sync gt_sync;

/* Joins the job (rank and size from the launcher's environment; none: a
 * single process) and sets up the method. Collective over the job. */
gs_status gt_sync_create(const gt_sync_params *params, gt_sync **sync_p);
/* Collective. */
gs_status gt_sync_destroy(gt_sync *sync);

/* A parameter-server rank trains nothing: after gt_sync_start it serves in
 * the background and only joins gt_sync_sum / gt_sync_same, in the same
 * order as the trainers (with zeros). */
int gt_sync_is_server(const gt_sync *sync);
/* This rank among the trainers (-1 on a server) and their number. */
int gt_sync_rank(const gt_sync *sync);
int gt_sync_size(const gt_sync *sync);
int gt_sync_servers(const gt_sync *sync);
/* What carries the data ("local" for one process, else the transport name). */
const char *gt_sync_transport(const gt_sync *sync);

/* Collective, once, before the first step: the initial weights (the same on
 * every trainer; NULL on a server). gt_sync_finish may write params. */
gs_status gt_sync_start(gt_sync *sync, float *params);
/* 1: gt_sync_finish leaves the updated weights in params (ps); 0: it leaves
 * the gradient summed over the trainers and the caller runs the optimizer. */
int gt_sync_updates_weights(const gt_sync *sync);

/* The factor of a trainer's gradient over its rows of a step of global rows:
 * 1 / global (the trainers' parts sum to the batch mean), or with ps
 * --elastic size / global (the servers take the mean over the parts of the
 * live trainers: the batch mean over the rows they computed). */
float gt_sync_grad_scale(const gt_sync *sync, size_t global);

/* The gradient vector (count floats, page-aligned). */
float *gt_sync_grads(gt_sync *sync);

/* Segment [offset, offset + count) of the gradient is final for this step
 * (it must be one of params.segments). */
gs_status gt_sync_ready(gt_sync *sync, size_t offset, size_t count);
/* Completes the step's synchronization (see gt_sync_updates_weights). */
gs_status gt_sync_finish(gt_sync *sync);

/* Sums count doubles over all ranks, in place (metrics). */
gs_status gt_sync_sum(gt_sync *sync, double *values, size_t count);
/* Seconds spent inside this module's calls so far: *sync_s starting, driving
 * and waiting for the exchanges; *wait_s (split_wait only, else 0) in the
 * barrier before them, i.e. waiting for the slowest rank. */
void gt_sync_times(const gt_sync *sync, double *wait_s, double *sync_s);

/* Compares a hash of the weights across the ranks that hold weights
 * (has_weights; a server passes 0): *same_p = 1 when they all agree. */
gs_status gt_sync_same(gt_sync *sync, uint64_t hash, int has_weights, int *same_p);

/* --elastic. After a call failed with GS_ERR_PEER_LOST (ps: a metrics call of the trainers'):
 * the survivors' communicator (gs_comm_shrink) replaces the failed one,
 * which is aborted with the requests still pending on it; rank and size
 * are then this rank's among the survivors. On failure the failed one
 * stays (shrink it again). *agree_s and *rebuild_s: the parts of the
 * shrink. */
gs_status gt_sync_shrink(gt_sync *sync, double *agree_s, double *rebuild_s);
/* ps --elastic: how many trainers the servers counted in the last round
 * (the same on every trainer that pulled it; gs_ps_key_workers), or -1
 * before the first round and with other methods. */
int gt_sync_live(gt_sync *sync);
/* ps: the round the next step's pushes go to (the steps the servers
 * applied, for a trainer that just rejoined), or -1. */
int64_t gt_sync_round(gt_sync *sync);
/* --elastic: a grow point (collective over the trainers). *grown_p = 1 when
 * processes joined: the communicator is then a new one, old ranks first. */
gs_status gt_sync_grow(gt_sync *sync, int *grown_p);
/* Broadcasts count values of dtype from trainer 0. */
gs_status gt_sync_bcast(gt_sync *sync, void *values, size_t count, gs_dtype dtype);
/* Allgathers count int64 values per trainer, in rank order. */
gs_status gt_sync_gather(gt_sync *sync, const int64_t *mine, int64_t *all, size_t count);
/* The job's context (its store carries gstrain's own notes). */
gs_ctx *gt_sync_ctx(gt_sync *sync);

#endif
