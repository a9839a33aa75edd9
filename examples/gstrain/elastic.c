/* gstrain --elastic: going on after a lost rank.
 *
 * A point of the run (trainer.h) failed with GS_ERR_PEER_LOST. Then:
 *   1. shrink: the survivors agree on who is alive and build a communicator
 *      of themselves (gs_comm_shrink, in gt_sync_shrink);
 *   2. resync: they allgather (job rank, points completed). A survivor is
 *      at most one point ahead of another (completing a point's collective
 *      needs every rank to have entered it, so to have completed the one
 *      before), so the last point every survivor completed is the minimum;
 *   3. rollback: every survivor restores the state from before the point
 *      after that one (the weights, the momentum and the epoch's sums: kept
 *      for the last two points, gt_elastic_save) and runs it again. A step
 *      whose allreduce completed on some survivors is undone there: no
 *      gradient of a half-finished step is applied.
 * The global batch is split over the ranks left (train_step reads t->rank
 * and t->size), so the math is that of an unbroken run within the
 * tolerance between rank counts. A rank lost during the resync is a new
 * loss: shrink again. */
#include "trainer.h"
#include "util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

gs_status gt_elastic_init(trainer *t)
{
    size_t bytes = (t->nparams * sizeof(float) + 63) & ~(size_t)63;
    for (int i = 0; i < 2; i++) {
        t->undo.params[i] = aligned_alloc(64, bytes);
        t->undo.velocity[i] = aligned_alloc(64, bytes);
        if (!t->undo.params[i] || !t->undo.velocity[i])
            return gt_fail(GS_ERR_NOMEM, "--elastic: no memory for copies of %zu parameters", t->nparams);
    }
    int world = gs_ctx_size(gt_sync_ctx(t->sync));
    t->members = calloc((size_t)world, sizeof(*t->members));
    if (!t->members)
        return gt_fail(GS_ERR_NOMEM, "--elastic: no memory for %d ranks", world);
    for (int r = 0; r < t->size; r++)
        t->members[r] = r; /* the trainers are the job's ranks (allreduce); a joiner learns them */
    t->grow_checked = UINT64_MAX;
    t->live_prev = t->size;
    return GS_OK;
}

void gt_elastic_free(trainer *t)
{
    for (int i = 0; i < 2; i++) {
        free(t->undo.params[i]);
        free(t->undo.velocity[i]);
    }
    free(t->members);
}

void gt_elastic_save(trainer *t, gt_point p)
{
    int slot = (int)(t->pos & 1);
    if (!t->opt.elastic)
        return;
    memcpy(t->undo.sums[slot], t->sums, sizeof(t->sums));
    if (p.kind == GT_PT_STEP && t->sgd) { /* ps: the servers hold the weights (a step is never redone) */
        memcpy(t->undo.params[slot], t->params, t->nparams * sizeof(float));
        memcpy(t->undo.velocity[slot], gt_sgd_velocity(t->sgd), t->nparams * sizeof(float));
    }
}

/* The store key under which a --die victim leaves the time of its kill. */
static void kill_key(int rank, char *key, size_t cap)
{
    snprintf(key, cap, "gstrain/killed/%d", rank);
}

void gt_elastic_maybe_die(trainer *t, gt_die_when when, uint64_t step)
{
    static const char *const names[] = {"compute", "sync", "recovery"};
    int me = gs_ctx_rank(gt_sync_ctx(t->sync));
    for (int i = 0; i < t->opt.ndie; i++) {
        const gt_die *d = &t->opt.die[i];
        char key[64];
        uint64_t now;
        if (d->rank != me || d->when != when || (when == GT_DIE_RECOVERY ? step < d->step : step != d->step))
            continue;
        if (when == GT_DIE_RECOVERY)
            nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL); /* the others are agreeing */
        now = gs_clock_ns();
        kill_key(me, key, sizeof(key));
        if (gs_store_put(gt_sync_ctx(t->sync), key, &now, sizeof(now)) != GS_OK)
            fprintf(stderr, "gstrain: rank %d: --die: cannot note the kill time: %s\n", me, gt_lib_error());
        fprintf(stderr, "gstrain: rank %d: --die %d:%llu:%s: SIGKILL now\n", me, d->rank,
                (unsigned long long)d->step, names[when]);
        fflush(NULL);
        raise(SIGKILL);
    }
}

/* The earliest --die kill time among the lost ranks (0: none of them was a
 * --die victim). */
