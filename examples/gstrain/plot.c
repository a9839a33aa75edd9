/* gstrain --plot (plot.h): the figures go to gnuplot through a pipe as
 * inline data, one block per panel. */
#include "plot.h"

#include "util.h"

#include <stdio.h>

/* One inline data block ("$name << EOD" ... "EOD"), a row per epoch. */
static void data_block(FILE *gp, const char *name, const gt_epoch_stats *stats, int epochs)
{
    fprintf(gp, "$%s << EOD\n", name);
    for (int e = 0; e < epochs; e++) {
        const gt_epoch_stats *s = &stats[e];
        fprintf(gp, "%d %.6f %.6f %.4f %.4f %.4f %.4f %.4f\n", s->epoch, s->train_loss, s->test_loss,
                100 * s->train_acc, 100 * s->test_acc, s->compute_s, s->wait_s, s->sync_s);
    }
    fprintf(gp, "EOD\n");
}

gs_status gt_plot_write(const char *path, const gt_run_info *info, const gt_epoch_stats *stats, int epochs)
{
    FILE *gp = popen("gnuplot", "w");
    int rc;
    if (!gp)
        return gt_fail(GS_ERR_SYSTEM, "--plot: cannot run gnuplot (apt-get install gnuplot-nox)");
    fprintf(gp, "set terminal pngcairo size 1200,400 font 'sans,10'\nset output '%s'\n", path);
    data_block(gp, "d", stats, epochs);
    fprintf(
        gp,
        "set multiplot layout 1,3 title 'gstrain: %d ranks over %s, sync %s, global batch %zu'\n"
        "set xlabel 'epoch'\nset grid\nset key top right\nset xtics 1\n"
        "set title 'loss'\nplot $d using 1:2 with linespoints title 'train', "
        "$d using 1:3 with linespoints title 'test'\n"
        "set title 'accuracy (%%)'\nset key bottom right\nplot $d using 1:4 with linespoints title 'train', "
        "$d using 1:5 with linespoints title 'test'\n"
        "set title 'time per epoch and rank (s)'\nset style data histograms\nset key below horizontal\n"
        "set style histogram rowstacked\nset style fill solid 0.8 border -1\nset boxwidth 0.6\n"
        "set yrange [0:*]\nplot $d using 6:xtic(1) title 'compute', '' using 7 title 'wait', "
        "'' using 8 title 'sync'\nunset multiplot\n",
        info->ranks, info->transport, info->sync, info->batch);
    rc = pclose(gp);
    if (rc != 0)
        return gt_fail(GS_ERR_SYSTEM, "--plot: gnuplot failed (exit status %d) drawing %s%s", rc, path,
                       rc == 127 << 8 ? ": is gnuplot installed? (apt-get install gnuplot-nox)" : "");
    return GS_OK;
}
