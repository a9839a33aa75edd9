/* The sync module's inside: the state every method shares and the small
 * table a method fills (sync_allreduce.c, sync_ps.c). */
#ifndef GT_SYNC_IMPL_H
#define GT_SYNC_IMPL_H

#include "sync.h"

#include <stdbool.h>

typedef struct gt_sync_ops {
    const char *name;
    /* After the job and the communicator exist: set up the method (collective). */
    gs_status (*open)(gt_sync *sync);
    /* The initial weights (NULL on a server). */
    gs_status (*start)(gt_sync *sync, float *params);
    /* Segment i of the gradient is final. */
    gs_status (*ready)(gt_sync *sync, size_t i);
    /* Every segment is final: complete this step's synchronization. */
    gs_status (*finish)(gt_sync *sync);
    /* Collective; continues past failures. */
    gs_status (*close)(gt_sync *sync);
} gt_sync_ops;

struct gt_sync {
    gt_sync_params p;
    const gt_sync_ops *ops;
    gs_ctx *ctx;
    gs_comm
        *comm; /* every rank of the job (ps --elastic: the trainers; NULL on a server); NULL with one rank */
    int rank, size; /* among the trainers */
    int server;     /* this rank is a parameter server */
    int servers;
    float *grads;
    size_t announced; /* floats announced by gt_sync_ready this step */
    int waited;       /* split_wait: this step's barrier is behind us */
    double wait_s, sync_s;
    /* allreduce: reductions started this step, in order; NULL once complete */
    gs_req *pending[GT_SYNC_MAX_SEGMENTS];
    size_t npending;
    /* ps */
    gs_ps *ps;
    float *params;                            /* the trainer's weights */
    float *pulled;                            /* where pulls land until finish */
    gs_req *ps_pending[GT_SYNC_MAX_SEGMENTS]; /* per segment; NULL when none */
    bool ps_pulled[GT_SYNC_MAX_SEGMENTS];     /* its request finished early (in a test): copy it */
    bool ps_failed[GT_SYNC_MAX_SEGMENTS];     /* --elastic: failed for a recovery, to be repeated */
};

extern const gt_sync_ops gt_sync_allreduce_ops;
extern const gt_sync_ops gt_sync_ps_ops;

/* Page-aligned, zeroed floats (freed with free()). */
float *gt_sync_alloc_floats(size_t count);

#endif
