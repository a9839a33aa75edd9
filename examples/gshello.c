/*
 * gshello: the smallest gradsync job. Every rank joins, says who it is,
 * the ranks allgather their host names and barrier, and rank 0 prints the
 * list. Runs unchanged under gsrun, mpirun, srun, torchrun or alone.
 *
 *   gsrun -n 4 gshello
 */
#include "gradsync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_BYTES 64

static int fail(const char *what, gs_status status)
{
    fprintf(stderr, "gshello: %s failed: %s (%s)\n", what, gs_status_name(status), gs_last_error());
    return 1;
}

int main(void)
{
    gs_ctx *ctx;
    char name[NAME_BYTES] = {0}, *all;
    gs_status status;
    int rank, size, rc = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    status = gs_ctx_create(&ctx);
    if (status != GS_OK)
        return fail("gs_ctx_create", status);
    rank = gs_ctx_rank(ctx);
    size = gs_ctx_size(ctx);
    if (gethostname(name, sizeof(name) - 1) != 0)
        snprintf(name, sizeof(name), "?");
    printf("hello from rank %d of %d on %s (pid %d)\n", rank, size, name, (int)getpid());
    all = calloc((size_t)size, NAME_BYTES);
    if (!all) {
        fprintf(stderr, "gshello: out of memory\n");
        rc = 1;
    } else if ((status = gs_store_allgather(ctx, "gshello/hosts", name, NAME_BYTES, all)) != GS_OK) {
        rc = fail("gs_store_allgather", status);
    } else if ((status = gs_store_barrier(ctx, "gshello/done")) != GS_OK) {
        rc = fail("gs_store_barrier", status);
    } else if (rank == 0) {
        printf("%d ranks:", size);
        for (int r = 0; r < size; r++)
            printf(" %d@%.*s", r, NAME_BYTES, all + (size_t)r * NAME_BYTES);
        printf("\n");
    }
    free(all);
    status = gs_ctx_destroy(ctx);
    if (status != GS_OK && rc == 0)
        rc = fail("gs_ctx_destroy", status);
    return rc;
}
