/* The MLP's forward and backward passes. Activations are row-major, one row
 * per image. Per layer: one GEMM forward; backward one GEMM for the weight
 * gradient and one for the gradient of the layer's input (skipped for the
 * first layer: the images need no gradient). */
#include "mlp.h"
#include "util.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const size_t widths[GT_LAYERS + 1] = {784, 512, 256, 10};

struct gt_mlp {
    float *params, *grads;
    size_t batch_cap;
    size_t blocks[GT_LAYERS]; /* row blocks of each layer's weight gradient */
    gt_layer layer[GT_LAYERS];
    float *act[GT_LAYERS + 1]; /* act[0] input, act[l+1] output of layer l (last: probabilities) */
    float *delta[2];           /* backward scratch: loss gradient w.r.t. a layer's output */
};

gt_layer gt_mlp_layer(int l)
{
    gt_layer layer = {.in = widths[l], .out = widths[l + 1]};
    for (int k = 0; k < l; k++)
        layer.offset += widths[k + 1] * widths[k] + widths[k + 1];
    layer.count = layer.out * layer.in + layer.out;
    return layer;
}

size_t gt_mlp_param_count(void)
{
    gt_layer last = gt_mlp_layer(GT_LAYERS - 1);
    return last.offset + last.count;
}

/* The weight gradient of a layer is computed in fixed panels of
 * GT_PANEL_ROWS rows of W (the last panel of a layer may be shorter), one
 * GEMM each, whatever the buckets: a BLAS kernel may round a row differently
 * in GEMMs of different shapes, so the panel layout, not the bucket layout,
 * fixes the bits. A bucket is a run of whole panels. */
static size_t panel_count(const gt_layer *ly)
{
    return (ly->out + GT_PANEL_ROWS - 1) / GT_PANEL_ROWS;
}

/* Buckets of layer l's W for buckets of bucket_floats (0: one), at least
 * one panel each. */
static size_t row_blocks(const gt_layer *ly, size_t bucket_floats)
{
    size_t w = ly->out * ly->in, blocks = bucket_floats ? (w + bucket_floats - 1) / bucket_floats : 1;
    size_t panels = panel_count(ly);
    return blocks > panels ? panels : blocks < 1 ? 1 : blocks;
}

/* Panels [*first, *last) of block k of n over the layer's panels, split evenly. */
static void block_panels(const gt_layer *ly, size_t n, size_t k, size_t *first, size_t *last)
{
    *first = panel_count(ly) * k / n;
    *last = panel_count(ly) * (k + 1) / n;
}

/* Rows [*first, *last) of W in panels [first_panel, last_panel). */
static void panel_rows(const gt_layer *ly, size_t first_panel, size_t last_panel, size_t *first, size_t *last)
{
    *first = first_panel * GT_PANEL_ROWS;
    *last = last_panel * GT_PANEL_ROWS < ly->out ? last_panel * GT_PANEL_ROWS : ly->out;
}

static gt_segment block_segment(const gt_layer *ly, size_t n, size_t k)
{
    size_t first_panel, last_panel, first, last;
    block_panels(ly, n, k, &first_panel, &last_panel);
    panel_rows(ly, first_panel, last_panel, &first, &last);
    return (gt_segment){.offset = ly->offset + first * ly->in,
                        .count = (last - first) * ly->in + (k == n - 1 ? ly->out : 0)};
}

size_t gt_mlp_buckets(size_t bucket_floats, gt_segment *out, size_t cap)
{
    size_t count = 0;
    for (int l = GT_LAYERS - 1; l >= 0; l--) {
        gt_layer ly = gt_mlp_layer(l);
        size_t n = row_blocks(&ly, bucket_floats);
        for (size_t k = 0; k < n; k++, count++)
            if (count < cap)
                out[count] = block_segment(&ly, n, k);
    }
    return count;
}

