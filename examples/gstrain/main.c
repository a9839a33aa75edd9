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
#include "plot.h"
#include "trainer.h"
#include "util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Point pos of the run: each epoch has steps + 2 points. */
gt_point gt_point_at(const trainer *t, uint64_t pos)
{
    uint64_t per = t->steps + 2, k = pos % per;
    if (pos >= per * (uint64_t)t->opt.epochs)
        return (gt_point){.kind = GT_PT_SAME, .epoch = t->opt.epochs};
    return (gt_point){.kind = k < t->steps    ? GT_PT_STEP
                              : k == t->steps ? GT_PT_SUMS
                                              : GT_PT_EVAL,
                      .epoch = (int)(pos / per) + 1,
                      .step = k < t->steps ? (size_t)k : 0};
}

uint64_t gt_point_count(const trainer *t)
{
    return (t->steps + 2) * (uint64_t)t->opt.epochs + 1;
}

uint64_t gt_steps_before(const trainer *t, uint64_t pos)
{
    uint64_t per = t->steps + 2, k = pos % per;
    if (pos >= per * (uint64_t)t->opt.epochs)
        return t->steps * (uint64_t)t->opt.epochs;
    return pos / per * t->steps + (k < t->steps ? k : t->steps);
}

/* Step `step` of the epoch: global batch [lo, lo + global) of the order,
 * this rank's share of it. The time inside the sync module counts as wait
 * (for the slowest rank, with --split-wait) and sync, the rest of the step
 * as compute. */
static gs_status train_step(trainer *t, size_t step)
{
    size_t batch = t->opt.batch, lo = step * batch,
           global = t->train.count - lo < batch ? t->train.count - lo : batch;
    size_t first = lo + global * (size_t)t->rank / (size_t)t->size;
    size_t n = lo + global * (size_t)(t->rank + 1) / (size_t)t->size - first;
    size_t correct = 0;
    uint64_t number = gt_steps_before(t, t->pos) + 1; /* the global step, 1-based */
    double start = gt_now_s(), wait0, sync0, wait1, sync1, *sums = t->sums;
    gs_status st;
    uint64_t t0 = gs_clock_ns(), t1, t2, t3; /* GS_TRACE: the phases beside the library's operations */
    gt_elastic_maybe_die(t, GT_DIE_COMPUTE, number);
    gt_sync_times(t->sync, &wait0, &sync0);
    load_rows(t, &t->train, t->order, first, n);
    gt_mlp_forward(t->mlp, n, t->labels, &sums[SUM_LOSS], &correct);
    gs_trace_span("forward", t0, t1 = gs_clock_ns());
    st = gt_mlp_backward(t->mlp, n, t->labels, gt_sync_grad_scale(t->sync, global), on_grad_ready, t->sync);
    gs_trace_span("backward", t1, t2 = gs_clock_ns());
    if (st == GS_OK) {
        gt_elastic_maybe_die(t, GT_DIE_SYNC, number);
        st = gt_sync_finish(t->sync);
    }
    gs_trace_span("sync", t2, t3 = gs_clock_ns());
    if (st == GS_OK && t->sgd)
        gt_sgd_step(t->sgd, t->params, gt_sync_grads(t->sync));
    gs_trace_span("update", t3, gs_clock_ns());
    gt_sync_times(t->sync, &wait1, &sync1);
    sums[SUM_CORRECT] += (double)correct;
    sums[SUM_ROWS] += (double)n;
    sums[SUM_COMPUTE] += gt_now_s() - start - (wait1 - wait0) - (sync1 - sync0);
    sums[SUM_WAIT] += wait1 - wait0;
    sums[SUM_SYNC] += sync1 - sync0;
    if (st == GS_OK && t->rank == 0) {
        double seen = sums[SUM_ROWS] > 0 ? sums[SUM_ROWS] : 1; /* this rank's rows so far */
        gt_progress_update(&t->bar, step + 1, lo + global, sums[SUM_LOSS] / seen,
                           sums[SUM_SYNC] / (sums[SUM_COMPUTE] + sums[SUM_WAIT] + sums[SUM_SYNC]));
    }
    return st;
}

/* The start of an epoch (its first step, or that step again after a
 * recovery): the epoch's order, zero sums, the progress bar. */
