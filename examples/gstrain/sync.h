/* Gradient synchronization between the data-parallel ranks.
 *
 * The trainer sees one small interface whatever the method:
 *   grads = gt_sync_grads(sync)         the flat gradient vector (registered
 *                                       with the transport where that helps)
 *   backward pass -> gt_sync_ready()    a layer's segment is final: a method
 *                                       may start reducing it while the
 *                                       backward pass goes on (overlap)
 *   gt_sync_finish()                    every segment now holds the sum over
 *                                       all ranks, bitwise the same on each
 * plus small reductions for metrics and the end-of-run weight check.
 * With one rank (no launcher) every call is local.
 * Methods: sync_allreduce.c. */
#ifndef GT_SYNC_H
#define GT_SYNC_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

typedef enum gt_sync_method {
    GT_SYNC_ALLREDUCE, /* ring/recursive-doubling allreduce through gradsync's collectives */
    GT_SYNC_PS,        /* push to / pull from gradsync's parameter server */
} gt_sync_method;

typedef struct gt_sync_params {
    gt_sync_method method;
    int overlap;    /* reduce each layer's segment as soon as backward produced it */
    int split_wait; /* a barrier before each step's synchronization, to time the
                       wait for the slowest rank apart from the data exchange */
    size_t count; /* floats in the gradient vector */
} gt_sync_params;

typedef struct gt_sync gt_sync;

/* Joins the job (rank and size from the launcher's environment; none: a
 * single process) and sets up the method. Collective over the job. */
gs_status gt_sync_create(const gt_sync_params *params, gt_sync **sync_p);
gs_status gt_sync_destroy(gt_sync *sync);
int gt_sync_rank(const gt_sync *sync);
int gt_sync_size(const gt_sync *sync);
/* What carries the data ("local" for one process, else the transport name). */
const char *gt_sync_transport(const gt_sync *sync);

/* The gradient vector (count floats, page-aligned). */
float *gt_sync_grads(gt_sync *sync);

/* Segment [offset, offset + count) of the gradient is final for this step. */
gs_status gt_sync_ready(gt_sync *sync, size_t offset, size_t count);
/* Waits until the whole gradient is the sum over all ranks (segments not
 * announced by gt_sync_ready are reduced here). */
gs_status gt_sync_finish(gt_sync *sync);

/* Sums count doubles over all ranks, in place (metrics). */
gs_status gt_sync_sum(gt_sync *sync, double *values, size_t count);
/* Seconds spent inside this module's calls so far: *sync_s starting, driving
 * and waiting for the reductions; *wait_s (split_wait only, else 0) in the
 * barrier before them, i.e. waiting for the slowest rank. */
void gt_sync_times(const gt_sync *sync, double *wait_s, double *sync_s);

/* Compares a hash across ranks: *same_p = 1 when every rank passed the same
 * value; hashes_out (size entries, may be NULL) receives them in rank order. */
gs_status gt_sync_same(gt_sync *sync, uint64_t hash, uint64_t *hashes_out, int *same_p);

#endif
