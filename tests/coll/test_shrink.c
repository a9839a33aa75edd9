/*
 * gs_comm_shrink: a rank SIGKILLed in the middle of an allreduce, the
 * survivors agree on who is alive, get a communicator of the rest, numbered
 * densely in the old order, and its allreduces give the right sums. Also: a
 * second rank killed during the agreement (out at once, not waited for), a
 * rank that never asks (out at the deadline, told so when it asks late),
 * random kill points, a shrink with no loss (the same ranks, twice nested),
 * the store's server (rank 0) killed (a fast, clear error), an external
 * store (callbacks over a toy table, the first asker decides), and the time
 * from the kill to the first allreduce after the shrink, with its parts.
 */
#include "coll_check.h"

#include "coll/coll.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define RANKS 4
#define COUNT (1u << 19) /* floats: 2 MiB, several chunks, so a victim dies inside a call */
#define CALLS 30

typedef struct sh_arg {
    const char *transport;
    int victim;        /* killed mid-allreduce */
    int dies_at;       /* the call it starts (mid: else before it), then dies */
    bool mid;          /* inside the call (else between calls) */
    int second;        /* -1, or a rank killed 500 ms after it saw the loss (during the agreement) */
    int laggard;       /* -1, or a rank that asks only after the deadline */
    int expect_n;      /* ranks of the shrunk communicator */
    const char *times; /* a file new rank 0 appends its timings to, or NULL */
} sh_arg;

static void die_mid_allreduce(gs_ctx *ctx, gs_comm *comm, float *buf, const sh_arg *a)
{
    uint64_t now;
    for (int c = 0; c < a->dies_at; c++)
        GS_ASSERT_OK(gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM));
    if (a->mid) {
        gs_req *req;
        GS_ASSERT_OK(gs_iallreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM, &req));
        gs_req_test(req); /* its first chunks leave, the rest never will */
    }
    now = gs_clock_ns();
    if (a->times)
        GS_ASSERT_OK(gs_store_put(ctx, "test/kill_ns", &now, sizeof(now)));
    raise(SIGKILL);
}

static void append_times(gs_ctx *ctx, gs_comm *shrunk, const sh_arg *a, uint64_t err_ns, uint64_t done_ns)
{
    uint64_t kill_ns;
    size_t len;
    FILE *f;
    if (!a->times || gs_comm_rank(shrunk) != 0)
        return;
    GS_ASSERT_OK(gs_store_get(ctx, "test/kill_ns", &kill_ns, sizeof(kill_ns), &len));
    f = fopen(a->times, "a");
    GS_ASSERT(f != NULL);
    fprintf(f, "%.3f %.3f %.3f %.3f %.3f\n", (double)(err_ns - kill_ns) / 1e6,
            (double)shrunk->shrink_agree_ns / 1e6, (double)shrunk->shrink_build_ns / 1e6,
            (double)(done_ns - err_ns - shrunk->shrink_agree_ns - shrunk->shrink_build_ns) / 1e6,
            (double)(done_ns - kill_ns) / 1e6);
    fclose(f);
}