static void begin_epoch(trainer *t, int epoch)
{
    shuffle(t->order, t->train.count, t->opt.seed, epoch);
    memset(t->sums, 0, sizeof(t->sums));
    t->epoch_start = gt_now_s();
    gt_progress_begin(&t->bar, t->rank == 0 ? t->opt.progress : GT_PROGRESS_NONE, stdout, epoch,
                      t->opt.epochs, t->steps);
}

/* The epoch's metrics summed over the ranks. The training loss and
 * accuracy are over the rows the sums hold: every row of the epoch, or
 * after a lost rank those the survivors computed. */
static gs_status epoch_sums(trainer *t, gt_epoch_stats *s)
{
    double sums[SUM_COUNT];
    gs_status st;
    s->time_s = gt_now_s() - t->epoch_start;
    if (t->rank == 0)
        gt_progress_end(&t->bar);
    memcpy(sums, t->sums, sizeof(sums));
    if ((st = gt_sync_sum(t->sync, sums, SUM_COUNT)) != GS_OK)
        return st;
    s->train_loss = sums[SUM_ROWS] > 0 ? sums[SUM_LOSS] / sums[SUM_ROWS] : 0;
    s->train_acc = sums[SUM_ROWS] > 0 ? sums[SUM_CORRECT] / sums[SUM_ROWS] : 0;
    s->compute_s = sums[SUM_COMPUTE] / t->size;
    s->wait_s = sums[SUM_WAIT] / t->size;
    s->sync_s = sums[SUM_SYNC] / t->size;
    s->images_per_s = (double)t->train.count / s->time_s;
    return GS_OK;
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
                         .weight_decay = opt->weight_decay,
                         .join = opt->join,
                         .elastic = opt->elastic};
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
    size_t ranks = t->opt.elastic ? 1 : (size_t)t->size; /* --elastic: the fewest ranks there may be left */
    t->steps = (t->train.count + t->opt.batch - 1) / t->opt.batch;
    t->batch_cap = (t->opt.batch + ranks - 1) / ranks;
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
    if (st == GS_OK && t->opt.elastic)
        st = gt_elastic_init(t);
    return st;
}

/* A ps joiner: the others may have completed steps between the state they
 * sent and the servers' readmission (steps have no collective of the
 * trainers): its run starts at the round it was readmitted at. */
static gs_status skip_applied_steps(trainer *t)
{
    int64_t round = gt_sync_round(t->sync);
    while (round > (int64_t)gt_steps_before(t, t->pos) && gt_point_at(t, t->pos).kind == GT_PT_STEP) {
        gt_point p = gt_point_at(t, t->pos);
        if (p.step == 0)
            begin_epoch(t, p.epoch); /* the epoch's order, as run_point would */
        t->pos++;
    }
    if (round >= 0 && round != (int64_t)gt_steps_before(t, t->pos))
        return gt_fail(GS_ERR_PROTOCOL, "rejoined at round %lld, but the trainers are at step %llu",
                       (long long)round, (unsigned long long)gt_steps_before(t, t->pos));
    t->grow_checked = t->pos;
    return GS_OK;
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
    /* a ps joiner takes the running ranks' state first: the servers readmit it
     * (in gt_sync_start) in a recovery the others join from their next step */
    if (st == GS_OK && t->opt.join && t->opt.method == GT_SYNC_PS)
        st = gt_elastic_adopt(t);
    if (st == GS_OK)
        st = gt_sync_start(t->sync, t->params);
    if (st == GS_OK && t->opt.join && t->opt.method == GT_SYNC_PS)
        st = skip_applied_steps(t);
    if (st == GS_OK && t->opt.join && t->opt.method != GT_SYNC_PS) /* where they are, weights, momentum */
        st = gt_elastic_adopt(t);
    return st;
}

static void teardown(trainer *t)
{
    gt_elastic_free(t);
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
                            .split_wait = t->opt.split_wait,
                            .elastic = t->opt.elastic,
                            .ranks_final = t->size};
}

/* A parameter-server rank: serves in the background (started by
 * gt_sync_start) and joins the trainers' collective calls with zeros, in
 * their order: per epoch the training sums and the evaluation sums, then the
 * weight check. */
