/* Human and machine output of gstrain (rank 0 only). */
#include "report.h"
#include "util.h"

#include <inttypes.h>
#include <unistd.h>

#define BAR_WIDTH 30

void gt_report_setup(FILE *out, const gt_run_info *info)
{
    fprintf(out, "gstrain: %d rank%s", info->ranks, info->ranks == 1 ? "" : "s");
    if (info->servers)
        fprintf(out, " + %d parameter server%s", info->servers, info->servers == 1 ? "" : "s");
    fprintf(out, " over %s, sync %s; MLP 784-512-256-10 (%zu parameters)\n", info->transport, info->sync,
            info->params);
    fprintf(out,
            "gstrain: %zu training / %zu test images, global batch %zu, lr %g, momentum %g, weight decay %g, "
            "seed %" PRIu64 ", %d BLAS thread%s per rank (kernel %s)\n",
            info->train_images, info->test_images, info->batch, (double)info->lr, (double)info->momentum,
            (double)info->weight_decay, info->seed, info->threads, info->threads == 1 ? "" : "s",
            info->blas_core);
    fflush(out);
}

void gt_progress_begin(gt_progress *p, gt_progress_mode mode, FILE *out, int epoch, int epochs, size_t steps)
{
    if (mode == GT_PROGRESS_AUTO)
        mode = isatty(fileno(out)) ? GT_PROGRESS_BAR : GT_PROGRESS_LINES;
    *p = (gt_progress){.mode = mode,
                       .out = out,
                       .epoch = epoch,
                       .epochs = epochs,
                       .steps = steps,
                       .last_tenth = 0,
                       .start_s = gt_now_s()};
}

