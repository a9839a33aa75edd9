/* What a person (or a script, with --json) sees: the run's setup, a
 * progress bar per epoch, one summary line per epoch, the final result. */
#ifndef GT_REPORT_H
#define GT_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum gt_progress_mode {
    GT_PROGRESS_AUTO,  /* bar on a terminal, else lines */
    GT_PROGRESS_BAR,   /* one line redrawn with \r */
    GT_PROGRESS_LINES, /* a line every 10% */
    GT_PROGRESS_NONE,
} gt_progress_mode;

typedef struct gt_run_info {
    int ranks;   /* trainers */
    int servers; /* parameter-server ranks */
    const char *transport;
    const char *sync; /* "none", "allreduce", "allreduce+overlap", "ps", "ps+overlap" */
    int epochs;
    size_t batch;
    float lr, momentum, weight_decay;
    uint64_t seed;
    size_t train_images, test_images, params;
    int threads;
    const char
        *blas_core; /* OpenBLAS's kernel (OPENBLAS_CORETYPE or the CPU's): the weights' bits depend on it */
    int split_wait;
    int elastic;     /* --elastic */
    int ranks_final; /* trainers at the end (fewer than ranks after a loss) */
} gt_run_info;

#define GT_LOST_MAX 8

/* --elastic: processes that joined at a grow point. */
typedef struct gt_join {
    int joined[GT_LOST_MAX]; /* their job ranks */
    int njoined;
    int ranks;        /* trainers after */
    uint64_t at_step; /* the steps done when they joined */
    double grow_s;    /* gs_comm_grow: admission, agreement, the new communicator */
    double adopt_s;   /* the broadcast of the point, the weights, the momentum and the figures */
} gt_join;

/* --elastic: one recovery from a lost rank, as the new rank 0 saw it. */
typedef struct gt_recovery {
    int lost[GT_LOST_MAX]; /* the job ranks (GS_RANK) lost */
    int nlost;
    int ranks;          /* trainers that went on */
    uint64_t at_step;   /* the global step (1-based) new rank 0 was in; at the end of an epoch, its last */
    int at_epoch_end;   /* lost in an epoch's metric sums, its evaluation or the final check */
    uint64_t from_step; /* steps every survivor had completed: the run goes on from there */
    int ahead;          /* survivors that had completed the next point as well: they undid it */
    double detect_s;    /* from the kill to the error (--die kills only, else < 0) */
    double agree_s;     /* the survivors' agreement in the store (gs_comm_shrink) */
    double rebuild_s;   /* the new communicator (gs_comm_shrink) */
    double resync_s;    /* the survivors telling each other where they are */
    double rollback_s;  /* restoring the weights and momentum of before the point to redo */
    double first_s;     /* from the end of the rollback to the first completed step (or point) */
    double total_s;     /* from the kill to that completion (--die kills only, else < 0) */
} gt_recovery;

typedef struct gt_epoch_stats {
    int epoch;
    double train_loss, train_acc; /* over the epoch's batches, all ranks */
    double test_loss, test_acc;
    double time_s;       /* wall time of the training steps */
    double eval_s;       /* wall time of the test-set evaluation */
    double compute_s;    /* per rank (mean over ranks): forward, backward, update */
    double wait_s;       /* per rank: waiting for the slowest rank (--split-wait, else 0) */
    double sync_s;       /* per rank: exchanging gradients (with --split-wait, after the wait) */
    double images_per_s; /* all ranks together */
} gt_epoch_stats;

typedef struct gt_progress {
    gt_progress_mode mode;
    FILE *out;
    int epoch, epochs;
    size_t steps;
    int last_tenth;
    double start_s;
} gt_progress;

void gt_report_setup(FILE *out, const gt_run_info *info);

/* mode AUTO resolves here (terminal or not). */
void gt_progress_begin(gt_progress *p, gt_progress_mode mode, FILE *out, int epoch, int epochs, size_t steps);
/* After step `done` of `steps`: loss and sync share so far (this rank). */
void gt_progress_update(gt_progress *p, size_t done, size_t images, double loss, double sync_share);
void gt_progress_end(gt_progress *p);

void gt_report_epoch(FILE *out, const gt_epoch_stats *s, int epochs, int split_wait);
void gt_report_final(FILE *out, const gt_run_info *info, const gt_epoch_stats *last, double total_s,
                     uint64_t hash, int same);
/* One JSON object on out. */
void gt_report_json(FILE *out, const gt_run_info *info, const gt_epoch_stats *stats, int n, double total_s,
                    uint64_t hash, int same, const gt_recovery *rec, int nrec, const gt_join *joins,
                    int njoins);
/* "rank 2 joined after step 32; 4 ranks continue (...)" */
void gt_report_join(FILE *out, const gt_join *j);
/* "rank 2 lost at step 913; 3 ranks continue from step 912 (...)" */
void gt_report_recovery(FILE *out, const gt_recovery *r);

#endif
