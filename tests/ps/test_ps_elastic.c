/* Elastic sync mode (gs_ps_params.elastic): a worker SIGKILLed in the middle
 * of a round, or one that misses the round's deadline, leaves the job; the
 * servers complete the round with the mean over the pushes they counted and
 * go on. Every gradient is a multiple of 12, so the means over 4, 3 or 2
 * workers are integers and the expected parameters, computed here in
 * double, are exact in float. */
#include "ps_job.h"

#include "util/clock.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 6

/* shared[] words of the job */
enum {
    SH_PUSHING = 0,  /* [0..8) worker w is about to push round SH_KILL_ROUND */
    SH_KILL_NS = 16, /* the victim's clock just before it killed itself */
    SH_DONE_NS = 17, /* worker 0's clock when its round after the kill completed */
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static float grad_of(int k, int w, int t, size_t i)
{
    return 12.0f * (float)((int)((i * 7 + (size_t)t * 3 + (size_t)w * 5 + (size_t)k) % 11) - 5);
}

/* Element i of key k (registered with zeros) after `rounds` rounds of SGD (lr 1) with the mean of
 * the gradients of the workers each round counted: counts(t, w) says
 * whether round t of key k counted worker w. */
typedef bool (*counts_fn)(int k, int t, int w, const void *arg);

static double expected(int k, size_t i, int rounds, int workers, counts_fn counts, const void *arg)
{
    double p = 0;
    for (int t = 0; t < rounds; t++) {
        double sum = 0;
        int n = 0;
        for (int w = 0; w < workers; w++)
            if (counts(k, t, w, arg)) {
                sum += grad_of(k, w, t, i);
                n++;
            }
        p -= sum / n;
    }
    return p;
}

static void check_params(const float *out, int k, size_t count, int rounds, int workers, counts_fn counts,
                         const void *arg);

/* How many pushes round t of key k counted. */
static int counted(int k, int t, int workers, counts_fn counts, const void *arg)
{
    int n = 0;
    for (int w = 0; w < workers; w++)
        n += counts(k, t, w, arg);
    return n;
}

/* The parameters after `rounds` rounds, and what the last one counted
 * (gs_ps_key_workers, the head the pull read). */
static void check_round(gs_ps *ps, const float *out, int k, size_t count, int rounds, counts_fn counts,
                        const void *arg)
{
    int workers = gs_ps_num_workers(ps);
    GS_ASSERT_EQ(gs_ps_key_workers(ps, (uint64_t)k + 1), counted(k, rounds - 1, workers, counts, arg));
    check_params(out, k, count, rounds, workers, counts, arg);
}

static void check_params(const float *out, int k, size_t count, int rounds, int workers, counts_fn counts,
                         const void *arg)
{
    for (size_t i = 0; i < count; i++) {
        double want = expected(k, i, rounds, workers, counts, arg);
        if ((double)out[i] != want)
            gs_test_fail_here(__FILE__, __LINE__, "key %d element %zu after round %d: %.9g, expected %.9g", k,
                              i, rounds - 1, (double)out[i], want);
    }
}

/* ---- a worker killed mid-round ------------------------------------------------------- */

typedef struct kill_plan {
    int victim, round; /* the victim SIGKILLs itself when it is to push this round */
} kill_plan;

static bool counts_killed(int k, int t, int w, const void *arg)
{
    const kill_plan *kp = arg;
    (void)k;
    return w != kp->victim || t < kp->round;
}

static void mid_round_worker(gs_ps *ps, ps_job *job)
{
    const kill_plan *kp = job->arg;
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    GS_ASSERT(g && out);
    for (int t = 0; t < job->steps; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = grad_of(0, me, t, i);
        if (t == kp->round && me != kp->victim)
            __atomic_store_n(&job->shared[SH_PUSHING + me], 1, __ATOMIC_RELEASE);
        if (t == kp->round && me == kp->victim) {
            /* mid-round: the others' pushes of this round are on their way */
            for (int w = 0; w < W; w++)
                while (w != me && !__atomic_load_n(&job->shared[SH_PUSHING + w], __ATOMIC_ACQUIRE))
                    sleep_ms(1);
            sleep_ms(20);
            job->shared[SH_KILL_NS] = gs_now_ns();
            raise(SIGKILL);
        }
        GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
        if (t == kp->round && me == 0)
            job->shared[SH_DONE_NS] = gs_now_ns();
        check_round(ps, out, 0, n, t + 1, counts_killed, kp);
    }
    free(g);
    free(out);
}

static ps_job killed_job(const char *transport, int workers, kill_plan *kp)
{
    ps_job job = ps_job_default(transport, 1, workers);
    ps_job_key(&job, 1, 1000);
    job.elastic = true;
    job.no_init = true;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    job.steps = ROUNDS;
    job.worker = mid_round_worker;
    job.arg = kp;
    job.expect_signal[kp->victim] = SIGKILL;
    return job;
}

GS_TEST_TP(elastic_sync_goes_on_after_a_worker_killed_mid_round)
{
    kill_plan kp = {.victim = 3, .round = 2};
    ps_job job = killed_job(transport, 4, &kp);
    job.shard_bytes = 1024; /* 4 shards of the key: every one completes without the victim */
    ps_job_run(&job);
}

GS_TEST_TP(elastic_sync_worker_zero_killed)
{
    kill_plan kp = {.victim = 0, .round = 1}; /* the first worker (initial values, notices first) */
    ps_job job = killed_job(transport, 3, &kp);
    ps_job_run(&job);
}

/* ---- a push counts whole or not at all: one key pushed, the other not -------------- */

#define SPLIT_VICTIM 2
#define SPLIT_ROUND  2

/* Key 0 (two shards, one per server): round SPLIT_ROUND counts the victim,
 * whose push-pull of it completed; key 1: from that round on it does not. */
static bool counts_split(int k, int t, int w, const void *arg)
{
    (void)arg;
    return w != SPLIT_VICTIM || t < SPLIT_ROUND || (k == 0 && t == SPLIT_ROUND);
}

static void split_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    GS_ASSERT(g && out && job->counts[1] == n);
    for (int t = 0; t < job->steps; t++)
        for (int k = 0; k < 2; k++) {
            if (me == SPLIT_VICTIM && t == SPLIT_ROUND && k == 1)
                raise(SIGKILL); /* key 0 of this round pushed and applied, key 1 never */
            for (size_t i = 0; i < n; i++)
                g[i] = grad_of(k, me, t, i);
            GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[k], g, out));
            check_round(ps, out, k, n, t + 1, counts_split, NULL);
        }
    free(g);
    free(out);
}