static void survivor_body(gs_ctx *ctx, int rank, void *argp)
{
    const sh_arg *a = argp;
    float *buf = malloc(COUNT * sizeof(float));
    gs_status st = GS_OK;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp), *shrunk = NULL;
    uint64_t err_ns, t0;
    float one = 1;
    int calls = 0;
    GS_ASSERT(buf != NULL);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = 1;
    if (rank == a->victim)
        die_mid_allreduce(ctx, comm, buf, a);
    for (; calls < CALLS && st == GS_OK; calls++)
        st = gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM);
    err_ns = gs_clock_ns();
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    if (rank == a->second) {
        usleep(500 * 1000);
        raise(SIGKILL);
    }
    if (rank == a->laggard) {
        usleep((useconds_t)(ctx->cfg.timeout_ms + 1500) * 1000);
        GS_ASSERT_STATUS(gs_comm_shrink(comm, &shrunk), GS_ERR_PEER_LOST);
        GS_ASSERT_CONTAINS(gs_last_error(), "decided without this rank");
        gs_comm_abort(comm);
        gs_tp_close(tp);
        free(buf);
        return;
    }
    t0 = gs_clock_ns();
    GS_ASSERT_OK(gs_comm_shrink(comm, &shrunk));
    if (a->second >= 0) /* not waited for: the agreement ended when it died */
        GS_ASSERT_LT(gs_clock_ns() - t0, (uint64_t)ctx->cfg.timeout_ms * 1000000 / 2);
    GS_ASSERT_OK(gs_allreduce(shrunk, &one, &one, 1, GS_F32, GS_SUM)); /* the first call after */
    append_times(ctx, shrunk, a, err_ns, gs_clock_ns());
    GS_ASSERT_EQ(gs_comm_size(shrunk), a->expect_n);
    GS_ASSERT_OK(gs_comm_abort(comm));
    GS_ASSERT_OK(gs_tp_close(tp));
    cc_check_member_sums(shrunk, rank, 4, COUNT);
    GS_ASSERT_OK(gs_comm_destroy(shrunk));
    free(buf);
}

static void run(sh_arg a, int rank_timeout_ms)
{
    gs_test_ranks_opts opts = {.n = RANKS, .timeout_ms = 90000, .rank_timeout_ms = rank_timeout_ms};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, survivor_body, &a, status);
    for (int r = 0; r < RANKS; r++)
        if (r == a.victim || r == a.second)
            GS_ASSERT_RANK_SIGNAL(status[r], SIGKILL);
        else
            GS_ASSERT_RANK_EXIT(status[r], 0);
}

GS_TEST_TP(killed_mid_allreduce_three_survivors_shrink)
{
    run((sh_arg){.transport = transport,
                 .victim = 2,
                 .dies_at = 3,
                 .mid = true,
                 .second = -1,
                 .laggard = -1,
                 .expect_n = 3},
        15000);
}

/* The store outlives rank 0 (served by the harness's parent, as gsrun
 * serves it): the survivors shrink past rank 0's loss. */
GS_TEST_TP(rank_0_killed_the_launchers_store_outlives_it)
{
    run((sh_arg){.transport = transport,
                 .victim = 0,
                 .dies_at = 2,
                 .mid = true,
                 .second = -1,
                 .laggard = -1,
                 .expect_n = 3},
        15000);
}

GS_TEST_TP(second_rank_killed_during_agreement_two_finish)
{
    run((sh_arg){.transport = transport,
                 .victim = 1,
                 .dies_at = 2,
                 .mid = true,
                 .second = 3,
                 .laggard = -1,
                 .expect_n = 2},
        15000);
}

GS_TEST_TP(rank_that_never_asks_is_out_at_the_deadline)
{
    run((sh_arg){.transport = transport,
                 .victim = 1,
                 .dies_at = 1,
                 .mid = true,
                 .second = -1,
                 .laggard = 3,
                 .expect_n = 2},
        3000);
}

GS_TEST_TP(random_kill_points)
{
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    fprintf(stderr, "  seed %u\n", seed);
    srand(seed);
    for (int run_i = 0; run_i < 3; run_i++) {
        sh_arg a = {.transport = transport,
                    .victim = rand() % RANKS,
                    .dies_at = rand() % 5,
                    .mid = rand() % 2,
                    .second = -1,
                    .laggard = -1,
                    .expect_n = RANKS - 1};
        fprintf(stderr, "  run %d: rank %d dies %s call %d\n", run_i, a.victim, a.mid ? "inside" : "before",
                a.dies_at);
        run(a, 15000);
    }
}

