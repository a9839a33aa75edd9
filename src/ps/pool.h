/*
 * A server's apply threads: the fused sum + optimizer of one shard split in
 * chunks that the serve loop and its helper threads take in turn. Each
 * element's arithmetic is the same whoever takes its chunk, so the result is
 * bit for bit the single-threaded one. The serve loop never waits for a
 * helper to start: it takes chunks itself until none are left, then waits
 * only for the chunks helpers took (a helper that never got a CPU took none).
 */
#ifndef GS_PS_POOL_H
#define GS_PS_POOL_H

#include "ps/optim.h"

typedef struct gs_ps_pool gs_ps_pool;

/* Starts `helpers` threads (at least 1). */
gs_status gs_ps_pool_create(int rank, int helpers, gs_ps_pool **pool_p);
/* Stops and joins the helpers; NULL is fine. */
void gs_ps_pool_destroy(gs_ps_pool *pool);
/* gs_ps_optim_apply_sum over count elements, helpers taking part when the
 * shard is large enough to share (pool may be NULL: the caller alone).
 * grads[] and state[] must stay valid until it returns (they do: it waits). */
void gs_ps_pool_apply_sum(gs_ps_pool *pool, const gs_ps_optim *o, float *w, const float *const *grads,
                          int ngrads, float grad_scale, float *const *state, uint64_t step, size_t count);

#endif
