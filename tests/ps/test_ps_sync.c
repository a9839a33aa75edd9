/* Sync (BSP) mode: every pull equals a single-process run of the same
 * optimizer on the same gradients, bit for bit, over every transport. */
#include "ps_job.h"

#include "ps/optim.h"

typedef struct reference {
    float *w, *s0, *s1, *sum, *g;
} reference;

static void ref_init(reference *r, int k, size_t n)
{
    r->w = calloc(n, sizeof(float));
    r->s0 = calloc(n, sizeof(float));
    r->s1 = calloc(n, sizeof(float));
    r->sum = calloc(n, sizeof(float));
    r->g = calloc(n, sizeof(float));
    GS_ASSERT(r->w && r->s0 && r->s1 && r->sum && r->g);
    ps_fill_init(k, r->w, n);
}

static void ref_free(reference *r)
{
    free(r->w);
    free(r->s0);
    free(r->s1);
    free(r->sum);
    free(r->g);
}

/* One step of the single-process run: the workers' gradients summed in
 * worker order, the optimizer on their mean. */
static void ref_step(reference *r, const gs_ps_optim *o, int k, int workers, uint64_t t, size_t n)
{
    float *state[2] = {r->s0, r->s1};
    ps_fill_grad(k, 0, t, r->sum, n);
    for (int w = 1; w < workers; w++) {
        ps_fill_grad(k, w, t, r->g, n);
        for (size_t i = 0; i < n; i++)
            r->sum[i] = r->sum[i] + r->g[i];
    }
    gs_ps_optim_apply(o, r->w, r->sum, 1.0f / (float)workers, state, t + 1, n);
}

static void assert_same(const float *got, const float *want, size_t n, uint64_t key, uint64_t t)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            gs_test_fail_here(__FILE__, __LINE__, "key %llu step %llu element %zu: got %.9g, reference %.9g",
                              (unsigned long long)key, (unsigned long long)t, i, (double)got[i],
                              (double)want[i]);
}

/* Blocking push_pull of every key, every step. */
static void sync_worker(gs_ps *ps, ps_job *job)
{
    int W = gs_ps_num_workers(ps), me = gs_ps_index(ps);
    reference ref[PS_MAX_KEYS];
    float *grad[PS_MAX_KEYS], *out[PS_MAX_KEYS];
    for (int k = 0; k < job->nkeys; k++) {
        ref_init(&ref[k], k, job->counts[k]);
        grad[k] = malloc(job->counts[k] * sizeof(float));
        out[k] = malloc(job->counts[k] * sizeof(float));
        GS_ASSERT(grad[k] && out[k]);
    }
    /* before any push, a pull gives the initial values */
    GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], out[0]));
    assert_same(out[0], ref[0].w, job->counts[0], job->keys[0], 0);
    for (int t = 0; t < job->steps; t++)
        for (int k = 0; k < job->nkeys; k++) {
            ps_fill_grad(k, me, (uint64_t)t, grad[k], job->counts[k]);
            GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[k], grad[k], out[k]));
            ref_step(&ref[k], &job->optim, k, W, (uint64_t)t, job->counts[k]);
            assert_same(out[k], ref[k].w, job->counts[k], job->keys[k], (uint64_t)t);
        }
    for (int k = 0; k < job->nkeys; k++) {
        ref_free(&ref[k]);
        free(grad[k]);
        free(out[k]);
    }
}

GS_TEST_TP(sync_sgd_one_server_two_workers)
{
    ps_job job = ps_job_default(transport, 1, 2);
    ps_job_key(&job, 1, 3000); /* three shards of 4 KiB */
    ps_job_key(&job, 2, 1);
    ps_job_key(&job, 3, 70001); /* 280 KB: pushed and pulled in place (zero copy) */
    job.worker = sync_worker;
    ps_job_run(&job);
}

/* Shards big enough for the server's apply threads (GS_PS_APPLY_THREADS,
 * default 2) to share, and a key big enough to be streamed (GS_OP_STREAM):
 * the result is still the single-process run's. */
