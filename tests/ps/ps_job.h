/*
 * Parameter-server test jobs: S servers and W workers as forked ranks of one
 * job (multirank.h), over every built transport.
 *
 *   GS_TEST_TP(sync_matches_reference) { ps_job job = ps_job_default(transport, 1, 2); ... ps_job_run(&job);
 * }
 *
 * registers "<transport>.sync_matches_reference" once per built transport
 * (gs_test.h: GS_TEST_TP; a transport this host cannot run is skipped, counted).
 *
 * Each rank creates its gs_ps from job->params (GS_* from the environment,
 * then the job's overrides), registers job->keys, then a server serves
 * (gs_ps_serve must return job->serve_status) and a worker runs job->worker.
 * job->shared is a MAP_SHARED page every rank sees, for cross-rank checks.
 */
#ifndef GS_TEST_PS_JOB_H
#define GS_TEST_PS_JOB_H

#include "gs_test.h"
#include "multirank.h"

#include "bootstrap/boot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PS_MAX_KEYS 8

typedef struct ps_job ps_job;
typedef void (*ps_worker_fn)(gs_ps *ps, ps_job *job);

struct ps_job {
    const char *transport;
    int servers, workers;
    int timeout_ms;      /* whole run */
    int rank_timeout_ms; /* GS_TIMEOUT_MS of the ranks */
    gs_ps_mode mode;
    gs_ps_agg agg;
    int staleness;
    size_t shard_bytes;
    gs_ps_optim optim;
    const char *checkpoint;
    int checkpoint_every;
    int nkeys;
    uint64_t keys[PS_MAX_KEYS];
    size_t counts[PS_MAX_KEYS];
    ps_worker_fn worker;
    ps_worker_fn server;                  /* instead of gs_ps_serve, if set */
    gs_status serve_status;               /* what gs_ps_serve must return */
    gs_status expect_create;              /* servers' gs_ps_create must return this (workers fail too) */
    bool serve_thread;                    /* serve with gs_ps_serve_start */
    bool no_init;                         /* register with NULL initial values: zeros */
    int expect_exit[GS_TEST_RANKS_MAX];   /* exit code each rank must end with (0) */
    int expect_signal[GS_TEST_RANKS_MAX]; /* or the signal it must die of (0: none) */
    bool elastic;                         /* gs_ps_params.elastic */
    bool no_average;                      /* gs_ps_params.average 0: the sum, not the mean */
    int steps;
    void *arg;
    volatile uint64_t *shared; /* 512 words every rank shares */
};

static inline ps_job ps_job_default(const char *transport, int servers, int workers)
{
    ps_job job = {.transport = transport,
                  .servers = servers,
                  .workers = workers,
                  .timeout_ms = 60000,
                  .rank_timeout_ms = 20000,
                  .mode = GS_PS_MODE_SYNC,
                  .agg = GS_PS_AGG_WRITE_SLOTS,
                  .staleness = -1,
                  .shard_bytes = 4096,
                  .optim = {.kind = GS_PS_SGD, .lr = 0.1f},
                  .steps = 5};
    job.shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (job.shared == MAP_FAILED)
        abort();
    memset((void *)job.shared, 0, 4096);
    return job;
}

static inline void ps_job_key(ps_job *job, uint64_t key, size_t count)
{
    job->keys[job->nkeys] = key;
    job->counts[job->nkeys++] = count;
}

static inline void ps_job_params(const ps_job *job, gs_ctx *ctx, gs_ps_params *p)
{
    gs_ps_params_init(ctx, p);
    p->transport = job->transport;
    p->servers = job->servers;
    p->mode = job->mode;
    p->agg = job->agg;
    p->staleness = job->staleness;
    p->shard_bytes = job->shard_bytes;
    p->optim = job->optim;
    p->elastic = job->elastic;
    p->average = job->no_average ? 0 : 1;
    if (job->checkpoint) {
        p->checkpoint = job->checkpoint;
        p->checkpoint_every = job->checkpoint_every;
    }
}

