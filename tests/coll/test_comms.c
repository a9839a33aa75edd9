/*
 * Many communicators: split by color (5 ranks into 3 groups, collectives on
 * all of them at once), a rank that opts out, groups from a list of ranks
 * made by their members only (twice the same list: two communicators), and
 * two threads each driving its own communicator, interleaved for thousands
 * of calls with every result checked.
 */
#include "coll_check.h"

#include <pthread.h>

/* The sum over the ranks of comm whose parent ranks are members of x + i. */
static void check_sum(gs_comm *comm, const int *members, int n, int parent_rank, int calls)
{
    float x[7], want;
    for (int c = 0; c < calls; c++) {
        for (int i = 0; i < 7; i++)
            x[i] = (float)(parent_rank * 10 + i + c);
        GS_ASSERT_OK(gs_allreduce(comm, x, x, 7, GS_F32, GS_SUM));
        for (int i = 0; i < 7; i++) {
            want = 0;
            for (int m = 0; m < n; m++)
                want += (float)(members[m] * 10 + i + c);
            GS_ASSERT(x[i] == want);
        }
    }
}

static void split_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *world = cc_open(ctx, a->transport, &tp), *sub, *rest;
    int color = rank % 3, members[5], n = 0;
    float b[3] = {0};
    /* color c: ranks c, c + 3, ordered by key -rank (descending) */
    for (int r = 4; r >= 0; r--)
        if (r % 3 == color)
            members[n++] = r;
    GS_ASSERT_OK(gs_comm_split(world, color, -rank, &sub));
    GS_ASSERT_EQ(gs_comm_size(sub), n);
    GS_ASSERT_EQ(gs_comm_rank(sub), members[0] == rank ? 0 : 1);
    check_sum(sub, members, n, rank, 20);
    /* a broadcast from sub's rank 0 and an allreduce on the world, between */
    if (gs_comm_rank(sub) == 0)
        b[0] = b[1] = b[2] = (float)(100 + rank);
    GS_ASSERT_OK(gs_broadcast(sub, b, b, 3, GS_F32, 0));
    GS_ASSERT(b[2] == (float)(100 + members[0]));
    check_sum(world, (int[]){0, 1, 2, 3, 4}, 5, rank, 3);
    check_sum(sub, members, n, rank, 5);
    /* rank 4 opts out of the next split: the others form one communicator */
    GS_ASSERT_OK(gs_comm_split(world, rank == 4 ? GS_COMM_NO_COLOR : 7, 0, &rest));
    if (rank == 4) {
        GS_ASSERT(rest == NULL);
    } else {
        GS_ASSERT_EQ(gs_comm_size(rest), 4);
        GS_ASSERT_EQ(gs_comm_rank(rest), rank);
        check_sum(rest, (int[]){0, 1, 2, 3}, 4, rank, 5);
        GS_ASSERT_OK(gs_comm_destroy(rest));
    }
    GS_ASSERT_OK(gs_comm_destroy(sub));
    cc_close(world, tp);
}

GS_TEST_TP(split_into_three_colors_at_five_ranks)
{
    cc_run_env(transport, 5, split_body, 0, NULL);
}

/* Ranks 3 and 1 (in that order) make a group, twice; the others do not
 * take part and run a world allreduce meanwhile... after the groups. */
static void group_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    static const int list[] = {3, 1};
    gs_tp *tp;
    gs_comm *world = cc_open(ctx, a->transport, &tp), *g1, *g2;
    if (rank == 1 || rank == 3) {
        GS_ASSERT_OK(gs_comm_create_group(world, list, 2, &g1));
        GS_ASSERT_OK(gs_comm_create_group(world, list, 2, &g2));
        GS_ASSERT_EQ(gs_comm_rank(g1), rank == 3 ? 0 : 1);
        GS_ASSERT_EQ(gs_comm_size(g2), 2);
        check_sum(g2, list, 2, rank, 4);
        check_sum(g1, list, 2, rank, 4);
        GS_ASSERT_OK(gs_comm_destroy(g1));
        GS_ASSERT_OK(gs_comm_destroy(g2));
    }
    check_sum(world, (int[]){0, 1, 2, 3}, 4, rank, 2);
    cc_close(world, tp);
}

GS_TEST_TP(groups_from_a_list_of_ranks)
{
    cc_run_env(transport, 4, group_body, 0, NULL);
}

/* ---- two threads, two communicators ------------------------------------- */

#define THREAD_CALLS 2000