GS_TEST_TP(sync_adam_big_shards_shared_by_apply_threads_and_streamed)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.optim = (gs_ps_optim){.kind = GS_PS_ADAM, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    job.shard_bytes = 2u << 20;
    job.steps = 3;
    ps_job_key(&job, 1, 700001);             /* two shards of 1.4 MB, each 6 chunks */
    ps_job_key(&job, 2, (8u << 20) / 4 + 1); /* 8 MiB + 4 B: streamed, 5 shards */
    job.worker = sync_worker;
    ps_job_run(&job);
}

/* Far more shards than a verbs peer has receive credits (64): each step's
 * notices outrun the credits, and the server must retry them as the credits
 * come back (silently, without a completion), never sleep on them. */
GS_TEST_TP(sync_notices_outrun_the_receive_credits)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.shard_bytes = 256;
    job.steps = 4;
    ps_job_key(&job, 1, 64 * 300); /* 300 shards */
    ps_job_key(&job, 2, 5);
    job.worker = sync_worker;
    ps_job_run(&job);
}

GS_TEST_TP(sync_momentum_two_servers_three_workers)
{
    ps_job job = ps_job_default(transport, 2, 3);
    job.optim = (gs_ps_optim){.kind = GS_PS_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f};
    ps_job_key(&job, 10, 5000);
    ps_job_key(&job, 11, 77);
    ps_job_key(&job, 12, 1025);
    job.worker = sync_worker;
    ps_job_run(&job);
}

GS_TEST_TP(sync_adam_three_servers_two_workers_served_by_thread)
{
    ps_job job = ps_job_default(transport, 3, 2);
    job.optim = (gs_ps_optim){.kind = GS_PS_ADAM, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    job.serve_thread = true;
    ps_job_key(&job, 7, 4099);
    ps_job_key(&job, 8, 3);
    job.worker = sync_worker;
    ps_job_run(&job);
}

/* Non-blocking: every key's push started before any is waited for, then
 * pulls started together; the result is the same. */
static void nonblocking_worker(gs_ps *ps, ps_job *job)
{
    int W = gs_ps_num_workers(ps), me = gs_ps_index(ps);
    reference ref[PS_MAX_KEYS];
    float *grad[PS_MAX_KEYS], *out[PS_MAX_KEYS];
    gs_req *req[PS_MAX_KEYS];
    for (int k = 0; k < job->nkeys; k++) {
        ref_init(&ref[k], k, job->counts[k]);
        grad[k] = malloc(job->counts[k] * sizeof(float));
        out[k] = malloc(job->counts[k] * sizeof(float));
    }
    for (int t = 0; t < job->steps; t++) {
        for (int k = 0; k < job->nkeys; k++) {
            ps_fill_grad(k, me, (uint64_t)t, grad[k], job->counts[k]);
            GS_ASSERT_OK(gs_ps_ipush(ps, job->keys[k], grad[k], &req[k]));
        }
        for (int k = 0; k < job->nkeys; k++) {
            gs_status st = gs_req_test(req[k]); /* finished (released) or still running */
            if (st == GS_INPROGRESS)
                st = gs_req_wait(req[k]);
            GS_ASSERT_OK(st);
            GS_ASSERT_OK(gs_ps_ipull(ps, job->keys[k], out[k], &req[k]));
        }
        for (int k = 0; k < job->nkeys; k++) {
            gs_status st;
            if (k % 2 == 0) /* both ways to finish a request: test until it is done, or wait */
                while ((st = gs_req_test(req[k])) == GS_INPROGRESS)
                    ;
            else
                st = gs_req_wait(req[k]);
            GS_ASSERT_OK(st);
            ref_step(&ref[k], &job->optim, k, W, (uint64_t)t, job->counts[k]);
            assert_same(out[k], ref[k].w, job->counts[k], job->keys[k], (uint64_t)t);
        }
    }
    for (int k = 0; k < job->nkeys; k++) {
        ref_free(&ref[k]);
        free(grad[k]);
        free(out[k]);
    }
}

GS_TEST_TP(sync_nonblocking_requests)
{
    ps_job job = ps_job_default(transport, 2, 2);
    ps_job_key(&job, 100, 2500);
    ps_job_key(&job, 101, 10);
    ps_job_key(&job, 102, 1);
    job.worker = nonblocking_worker;
    ps_job_run(&job);
}
