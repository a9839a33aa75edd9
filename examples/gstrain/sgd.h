/* Stochastic gradient descent with momentum and optional weight decay, as
 * torch.optim.SGD (dampening 0, not Nesterov):
 *   g = grad + weight_decay * w;  v = momentum * v + g;  w = w - lr * v. */
#ifndef GT_SGD_H
#define GT_SGD_H

#include "gradsync.h"

#include <stddef.h>

typedef struct gt_sgd_params {
    float lr;
    float momentum;
    float weight_decay;
} gt_sgd_params;

typedef struct gt_sgd gt_sgd;

gs_status gt_sgd_create(size_t count, const gt_sgd_params *params, gt_sgd **sgd_p);
void gt_sgd_destroy(gt_sgd *sgd);
/* One update of the count weights from the (globally averaged) gradient. */
void gt_sgd_step(gt_sgd *sgd, float *weights, const float *grads);
/* The optimizer's state: the count momentum floats (saved and restored by
 * --elastic, broadcast to a joiner). */
float *gt_sgd_velocity(gt_sgd *sgd);

#endif