typedef struct thread_job {
    gs_comm *comm;
    int rank, size, salt;
    int bad; /* calls with a wrong result or status */
} thread_job;

static void *thread_main(void *p)
{
    thread_job *j = p;
    for (int c = 0; c < THREAD_CALLS; c++) {
        int32_t x[3] = {j->rank + c, j->salt, c % 5 == 0 ? j->rank : 1};
        gs_status st = c % 3 == 2 ? gs_allreduce(j->comm, x, x, 3, GS_I32, GS_MAX)
                                  : gs_allreduce(j->comm, x, x, 3, GS_I32, GS_SUM);
        int32_t want0 = c % 3 == 2 ? j->size - 1 + c : j->size * c + j->size * (j->size - 1) / 2;
        int32_t want1 = c % 3 == 2 ? j->salt : j->salt * j->size;
        if (st != GS_OK || x[0] != want0 || x[1] != want1)
            j->bad++;
    }
    return NULL;
}

static void threads_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *world = cc_open(ctx, a->transport, &tp), *dup;
    pthread_t t[2];
    thread_job jobs[2];
    int size = gs_comm_size(world);
    GS_ASSERT_OK(gs_comm_split(world, 0, rank, &dup));
    jobs[0] = (thread_job){.comm = world, .rank = rank, .size = size, .salt = 11};
    jobs[1] = (thread_job){.comm = dup, .rank = rank, .size = size, .salt = 23};
    for (int i = 0; i < 2; i++)
        GS_ASSERT_EQ(pthread_create(&t[i], NULL, thread_main, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    GS_ASSERT_EQ(jobs[0].bad, 0);
    GS_ASSERT_EQ(jobs[1].bad, 0);
    GS_ASSERT_OK(gs_comm_destroy(dup));
    cc_close(world, tp);
}

GS_TEST_TP(two_threads_drive_two_communicators)
{
    cc_run_env(transport, 3, threads_body, 0, NULL);
}

/* A bad color is refused before anything is exchanged. */
GS_TEST(a_bad_color_is_refused)
{
    GS_ASSERT_STATUS(gs_comm_split(NULL, 0, 0, NULL), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_comm_create_group(NULL, (int[]){0}, 1, NULL), GS_ERR_INVALID);
}

/* ---- a local abort ------------------------------------------------------- */

/* Rank 1 starts an allreduce and aborts the communicator: the others, in
 * that allreduce, fail within about a second (the deadline is 20 s) with a
 * sentence naming rank 1, and their destroy does not wait; rank 1's abort
 * returns at once and frees everything (ASan checks the leaks). */
static void abort_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *world = cc_open(ctx, a->transport, &tp), *comm;
    float *x = calloc(1u << 18, sizeof(float));
    uint64_t t0;
    GS_ASSERT(x != NULL);
    GS_ASSERT_OK(gs_comm_split(world, 0, rank, &comm)); /* its own transport: abort closes it */
    GS_ASSERT_OK(gs_allreduce(comm, x, x, 1u << 18, GS_F32, GS_SUM));
    t0 = gs_now_ns();
    if (rank == 1) {
        gs_req *req;
        GS_ASSERT_OK(gs_iallreduce(comm, x, x, 1u << 18, GS_F32, GS_SUM, &req));
        GS_ASSERT_OK(gs_comm_abort(comm));
        GS_ASSERT_LT((gs_now_ns() - t0) / 1000000u, 1000);
    } else {
        GS_ASSERT_STATUS(gs_allreduce(comm, x, x, 1u << 18, GS_F32, GS_SUM), GS_ERR_PEER_LOST);
        fprintf(stderr, "  rank %d: %s after %.0f ms\n", rank, gs_last_error(),
                (double)(gs_now_ns() - t0) / 1e6);
        GS_ASSERT_LT((gs_now_ns() - t0) / 1000000u, 2000);
        GS_ASSERT_CONTAINS(gs_last_error(), ": allreduce #2: rank 1 aborted the communicator");
        t0 = gs_now_ns();
        GS_ASSERT_OK(gs_comm_destroy(comm));
        GS_ASSERT_LT((gs_now_ns() - t0) / 1000000u, 1000);
    }
    check_sum(world, (int[]){0, 1, 2}, 3, rank, 2); /* the parent goes on */
    free(x);
    cc_close(world, tp);
}

GS_TEST_TP(abort_mid_collective_is_quick_everywhere)
{
    const char *env[] = {"GS_TIMEOUT_MS=20000", NULL};
    cc_run_env(transport, 3, abort_body, 0, env);
}
