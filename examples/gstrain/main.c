/*
 * gstrain: data-parallel training of a 784-512-256-10 MLP on Fashion-MNIST.
 *
 * Every rank holds the same weights. Each step takes one global batch of the
 * epoch's shuffled order (the same order on every rank); rank r computes the
 * gradient sum over its share of the batch, scaled by 1 / global batch size;
 * the sync step sums those over the ranks, so every rank applies the same
 * mean gradient and the math does not depend on the number of ranks (only
 * the order of float additions does). At the end, a hash of the weights is
 * compared across ranks: they must be bitwise identical. With --sync ps some
 * ranks are parameter servers: they run serve() instead of the training.
 */
#include "data.h"
#include "mlp.h"
#include "options.h"
#include "plot.h"
#include "report.h"
#include "sgd.h"
#include "sync.h"
#include "util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct trainer {
    gt_options opt;
    gt_dataset train, test;
    gt_sync *sync;
    gt_mlp *mlp;
    gt_sgd *sgd;
    float *params;
    size_t nparams;
    size_t *order;    /* this epoch's shuffled training-set order */
    uint8_t *labels;  /* labels of the rows in the model's input */
    size_t batch_cap; /* most rows this rank puts through the model at once */
    int rank, size;
    gt_run_info info;
    gt_epoch_stats *stats;
} trainer;

/* Per-epoch sums of one rank, summed over the ranks at the end of the epoch. */
enum { SUM_LOSS, SUM_CORRECT, SUM_COMPUTE, SUM_WAIT, SUM_SYNC, SUM_COUNT };

static gs_status on_grad_ready(void *arg, size_t offset, size_t count)
{
    return gt_sync_ready(arg, offset, count);
}

