/*
 * Server-side optimizers, applied to one shard at a time. The arithmetic is
 * spelled out in gradsync.h (gs_ps_optim); everything is f32 except Adam's
 * bias corrections, which are computed in double as PyTorch does.
 */
#ifndef GS_PS_OPTIM_H
#define GS_PS_OPTIM_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

/* f32 state vectors the optimizer keeps per element: 0 (SGD), 1 (momentum), 2 (Adam). */
int gs_ps_optim_nstate(gs_ps_optimizer kind);
const char *gs_ps_optim_name(gs_ps_optimizer kind);
/* GS_ERR_INVALID (logged, naming the field) for an unknown kind or a
 * negative or non-finite hyperparameter, beta outside [0, 1), eps <= 0. */
gs_status gs_ps_optim_check(const gs_ps_optim *optim);

/*
 * One update of count parameters w with gradient grad scaled by grad_scale
 * (1/W for the mean over W workers): g = grad[i] * grad_scale + wd * w[i],
 * then the rule of optim->kind. state[0..nstate-1] are the shard's state
 * vectors (zero at first). step is this update's number, starting at 1
 * (Adam's bias correction).
 */
void gs_ps_optim_apply(const gs_ps_optim *optim, float *w, const float *grad, float grad_scale,
                       float *const *state, uint64_t step, size_t count);
#define GS_PS_FUSE_MAX 64 /* more gradients: sum first, then one pass of the optimizer */

/* The same with grad = the sum of ngrads arrays, added in order
 * (((g0 + g1) + g2) ...), fused block by block so that every array is read
 * once: the result is bit for bit that of summing first. */
void gs_ps_optim_apply_sum(const gs_ps_optim *optim, float *w, const float *const *grads, int ngrads,
                           float grad_scale, float *const *state, uint64_t step, size_t count);

#endif