void gt_progress_update(gt_progress *p, size_t done, size_t images, double loss, double sync_share)
{
    int tenth = p->steps ? (int)(done * 10 / p->steps) : 10;
    double elapsed = gt_now_s() - p->start_s;
    double rate = elapsed > 0 ? (double)images / elapsed : 0;
    char bar[BAR_WIDTH + 1];
    if (p->mode == GT_PROGRESS_NONE || (p->mode == GT_PROGRESS_LINES && tenth == p->last_tenth))
        return;
    p->last_tenth = tenth;
    size_t filled = p->steps ? done * BAR_WIDTH / p->steps : BAR_WIDTH;
    for (size_t i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    fprintf(p->out, "%sepoch %d/%d [%s] %3zu%%  loss %.4f  %6.0f img/s  sync %4.1f%%%s",
            p->mode == GT_PROGRESS_BAR ? "\r" : "", p->epoch, p->epochs, bar,
            p->steps ? done * 100 / p->steps : 100, loss, rate, 100 * sync_share,
            p->mode == GT_PROGRESS_BAR ? "" : "\n");
    fflush(p->out);
}

void gt_progress_end(gt_progress *p)
{
    if (p->mode == GT_PROGRESS_BAR) {
        fputs("\r\033[K", p->out); /* the summary line replaces the bar */
        fflush(p->out);
    }
}

static double share(double part, double whole)
{
    return whole > 0 ? 100 * part / whole : 0;
}

void gt_report_epoch(FILE *out, const gt_epoch_stats *s, int epochs, int split_wait)
{
    double step = s->compute_s + s->wait_s + s->sync_s;
    fprintf(out,
            "epoch %d/%d  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  %.2f s  %.0f img/s  "
            "step: compute %.2f s",
            s->epoch, epochs, s->train_loss, 100 * s->train_acc, s->test_loss, 100 * s->test_acc, s->time_s,
            s->images_per_s, s->compute_s);
    if (split_wait)
        fprintf(out, ", wait for slowest %.2f s (%.1f%%)", s->wait_s, share(s->wait_s, step));
    fprintf(out, ", sync %.2f s (%.1f%%)\n", s->sync_s, share(s->sync_s, step));
    fflush(out);
}

void gt_report_final(FILE *out, const gt_run_info *info, const gt_epoch_stats *last, double total_s,
                     uint64_t hash, int same)
{
    if (same)
        fprintf(out, "weights: bitwise identical on all %d rank%s (hash %016" PRIx64 ")\n", info->ranks_final,
                info->ranks_final == 1 ? "" : "s", hash);
    else
        fprintf(out, "weights: DIFFER between ranks (rank 0 hash %016" PRIx64 ")\n", hash);
    if (last)
        fprintf(out, "final test accuracy %.2f%% after %d epoch%s, %.1f s in all\n", 100 * last->test_acc,
                last->epoch, last->epoch == 1 ? "" : "s", total_s);
    fflush(out);
}

void gt_report_recovery(FILE *out, const gt_recovery *r)
{
    fprintf(out, "gstrain: rank%s", r->nlost == 1 ? "" : "s");
    for (int i = 0; i < r->nlost; i++)
        fprintf(out, "%s %d", i ? "," : "", r->lost[i]);
    if (r->at_epoch_end)
        fprintf(out, " lost after step %" PRIu64 " (end of an epoch)", r->at_step);
    else
        fprintf(out, " lost at step %" PRIu64, r->at_step);
    fprintf(out, "; %d rank%s continue from step %" PRIu64 " (", r->ranks, r->ranks == 1 ? "" : "s",
            r->from_step);
    if (r->detect_s >= 0)
        fprintf(out, "detection %.0f ms, ", 1e3 * r->detect_s);
    fprintf(out, "agreement %.1f ms, rebuild %.1f ms, resync %.1f ms, rollback %.1f ms)", 1e3 * r->agree_s,
            1e3 * r->rebuild_s, 1e3 * r->resync_s, 1e3 * r->rollback_s);
    if (r->ahead)
        fprintf(out, "; %d rank%s had gone one point further and undid it", r->ahead,
                r->ahead == 1 ? "" : "s");
    fputc('\n', out);
    fflush(out);
}

/* A time that may be unknown (< 0): null. */
static void json_seconds(FILE *out, const char *key, double s)
{
    if (s < 0)
        fprintf(out, ", \"%s\": null", key);
    else
        fprintf(out, ", \"%s\": %.6f", key, s);
}

static void json_recoveries(FILE *out, const gt_recovery *rec, int nrec)
{
    fprintf(out, ", \"recoveries\": [");
    for (int i = 0; i < nrec; i++) {
        const gt_recovery *r = &rec[i];
        fprintf(out, "%s{\"lost\": [", i ? ", " : "");
        for (int k = 0; k < r->nlost; k++)
            fprintf(out, "%s%d", k ? ", " : "", r->lost[k]);
        fprintf(out,
                "], \"ranks\": %d, \"at_step\": %" PRIu64 ", \"at_epoch_end\": %s, \"from_step\": %" PRIu64
                ", \"ahead\": %d",
                r->ranks, r->at_step, r->at_epoch_end ? "true" : "false", r->from_step, r->ahead);
        json_seconds(out, "detect_s", r->detect_s);
        json_seconds(out, "agree_s", r->agree_s);
        json_seconds(out, "rebuild_s", r->rebuild_s);
        json_seconds(out, "resync_s", r->resync_s);
        json_seconds(out, "rollback_s", r->rollback_s);
        json_seconds(out, "first_step_s", r->first_s);
        json_seconds(out, "kill_to_step_s", r->total_s);
        fputc('}', out);
    }
    fputc(']', out);
}

void gt_report_join(FILE *out, const gt_join *j)
{
    fprintf(out, "gstrain: rank%s", j->njoined == 1 ? "" : "s");
    for (int i = 0; i < j->njoined; i++)
        fprintf(out, "%s %d", i ? "," : "", j->joined[i]);
    fprintf(out,
            " joined after step %" PRIu64 "; %d ranks continue (grow %.1f ms, state broadcast %.1f ms)\n",
            j->at_step, j->ranks, 1e3 * j->grow_s, 1e3 * j->adopt_s);
    fflush(out);
}

static void json_joins(FILE *out, const gt_join *joins, int njoins)
{
    fprintf(out, ", \"joins\": [");
    for (int i = 0; i < njoins; i++) {
        const gt_join *j = &joins[i];
        fprintf(out, "%s{\"joined\": [", i ? ", " : "");
        for (int k = 0; k < j->njoined; k++)
            fprintf(out, "%s%d", k ? ", " : "", j->joined[k]);
        fprintf(out, "], \"ranks\": %d, \"at_step\": %" PRIu64, j->ranks, j->at_step);
        json_seconds(out, "grow_s", j->grow_s);
        json_seconds(out, "adopt_s", j->adopt_s);
        fputc('}', out);
    }
    fputc(']', out);
}

void gt_report_json(FILE *out, const gt_run_info *info, const gt_epoch_stats *stats, int n, double total_s,
                    uint64_t hash, int same, const gt_recovery *rec, int nrec, const gt_join *joins,
                    int njoins)
{
    fprintf(
        out,
        "{\"ranks\": %d, \"servers\": %d, \"transport\": \"%s\", \"sync\": \"%s\", \"params\": %zu, "
        "\"train_images\": %zu, "
        "\"test_images\": %zu, \"batch\": %zu, \"lr\": %g, \"momentum\": %g, \"weight_decay\": %g, "
        "\"seed\": %" PRIu64 ", \"threads\": %d, \"blas_core\": \"%s\", \"split_wait\": %s, \"epochs\": [",
        info->ranks, info->servers, info->transport, info->sync, info->params, info->train_images,
        info->test_images, info->batch, (double)info->lr, (double)info->momentum, (double)info->weight_decay,
        info->seed, info->threads, info->blas_core, info->split_wait ? "true" : "false");
    for (int i = 0; i < n; i++) {
        const gt_epoch_stats *s = &stats[i];
        double step = s->compute_s + s->wait_s + s->sync_s;
        fprintf(
            out,
            "%s{\"epoch\": %d, \"train_loss\": %.6f, \"train_acc\": %.6f, \"test_loss\": %.6f, "
            "\"test_acc\": %.6f, \"time_s\": %.4f, \"eval_s\": %.4f, \"compute_s\": %.4f, \"wait_s\": %.4f, "
            "\"sync_s\": %.4f, \"wait_share\": %.4f, \"sync_share\": %.4f, \"images_per_s\": %.1f}",
            i ? ", " : "", s->epoch, s->train_loss, s->train_acc, s->test_loss, s->test_acc, s->time_s,
            s->eval_s, s->compute_s, s->wait_s, s->sync_s, share(s->wait_s, step) / 100,
            share(s->sync_s, step) / 100, s->images_per_s);
    }
    fprintf(out, "], \"elastic\": %s, \"ranks_final\": %d", info->elastic ? "true" : "false",
            info->ranks_final);
    json_recoveries(out, rec, nrec);
    json_joins(out, joins, njoins);
    fprintf(out,
            ", \"final_test_acc\": %.6f, \"total_s\": %.3f, \"weights_hash\": \"%016" PRIx64 "\", "
            "\"weights_identical\": %s}\n",
            n ? stats[n - 1].test_acc : 0.0, total_s, hash, same ? "true" : "false");
    fflush(out);
}