GS_TEST_TP(elastic_sync_counts_a_push_whole_or_not_at_all)
{
    ps_job job = ps_job_default(transport, 2, 3);
    ps_job_key(&job, 1, 512); /* 2 KiB: a shard on each server */
    ps_job_key(&job, 2, 512);
    job.shard_bytes = 1024;
    job.elastic = true;
    job.no_init = true;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    job.steps = ROUNDS;
    job.worker = split_worker;
    job.expect_signal[SPLIT_VICTIM] = SIGKILL;
    ps_job_run(&job);
}

/* ---- a worker that misses the deadline ------------------------------------------------- */

#define HUNG_ROUND 1

static bool counts_hung(int k, int t, int w, const void *arg)
{
    (void)k;
    (void)arg;
    return w != 2 || t < HUNG_ROUND;
}

/* Worker 2 stops for longer than GS_TIMEOUT_MS before round HUNG_ROUND: the
 * server leaves it out at the deadline; the others go on with the mean of
 * two; its own later call fails (it is out: nothing it sends counts). */
static void hung_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    GS_ASSERT(g && out);
    for (int t = 0; t < job->steps; t++) {
        uint64_t t0 = gs_now_ns();
        for (size_t i = 0; i < n; i++)
            g[i] = grad_of(0, me, t, i);
        if (me == 2 && t == HUNG_ROUND) {
            sleep_ms(2500);
            GS_ASSERT(gs_ps_push_pull(ps, job->keys[0], g, out) != GS_OK);
            break;
        }
        GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
        if (t == HUNG_ROUND)
            GS_ASSERT_LT(gs_now_ns() - t0, 2000000000ull); /* the deadline (1 s), not the sleeper */
        check_round(ps, out, 0, n, t + 1, counts_hung, NULL);
    }
    free(g);
    free(out);
}

GS_TEST_TP(elastic_sync_leaves_out_a_worker_past_the_deadline)
{
    ps_job job = ps_job_default(transport, 1, 3);
    ps_job_key(&job, 1, 300);
    job.elastic = true;
    job.no_init = true;
    job.rank_timeout_ms = 1000;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    job.steps = 4;
    job.worker = hung_worker;
    ps_job_run(&job);
}

/* ---- refused combinations --------------------------------------------------------------- */

