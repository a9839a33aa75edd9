/* The server-side optimizers (SGD, momentum, Adam) on one shard, fused with
 * the sum of the workers' slots (optim.h). Pure arithmetic over f32 arrays:
 * no transport, no shard layout beyond the pointers it is given. */
#include "ps/optim.h"

#include "kernel/reduce.h"
#include "util/log.h"

#include <math.h>

int gs_ps_optim_nstate(gs_ps_optimizer kind)
{
    switch (kind) {
    case GS_PS_MOMENTUM: return 1;
    case GS_PS_ADAM: return 2;
    default: return 0;
    }
}

const char *gs_ps_optim_name(gs_ps_optimizer kind)
{
    switch (kind) {
    case GS_PS_SGD: return "sgd";
    case GS_PS_MOMENTUM: return "momentum";
    case GS_PS_ADAM: return "adam";
    default: return "unknown";
    }
}

static int bad_number(float value)
{
    return !isfinite(value) || value < 0.0f;
}

gs_status gs_ps_optim_check(const gs_ps_optim *o)
{
    const char *bad = NULL;
    if ((unsigned)o->kind >= GS_PS_OPTIMIZER_COUNT)
        bad = "kind";
    else if (bad_number(o->lr))
        bad = "lr";
    else if (bad_number(o->weight_decay))
        bad = "weight_decay";
    else if (o->kind == GS_PS_MOMENTUM && bad_number(o->momentum))
        bad = "momentum";
    else if (o->kind == GS_PS_ADAM && (bad_number(o->beta1) || o->beta1 >= 1.0f))
        bad = "beta1";
    else if (o->kind == GS_PS_ADAM && (bad_number(o->beta2) || o->beta2 >= 1.0f))
        bad = "beta2";
    else if (o->kind == GS_PS_ADAM && (bad_number(o->eps) || o->eps == 0.0f))
        bad = "eps";
    if (bad)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                       "optimizer %s: field %s is out of range (lr, weight_decay, momentum >= 0, "
                       "0 <= beta < 1, eps > 0, all finite)",
                       gs_ps_optim_name(o->kind), bad);
    return GS_OK;
}

static void apply_sgd(float *restrict w, const float *restrict grad, float scale, float lr, float wd,
                      size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float g = grad[i] * scale + wd * w[i];
        w[i] = w[i] - lr * g;
    }
}

static void apply_momentum(float *restrict w, const float *restrict grad, float scale, float lr, float wd,
                           float mu, float *restrict buf, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float g = grad[i] * scale + wd * w[i];
        buf[i] = mu * buf[i] + g;
        w[i] = w[i] - lr * buf[i];
    }
}

/* PyTorch's formulation: step_size = lr / (1 - beta1^t),
 * denom = sqrt(v) / sqrt(1 - beta2^t) + eps, w -= step_size * (m / denom). */
static void apply_adam(const gs_ps_optim *o, float *restrict w, const float *restrict grad, float scale,
                       float *restrict m, float *restrict v, uint64_t step, size_t count)
{
    double t = (double)step;
    float step_size = (float)((double)o->lr / (1.0 - pow((double)o->beta1, t)));
    float bc2_sqrt = (float)sqrt(1.0 - pow((double)o->beta2, t));
    float b1 = o->beta1, b2 = o->beta2, eps = o->eps, wd = o->weight_decay;
    for (size_t i = 0; i < count; i++) {
        float g = grad[i] * scale + wd * w[i];
        m[i] = b1 * m[i] + (1.0f - b1) * g;
        v[i] = b2 * v[i] + (1.0f - b2) * (g * g);
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        w[i] = w[i] - step_size * (m[i] / denom);
    }
}

#define FUSE_BLOCK 2048 /* elements summed into a buffer that stays in L1 */

void gs_ps_optim_apply_sum(const gs_ps_optim *o, float *w, const float *const *grads, int ngrads,
                           float grad_scale, float *const *state, uint64_t step, size_t count)
{
    float sum[FUSE_BLOCK] __attribute__((aligned(64)));
    gs_red_fn add = gs_red_kernel(GS_F32, GS_SUM);
    if (ngrads == 1) {
        gs_ps_optim_apply(o, w, grads[0], grad_scale, state, step, count);
        return;
    }
    for (size_t at = 0; at < count; at += FUSE_BLOCK) {
        size_t n = count - at < FUSE_BLOCK ? count - at : FUSE_BLOCK;
        float *st[2] = {state[0] ? state[0] + at : NULL, state[1] ? state[1] + at : NULL};
        add(sum, grads[0] + at, grads[1] + at, n);
        for (int g = 2; g < ngrads; g++)
            add(sum, sum, grads[g] + at, n);
        gs_ps_optim_apply(o, w + at, sum, grad_scale, st, step, n);
    }
}

void gs_ps_optim_apply(const gs_ps_optim *o, float *w, const float *grad, float grad_scale,
                       float *const *state, uint64_t step, size_t count)
{
    switch (o->kind) {
    case GS_PS_SGD: apply_sgd(w, grad, grad_scale, o->lr, o->weight_decay, count); break;
    case GS_PS_MOMENTUM:
        apply_momentum(w, grad, grad_scale, o->lr, o->weight_decay, o->momentum, state[0], count);
        break;
    case GS_PS_ADAM: apply_adam(o, w, grad, grad_scale, state[0], state[1], step, count); break;
    default: break;
    }
}