static float *alloc_floats(size_t count)
{
    size_t bytes = (count * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

gs_status gt_mlp_create(float *params, float *grads, size_t batch_cap, size_t bucket_floats, gt_mlp **mlp_p)
{
    gt_mlp *mlp = calloc(1, sizeof(*mlp));
    int ok = 1;
    if (!mlp)
        return gt_fail(GS_ERR_NOMEM, "no memory for the model");
    mlp->params = params;
    mlp->grads = grads;
    mlp->batch_cap = batch_cap ? batch_cap : 1;
    for (int l = 0; l < GT_LAYERS; l++) {
        mlp->layer[l] = gt_mlp_layer(l);
        mlp->blocks[l] = row_blocks(&mlp->layer[l], bucket_floats);
    }
    for (int l = 0; l <= GT_LAYERS; l++)
        ok &= (mlp->act[l] = alloc_floats(mlp->batch_cap * widths[l])) != NULL;
    for (int i = 0; i < 2; i++)
        ok &= (mlp->delta[i] = alloc_floats(mlp->batch_cap * widths[1])) != NULL; /* widest hidden */
    if (!ok) {
        gt_mlp_destroy(mlp);
        return gt_fail(GS_ERR_NOMEM, "no memory for the activations of batches of %zu images", batch_cap);
    }
    *mlp_p = mlp;
    return GS_OK;
}

void gt_mlp_destroy(gt_mlp *mlp)
{
    if (!mlp)
        return;
    for (int l = 0; l <= GT_LAYERS; l++)
        free(mlp->act[l]);
    for (int i = 0; i < 2; i++)
        free(mlp->delta[i]);
    free(mlp);
}

void gt_mlp_init(gt_mlp *mlp, uint64_t seed)
{
    uint64_t key = gt_rand_key(seed, GT_STREAM_INIT);
    for (int l = 0; l < GT_LAYERS; l++) {
        const gt_layer *ly = &mlp->layer[l];
        float *w = mlp->params + ly->offset;
        float bound = sqrtf(6.0f / (float)ly->in);
        for (size_t i = 0; i < ly->out * ly->in; i++)
            w[i] = (2.0f * gt_rand_unit(key, ly->offset + i) - 1.0f) * bound;
        memset(w + ly->out * ly->in, 0, ly->out * sizeof(float));
    }
}

float *gt_mlp_input(gt_mlp *mlp)
{
    return mlp->act[0];
}

/* out = in W^T + b for n rows. */
static void linear_forward(const gt_layer *ly, const float *params, const float *in, float *out, size_t n)
{
    const float *w = params + ly->offset, *b = w + ly->out * ly->in;
    for (size_t r = 0; r < n; r++)
        memcpy(out + r * ly->out, b, ly->out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)ly->out, (int)ly->in, 1.0f, in,
                (int)ly->in, w, (int)ly->in, 1.0f, out, (int)ly->out);
}

static void relu(float *x, size_t len)
{
    for (size_t i = 0; i < len; i++)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* Turns each row of logits into probabilities; returns the row's loss and
 * counts a correct argmax. */
static double softmax_row(float *z, size_t classes, uint8_t label, size_t *correct)
{
    size_t best = 0;
    float max = z[0], sum = 0.0f;
    for (size_t c = 1; c < classes; c++)
        if (z[c] > max) {
            max = z[c];
            best = c;
        }
    double loss = (double)max - (double)z[label];
    for (size_t c = 0; c < classes; c++) {
        z[c] = expf(z[c] - max);
        sum += z[c];
    }
    for (size_t c = 0; c < classes; c++)
        z[c] /= sum;
    *correct += best == label;
    return loss + log((double)sum);
}

void gt_mlp_forward(gt_mlp *mlp, size_t n, const uint8_t *labels, double *loss_sum, size_t *correct)
{
    for (int l = 0; l < GT_LAYERS && n > 0; l++) {
        linear_forward(&mlp->layer[l], mlp->params, mlp->act[l], mlp->act[l + 1], n);
        if (l < GT_LAYERS - 1)
            relu(mlp->act[l + 1], n * mlp->layer[l].out);
    }
    for (size_t r = 0; r < n; r++)
        *loss_sum +=
            softmax_row(mlp->act[GT_LAYERS] + r * widths[GT_LAYERS], widths[GT_LAYERS], labels[r], correct);
}

/* The gradient of the summed loss with respect to the logits, times scale:
 * (softmax - one_hot(label)) * scale. */
static void loss_gradient(const float *prob, const uint8_t *labels, size_t n, size_t classes, float scale,
                          float *delta)
{
    for (size_t r = 0; r < n; r++)
        for (size_t c = 0; c < classes; c++)
            delta[r * classes + c] = (prob[r * classes + c] - (c == labels[r] ? 1.0f : 0.0f)) * scale;
}

/* db += the sum of the n rows of delta (row after row: a fixed order). */
static void column_sums(const float *restrict delta, size_t n, size_t width, float *restrict db)
{
    for (size_t r = 0; r < n; r++)
        for (size_t c = 0; c < width; c++)
            db[c] += delta[r * width + c];
}

/* d_in *= (in > 0), the derivative of the ReLU that produced in. */
static void relu_mask(const float *restrict in, float *restrict d_in, size_t len)
{
    for (size_t i = 0; i < len; i++)
        d_in[i] = in[i] > 0.0f ? d_in[i] : 0.0f;
}

/* Rows [first, last) of dW = delta^T in (summed over the n rows). */
static void weight_gradient_rows(const gt_layer *ly, const float *delta, const float *in, size_t n,
                                 size_t first, size_t last, float *dw)
{
    if (n == 0) {
        memset(dw + first * ly->in, 0, (last - first) * ly->in * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(last - first), (int)ly->in, (int)n, 1.0f,
                delta + first, (int)ly->out, in, (int)ly->in, 0.0f, dw + first * ly->in, (int)ly->in);
}

/* The gradient of layer l's W and b, block after block of W's panels (b
 * first: it completes the last block), each block announced when done. */
static gs_status layer_gradient(gt_mlp *mlp, int l, const float *delta, size_t n, gt_grad_ready_fn ready,
                                void *arg)
{
    const gt_layer *ly = &mlp->layer[l];
    float *dw = mlp->grads + ly->offset, *db = dw + ly->out * ly->in;
    gs_status st = GS_OK;
    memset(db, 0, ly->out * sizeof(float));
    column_sums(delta, n, ly->out, db);
    for (size_t k = 0; k < mlp->blocks[l] && st == GS_OK; k++) {
        size_t first_panel, last_panel;
        block_panels(ly, mlp->blocks[l], k, &first_panel, &last_panel);
        for (size_t p = first_panel; p < last_panel; p++) {
            size_t first, last;
            panel_rows(ly, p, p + 1, &first, &last);
            weight_gradient_rows(ly, delta, mlp->act[l], n, first, last, dw);
        }
        if (ready) {
            gt_segment seg = block_segment(ly, mlp->blocks[l], k);
            st = ready(arg, seg.offset, seg.count);
        }
    }
    return st;
}

/* d_in = delta W, zeroed where the layer's input (a ReLU output) was 0. */
static void linear_backward_input(const gt_layer *ly, const float *params, const float *delta,
                                  const float *in, size_t n, float *d_in)
{
    if (n == 0)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)ly->in, (int)ly->out, 1.0f, delta,
                (int)ly->out, params + ly->offset, (int)ly->in, 0.0f, d_in, (int)ly->in);
    relu_mask(in, d_in, n * ly->in);
}

gs_status gt_mlp_backward(gt_mlp *mlp, size_t n, const uint8_t *labels, float scale, gt_grad_ready_fn ready,
                          void *arg)
{
    float *delta = mlp->delta[0], *next = mlp->delta[1];
    gs_status st = GS_OK;
    loss_gradient(mlp->act[GT_LAYERS], labels, n, widths[GT_LAYERS], scale, delta);
    for (int l = GT_LAYERS - 1; l >= 0 && st == GS_OK; l--) {
        const gt_layer *ly = &mlp->layer[l];
        st = layer_gradient(mlp, l, delta, n, ready, arg);
        if (l > 0) {
            float *t = delta;
            linear_backward_input(ly, mlp->params, delta, mlp->act[l], n, next);
            delta = next;
            next = t;
        }
    }
    return st;
}