static void never_runs(gs_ps *ps, ps_job *job)
{
    (void)ps;
    (void)job;
    GS_ASSERT(0);
}

GS_TEST_TP(elastic_needs_sync_write_mode)
{
    ps_job job = ps_job_default(transport, 1, 2);
    ps_job_key(&job, 1, 16);
    job.elastic = true;
    job.mode = GS_PS_MODE_ASYNC;
    job.worker = never_runs;
    job.expect_create = GS_ERR_CONFIG;
    ps_job_run(&job);
}

/* ---- timing: from the kill to the next completed round ----------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* GS_PS_ELASTIC_RUNS runs (default 1) of 1 server + 3 workers, worker 2
 * killed in round 2 of a 64 KiB key; prints each run's time from the kill
 * to worker 0's completed push-pull of that round, then the median. */
GS_TEST_TP(elastic_timing)
{
    const char *env = getenv("GS_PS_ELASTIC_RUNS");
    int runs = env ? atoi(env) : 1;
    uint64_t *ms = calloc((size_t)(runs > 0 ? runs : 1), sizeof(uint64_t));
    GS_ASSERT(runs >= 1 && ms);
    for (int r = 0; r < runs; r++) {
        kill_plan kp = {.victim = 2, .round = 2};
        ps_job job = killed_job(transport, 3, &kp);
        job.counts[0] = 16384;
        ps_job_run(&job);
        GS_ASSERT(job.shared[SH_DONE_NS] > job.shared[SH_KILL_NS] && job.shared[SH_KILL_NS] > 0);
        ms[r] = (job.shared[SH_DONE_NS] - job.shared[SH_KILL_NS]) / 1000; /* us */
        printf("run %d: kill to the next completed round %.1f ms\n", r, (double)ms[r] / 1e3);
        munmap((void *)job.shared, 4096);
    }
    qsort(ms, (size_t)runs, sizeof(*ms), cmp_u64);
    printf("%s: median over %d runs: %.1f ms (min %.1f, max %.1f)\n", transport, runs,
           (double)ms[runs / 2] / 1e3, (double)ms[0] / 1e3, (double)ms[runs - 1] / 1e3);
    free(ms);
}

/* ---- a worker killed and restarted (GS_REJOIN=1) ------------------------------------------ */

#define RJ_VICTIM 2
#define RJ_KILL   2 /* the victim dies before pushing this round */
#define RJ_ROUNDS 10
enum { SH_JOINED_AT = 32, SH_SURVIVOR_ROUND = 33 };

/* Rounds before RJ_KILL count every worker, then the two survivors, and
 * from the round the joiner was admitted in (arg: that round, 0 while not
 * known) every worker again. */
static bool counts_rejoin(int k, int t, int w, const void *arg)
{
    int joined = *(const int *)arg;
    (void)k;
    return w != RJ_VICTIM || t < RJ_KILL || (joined > 0 && t >= joined);
}

static void rejoin_params(const ps_job *job, gs_ctx *ctx, gs_ps_params *p)
{
    ps_job_params(job, ctx, p);
    p->elastic = 1;
}

/* A survivor: repeats a call that failed because the servers started the
 * recovery that readmits the joiner (gs_ps_recover first). */
static void rejoin_survivor(gs_ctx *ctx, ps_job *job)
{
    gs_ps *ps = NULL;
    gs_ps_params p;
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    int recoveries = 0;
    rejoin_params(job, ctx, &p);
    GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
    ps_register_keys(ps, job);
    int me = gs_ps_index(ps);
    for (int t = 0; t < RJ_ROUNDS; t++) {
        gs_status st;
        int joined;
        for (size_t i = 0; i < n; i++)
            g[i] = grad_of(0, me, t, i);
        while ((st = gs_ps_push_pull(ps, job->keys[0], g, out)) != GS_OK) {
            GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
            GS_ASSERT_CONTAINS(gs_last_error(), "started a recovery");
            GS_ASSERT_LT(++recoveries, 2);
            GS_ASSERT_OK(gs_ps_recover(ps));
        }
        joined = (int)__atomic_load_n(&job->shared[SH_JOINED_AT], __ATOMIC_ACQUIRE);
        check_params(out, 0, n, t + 1, 3, counts_rejoin, &joined);
        if (me == 0)
            __atomic_store_n(&job->shared[SH_SURVIVOR_ROUND], (uint64_t)t + 1, __ATOMIC_RELEASE);
        sleep_ms(20); /* let the joiner come in while the job runs */
    }
    GS_ASSERT_EQ(recoveries, 1);
    gs_ps_destroy(ps);
    free(g);
    free(out);
}

