/* gstrain's command line. */
#ifndef GT_OPTIONS_H
#define GT_OPTIONS_H

#include "report.h"
#include "sync.h"

#include <stddef.h>
#include <stdint.h>

/* --die RANK:STEP[:WHEN] (fault injection for the elastic tests): where
 * the rank SIGKILLs itself. */
typedef enum gt_die_when {
    GT_DIE_COMPUTE,  /* at the start of global step STEP (before its forward pass) */
    GT_DIE_SYNC,     /* in step STEP, with its gradient exchange under way */
    GT_DIE_RECOVERY, /* in the first recovery at or after step STEP, 100 ms into it (a second failure) */
} gt_die_when;

typedef struct gt_die {
    int rank; /* the job's rank (GS_RANK) */
    uint64_t step;
    gt_die_when when;
} gt_die;

#define GT_DIE_MAX 4

typedef struct gt_options {
    const char *data_dir;
    int epochs;
    size_t batch; /* global: split over the ranks */
    float lr, momentum, weight_decay;
    uint64_t seed;
    size_t limit, test_limit; /* 0: every image */
    int threads;              /* OpenBLAS threads per rank */
    gt_sync_method method;
    int overlap;
    int split_wait;
    size_t bucket_kb; /* gradient exchanged in buckets of at most this (0: per layer) */
    gt_progress_mode progress;
    int json;
    const char *save; /* write the final weights here (rank 0) */
    const char *plot; /* draw the epochs' figures into this PNG (rank 0, gnuplot) */
    int elastic;      /* a lost rank does not end the run: the survivors shrink and go on */
    int join;         /* join a running --elastic job (--join, or GS_REJOIN=1 with --elastic) */
    gt_die die[GT_DIE_MAX];
    int ndie;
} gt_options;

/* Parses argv. Returns 0 to run, 1 when --help was printed, 2 on a usage
 * error (already printed). */
int gt_options_parse(int argc, char **argv, gt_options *opt);

#endif
