/* gstrain --plot FILE: loss, test accuracy and the compute/sync split per
 * epoch in one PNG, drawn by gnuplot (Debian's gnuplot-nox). */
#ifndef GT_PLOT_H
#define GT_PLOT_H

#include "report.h"

#include "gradsync.h"

/* Draws the epochs' figures into path (PNG, 1200 x 400); GS_ERR_SYSTEM
 * with a message when gnuplot is missing or fails. */
gs_status gt_plot_write(const char *path, const gt_run_info *info, const gt_epoch_stats *stats, int epochs);

#endif