static void no_loss_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp), *once, *twice;
    GS_ASSERT_OK(gs_comm_shrink(comm, &once));
    GS_ASSERT_EQ(gs_comm_size(once), RANKS);
    GS_ASSERT_EQ(gs_comm_rank(once), rank);
    GS_ASSERT_OK(gs_comm_shrink(once, &twice)); /* nested: outlives the one it came from */
    cc_close(comm, tp);
    GS_ASSERT_OK(gs_comm_destroy(once));
    GS_ASSERT_EQ(gs_comm_rank(twice), rank);
    cc_check_member_sums(twice, rank, 3, COUNT);
    GS_ASSERT_OK(gs_comm_destroy(twice));
}

GS_TEST_TP(shrink_without_loss_gives_the_same_ranks)
{
    cc_run_env(transport, RANKS, no_loss_body, 0, NULL);
}

/* A sub-communicator of world ranks 0-2 in reverse order (sub rank 0 is
 * world rank 2); world rank 1 dies in it; the survivors, world ranks 2 and
 * 0, become ranks 0 and 1 of the shrunk one. World rank 3 takes no part. */
static void split_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float *buf = malloc(COUNT * sizeof(float));
    gs_tp *tp;
    gs_comm *world = cc_open(ctx, a->transport, &tp), *sub = NULL, *shrunk = NULL;
    gs_status st = GS_OK;
    GS_ASSERT(buf != NULL);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = 1;
    GS_ASSERT_OK(gs_comm_split(world, rank < 3 ? 0 : GS_COMM_NO_COLOR, -rank, &sub));
    if (rank < 3) {
        if (rank == 1) {
            sh_arg die = {.dies_at = 2, .mid = true};
            die_mid_allreduce(ctx, sub, buf, &die);
        }
        for (int c = 0; c < CALLS && st == GS_OK; c++)
            st = gs_allreduce(sub, buf, buf, COUNT, GS_F32, GS_SUM);
        GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
        GS_ASSERT_OK(gs_comm_shrink(sub, &shrunk));
        GS_ASSERT_EQ(gs_comm_size(shrunk), 2);
        GS_ASSERT_EQ(gs_comm_rank(shrunk), rank == 2 ? 0 : 1);
        cc_check_member_sums(shrunk, gs_comm_rank(sub), 3, COUNT);
        GS_ASSERT_OK(gs_comm_abort(sub));
        GS_ASSERT_OK(gs_comm_destroy(shrunk));
    }
    GS_ASSERT_OK(gs_comm_abort(world));
    GS_ASSERT_OK(gs_tp_close(tp));
    free(buf);
}

GS_TEST_TP(sub_communicator_shrinks_in_its_own_order)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = RANKS, .timeout_ms = 60000, .rank_timeout_ms = 15000};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, split_body, &a, status);
    for (int r = 0; r < RANKS; r++)
        if (r == 1)
            GS_ASSERT_RANK_SIGNAL(status[r], SIGKILL);
        else
            GS_ASSERT_RANK_EXIT(status[r], 0);
}

static void store_gone_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float *buf = malloc(COUNT * sizeof(float));
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp), *shrunk = NULL;
    gs_status st = GS_OK;
    uint64_t t0;
    GS_ASSERT(buf != NULL);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = 1;
    if (rank == 0) {
        sh_arg die = {.dies_at = 2, .mid = true};
        die_mid_allreduce(ctx, comm, buf, &die);
    }
    for (int c = 0; c < CALLS && st == GS_OK; c++)
        st = gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM);
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    t0 = gs_clock_ns();
    GS_ASSERT_STATUS(gs_comm_shrink(comm, &shrunk), GS_ERR_PEER_LOST);
    fprintf(stderr, "  rank %d: %s\n", rank, gs_last_error());
    GS_ASSERT_CONTAINS(gs_last_error(), "the store is gone");
    GS_ASSERT_LT(gs_clock_ns() - t0, 3000000000ull); /* at once, not at the deadline */
    gs_comm_abort(comm);
    gs_tp_close(tp);
    free(buf);
}

GS_TEST_TP(store_served_by_killed_rank_0_fails_fast)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {
        .n = RANKS, .timeout_ms = 60000, .rank_timeout_ms = 15000, .rank0_serves = true};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, store_gone_body, &a, status);
    GS_ASSERT_RANK_SIGNAL(status[0], SIGKILL);
    for (int r = 1; r < RANKS; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
}

