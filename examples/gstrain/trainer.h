/* The trainer's state, shared by main.c (the run) and elastic.c (going on
 * after a lost rank, --elastic). */
#ifndef GT_TRAINER_H
#define GT_TRAINER_H

#include "data.h"
#include "mlp.h"
#include "options.h"
#include "report.h"
#include "sgd.h"
#include "sync.h"

#include <stddef.h>
#include <stdint.h>

/* Per-epoch sums of one rank, summed over the ranks at the end of the epoch. */
enum { SUM_LOSS, SUM_CORRECT, SUM_ROWS, SUM_COMPUTE, SUM_WAIT, SUM_SYNC, SUM_COUNT };

/* The run is a sequence of points, the same on every rank, each one or
 * more collective calls: per epoch its steps, the sum of its metrics and
 * the evaluation; at the end the weight check. */
typedef enum gt_point_kind { GT_PT_STEP, GT_PT_SUMS, GT_PT_EVAL, GT_PT_SAME } gt_point_kind;

typedef struct gt_point {
    gt_point_kind kind;
    int epoch;   /* 1-based */
    size_t step; /* GT_PT_STEP: the step within the epoch, 0-based */
} gt_point;

/* --elastic: the state from before each of the last two points (slot: the
 * point's number mod 2). A survivor can be one point ahead of another (it
 * completed a point whose collective failed elsewhere): it undoes it. */
typedef struct gt_undo {
    float *params[2], *velocity[2]; /* before a step */
    double sums[2][SUM_COUNT];      /* before any point */
} gt_undo;

#define GT_RECOVERIES_MAX 16

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
    /* where the run is */
    size_t steps;           /* per epoch */
    uint64_t pos;           /* points completed */
    double sums[SUM_COUNT]; /* this rank's, this epoch */
    double epoch_start;
    gt_progress bar;
    int reported; /* epochs whose summary this process printed */
    /* --elastic */
    gt_undo undo;
    int *members; /* the job ranks of the trainers, in their rank order */
    gt_recovery rec[GT_RECOVERIES_MAX];
    int nrec;
    int timing;          /* the last recovery's first completed point is still to come */
    uint64_t resumed_ns; /* the end of its rollback */
    uint64_t kill_ns;    /* the --die kill it recovered from (0: unknown) */
    gt_join joins[GT_RECOVERIES_MAX];
    int njoins;
    uint64_t grow_checked; /* the point whose grow point is behind (UINT64_MAX: none yet) */
    int live_prev;         /* ps: the trainers the last round counted, as of the last check */
} trainer;

/* Point pos of the run; the number of points; the steps before point pos. */
gt_point gt_point_at(const trainer *t, uint64_t pos);
uint64_t gt_point_count(const trainer *t);
uint64_t gt_steps_before(const trainer *t, uint64_t pos);

/* elastic.c */
gs_status gt_elastic_init(trainer *t);
void gt_elastic_free(trainer *t);
/* Before running point t->pos (p): keeps what undoing it needs. */
void gt_elastic_save(trainer *t, gt_point p);
/* --die: SIGKILLs this process if an option names this rank, step and moment. */
void gt_elastic_maybe_die(trainer *t, gt_die_when when, uint64_t step);
/* After point t->pos failed with GS_ERR_PEER_LOST at failed_ns: shrinks to
 * the survivors, agrees with them on the last point every one completed,
 * undoes a later one, and sets t->pos, t->rank, t->size to go on. */
gs_status gt_elastic_recover(trainer *t, uint64_t failed_ns);
/* A point completed: the first after a recovery completes its figures. */
void gt_elastic_point_done(trainer *t);
/* A grow point (before point t->pos, an epoch's first step or the final
 * check): processes waiting to join are admitted and take the state of
 * trainer 0 (gt_elastic_adopt). Collective over the trainers. */
gs_status gt_elastic_grow(trainer *t);
/* After a grow (every trainer, the joiners too): trainer 0's point,
 * weights, momentum and figures, and the trainers' job ranks. */
gs_status gt_elastic_adopt(trainer *t);

#endif
