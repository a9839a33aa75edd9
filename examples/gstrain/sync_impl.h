/* The sync module's inside: the state every method shares and the small
 * table a method fills (sync_allreduce.c; one rank uses it too). */
#ifndef GT_SYNC_IMPL_H
#define GT_SYNC_IMPL_H

#include "sync.h"

#define GT_SYNC_MAX_PENDING 16

typedef struct gt_sync_ops {
    const char *name;
    /* Segment [offset, offset + count) of sync->grads is final. */
    gs_status (*ready)(gt_sync *sync, size_t offset, size_t count);
    /* Every segment is final: complete this step's synchronization. */
    gs_status (*finish)(gt_sync *sync);
} gt_sync_ops;

struct gt_sync {
    gt_sync_params p;
    const gt_sync_ops *ops;
    gs_ctx *ctx;
    gs_comm *comm; /* NULL with one rank */
    int rank, size;
    float *grads;
    size_t announced;     /* floats announced by gt_sync_ready this step */
    int waited;           /* split_wait: this step's barrier is behind us */
    double wait_s, sync_s;
    /* allreduce: reductions started this step, oldest first; NULL once complete */
    gs_req *pending[GT_SYNC_MAX_PENDING];
    size_t npending;
};

extern const gt_sync_ops gt_sync_allreduce_ops;

#endif