/* ---- an external store: a toy table in shared memory (robust lock: a rank
 * may die holding it), with add ---------------------------------------------- */

#define TOY_KEYS  512
#define TOY_VALUE 512

typedef struct toy_store {
    pthread_mutex_t lock;
    int count;
    struct {
        char key[256];
        size_t len;
        uint8_t value[TOY_VALUE];
    } e[TOY_KEYS];
} toy_store;

static void toy_lock(toy_store *t)
{
    if (pthread_mutex_lock(&t->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&t->lock);
}

static int toy_find(toy_store *t, const char *key)
{
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->e[i].key, key) == 0)
            return i;
    return -1;
}

static gs_status toy_put_locked(toy_store *t, const char *key, const void *value, size_t len)
{
    int i = toy_find(t, key);
    if (len > TOY_VALUE || strlen(key) >= sizeof(t->e[0].key) || (i < 0 && t->count == TOY_KEYS))
        return GS_ERR_NOMEM;
    if (i < 0)
        i = t->count++;
    snprintf(t->e[i].key, sizeof(t->e[i].key), "%s", key);
    if (len)
        memcpy(t->e[i].value, value, len);
    t->e[i].len = len;
    return GS_OK;
}

static gs_status toy_set(void *arg, const char *key, const void *value, size_t len)
{
    toy_store *t = arg;
    toy_lock(t);
    gs_status st = toy_put_locked(t, key, value, len);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static gs_status toy_get(void *arg, const char *key, void *buf, size_t cap, size_t *len_p, int timeout_ms)
{
    toy_store *t = arg;
    struct timespec nap = {0, 200000};
    uint64_t deadline = gs_clock_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        toy_lock(t);
        int i = toy_find(t, key);
        if (i >= 0) {
            if (cap && t->e[i].len)
                memcpy(buf, t->e[i].value, t->e[i].len < cap ? t->e[i].len : cap);
            *len_p = t->e[i].len;
            pthread_mutex_unlock(&t->lock);
            return GS_OK;
        }
        pthread_mutex_unlock(&t->lock);
        if (gs_clock_ns() >= deadline)
            return GS_ERR_TIMEOUT;
        nanosleep(&nap, NULL);
    }
}

static gs_status toy_add(void *arg, const char *key, int64_t delta, int64_t *value_p)
{
    toy_store *t = arg;
    int64_t v = 0;
    toy_lock(t);
    int i = toy_find(t, key);
    if (i >= 0)
        memcpy(&v, t->e[i].value, sizeof(v));
    v += delta;
    gs_status st = toy_put_locked(t, key, &v, sizeof(v));
    pthread_mutex_unlock(&t->lock);
    *value_p = v;
    return st;
}

static toy_store *toy_open(void)
{
    pthread_mutexattr_t attr;
    toy_store *t = mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    GS_ASSERT(t != MAP_FAILED);
    memset(t, 0, sizeof(*t));
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&t->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    return t;
}

typedef struct ext_arg {
    const char *transport;
    toy_store *toy;
} ext_arg;

#define EXT_TIMEOUT_MS 3000 /* a dead member no transport saw die is out at the deadline */