static uint64_t kill_time(trainer *t, const gt_recovery *r)
{
    uint64_t earliest = 0;
    for (int i = 0; i < r->nlost; i++)
        for (int k = 0; k < t->opt.ndie; k++) {
            char key[64];
            uint64_t ns = 0;
            size_t len = 0;
            if (t->opt.die[k].rank != r->lost[i])
                continue;
            kill_key(r->lost[i], key, sizeof(key));
            if (gs_store_get(gt_sync_ctx(t->sync), key, &ns, sizeof(ns), &len) == GS_OK &&
                len == sizeof(ns) && (!earliest || ns < earliest))
                earliest = ns;
            break;
        }
    return earliest;
}

/* Shrinks until the survivors' allgather of (job rank, points completed)
 * succeeds; all: 2 values per survivor. */
static gs_status shrink_and_resync(trainer *t, gt_recovery *r, int64_t **all_p)
{
    int64_t mine[2];
    for (int attempt = 0;; attempt++) {
        double agree_s = 0, rebuild_s = 0, t0;
        gs_status st = gt_sync_shrink(t->sync, &agree_s, &rebuild_s);
        if (st != GS_OK)
            return st;
        r->agree_s += agree_s;
        r->rebuild_s += rebuild_s;
        free(*all_p);
        *all_p = calloc(2 * (size_t)gt_sync_size(t->sync), sizeof(**all_p));
        if (!*all_p)
            return gt_fail(GS_ERR_NOMEM, "--elastic: no memory for %d ranks", gt_sync_size(t->sync));
        mine[0] = gs_ctx_rank(gt_sync_ctx(t->sync));
        mine[1] = (int64_t)t->pos;
        t0 = gt_now_s();
        st = gt_sync_gather(t->sync, mine, *all_p, 2);
        r->resync_s += gt_now_s() - t0;
        if (st == GS_OK)
            return GS_OK;
        if (st != GS_ERR_PEER_LOST || attempt + 1 >= t->size)
            return st;
        fprintf(stderr, "gstrain: rank %d: another rank was lost after the shrink; shrinking again\n",
                gt_rank);
    }
}

/* The ranks of t->members missing from the survivors' list. */
static void find_lost(const trainer *t, const int64_t *all, int n, gt_recovery *r)
{
    for (int q = 0; q < t->size; q++) {
        int alive = 0;
        for (int i = 0; i < n && !alive; i++)
            alive = all[2 * i] == t->members[q];
        if (!alive && r->nlost < GT_LOST_MAX)
            r->lost[r->nlost++] = t->members[q];
    }
}

gs_status gt_elastic_recover(trainer *t, uint64_t failed_ns)
{
    gt_recovery r = {.detect_s = -1, .total_s = -1};
    gt_point at = gt_point_at(t, t->pos);
    int64_t *all = NULL, low, high;
    uint64_t kill_ns, t0;
    gs_status st;
    int n, slot;
    gt_elastic_maybe_die(t, GT_DIE_RECOVERY, gt_steps_before(t, t->pos) + 1);
    if ((st = shrink_and_resync(t, &r, &all)) != GS_OK) {
        free(all);
        return st;
    }
    n = gt_sync_size(t->sync);
    low = high = all[1];
    for (int i = 1; i < n; i++) {
        low = all[2 * i + 1] < low ? all[2 * i + 1] : low;
        high = all[2 * i + 1] > high ? all[2 * i + 1] : high;
    }
    for (int i = 0; i < n; i++)
        r.ahead += all[2 * i + 1] > low;
    if (high - low > 1 || (uint64_t)low > t->pos || t->pos - (uint64_t)low > 1) {
        free(all);
        return gt_fail(GS_ERR_PROTOCOL,
                       "--elastic: the survivors are at points %lld to %lld (this rank %llu)", (long long)low,
                       (long long)high, (unsigned long long)t->pos);
    }
    /* ps: the servers applied every step a survivor completed and hold the
     * weights; a step is never run again (only the metrics points are) */
    if (t->opt.method == GT_SYNC_PS && gt_point_at(t, (uint64_t)low).kind == GT_PT_STEP && high > low) {
        free(all);
        return gt_fail(GS_ERR_PROTOCOL,
                       "--elastic: a survivor is behind another at a step (%lld, %lld): the parameter "
                       "server cannot undo a step",
                       (long long)low, (long long)high);
    }
    /* rollback: the state from before point low, which every survivor runs next */
    t0 = gs_clock_ns();
    slot = (int)(low & 1);
    memcpy(t->sums, t->undo.sums[slot], sizeof(t->sums));
    if (gt_point_at(t, (uint64_t)low).kind == GT_PT_STEP && t->sgd) {
        memcpy(t->params, t->undo.params[slot], t->nparams * sizeof(float));
        memcpy(gt_sgd_velocity(t->sgd), t->undo.velocity[slot], t->nparams * sizeof(float));
    }
    t->resumed_ns = gs_clock_ns();
    r.rollback_s = (double)(t->resumed_ns - t0) * 1e-9;
    find_lost(t, all, n, &r);
    for (int i = 0; i < n; i++)
        t->members[i] = (int)all[2 * i];
    free(all);
    r.ranks = n;
    r.at_epoch_end = at.kind != GT_PT_STEP;
    r.at_step = gt_steps_before(t, t->pos) + (at.kind == GT_PT_STEP);
    r.from_step = gt_steps_before(t, (uint64_t)low);
    t->pos = (uint64_t)low;
    t->rank = gt_sync_rank(t->sync);
    t->size = n;
    t->live_prev = n;
    kill_ns = kill_time(t, &r);
    if (kill_ns && kill_ns < failed_ns)
        r.detect_s = (double)(failed_ns - kill_ns) * 1e-9;
    t->kill_ns = kill_ns;
    t->timing = 1;
    if (t->nrec < GT_RECOVERIES_MAX)
        t->rec[t->nrec++] = r;
    if (t->rank == 0) {
        gt_report_recovery(t->opt.json ? stderr : stdout, &r);
        if (t->bar.mode == GT_PROGRESS_NONE && t->opt.progress != GT_PROGRESS_NONE)
            gt_progress_begin(&t->bar, t->opt.progress, stdout, t->bar.epoch, t->opt.epochs, t->steps);
    }
    return GS_OK;
}