/* The initial value of element i of key k (the first worker sends it). */
static inline float ps_init_value(int k, size_t i)
{
    return 0.5f + 0.001f * (float)(i % 1000) - 0.25f * (float)k;
}

/* The gradient worker w pushes at step t for element i of key k. */
static inline float ps_grad_value(int k, int w, uint64_t t, size_t i)
{
    return sinf(0.01f * (float)i + 0.7f * (float)t + 1.3f * (float)w + (float)k);
}

static inline void ps_fill_init(int k, float *buf, size_t n)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = ps_init_value(k, i);
}

static inline void ps_fill_grad(int k, int w, uint64_t t, float *buf, size_t n)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = ps_grad_value(k, w, t, i);
}

static inline void ps_register_keys(gs_ps *ps, const ps_job *job)
{
    for (int k = 0; k < job->nkeys; k++) {
        float *init = NULL;
        if (!gs_ps_is_server(ps) && gs_ps_index(ps) == 0 && !job->no_init) {
            init = malloc(job->counts[k] * sizeof(float));
            GS_ASSERT(init != NULL);
            ps_fill_init(k, init, job->counts[k]);
        }
        GS_ASSERT_OK(gs_ps_register(ps, job->keys[k], job->counts[k], init));
        free(init);
    }
}

static void ps_rank_main(gs_ctx *ctx, int rank, void *arg)
{
    ps_job *job = arg;
    gs_ps_params p;
    gs_ps *ps = NULL;
    ps_job_params(job, ctx, &p);
    if (job->expect_create != GS_OK) {
        gs_status st = gs_ps_create(ctx, &p, &ps);
        if (rank >= job->workers)
            GS_ASSERT_STATUS(st, job->expect_create);
        else
            GS_ASSERT(st != GS_OK);
        return;
    }
    GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
    ps_register_keys(ps, job);
    if (gs_ps_is_server(ps) && job->server) {
        job->server(ps, job);
    } else if (gs_ps_is_server(ps)) {
        if (job->serve_thread) {
            GS_ASSERT_OK(gs_ps_serve_start(ps));
            GS_ASSERT_STATUS(gs_ps_destroy(ps), job->serve_status);
            return;
        }
        GS_ASSERT_STATUS(gs_ps_serve(ps), job->serve_status);
    } else {
        job->worker(ps, job);
    }
    gs_ps_destroy(ps);
}

static inline void ps_job_run(ps_job *job)
{
    char to[64];
    const char *env[] = {to, NULL};
    int status[GS_TEST_RANKS_MAX];
    int n = job->servers + job->workers;
    gs_test_ranks_opts opts = {
        .n = n, .timeout_ms = job->timeout_ms, .rank_timeout_ms = job->rank_timeout_ms, .env = env};
    snprintf(to, sizeof(to), "GS_TIMEOUT_MS=%d", job->rank_timeout_ms);
    int ok = gs_test_run_ranks_opts(&opts, ps_rank_main, job, status);
    for (int r = 0; r < n; r++) {
        char buf[64];
        if (job->expect_signal[r]) {
            if (!WIFSIGNALED(status[r]) || WTERMSIG(status[r]) != job->expect_signal[r])
                gs_test_fail_here(__FILE__, __LINE__, "rank %d ended with %s, expected signal %d", r,
                                  gs_test_status_text(status[r], buf, sizeof(buf)), job->expect_signal[r]);
            continue;
        }
        if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != job->expect_exit[r])
            gs_test_fail_here(__FILE__, __LINE__, "rank %d (%s) ended with %s, expected exit %d", r,
                              r >= job->workers ? "server" : "worker",
                              gs_test_status_text(status[r], buf, sizeof(buf)), job->expect_exit[r]);
    }
    (void)ok;
}

#endif
