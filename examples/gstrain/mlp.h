/* The model: a 784-512-256-10 multilayer perceptron, ReLU between layers,
 * softmax cross-entropy at the end; GEMMs through OpenBLAS.
 *
 * Parameters and gradients live in two flat float vectors the caller owns
 * (so the gradient vector can be a registered buffer the synchronization
 * reduces in place). Layer l's weights W_l (out x in, row-major) and then its
 * bias b_l are one contiguous segment of each vector, layer after layer. */
#ifndef GT_MLP_H
#define GT_MLP_H

#include "gradsync.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

#define GT_LAYERS 3

/* Rows of W in one panel of the weight gradient: each panel is one GEMM of
 * a fixed shape, so the gradient's bits do not depend on the buckets. */
#define GT_PANEL_ROWS 16

typedef struct gt_layer {
    size_t in, out;
    size_t offset; /* of W_l in the flat vectors; b_l follows at offset + out * in */
    size_t count;  /* out * in + out */
} gt_layer;

typedef struct gt_mlp gt_mlp;

/* Called by the backward pass as soon as one bucket of the gradient
 * [offset, offset + count) is final (last layer first). */
typedef gs_status (*gt_grad_ready_fn)(void *arg, size_t offset, size_t count);

/* The buckets the backward pass announces, in its order: each layer's W cut
 * into blocks of whole panels (GT_PANEL_ROWS rows) of at most bucket_floats
 * (0: no cut; at least one panel), split evenly, the layer's b riding with
 * its last block. Writes up to cap of them to out; returns how many there
 * are. */
size_t gt_mlp_buckets(size_t bucket_floats, gt_segment *out, size_t cap);

/* Number of floats in the parameter (and gradient) vector. */
size_t gt_mlp_param_count(void);
/* The layout of layer l. */
gt_layer gt_mlp_layer(int l);

/* A model over caller-owned params and grads (gt_mlp_param_count floats
 * each) with activations for batches of up to batch_cap images, announcing
 * its gradient in buckets of bucket_floats (see gt_mlp_buckets). */
gs_status gt_mlp_create(float *params, float *grads, size_t batch_cap, size_t bucket_floats, gt_mlp **mlp_p);
void gt_mlp_destroy(gt_mlp *mlp);

/* He-uniform weights (U(-sqrt(6/in), sqrt(6/in))), zero biases, drawn from
 * the counter-based stream of seed: identical on every rank. */
void gt_mlp_init(gt_mlp *mlp, uint64_t seed);

/* Where the caller writes the input batch: batch_cap x 784 floats. */
float *gt_mlp_input(gt_mlp *mlp);

/* Forward pass over the first n rows of the input. Adds the summed
 * cross-entropy of the rows to *loss_sum and the number of rows whose
 * argmax is the label to *correct. Keeps what the backward pass needs. */
void gt_mlp_forward(gt_mlp *mlp, size_t n, const uint8_t *labels, double *loss_sum, size_t *correct);

/* Backward pass after gt_mlp_forward(n): grads = scale * (sum over the n
 * rows of the gradient of each row's loss). With scale = 1 / global batch
 * and the per-rank results summed, that is the global batch mean. Calls
 * ready (if not NULL) per bucket, in gt_mlp_buckets' order; stops at its
 * first error. */
gs_status gt_mlp_backward(gt_mlp *mlp, size_t n, const uint8_t *labels, float scale, gt_grad_ready_fn ready,
                          void *arg);

#endif