/* Fisher-Yates over 0..n-1 with the epoch's counter-based random stream. */
static void shuffle(size_t *order, size_t n, uint64_t seed, int epoch)
{
    uint64_t key = gt_rand_key(seed, ((uint64_t)epoch << 8) | GT_STREAM_SHUFFLE);
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i-- > 1;) {
        size_t j = (size_t)(gt_rand_at(key, n - 1 - i) % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* Rows [first, first + n) of the order (or of the set, order NULL) into the model's input. */
static void load_rows(trainer *t, const gt_dataset *set, const size_t *order, size_t first, size_t n)
{
    float *in = gt_mlp_input(t->mlp);
    for (size_t i = 0; i < n; i++) {
        size_t index = order ? order[first + i] : first + i;
        gt_data_image(set, index, in + i * GT_IMAGE_PIXELS);
        t->labels[i] = set->labels[index];
    }
}

/* One step on global batch [lo, lo + global) of the order. The time inside
 * the sync module counts as wait (for the slowest rank, with --split-wait)
 * and sync, the rest of the step as compute. */
static gs_status train_step(trainer *t, size_t lo, size_t global, double *sums)
{
    size_t first = lo + global * (size_t)t->rank / (size_t)t->size;
    size_t n = lo + global * (size_t)(t->rank + 1) / (size_t)t->size - first;
    size_t correct = 0;
    double start = gt_now_s(), wait0, sync0, wait1, sync1;
    gs_status st;
    uint64_t t0 = gs_clock_ns(), t1, t2, t3; /* GS_TRACE: the phases beside the library's operations */
    gt_sync_times(t->sync, &wait0, &sync0);
    load_rows(t, &t->train, t->order, first, n);
    gt_mlp_forward(t->mlp, n, t->labels, &sums[SUM_LOSS], &correct);
    gs_trace_span("forward", t0, t1 = gs_clock_ns());
    st = gt_mlp_backward(t->mlp, n, t->labels, 1.0f / (float)global, on_grad_ready, t->sync);
    gs_trace_span("backward", t1, t2 = gs_clock_ns());
    if (st == GS_OK)
        st = gt_sync_finish(t->sync);
    gs_trace_span("sync", t2, t3 = gs_clock_ns());
    if (st == GS_OK && t->sgd)
        gt_sgd_step(t->sgd, t->params, gt_sync_grads(t->sync));
    gs_trace_span("update", t3, gs_clock_ns());
    gt_sync_times(t->sync, &wait1, &sync1);
    sums[SUM_CORRECT] += (double)correct;
    sums[SUM_COMPUTE] += gt_now_s() - start - (wait1 - wait0) - (sync1 - sync0);
    sums[SUM_WAIT] += wait1 - wait0;
    sums[SUM_SYNC] += sync1 - sync0;
    return st;
}

static gs_status train_epoch(trainer *t, int epoch, gt_epoch_stats *s)
{
    size_t n = t->train.count, batch = t->opt.batch, steps = (n + batch - 1) / batch;
    double sums[SUM_COUNT] = {0}, start = gt_now_s();
    gt_progress bar;
    gs_status st = GS_OK;
    shuffle(t->order, n, t->opt.seed, epoch);
    if (t->rank == 0)
        gt_progress_begin(&bar, t->opt.progress, stdout, epoch, t->opt.epochs, steps);
    for (size_t step = 0; step < steps && st == GS_OK; step++) {
        size_t lo = step * batch, global = n - lo < batch ? n - lo : batch;
        st = train_step(t, lo, global, sums);
        if (t->rank == 0) {
            double seen = (double)(lo + global) / (double)t->size; /* this rank's rows, about */
            gt_progress_update(&bar, step + 1, lo + global, sums[SUM_LOSS] / seen,
                               sums[SUM_SYNC] / (sums[SUM_COMPUTE] + sums[SUM_WAIT] + sums[SUM_SYNC]));
        }
    }
    s->time_s = gt_now_s() - start;
    if (t->rank == 0)
        gt_progress_end(&bar);
    if (st == GS_OK)
        st = gt_sync_sum(t->sync, sums, SUM_COUNT);
    s->epoch = epoch;
    s->train_loss = sums[SUM_LOSS] / (double)n;
    s->train_acc = sums[SUM_CORRECT] / (double)n;
    s->compute_s = sums[SUM_COMPUTE] / t->size;
    s->wait_s = sums[SUM_WAIT] / t->size;
    s->sync_s = sums[SUM_SYNC] / t->size;
    s->images_per_s = (double)n / s->time_s;
    return st;
}

/* Test loss and accuracy: each rank evaluates its slice of the test set. */
static gs_status evaluate(trainer *t, gt_epoch_stats *s)
{
    size_t n = t->test.count, lo = n * (size_t)t->rank / (size_t)t->size;
    size_t hi = n * (size_t)(t->rank + 1) / (size_t)t->size, correct = 0;
    double sums[2] = {0}, start = gt_now_s();
    gs_status st;
    for (size_t first = lo; first < hi; first += t->batch_cap) {
        size_t rows = hi - first < t->batch_cap ? hi - first : t->batch_cap;
        load_rows(t, &t->test, NULL, first, rows);
        gt_mlp_forward(t->mlp, rows, t->labels, &sums[0], &correct);
    }
    sums[1] = (double)correct;
    st = gt_sync_sum(t->sync, sums, 2);
    s->test_loss = sums[0] / (double)n;
    s->test_acc = sums[1] / (double)n;
    s->eval_s = gt_now_s() - start;
    return st;
}

static gs_status save_weights(const trainer *t)
{
    FILE *f = fopen(t->opt.save, "wb");
    gs_status st = GS_OK;
    if (!f)
        return gt_fail(GS_ERR_IO, "cannot create %s: %m", t->opt.save);
    if (fwrite(t->params, sizeof(float), t->nparams, f) != t->nparams)
        st = gt_fail(GS_ERR_IO, "cannot write the weights to %s: %m", t->opt.save);
    if (fclose(f) != 0 && st == GS_OK)
        st = gt_fail(GS_ERR_IO, "cannot write the weights to %s: %m", t->opt.save);
    return st;
}

static size_t bucket_floats(const gt_options *opt)
{
    return opt->bucket_kb * 1024 / sizeof(float);
}

static gt_sync_params sync_params(const gt_options *opt)
{
    gt_sync_params sp = {.method = opt->method,
                         .overlap = opt->overlap,
                         .split_wait = opt->split_wait,
                         .count = gt_mlp_param_count(),
                         .lr = opt->lr,
                         .momentum = opt->momentum,
                         .weight_decay = opt->weight_decay};
    sp.nsegments = gt_mlp_buckets(bucket_floats(opt), sp.segments, GT_SYNC_MAX_SEGMENTS);
    return sp;
}

/* A trainer's data, model and optimizer (a server rank has none of them). */
static gs_status setup_trainer(trainer *t)
{
    gs_status st = gt_data_load(t->opt.data_dir, "train", t->opt.limit, &t->train);
    if (st == GS_OK)
        st = gt_data_load(t->opt.data_dir, "t10k", t->opt.test_limit, &t->test);
    if (st != GS_OK)
        return st;
    t->batch_cap = (t->opt.batch + (size_t)t->size - 1) / (size_t)t->size;
    t->batch_cap = t->batch_cap < 256 ? 256 : t->batch_cap;
    t->params = aligned_alloc(64, (t->nparams * sizeof(float) + 63) & ~(size_t)63);
    t->order = calloc(t->train.count, sizeof(size_t));
    t->labels = calloc(t->batch_cap, 1);
    t->stats = calloc((size_t)t->opt.epochs, sizeof(gt_epoch_stats));
    if (!t->params || !t->order || !t->labels || !t->stats)
        return gt_fail(GS_ERR_NOMEM, "no memory for a model of %zu parameters and %zu images", t->nparams,
                       t->train.count);
    st = gt_mlp_create(t->params, gt_sync_grads(t->sync), t->batch_cap, bucket_floats(&t->opt), &t->mlp);
    if (st == GS_OK && !gt_sync_updates_weights(t->sync))
        st = gt_sgd_create(t->nparams, &(gt_sgd_params){t->opt.lr, t->opt.momentum, t->opt.weight_decay},
                           &t->sgd);
    if (st == GS_OK)
        gt_mlp_init(t->mlp, t->opt.seed);
    return st;
}

static gs_status setup(trainer *t)
{
    gt_sync_params sp = sync_params(&t->opt);
    gs_status st;
    if (sp.nsegments > GT_SYNC_MAX_SEGMENTS)
        return gt_fail(GS_ERR_INVALID, "--bucket-kb %zu cuts the gradient into %zu buckets, more than %d",
                       t->opt.bucket_kb, sp.nsegments, GT_SYNC_MAX_SEGMENTS);
    st = gt_sync_create(&sp, &t->sync);
    if (st != GS_OK)
        return st;
    t->rank = gt_sync_rank(t->sync);
    t->size = gt_sync_size(t->sync);
    t->nparams = sp.count;
    if (!gt_sync_is_server(t->sync))
        st = setup_trainer(t);
    if (st == GS_OK)
        st = gt_sync_start(t->sync, t->params);
    return st;
}

static void teardown(trainer *t)
{
    gt_sgd_destroy(t->sgd);
    gt_mlp_destroy(t->mlp);
    free(t->stats);
    free(t->labels);
    free(t->order);
    free(t->params);
    gt_data_free(&t->test);
    gt_data_free(&t->train);
    if (t->sync && gt_sync_destroy(t->sync) != GS_OK)
        fprintf(stderr, "gstrain: rank %d: warning: leaving the job failed: %s\n", t->rank, gt_lib_error());
}

static const char *sync_name(const trainer *t)
{
    if (t->opt.method == GT_SYNC_PS)
        return t->opt.overlap ? "ps+overlap" : "ps";
    if (t->size == 1)
        return "none";
    return t->opt.overlap ? "allreduce+overlap" : "allreduce";
}

static void describe(trainer *t)
{
    t->info = (gt_run_info){.ranks = t->size,
                            .servers = gt_sync_servers(t->sync),
                            .transport = gt_sync_transport(t->sync),
                            .sync = sync_name(t),
                            .epochs = t->opt.epochs,
                            .batch = t->opt.batch,
                            .lr = t->opt.lr,
                            .momentum = t->opt.momentum,
                            .weight_decay = t->opt.weight_decay,
                            .seed = t->opt.seed,
                            .train_images = t->train.count,
                            .test_images = t->test.count,
                            .params = t->nparams,
                            .threads = t->opt.threads,
                            .blas_core = openblas_get_corename(),
                            .split_wait = t->opt.split_wait};
}

/* A parameter-server rank: serves in the background (started by
 * gt_sync_start) and joins the trainers' collective calls with zeros, in
 * their order: per epoch the training sums and the evaluation sums, then the
 * weight check. */
static gs_status serve(trainer *t, int *same_p)
{
    gs_status st = GS_OK;
    for (int epoch = 1; epoch <= t->opt.epochs && st == GS_OK; epoch++) {
        double train_sums[SUM_COUNT] = {0}, eval_sums[2] = {0};
        st = gt_sync_sum(t->sync, train_sums, SUM_COUNT);
        if (st == GS_OK)
            st = gt_sync_sum(t->sync, eval_sums, 2);
    }
    if (st == GS_OK)
        st = gt_sync_same(t->sync, 0, 0, same_p);
    return st;
}

/* Trains, evaluates after every epoch, checks the weights agree; trainer 0
 * reports. The collective calls here and in serve() must match. */
static gs_status run(trainer *t, int *same_p)
{
    double start = gt_now_s();
    uint64_t hash;
    int epoch = 0, same = 0;
    gs_status st = GS_OK;
    describe(t);
    if (t->rank == 0 && !t->opt.json)
        gt_report_setup(stdout, &t->info);
    for (epoch = 1; epoch <= t->opt.epochs && st == GS_OK; epoch++) {
        gt_epoch_stats *s = &t->stats[epoch - 1];
        st = train_epoch(t, epoch, s);
        if (st == GS_OK)
            st = evaluate(t, s);
        if (st == GS_OK && t->rank == 0 && !t->opt.json)
            gt_report_epoch(stdout, s, t->opt.epochs, t->opt.split_wait);
    }
    if (st != GS_OK)
        return st;
    hash = gt_hash64(t->params, t->nparams * sizeof(float));
    st = gt_sync_same(t->sync, hash, 1, &same);
    if (st == GS_OK && t->rank == 0 && t->opt.save)
        st = save_weights(t);
    if (st == GS_OK && t->rank == 0 && t->opt.plot)
        st = gt_plot_write(t->opt.plot, &t->info, t->stats, t->opt.epochs);
    if (st == GS_OK && t->rank == 0) {
        if (t->opt.json)
            gt_report_json(stdout, &t->info, t->stats, t->opt.epochs, gt_now_s() - start, hash, same);
        else
            gt_report_final(stdout, &t->info, &t->stats[t->opt.epochs - 1], gt_now_s() - start, hash, same);
    }
    *same_p = same;
    return st;
}

int main(int argc, char **argv)
{
    trainer t = {0};
    int same = 0, rc = gt_options_parse(argc, argv, &t.opt);
    gs_status st;
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    openblas_set_num_threads(t.opt.threads);
    st = setup(&t);
    if (st == GS_OK)
        st = gt_sync_is_server(t.sync) ? serve(&t, &same) : run(&t, &same);
    if (st == GS_OK && !same)
        st = gt_fail(GS_ERR_MISMATCH, "the ranks ended with different weights");
    teardown(&t);
    return st == GS_OK ? 0 : 1;
}
