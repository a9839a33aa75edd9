/* Atomic aggregation (GS_PS_AGG=atomic): fixed-point FETCH_ADD into the
 * server's accumulator is exact for integer-valued gradients; overflow is
 * reported, never silent: beyond the bound before anything is sent, and a
 * wrap seen in a FETCH_ADD's old value refuses the step on every worker. */
#include "ps_job.h"

#include "ps/ps.h"
#include "ps/optim.h"

static float int_grad(int w, uint64_t t, size_t i)
{
    return (float)((int)((i * 13 + t * 5 + (size_t)w * 3) % 17) - 8) * 1024.0f;
}

/* The single-process run: sum in worker order, SGD on the mean. */
static void ref_step(float *ref, int workers, uint64_t t, size_t n, float lr)
{
    gs_ps_optim o = {.kind = GS_PS_SGD, .lr = lr};
    float *sum = calloc(n, sizeof(float));
    for (int w = 0; w < workers; w++)
        for (size_t i = 0; i < n; i++)
            sum[i] += int_grad(w, t, i);
    gs_ps_optim_apply(&o, ref, sum, 1.0f / (float)workers, NULL, t + 1, n);
    free(sum);
}

static void exact_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    ps_fill_init(0, ref, n);
    for (int t = 0; t < job->steps; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = int_grad(me, (uint64_t)t, i);
        GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
        ref_step(ref, W, (uint64_t)t, n, job->optim.lr);
        GS_ASSERT(memcmp(out, ref, n * sizeof(float)) == 0);
    }
    free(g);
    free(out);
    free(ref);
}

GS_TEST_TP(atomic_is_exact_for_integer_gradients)
{
    ps_job job = ps_job_default(transport, 2, 3);
    job.agg = GS_PS_AGG_FETCH_ADD;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 0.25f};
    job.steps = 4;
    ps_job_key(&job, 3, 5000); /* 5 shards; 2 chunks in the biggest */
    job.worker = exact_worker;
    ps_job_run(&job);
}

/* Non-integer gradients are rounded to 2^-32: the result stays within that
 * of the exact run. */
static void rounding_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        ref[i] = ps_init_value(0, i);
    for (int t = 0; t < job->steps; t++) {
        ps_fill_grad(0, me, (uint64_t)t, g, n);
        GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
        for (size_t i = 0; i < n; i++) {
            double sum = 0;
            for (int w = 0; w < W; w++)
                sum += ps_grad_value(0, w, (uint64_t)t, i);
            ref[i] -= job->optim.lr * sum / W;
            GS_ASSERT(fabs(out[i] - ref[i]) < 1e-5);
        }
    }
    free(g);
    free(out);
    free(ref);
}

GS_TEST_TP(atomic_rounds_other_gradients_to_the_scale)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.agg = GS_PS_AGG_FETCH_ADD;
    job.steps = 3;
    ps_job_key(&job, 4, 300);
    job.worker = rounding_worker;
    ps_job_run(&job);
}

/* A gradient beyond the bound is refused before anything is sent: the
 * step never happens, the next one works. */
static void bound_worker(gs_ps *ps, ps_job *job)
{
    int W = gs_ps_num_workers(ps), me = gs_ps_index(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    ps_fill_init(0, ref, n);
    for (size_t i = 0; i < n; i++)
        g[i] = int_grad(me, 0, i);
    g[n / 2] = 3e9f; /* |g| * 2^32 * W > 2^63 */
    GS_ASSERT_STATUS(gs_ps_push_pull(ps, job->keys[0], g, out), GS_ERR_OVERFLOW);
    GS_ASSERT_CONTAINS(gs_last_error(), "nothing was pushed");
    g[n / 2] = NAN;
    GS_ASSERT_STATUS(gs_ps_push(ps, job->keys[0], g), GS_ERR_OVERFLOW);
    /* the parameters are untouched; the next step goes through */
    GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], out));
    GS_ASSERT(memcmp(out, ref, n * sizeof(float)) == 0);
    for (size_t i = 0; i < n; i++)
        g[i] = int_grad(me, 0, i);
    GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
    ref_step(ref, W, 0, n, job->optim.lr);
    GS_ASSERT(memcmp(out, ref, n * sizeof(float)) == 0);
    free(g);
    free(out);
    free(ref);
}

GS_TEST_TP(atomic_refuses_gradients_beyond_the_bound)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.agg = GS_PS_AGG_FETCH_ADD;
    ps_job_key(&job, 6, 100);
    job.worker = bound_worker;
    ps_job_run(&job);
}

/* A wrap in the accumulator (planted here by adding a huge value behind
 * the library's back, as a buggy or foreign writer would) is seen by the
 * worker whose add wrapped; the server refuses the step and every worker's
 * push_pull of it reports GS_ERR_OVERFLOW; the next step is clean again. */
static void wrap_worker(gs_ps *ps, ps_job *job)
{
    int W = gs_ps_num_workers(ps), me = gs_ps_index(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    gs_ps_wkey *wk = &ps->wrk.keys[0];
    gs_ps_wshard *ws = &ps->wrk.shards[wk->first];
    ps_fill_init(0, ref, n);
    for (size_t i = 0; i < n; i++)
        g[i] = 1.0f;
    if (me == 0) {
        uint64_t *res = (uint64_t *)gs_mr_addr(wk->atomic);
        int got = 0;
        gs_wc wc;
        GS_ASSERT_OK(gs_ep_fetch_add(gs_tp_ep(ps->tp, ws->server_rank), res, wk->atomic, &ws->acc,
                                     gs_ps_acc_data_off((uint32_t)W), (uint64_t)(INT64_MAX - 10), 99,
                                     GS_OP_SIGNALED));
        while (!got)
            GS_ASSERT_OK(gs_tp_poll(ps->tp, &wc, 1, &got));
        GS_ASSERT_OK(wc.status);
    }
    __atomic_add_fetch(&job->shared[0], 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&job->shared[0], __ATOMIC_SEQ_CST) < (uint64_t)W)
        ;
    GS_ASSERT_STATUS(gs_ps_push_pull(ps, job->keys[0], g, out), GS_ERR_OVERFLOW);
    /* the refused step left the parameters alone; the next one is applied */
    GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
    for (size_t i = 0; i < n; i++)
        ref[i] = ref[i] - job->optim.lr * ((float)W * 1.0f * (1.0f / (float)W));
    GS_ASSERT(memcmp(out, ref, n * sizeof(float)) == 0);
    free(g);
    free(out);
    free(ref);
}

GS_TEST_TP(atomic_wrap_refuses_the_step_on_every_worker)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.agg = GS_PS_AGG_FETCH_ADD;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 0.5f};
    ps_job_key(&job, 7, 64);
    job.worker = wrap_worker;
    ps_job_run(&job);
}