void gt_elastic_point_done(trainer *t)
{
    gt_recovery *r = t->nrec ? &t->rec[t->nrec - 1] : NULL;
    uint64_t now;
    if (!t->timing || !r)
        return;
    now = gs_clock_ns();
    t->timing = 0;
    r->first_s = (double)(now - t->resumed_ns) * 1e-9;
    if (t->kill_ns)
        r->total_s = (double)(now - t->kill_ns) * 1e-9;
}

gs_status gt_elastic_adopt(trainer *t)
{
    int64_t pos = (int64_t)t->pos, mine = gs_ctx_rank(gt_sync_ctx(t->sync)), *all;
    size_t stats_words = (size_t)t->opt.epochs * sizeof(gt_epoch_stats) / sizeof(int32_t);
    gs_status st;
    t->rank = gt_sync_rank(t->sync);
    t->size = gt_sync_size(t->sync);
    if (!(all = calloc((size_t)t->size, sizeof(*all))))
        return gt_fail(GS_ERR_NOMEM, "--elastic: no memory for %d ranks", t->size);
    st = gt_sync_bcast(t->sync, &pos, 1, GS_I64);
    if (st == GS_OK)
        st = gt_sync_bcast(t->sync, t->params, t->nparams, GS_F32);
    if (st == GS_OK)
        st = t->sgd ? gt_sync_bcast(t->sync, gt_sgd_velocity(t->sgd), t->nparams, GS_F32) : GS_OK;
    if (st == GS_OK)
        st = gt_sync_bcast(t->sync, t->stats, stats_words, GS_I32);
    if (st == GS_OK)
        st = gt_sync_gather(t->sync, &mine, all, 1);
    if (st == GS_OK) {
        t->live_prev = -1; /* ps: the rounds' counts start over (see live_dropped) */
        for (int i = 0; i < t->size; i++)
            t->members[i] = (int)all[i];
        t->pos = (uint64_t)pos;
        t->grow_checked = t->pos; /* this point's grow point is the one just passed */
    }
    free(all);
    return st;
}

gs_status gt_elastic_grow(trainer *t)
{
    gt_join j = {.at_step = gt_steps_before(t, t->pos)};
    int nold = t->size, grown = 0;
    double t0 = gt_now_s(), t1;
    gs_status st;
    t->grow_checked = t->pos;
    if ((st = gt_sync_grow(t->sync, &grown)) != GS_OK || !grown)
        return st;
    t1 = gt_now_s();
    if ((st = gt_elastic_adopt(t)) != GS_OK)
        return st;
    j.grow_s = t1 - t0;
    j.adopt_s = gt_now_s() - t1;
    j.ranks = t->size;
    for (int i = nold; i < t->size && j.njoined < GT_LOST_MAX; i++)
        j.joined[j.njoined++] = t->members[i]; /* joiners come after the old ranks */
    if (t->njoins < GT_RECOVERIES_MAX)
        t->joins[t->njoins++] = j;
    if (t->rank == 0)
        gt_report_join(t->opt.json ? stderr : stdout, &j);
    return GS_OK;
}