static gs_status serve(trainer *t, int *same_p)
{
    gs_status st = GS_OK;
    if (t->opt.elastic) { /* the trainers sum and check among themselves; serving ends when they leave */
        *same_p = 1;
        return GS_OK;
    }
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

/* Runs point p (t->pos) once. */
static gs_status run_point(trainer *t, gt_point p, uint64_t *hash_p, int *same_p)
{
    gt_epoch_stats *s = &t->stats[p.epoch - 1];
    gs_status st;
    switch (p.kind) {
    case GT_PT_STEP:
        if (p.step == 0)
            begin_epoch(t, p.epoch);
        gt_elastic_save(t, p);
        return train_step(t, p.step);
    case GT_PT_SUMS:
        gt_elastic_save(t, p);
        s->epoch = p.epoch;
        return epoch_sums(t, s);
    case GT_PT_EVAL:
        st = evaluate(t, s);
        if (st == GS_OK && t->rank == 0 && !t->opt.json && t->reported < p.epoch) {
            gt_report_epoch(stdout, s, t->opt.epochs, t->opt.split_wait);
            t->reported = p.epoch;
        }
        return st;
    case GT_PT_SAME:
        *hash_p = gt_hash64(t->params, t->nparams * sizeof(float));
        return gt_sync_same(t->sync, *hash_p, 1, same_p);
    }
    return GS_ERR_INVALID;
}

/* ps --elastic: whether the last round counted fewer trainers than the one
 * seen before (a rejoined trainer raises the count: no loss). Every trainer
 * pulled the same rounds, so all of them see the same drop at the same step.
 * After a grow nobody compares until each has seen one round again (a
 * joiner has no history, and its first rounds may be ones it skipped). */
static int live_dropped(trainer *t)
{
    int live = gt_sync_live(t->sync), dropped = live > 0 && t->live_prev > 0 && live < t->live_prev;
    if (live > 0)
        t->live_prev = live;
    return dropped;
}

/* Trains, evaluates after every epoch, checks the weights agree; trainer 0
 * reports. The collective calls here and in serve() must match. With
 * --elastic a point lost with a rank is recovered from and run again. */
static gs_status run(trainer *t, int *same_p)
{
    double start = gt_now_s();
    uint64_t hash = 0, end = gt_point_count(t);
    int same = 0, ps = t->opt.method == GT_SYNC_PS;
    gs_status st = GS_OK;
    describe(t);
    if (t->rank == 0 && !t->opt.json)
        gt_report_setup(stdout, &t->info);
    while (t->pos < end) {
        gt_point p = gt_point_at(t, t->pos);
        st = GS_OK;
        if (t->opt.elastic && t->grow_checked != t->pos &&
            ((p.kind == GT_PT_STEP && p.step == 0) || p.kind == GT_PT_SAME))
            st = gt_elastic_grow(t); /* processes waiting to join come in here */
        /* ps: the servers went on without a lost trainer (the last round counted
         * fewer): before the next step the others shrink to themselves */
        int lost = st == GS_OK && t->opt.elastic && ps && p.kind == GT_PT_STEP && live_dropped(t);
        if (lost)
            gt_elastic_save(t, p); /* what the recovery restores for this point: the state now */
        if (st == GS_OK && !lost)
            st = run_point(t, p, &hash, &same);
        if (st == GS_OK && !lost) {
            t->pos++;
            gt_elastic_point_done(t);
            continue;
        }
        /* ps: the servers go on without a lost trainer, so a step fails only with a
         * lost server, which --elastic does not survive (a step cannot be undone there) */
        if (!lost && (!t->opt.elastic || st != GS_ERR_PEER_LOST || (ps && p.kind == GT_PT_STEP)))
            return st;
        if ((st = gt_elastic_recover(t, gs_clock_ns())) != GS_OK)
            return st;
    }
    t->info.ranks_final = t->size;
    if (st == GS_OK && t->rank == 0 && t->opt.save)
        st = save_weights(t);
    if (st == GS_OK && t->rank == 0 && t->opt.plot)
        st = gt_plot_write(t->opt.plot, &t->info, t->stats, t->opt.epochs);
    if (st == GS_OK && t->rank == 0) {
        if (t->opt.json)
            gt_report_json(stdout, &t->info, t->stats, t->opt.epochs, gt_now_s() - start, hash, same, t->rec,
                           t->nrec, t->joins, t->njoins);
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
    gt_elastic = t.opt.elastic;
    if (t.opt.join)
        setenv("GS_REJOIN", "1", 1); /* the context takes a lost rank's place in the store */
    st = setup(&t);
    if (st == GS_OK)
        st = gt_sync_is_server(t.sync) ? serve(&t, &same) : run(&t, &same);
    if (st == GS_OK && !same)
        st = gt_fail(GS_ERR_MISMATCH, "the ranks ended with different weights");
    teardown(&t);
    return st == GS_OK ? 0 : 1;
}
