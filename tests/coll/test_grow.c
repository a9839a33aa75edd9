/*
 * gs_comm_grow: rank 3 of 4 is SIGKILLed mid-allreduce, the survivors
 * shrink, a replacement process (GS_REJOIN=1, the lost rank's place in the
 * store) joins at a point they choose, and the 4 of them sum correctly, the
 * joiner last. Also: with no joiner the old ranks get NULL (keep comm); a
 * joiner that dies before it is admitted is out of the agreement (the old
 * ranks get a communicator of themselves); a joiner nobody admits fails at
 * its deadline with a clear error.
 *
 * Rank 3's harness process is a supervisor: it forks the real rank 3 (its
 * own context), waits for its death, then forks the replacement, as gsrun
 * --restarts does.
 */
#include "coll_check.h"

#include "bootstrap/boot.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RANKS 4
#define COUNT (1u << 18)

typedef enum {
    JOIN_OK,        /* the replacement joins */
    JOIN_DIES,      /* the replacement announces itself and dies before it is admitted */
    JOIN_NOT_ASKED, /* the old ranks never grow: the replacement times out */
} join_case;

typedef struct gr_arg {
    const char *transport;
    join_case how;
} gr_arg;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The first rank 3: in the communicator, dies inside its third allreduce. */
static void first_incarnation(const gr_arg *a)
{
    gs_ctx *ctx = gs_test_own_ctx();
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    float *buf = calloc(COUNT, sizeof(float));
    gs_req *req;
    for (int c = 0; c < 2; c++)
        GS_ASSERT_OK(gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM));
    GS_ASSERT_OK(gs_iallreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM, &req));
    gs_req_test(req);
    raise(SIGKILL);
}

/* The replacement: joins, checks the sums, leaves. */
static void replacement(const gr_arg *a)
{
    gs_ctx *ctx;
    gs_comm *comm = NULL;
    setenv("GS_REJOIN", "1", 1);
    ctx = gs_test_own_ctx();
    if (a->how == JOIN_DIES) {
        char key[64];
        uint64_t nonce = 7;
        snprintf(key, sizeof(key), "grow/want.%d", 3); /* what gs_comm_grow announces, then death */
        GS_ASSERT_OK(gs_boot_kv_put(ctx, key, &nonce, sizeof(nonce)));
        GS_ASSERT_OK(gs_store_put(ctx, "test/joiner-died", "", 0));
        raise(SIGKILL);
    }
    if (a->how == JOIN_NOT_ASKED) {
        GS_ASSERT_STATUS(gs_comm_grow(ctx, NULL, &comm), GS_ERR_TIMEOUT);
        GS_ASSERT_CONTAINS(gs_last_error(), "no running rank admitted this process");
        GS_ASSERT_OK(gs_store_put(ctx, "test/joiner-gave-up", "", 0));
        GS_ASSERT_OK(gs_ctx_destroy(ctx));
        _exit(0);
    }
    GS_ASSERT_OK(gs_comm_grow(ctx, NULL, &comm));
    GS_ASSERT_EQ(gs_comm_size(comm), RANKS);
    GS_ASSERT_EQ(gs_comm_rank(comm), RANKS - 1); /* joiners come last */
    cc_check_member_sums(comm, 3, 3, COUNT);
    GS_ASSERT_OK(gs_comm_destroy(comm));
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
    _exit(0);
}

static void supervisor(const gr_arg *a)
{
    int status;
    pid_t pid = fork();
    GS_ASSERT(pid >= 0);
    if (pid == 0)
        first_incarnation(a);
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    GS_ASSERT_RANK_SIGNAL(status, SIGKILL);
    pid = fork();
    GS_ASSERT(pid >= 0);
    if (pid == 0)
        replacement(a);
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (a->how == JOIN_DIES)
        GS_ASSERT_RANK_SIGNAL(status, SIGKILL);
    else
        GS_ASSERT_RANK_EXIT(status, 0);
}

