/* Kill and restart of a server: the restarted process (GS_REJOIN=1)
 * restores its checkpoint, the workers get GS_ERR_PEER_LOST, call
 * gs_ps_recover, repeat the failed call, and carry on; the parameters
 * after every step equal those of a run without the failure, bit for bit:
 * no applied update is lost or applied twice. */
#include "ps_job.h"

#include "ps/optim.h"
#include "util/log.h"

#include <glob.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { SH_KILL = 10, SH_KILLED, SH_RECOVERIES };

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A server process: create, register, serve until the workers are done. */
static void server_process(ps_job *job, bool restarted)
{
    gs_ctx *ctx;
    gs_ps *ps = NULL;
    gs_ps_params p;
    if (restarted)
        setenv("GS_REJOIN", "1", 1);
    ctx = gs_test_own_ctx();
    ps_job_params(job, ctx, &p);
    GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
    GS_ASSERT(gs_ps_is_server(ps));
    ps_register_keys(ps, job); /* a restarted server knows its keys already: these return at once */
    GS_ASSERT_OK(gs_ps_serve(ps));
    GS_ASSERT_OK(gs_ps_destroy(ps));
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
    _exit(0);
}

/* The server rank: runs the server in a child, kills it when told, starts
 * a replacement. Only job->arg's server index is killed. */
static void supervisor(ps_job *job, int index)
{
    int status;
    pid_t pid = fork();
    GS_ASSERT(pid >= 0);
    if (pid == 0)
        server_process(job, false);
    if (index == (int)(intptr_t)job->arg) {
        while (!__atomic_load_n(&job->shared[SH_KILL], __ATOMIC_SEQ_CST) &&
               waitpid(pid, &status, WNOHANG) == 0)
            sleep_ms(1);
        kill(pid, SIGKILL);
        GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
        __atomic_store_n(&job->shared[SH_KILLED], 1, __ATOMIC_SEQ_CST);
        pid = fork();
        GS_ASSERT(pid >= 0);
        if (pid == 0)
            server_process(job, true);
    }
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    GS_ASSERT_RANK_EXIT(status, 0);
}

typedef struct reference {
    float *w, *m, *v, *sum, *g;
} reference;

static void ref_step(reference *r, const gs_ps_optim *o, int k, int workers, uint64_t t, size_t n)
{
    float *state[2] = {r->m, r->v};
    ps_fill_grad(k, 0, t, r->sum, n);
    for (int w = 1; w < workers; w++) {
        ps_fill_grad(k, w, t, r->g, n);
        for (size_t i = 0; i < n; i++)
            r->sum[i] = r->sum[i] + r->g[i];
    }
    gs_ps_optim_apply(o, r->w, r->sum, 1.0f / (float)workers, state, t + 1, n);
}

static void worker_process(gs_ctx *ctx, ps_job *job)
{
    gs_ps *ps = NULL;
    gs_ps_params p;
    reference ref[PS_MAX_KEYS];
    float *grad[PS_MAX_KEYS], *out[PS_MAX_KEYS];
    int recoveries = 0;
    ps_job_params(job, ctx, &p);
    GS_ASSERT_OK(gs_ps_create(ctx, &p, &ps));
    ps_register_keys(ps, job);
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    for (int k = 0; k < job->nkeys; k++) {
        size_t n = job->counts[k];
        ref[k] = (reference){calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4), calloc(n, 4)};
        ps_fill_init(k, ref[k].w, n);
        grad[k] = malloc(n * 4);
        out[k] = malloc(n * 4);
    }
    for (int t = 0; t < job->steps; t++) {
        for (int k = 0; k < job->nkeys; k++) {
            gs_status st;
            ps_fill_grad(k, me, (uint64_t)t, grad[k], job->counts[k]);
            while ((st = gs_ps_push_pull(ps, job->keys[k], grad[k], out[k])) != GS_OK) {
                GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
                GS_ASSERT_LT(++recoveries, 3);
                GS_ASSERT_OK(gs_ps_recover(ps));
            }
            ref_step(&ref[k], &job->optim, k, W, (uint64_t)t, job->counts[k]);
            for (size_t i = 0; i < job->counts[k]; i++)
                if (memcmp(&out[k][i], &ref[k].w[i], 4) != 0)
                    gs_test_fail_here(__FILE__, __LINE__,
                                      "worker %d key %d step %d element %zu: %.9g, reference %.9g", me, k, t,
                                      i, (double)out[k][i], (double)ref[k].w[i]);
        }
        if (me == 0 && t == 5)
            __atomic_store_n(&job->shared[SH_KILL], 1, __ATOMIC_SEQ_CST);
    }
    GS_ASSERT(__atomic_load_n(&job->shared[SH_KILLED], __ATOMIC_SEQ_CST));
    GS_ASSERT_EQ(recoveries, 1);
    __atomic_add_fetch(&job->shared[SH_RECOVERIES], 1, __ATOMIC_SEQ_CST);
    GS_ASSERT_OK(gs_ps_destroy(ps));
    for (int k = 0; k < job->nkeys; k++) {
        free(ref[k].w), free(ref[k].m), free(ref[k].v), free(ref[k].sum), free(ref[k].g);
        free(grad[k]);
        free(out[k]);
    }
}

static void restart_rank(gs_ctx *ctx, int rank, void *arg)
{
    ps_job *job = arg;
    (void)ctx;
    if (rank >= job->workers) {
        supervisor(job, rank - job->workers);
        return;
    }
    ctx = gs_test_own_ctx();
    worker_process(ctx, job);
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

static void remove_checkpoints(const char *prefix)
{
    char pattern[256];
    glob_t g;
    snprintf(pattern, sizeof(pattern), "%s.server*", prefix);
    if (glob(pattern, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++)
            unlink(g.gl_pathv[i]);
        globfree(&g);
    }
}

static void run_restart(const char *transport, int servers, int workers, int victim, const char *name)
{
    char prefix[128], to[64];
    const char *env[] = {to, NULL};
    int status[GS_TEST_RANKS_MAX];
    ps_job job = ps_job_default(transport, servers, workers);
    snprintf(prefix, sizeof(prefix), "/tmp/gs_ps_restart_%s_%s_%d", name, transport, (int)getpid());
    job.optim = (gs_ps_optim){.kind = GS_PS_MOMENTUM, .lr = 0.05f, .momentum = 0.9f};
    job.checkpoint = prefix;
    job.checkpoint_every = 2;
    job.steps = 14;
    job.arg = (void *)(intptr_t)victim;
    ps_job_key(&job, 1, 3000);
    ps_job_key(&job, 2, 333);
    ps_job_key(&job, 3, 1024);
    snprintf(to, sizeof(to), "GS_TIMEOUT_MS=%d", 15000);
    gs_test_ranks_opts opts = {
        .n = servers + workers, .timeout_ms = 90000, .rank_timeout_ms = 15000, .env = env, .no_ctx = true};
    gs_test_run_ranks_opts(&opts, restart_rank, &job, status);
    remove_checkpoints(prefix);
    for (int r = 0; r < servers + workers; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
    GS_ASSERT_EQ(job.shared[SH_RECOVERIES], workers);
}

GS_TEST_TP(killed_server_restarts_and_loses_nothing)
{
    run_restart(transport, 1, 2, 0, "one");
}

GS_TEST_TP(killed_server_among_two_restarts_and_loses_nothing)
{
    run_restart(transport, 2, 3, 1, "two");
}