/* The joiner: pulls the current parameters, finds the round they are after
 * (exact arithmetic: only one round's expected values match), then pushes
 * from that round on. */
static void rejoin_joiner(gs_ctx *ctx, ps_job *job)
{
    gs_ps *ps = NULL;
    gs_ps_params p;
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    int at = -1;
    rejoin_params(job, ctx, &p);
    GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
    GS_ASSERT_EQ(gs_ps_index(ps), RJ_VICTIM);
    ps_register_keys(ps, job); /* the keys came from the store: these return at once */
    GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], out));
    for (int r = RJ_KILL; r <= RJ_ROUNDS && at < 0; r++) {
        int joined = 0; /* before it: the rounds without the joiner */
        bool same = true;
        for (size_t i = 0; i < n && same; i++)
            same = (double)out[i] == expected(0, i, r, 3, counts_rejoin, &joined);
        at = same ? r : -1;
    }
    GS_ASSERT(at >= RJ_KILL + 1 && at < RJ_ROUNDS); /* admitted after the loss, before the end */
    __atomic_store_n(&job->shared[SH_JOINED_AT], (uint64_t)at, __ATOMIC_RELEASE);
    for (int t = at; t < RJ_ROUNDS; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = grad_of(0, RJ_VICTIM, t, i);
        GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
        check_params(out, 0, n, t + 1, 3, counts_rejoin, &at);
    }
    GS_ASSERT_OK(gs_ps_destroy(ps));
    free(g);
    free(out);
}

/* The victim's rank: the first process dies before round RJ_KILL; once the
 * survivors are two rounds further, a replacement starts with GS_REJOIN=1. */
static void rejoin_victim(ps_job *job)
{
    int status;
    pid_t pid = fork();
    GS_ASSERT(pid >= 0);
    if (pid == 0) {
        gs_ctx *ctx = gs_test_own_ctx();
        gs_ps *ps = NULL;
        gs_ps_params p;
        size_t n = job->counts[0];
        float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
        rejoin_params(job, ctx, &p);
        GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
        ps_register_keys(ps, job);
        for (int t = 0; t < RJ_KILL; t++) {
            for (size_t i = 0; i < n; i++)
                g[i] = grad_of(0, RJ_VICTIM, t, i);
            GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
        }
        raise(SIGKILL);
    }
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    GS_ASSERT_RANK_SIGNAL(status, SIGKILL);
    while (__atomic_load_n(&job->shared[SH_SURVIVOR_ROUND], __ATOMIC_ACQUIRE) < RJ_KILL + 2)
        sleep_ms(2);
    pid = fork();
    GS_ASSERT(pid >= 0);
    if (pid == 0) {
        setenv("GS_REJOIN", "1", 1);
        gs_ctx *ctx = gs_test_own_ctx();
        rejoin_joiner(ctx, job);
        GS_ASSERT_OK(gs_ctx_destroy(ctx));
        _exit(0);
    }
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    GS_ASSERT_RANK_EXIT(status, 0);
}

static void rejoin_rank(gs_ctx *unused, int rank, void *arg)
{
    ps_job *job = arg;
    gs_ctx *ctx;
    (void)unused;
    if (rank == RJ_VICTIM) {
        rejoin_victim(job);
        return;
    }
    ctx = gs_test_own_ctx();
    if (rank < job->workers) {
        rejoin_survivor(ctx, job);
    } else {
        gs_ps *ps = NULL;
        gs_ps_params p;
        rejoin_params(job, ctx, &p);
        GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
        ps_register_keys(ps, job);
        GS_ASSERT_OK(gs_ps_serve(ps));
        gs_ps_destroy(ps);
    }
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

GS_TEST_TP(elastic_sync_killed_worker_rejoins)
{
    ps_job job = ps_job_default(transport, 1, 3);
    char to[64];
    const char *env[] = {to, NULL};
    int status[GS_TEST_RANKS_MAX];
    gs_test_ranks_opts opts = {
        .n = 4, .timeout_ms = 60000, .rank_timeout_ms = 10000, .env = env, .no_ctx = true};
    ps_job_key(&job, 1, 500);
    job.no_init = true;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    snprintf(to, sizeof(to), "GS_TIMEOUT_MS=%d", 10000);
    gs_test_run_ranks_opts(&opts, rejoin_rank, &job, status);
    for (int r = 0; r < 4; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
}
