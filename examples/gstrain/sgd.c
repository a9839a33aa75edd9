/* SGD with momentum: one pass over the flat parameter vector. */
#include "sgd.h"
#include "util.h"

#include <stdlib.h>

struct gt_sgd {
    gt_sgd_params p;
    size_t count;
    float *velocity; /* starts at zero, so the first step's v is the gradient, as in torch */
};

gs_status gt_sgd_create(size_t count, const gt_sgd_params *params, gt_sgd **sgd_p)
{
    gt_sgd *sgd = calloc(1, sizeof(*sgd));
    if (!sgd || !(sgd->velocity = calloc(count ? count : 1, sizeof(float)))) {
        free(sgd);
        return gt_fail(GS_ERR_NOMEM, "no memory for the momentum of %zu parameters", count);
    }
    sgd->p = *params;
    sgd->count = count;
    *sgd_p = sgd;
    return GS_OK;
}

void gt_sgd_destroy(gt_sgd *sgd)
{
    if (!sgd)
        return;
    free(sgd->velocity);
    free(sgd);
}

void gt_sgd_step(gt_sgd *sgd, float *restrict weights, const float *restrict grads)
{
    const float lr = sgd->p.lr, mu = sgd->p.momentum, wd = sgd->p.weight_decay;
    float *restrict v = sgd->velocity;
    for (size_t i = 0; i < sgd->count; i++) {
        float g = grads[i] + wd * weights[i];
        v[i] = mu * v[i] + g;
        weights[i] -= lr * v[i];
    }
}

float *gt_sgd_velocity(gt_sgd *sgd)
{
    return sgd->velocity;
}
