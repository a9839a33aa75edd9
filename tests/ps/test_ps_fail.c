/* Failures: a worker that dies or hangs is reported by sync servers within
 * the deadline (no hang); async goes on with the rest; a server that dies
 * gives its workers GS_ERR_PEER_LOST. */
#include "ps_job.h"

#include "util/clock.h"

#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* How soon a loss must be reported: 5 s, or 120 s in the rxe guest, whose
 * emulated CPU makes verbs' retry timers crawl. */
static uint64_t report_within_ns(void)
{
    return (getenv("GS_RXE_GUEST") ? 120ull : 5ull) * 1000000000ull;
}

static float int_grad(int w, int t, size_t i)
{
    return (float)((int)((i * 7 + (size_t)t * 3 + (size_t)w * 5) % 11) - 5);
}

/* The last worker dies before step 2; the others must hear of it. */
static void dying_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    for (int t = 0; t < job->steps; t++) {
        uint64_t t0 = gs_now_ns();
        gs_status st;
        if (me == W - 1 && t == 2)
            _exit(3);
        st = gs_ps_push_pull(ps, job->keys[0], g, out);
        if (t < 2) {
            GS_ASSERT_OK(st);
            continue;
        }
        GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
        GS_ASSERT_CONTAINS(gs_last_error(), "worker 2");
        GS_ASSERT_LT(gs_now_ns() - t0, report_within_ns()); /* well within the 20 s deadline */
        /* and it stays failed */
        GS_ASSERT_STATUS(gs_ps_push_pull(ps, job->keys[0], g, out), GS_ERR_PEER_LOST);
        break;
    }
    free(g);
    free(out);
}

GS_TEST_TP(sync_reports_a_dead_worker)
{
    ps_job job = ps_job_default(transport, 1, 3);
    ps_job_key(&job, 1, 2000);
    job.worker = dying_worker;
    job.serve_status = GS_ERR_PEER_LOST;
    job.expect_exit[2] = 3;
    ps_job_run(&job);
}

/* The last worker stops answering (alive, stuck) at step 1: the server
 * gives up on it at GS_TIMEOUT_MS, the others hear GS_ERR_TIMEOUT. */
static void hung_worker(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    uint64_t t0;
    GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out));
    if (me == W - 1) {
        sleep_ms(4000);
        GS_ASSERT(gs_ps_push_pull(ps, job->keys[0], g, out) != GS_OK);
    } else {
        t0 = gs_now_ns();
        GS_ASSERT_STATUS(gs_ps_push_pull(ps, job->keys[0], g, out), GS_ERR_TIMEOUT);
        GS_ASSERT_LT(gs_now_ns() - t0, 3500000000ull);
    }
    free(g);
    free(out);
}

GS_TEST_TP(sync_reports_a_hung_worker_at_the_deadline)
{
    ps_job job = ps_job_default(transport, 1, 3);
    job.rank_timeout_ms = 1500;
    ps_job_key(&job, 1, 100);
    job.worker = hung_worker;
    job.serve_status = GS_ERR_TIMEOUT;
    ps_job_run(&job);
}

GS_TEST_TP(sync_atomic_reports_a_hung_worker_at_the_deadline)
{
    ps_job job = ps_job_default(transport, 1, 3);
    job.agg = GS_PS_AGG_FETCH_ADD;
    job.rank_timeout_ms = 1500;
    ps_job_key(&job, 1, 100);
    job.worker = hung_worker;
    job.serve_status = GS_ERR_TIMEOUT;
    ps_job_run(&job);
}

/* Async: the last worker dies after 3 pushes; the others push on, and the
 * parameters hold exactly every push that was applied. shared[1] is set
 * when the last worker's pushes are all applied, just before it dies: the
 * others take their second half of steps only after that (async lets them
 * run far ahead of it, and they would pull before its pushes land). */
static void async_survivor(gs_ps *ps, ps_job *job)
{
    int me = gs_ps_index(ps), W = gs_ps_num_workers(ps);
    size_t n = job->counts[0];
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    int steps = me == W - 1 ? 3 : job->steps;
    for (int t = 0; t < steps; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = int_grad(me, t, i);
        while (t == job->steps / 2 && __atomic_load_n(&job->shared[1], __ATOMIC_SEQ_CST) == 0)
            sleep_ms(1);
        GS_ASSERT_OK(gs_ps_push_pull(ps, job->keys[0], g, out)); /* applied when it returns */
    }
    if (me == W - 1) {
        __atomic_store_n(&job->shared[1], 1, __ATOMIC_SEQ_CST);
        _exit(3);
    }
    __atomic_add_fetch(&job->shared[0], 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&job->shared[0], __ATOMIC_SEQ_CST) < (uint64_t)W - 1)
        sleep_ms(1);
    GS_ASSERT_OK(gs_ps_pull(ps, job->keys[0], out));
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        for (int w = 0; w < W; w++)
            for (int t = 0; t < (w == W - 1 ? 3 : job->steps); t++)
                sum += int_grad(w, t, i);
        if ((double)out[i] != -sum / W)
            gs_test_fail_here(__FILE__, __LINE__, "element %zu: %.9g, expected %.9g", i, (double)out[i],
                              -sum / W);
    }
    free(g);
    free(out);
}