static void ext_body(gs_ctx *unused, int rank, void *argp)
{
    const ext_arg *a = argp;
    gs_kv_store kv = {.arg = a->toy, .set = toy_set, .get = toy_get, .add = toy_add};
    gs_ctx_params p;
    gs_ctx *ctx;
    gs_tp *tp;
    gs_comm *comm, *shrunk;
    gs_status st = GS_OK;
    float *buf = malloc(COUNT * sizeof(float));
    uint64_t t0;
    (void)unused;
    GS_ASSERT(buf != NULL);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = 1;
    gs_ctx_params_init(&p);
    p.rank = rank;
    p.world_size = RANKS;
    p.store = &kv;
    p.timeout_ms = EXT_TIMEOUT_MS;
    GS_ASSERT_OK(gs_ctx_create_with(&p, &ctx));
    comm = cc_open(ctx, a->transport, &tp);
    if (rank == 2) {
        sh_arg die = {.dies_at = 2, .mid = true};
        die_mid_allreduce(ctx, comm, buf, &die);
    }
    for (int c = 0; c < CALLS && st == GS_OK; c++)
        st = gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_SUM);
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    t0 = gs_clock_ns();
    GS_ASSERT_OK(gs_comm_shrink(comm, &shrunk));
    fprintf(stderr, "  rank %d: shrink over the external store took %.0f ms\n", rank,
            (double)(gs_clock_ns() - t0) / 1e6);
    /* the lost rank's death was seen by a survivor's transport: not waited for */
    GS_ASSERT_LT(gs_clock_ns() - t0, (uint64_t)EXT_TIMEOUT_MS * 900000u);
    GS_ASSERT_EQ(gs_comm_size(shrunk), RANKS - 1);
    GS_ASSERT_OK(gs_comm_abort(comm));
    GS_ASSERT_OK(gs_tp_close(tp));
    cc_check_member_sums(shrunk, rank, 3, COUNT);
    GS_ASSERT_OK(gs_comm_destroy(shrunk));
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
    free(buf);
}

GS_TEST_TP(external_store_survivors_shrink)
{
    ext_arg a = {.transport = transport, .toy = toy_open()};
    gs_test_ranks_opts opts = {.n = RANKS, .timeout_ms = 60000, .rank_timeout_ms = 15000, .no_ctx = true};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, ext_body, &a, status);
    for (int r = 0; r < RANKS; r++)
        if (r == 2)
            GS_ASSERT_RANK_SIGNAL(status[r], SIGKILL);
        else
            GS_ASSERT_RANK_EXIT(status[r], 0);
    pthread_mutex_destroy(&a.toy->lock);
    munmap(a.toy, sizeof(*a.toy));
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* GS_SHRINK_RUNS (default 5) runs of: rank 3 killed inside an allreduce,
 * the 3 survivors shrink and run one allreduce; the medians of new rank
 * 0's times, in ms: the kill to its error (detection), its agreement, its
 * rebuild, the first call, and the kill to the first call's end. */
GS_TEST_TP(timing_kill_to_first_allreduce_after_shrink)
{
    char path[] = "/tmp/gs-shrink-times-XXXXXX";
    const char *env = getenv("GS_SHRINK_RUNS");
    int runs = env ? atoi(env) : 5, fd = mkstemp(path), n = 0;
    double cols[5][64];
    FILE *f;
    GS_ASSERT(fd >= 0);
    close(fd);
    if (runs < 1 || runs > 64)
        runs = 5;
    for (int i = 0; i < runs; i++)
        run((sh_arg){.transport = transport,
                     .victim = 3,
                     .dies_at = 2,
                     .mid = true,
                     .second = -1,
                     .laggard = -1,
                     .expect_n = 3,
                     .times = path},
            15000);
    f = fopen(path, "r");
    GS_ASSERT(f != NULL);
    while (n < 64 && fscanf(f, "%lf %lf %lf %lf %lf", &cols[0][n], &cols[1][n], &cols[2][n], &cols[3][n],
                            &cols[4][n]) == 5)
        n++;
    fclose(f);
    unlink(path);
    GS_ASSERT_EQ(n, runs);
    for (int c = 0; c < 5; c++)
        qsort(cols[c], (size_t)n, sizeof(double), cmp_double);
    fprintf(
        stderr,
        "  %s, 4 ranks, %d runs, median ms: detection %.1f, agreement %.1f, rebuild %.1f, first allreduce "
        "%.1f; kill to first allreduce done %.1f (min %.1f, max %.1f)\n",
        transport, n, cols[0][n / 2], cols[1][n / 2], cols[2][n / 2], cols[3][n / 2], cols[4][n / 2],
        cols[4][0], cols[4][n - 1]);
}