static void old_rank(int rank, const gr_arg *a)
{
    gs_ctx *ctx = gs_test_own_ctx();
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp), *shrunk = NULL, *grown = NULL;
    float *buf = calloc(COUNT, sizeof(float));
    gs_status st = GS_OK;
    size_t len;
    for (int c = 0; c < 50 && st == GS_OK; c++)
        st = gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM);
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    GS_ASSERT_OK(gs_comm_shrink(comm, &shrunk));
    GS_ASSERT_OK(gs_comm_abort(comm));
    GS_ASSERT_OK(gs_tp_close(tp));
    GS_ASSERT_EQ(gs_comm_size(shrunk), RANKS - 1);
    if (a->how == JOIN_NOT_ASKED) { /* never grows: the joiner gives up on its own */
        GS_ASSERT_OK(gs_boot_store_get_ms(ctx, "test/joiner-gave-up", NULL, 0, &len, 20000));
        cc_check_member_sums(shrunk, rank, 3, COUNT);
    } else {
        if (a->how == JOIN_DIES)
            GS_ASSERT_OK(gs_store_get(ctx, "test/joiner-died", NULL, 0, &len));
        /* grow points until the joiner is seen: the same number of calls on every old rank */
        for (int point = 0; !grown; point++) {
            GS_ASSERT_LT(point, 2000);
            GS_ASSERT_OK(gs_comm_grow(NULL, shrunk, &grown));
            if (!grown)
                sleep_ms(5);
        }
        GS_ASSERT_OK(gs_comm_destroy(shrunk));
        shrunk = NULL;
        GS_ASSERT_EQ(gs_comm_rank(grown), rank); /* the old ranks keep their order, first */
        GS_ASSERT_EQ(gs_comm_size(grown), a->how == JOIN_OK ? RANKS : RANKS - 1);
        cc_check_member_sums(grown, rank, 3, COUNT);
        /* nobody else waits: the next grow point changes nothing */
        gs_comm *again = NULL;
        GS_ASSERT_OK(gs_comm_grow(NULL, grown, &again));
        GS_ASSERT(again == NULL);
    }
    GS_ASSERT_OK(gs_comm_destroy(grown ? grown : shrunk));
    free(buf);
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

static void body(gs_ctx *ctx, int rank, void *argp)
{
    (void)ctx;
    if (rank == RANKS - 1)
        supervisor(argp);
    else
        old_rank(rank, argp);
}

static void run(const char *transport, join_case how)
{
    gr_arg a = {.transport = transport, .how = how};
    int status[GS_TEST_RANKS_MAX];
    gs_test_ranks_opts opts = {.n = RANKS,
                               .timeout_ms = 90000,
                               .rank_timeout_ms = how == JOIN_NOT_ASKED ? 3000 : 15000,
                               .no_ctx = true};
    gs_test_run_ranks_opts(&opts, body, &a, status);
    for (int r = 0; r < RANKS; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
}

GS_TEST_TP(lost_rank_replaced_by_a_joiner_four_sum_again)
{
    run(transport, JOIN_OK);
}

GS_TEST_TP(joiner_dead_before_admission_is_out_of_the_agreement)
{
    run(transport, JOIN_DIES);
}

GS_TEST_TP(joiner_nobody_admits_fails_at_its_deadline)
{
    run(transport, JOIN_NOT_ASKED);
}

/* A communicator of every job rank: nobody can join, nothing is exchanged. */
static void full_body(gs_ctx *ctx, int rank, void *argp)
{
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, ((const cc_arg *)argp)->transport, &tp), *grown = (gs_comm *)1;
    (void)rank;
    GS_ASSERT_OK(gs_comm_grow(NULL, comm, &grown));
    GS_ASSERT(grown == NULL);
    GS_ASSERT_STATUS(gs_comm_grow(NULL, NULL, &grown), GS_ERR_INVALID);
    cc_close(comm, tp);
}

GS_TEST_TP(full_job_grow_is_a_no_op)
{
    cc_run_env(transport, 2, full_body, 0, NULL);
}
