/* Async (ASP) mode: every push applied exactly once on arrival; bounded
 * staleness (SSP) holds under a deliberately slow worker; a pull never
 * tears under concurrent updates. */
#include "ps_job.h"

#include "ps/ps.h"

#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Integer gradients with lr 1 and the mean over 2 workers: every value is a
 * multiple of 1/2, so the final parameters are exact whatever the order. */
static float int_grad(int w, int t, size_t i)
{
    return (float)((int)((i * 7 + (size_t)t * 3 + (size_t)w * 5) % 11) - 5);
}

static void async_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    for (int t = 0; t < job->steps; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = int_grad(me, t, i);
        GS_ASSERT_OK(gs_ps_push(ps, job->keys[0], g));
    }
    /* read-your-writes: our pushes are all in */
    GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], out));
    __atomic_add_fetch(&job->shared[0], 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&job->shared[0], __ATOMIC_SEQ_CST) < (uint64_t)W)
        sleep_ms(1);
    /* everyone's pushes are in: the parameters are init - sum / W */
    GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], out));
    for (size_t i = 0; i < n; i++) {
        float want = 0.0f; /* registered without initial values */
        double sum = 0;
        for (int w = 0; w < W; w++)
            for (int t = 0; t < job->steps; t++)
                sum += int_grad(w, t, i);
        want = (float)((double)want - sum / W);
        if (out[i] != want)
            gs_test_fail_here(__FILE__, __LINE__, "element %zu: %.9g, expected %.9g", i, (double)out[i],
                              (double)want);
    }
    free(g);
    free(out);
}

GS_TEST_TP(async_applies_every_push_once)
{
    ps_job job = ps_job_default(transport, 2, 2);
    job.mode = GS_PS_MODE_ASYNC;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    job.steps = 20;
    ps_job_key(&job, 5, 3000);
    job.no_init = true;
    job.worker = async_worker;
    ps_job_run(&job);
}

/* SSP: worker 1 is slow; worker 0 may run ahead, never more than s steps.
 * shared[1] counts the pushes worker 1 has started; shared[2] records the
 * largest lead worker 0 saw. */
static void ssp_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), s = job->staleness;
    size_t n = job->counts[0];
    float *g = calloc(n, sizeof(float));
    for (int t = 0; t < job->steps; t++) {
        if (me == 1) {
            sleep_ms(15);
            __atomic_store_n(&job->shared[1], (uint64_t)t + 1, __ATOMIC_SEQ_CST);
            GS_ASSERT_OK(gs_ps_push(ps, job->keys[0], g));
            continue;
        }
        GS_ASSERT_OK(gs_ps_push(ps, job->keys[0], g));
        /* push t went out only after the slow worker's push t - s - 1 was applied */
        uint64_t slow = __atomic_load_n(&job->shared[1], __ATOMIC_SEQ_CST);
        int64_t lead = (int64_t)t - (int64_t)slow;
        GS_ASSERT_LE(lead, s);
        if ((uint64_t)lead > job->shared[2] || job->shared[2] == 0)
            job->shared[2] = (uint64_t)(lead > 0 ? lead : 0);
    }
    if (me == 0)
        GS_ASSERT_GE(job->shared[2], s > 0 ? 1 : 0); /* it did run ahead */
    free(g);
}

static void run_ssp(const char *transport, int s)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.mode = GS_PS_MODE_ASYNC;
    job.staleness = s;
    job.steps = 25;
    ps_job_key(&job, 9, 700);
    job.worker = ssp_worker;
    ps_job_run(&job);
}

GS_TEST_TP(ssp_bound_holds_under_a_slow_worker)
{
    run_ssp(transport, 3);
}

GS_TEST_TP(ssp_zero_is_lockstep)
{
    run_ssp(transport, 0);
}

/* Stress: worker 0 pushes as fast as it can (async, each push rewrites the
 * whole 1 MiB shard); worker 1 pulls as fast as it can. Every element of a
 * consistent copy is init - k/2 for one k: any mix of two updates shows. */
static void tear_worker(gs_ps *ps, ps_job *job)
{
    size_t n = job->counts[0];
    float *buf = malloc(n * sizeof(float));
    int me = gs_ps_index(ps);
    if (me == 0) {
        for (size_t i = 0; i < n; i++)
            buf[i] = 1.0f;
        for (int t = 0; t < job->steps; t++) {
            uint64_t seen = __atomic_load_n(&job->shared[4], __ATOMIC_SEQ_CST);
            GS_ASSERT_OK(gs_ps_push(ps, job->keys[0], buf));
            /* now and then let the puller catch up, so that it sees many versions */
            for (int spin = 0;
                 t % 4 == 0 && spin < 50 && __atomic_load_n(&job->shared[4], __ATOMIC_SEQ_CST) == seen;
                 spin++)
                sleep_ms(1);
        }
        __atomic_store_n(&job->shared[3], 1, __ATOMIC_SEQ_CST);
    } else {
        uint64_t pulls = 0, changes = 0;
        float last = 0.0f;
        while (!__atomic_load_n(&job->shared[3], __ATOMIC_SEQ_CST) || pulls < 10) {
            GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], buf));
            for (size_t i = 1; i < n; i++)
                if (buf[i] != buf[0])
                    gs_test_fail_here(__FILE__, __LINE__,
                                      "torn pull %llu: element 0 is %.9g, element %zu is %.9g",
                                      (unsigned long long)pulls, (double)buf[0], i, (double)buf[i]);
            changes += buf[0] != last;
            last = buf[0];
            pulls++;
            __atomic_store_n(&job->shared[4], pulls, __ATOMIC_SEQ_CST);
        }
        fprintf(stderr, "  %llu pulls saw %llu different versions; %llu reads were torn and retried\n",
                (unsigned long long)pulls, (unsigned long long)changes,
                (unsigned long long)ps->wrk.pull_retries);
        GS_ASSERT_GE(changes, 20);
        /* shm and verbs READ while the server writes: the seqlock must have seen it. (tcp's
         * READs are answered by the server's progress engine, mostly between updates.) */
        if (strcmp(job->transport, "tcp") != 0)
            GS_ASSERT_GE(ps->wrk.pull_retries, 1);
    }
    free(buf);
}

GS_TEST_TP(pull_never_tears_under_concurrent_updates)
{
    ps_job job = ps_job_default(transport, 1, 2);
    job.mode = GS_PS_MODE_ASYNC;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    job.shard_bytes = 1 << 20;
    job.steps = 150;
    job.timeout_ms = 100000; /* the rxe guest emulates its CPU: slow */
    ps_job_key(&job, 1, (1 << 20) / sizeof(float));
    job.worker = tear_worker;
    job.no_init = true; /* the shard starts uniform: all zeros */
    ps_job_run(&job);
}