GS_TEST_TP(async_goes_on_without_a_dead_worker)
{
    ps_job job = ps_job_default(transport, 1, 4);
    job.mode = GS_PS_MODE_ASYNC;
    job.optim = (gs_ps_optim){.kind = GS_PS_SGD, .lr = 1.0f};
    job.no_init = true;
    job.steps = 12;
    ps_job_key(&job, 1, 1500);
    job.worker = async_survivor;
    job.expect_exit[3] = 3;
    ps_job_run(&job);
}

/* The server dies after the workers' third step (no restart): every worker
 * gets GS_ERR_PEER_LOST, quickly, with what to do next. */
static void doomed_server(gs_ps *ps, ps_job *job)
{
    GS_ASSERT_OK(gs_ps_serve_start(ps));
    while (__atomic_load_n(&job->shared[5], __ATOMIC_SEQ_CST) == 0)
        sleep_ms(1);
    _exit(3);
}

/* The first worker to reach step 3 tells the server to die and notes when
 * (shared[6]): the other may still be in step 2 and fail there. */
static void orphan_worker(gs_ps *ps, ps_job *job)
{
    size_t n = job->counts[0];
    float *g = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    gs_status st = GS_OK;
    for (int t = 0; t < 1000 && st == GS_OK; t++) {
        uint64_t unset = 0;
        if (t == 3 && __atomic_compare_exchange_n(&job->shared[6], &unset, gs_now_ns(), false,
                                                  __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            __atomic_store_n(&job->shared[5], 1, __ATOMIC_SEQ_CST);
        st = gs_ps_push_pull(ps, job->keys[0], g, out);
        GS_ASSERT(t >= 2 || st == GS_OK); /* step 2 may still be pulling when the server dies */
    }
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "gs_ps_recover");
    GS_ASSERT(__atomic_load_n(&job->shared[6], __ATOMIC_SEQ_CST) != 0);
    GS_ASSERT_LT(gs_now_ns() - __atomic_load_n(&job->shared[6], __ATOMIC_SEQ_CST), report_within_ns());
    GS_ASSERT_STATUS(gs_ps_pull(ps, job->keys[0], out), GS_ERR_PEER_LOST); /* until recovered */
    free(g);
    free(out);
}

GS_TEST_TP(workers_hear_of_a_dead_server)
{
    ps_job job = ps_job_default(transport, 1, 2);
    ps_job_key(&job, 1, 1000);
    job.worker = orphan_worker;
    job.server = doomed_server;
    job.expect_exit[2] = 3;
    ps_job_run(&job);
}

/* The server takes the worker's push and then dies without a word, while
 * the worker is between two calls; the worker's wait then finds the loss
 * itself (its transport already knows) and must still say what to do. */
static void silent_server(gs_ps *ps, ps_job *job)
{
    (void)ps;
    while (__atomic_load_n(&job->shared[5], __ATOMIC_SEQ_CST) == 0)
        sleep_ms(1);
    _exit(3);
}

static void waiting_worker(gs_ps *ps, ps_job *job)
{
    size_t n = job->counts[0];
    float *g = calloc(n, sizeof(float)), *out = calloc(n, sizeof(float));
    gs_req *req = NULL;
    GS_ASSERT_OK(gs_ps_ipush_pull(ps, job->keys[0], g, out, &req));
    sleep_ms(100); /* the push is taken (no notice will come) */
    __atomic_store_n(&job->shared[5], 1, __ATOMIC_SEQ_CST);
    sleep_ms(300); /* the transport sees the server go */
    GS_ASSERT_STATUS(gs_req_wait(req), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "gs_ps_recover");
    GS_ASSERT_STATUS(gs_ps_pull(ps, job->keys[0], out), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "gs_ps_recover");
    free(g);
    free(out);
}

GS_TEST_TP(a_wait_that_finds_the_server_dead_says_what_to_do)
{
    ps_job job = ps_job_default(transport, 1, 1);
    ps_job_key(&job, 1, 1000);
    job.worker = waiting_worker;
    job.server = silent_server;
    job.expect_exit[1] = 3;
    ps_job_run(&job);
}
