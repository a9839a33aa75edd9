/*
 * Non-blocking collectives (several in flight, completing in order, progress
 * by gs_req_test or by the progress thread), the fused allreduce, and the
 * argument checks.
 */
#include "coll_check.h"

#include <unistd.h>

#define NREQ 12

/* NREQ collectives of different kinds in flight at once, then tested to
 * completion in reverse order. */
static void inflight_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx);
    const size_t count = 2000;
    float *in[NREQ], *out[NREQ];
    gs_req *req[NREQ];
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    for (int i = 0; i < NREQ; i++) {
        in[i] = malloc(count * (size_t)n * sizeof(float));
        out[i] = malloc(count * (size_t)n * sizeof(float));
        cc_fill(GS_F32, GS_SUM, rank + i, in[i], count * (size_t)n);
        switch (i % 4) {
        case 0: GS_ASSERT_OK(gs_iallreduce(comm, in[i], out[i], count, GS_F32, GS_SUM, &req[i])); break;
        case 1: GS_ASSERT_OK(gs_ireduce_scatter(comm, in[i], out[i], count, GS_F32, GS_SUM, &req[i])); break;
        case 2: GS_ASSERT_OK(gs_iallgather(comm, in[i], out[i], count, GS_F32, &req[i])); break;
        default: GS_ASSERT_OK(gs_ibroadcast(comm, in[i], out[i], count, GS_F32, i % n, &req[i])); break;
        }
    }
    for (int i = NREQ - 1; i >= 0; i--) {
        uint64_t deadline = gs_now_ns() + 20000000000ull;
        gs_status st;
        while ((st = gs_req_test(req[i])) == GS_INPROGRESS)
            GS_ASSERT(gs_now_ns() < deadline);
        GS_ASSERT_OK(st);
    }
    for (int i = 0; i < NREQ; i++) {
        float want[1];
        for (size_t e = 0; e < count; e++) {
            switch (i % 4) {
            case 0: /* rank r contributed values of rank r + i */
            case 1: {
                float acc = 0, v;
                for (int r = 0; r < n; r++) {
                    cc_put(GS_F32, GS_SUM, r + i, (i % 4 == 1 ? (size_t)rank * count : 0) + e, &v);
                    acc += v;
                }
                want[0] = acc;
                break;
            }
            case 2: break; /* below */
            default: cc_put(GS_F32, GS_SUM, i % n + i, e, want); break;
            }
            if (i % 4 == 2) { /* allgather: check every block */
                for (int q = 0; q < n; q++) {
                    cc_put(GS_F32, GS_SUM, q + i, e, want);
                    GS_ASSERT(out[i][(size_t)q * count + e] == want[0]);
                }
            } else {
                GS_ASSERT(out[i][e] == want[0]);
            }
        }
        free(in[i]);
        free(out[i]);
    }
    cc_close(comm, tp);
}

static void run_inflight(const char *transport, int n, bool thread)
{
    const char *env_thread[] = {"GS_PROGRESS_THREAD=1", "GS_CHUNK_BYTES=4096", NULL};
    const char *env_plain[] = {"GS_CHUNK_BYTES=4096", NULL};
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {
        .n = n, .timeout_ms = 60000, .rank_timeout_ms = 20000, .env = thread ? env_thread : env_plain};
    int status[GS_TEST_RANKS_MAX];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, inflight_body, &a, status), n);
}

GS_TEST_TP(nonblocking_in_flight_complete_in_order)
{
    run_inflight(transport, 3, false);
}
GS_TEST_TP(nonblocking_with_progress_thread)
{
    run_inflight(transport, 4, true);
}

/* With the progress thread, a collective completes while the caller does
 * not call into gradsync at all (it only sleeps). */
static void overlap_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    const size_t count = 100000;
    float *buf = malloc(count * sizeof(float));
    gs_req *req;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    cc_fill(GS_F32, GS_SUM, rank, buf, count);
    GS_ASSERT_OK(gs_iallreduce(comm, buf, buf, count, GS_F32, GS_SUM, &req));
    usleep(1500000); /* "compute": both ranks are away from gradsync */
    /* 100 columns of 4 KiB: only a progress thread can have finished them */
    GS_ASSERT_OK(gs_req_test(req));
    cc_check_reduced("overlap", GS_F32, GS_SUM, gs_ctx_size(ctx), buf, 0, count);
    free(buf);
    cc_close(comm, tp);
}

GS_TEST_TP(progress_thread_overlaps_compute)
{
    const char *env[] = {"GS_PROGRESS_THREAD=1", "GS_CHUNK_BYTES=4096", "GS_ALGO=ring", NULL};
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 60000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, overlap_body, &a, status), 2);
}

/* Calls of every size in a row on 2 ranks (auto: direct with unsignaled
 * sends for the small ones, whose outbox slots are freed by the peer's next
 * call, ring or the boxes for the large ones), several small ones in flight
 * at once (more than the outbox has slots), data different every call. */
static void check_sum(const float *out, size_t count, int seed, int n)
{
    for (size_t e = 0; e < count; e++) {
        float acc = 0, v;
        for (int r = 0; r < n; r++) {
            cc_put(GS_F32, GS_SUM, r + seed, e, &v);
            acc += v;
        }
        if (out[e] != acc)
            gs_test_fail_here(__FILE__, __LINE__, "seed %d: element %zu of %zu is %g, want %g", seed, e,
                              count, (double)out[e], (double)acc);
    }
}

static void mixed_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx);
    enum { INFLIGHT = 7, ROUNDS = 40 };
    const size_t big = 20000, small = 2;
    float *in = malloc(big * sizeof(float)), *out = malloc(big * sizeof(float));
    float sin[INFLIGHT][2], sout[INFLIGHT][2];
    gs_req *req[INFLIGHT];
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    for (int i = 0; i < ROUNDS; i++) {
        cc_fill(GS_F32, GS_SUM, rank + i, in, small);
        GS_ASSERT_OK(gs_allreduce(comm, in, out, small, GS_F32, GS_SUM));
        check_sum(out, small, i, n);
        cc_fill(GS_F32, GS_SUM, rank + i + 1, in, big);
        GS_ASSERT_OK(gs_allreduce(comm, in, out, big, GS_F32, GS_SUM));
        check_sum(out, big, i + 1, n);
        cc_fill(GS_F32, GS_SUM, rank + i + 2, out, small);
        GS_ASSERT_OK(gs_allreduce(comm, out, out, small, GS_F32, GS_SUM)); /* in place */
        check_sum(out, small, i + 2, n);
        GS_ASSERT_OK(gs_barrier(comm));
        for (int k = 0; k < INFLIGHT; k++) {
            cc_fill(GS_F32, GS_SUM, rank + i + k, sin[k], small);
            GS_ASSERT_OK(gs_iallreduce(comm, sin[k], sout[k], small, GS_F32, GS_SUM, &req[k]));
        }
        for (int k = 0; k < INFLIGHT; k++) {
            GS_ASSERT_OK(gs_req_wait(req[k]));
            check_sum(sout[k], small, i + k, n);
        }
    }
    free(in);
    free(out);
    cc_close(comm, tp);
}

GS_TEST_TP(mixed_sizes_in_a_row)
{
    const char *env[] = {"GS_CHUNK_BYTES=4096", NULL};
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 60000, .rank_timeout_ms = 20000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, mixed_body, &a, status), 2);
}

/* ---- fusion ------------------------------------------------------------------ */

static void multi_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx);
    static const size_t counts[] = {3, 0, 1000, 1, 77777, 5};
    enum { NT = sizeof(counts) / sizeof(counts[0]) };
    gs_tensor t[NT];
    double *send[NT], *recv[NT];
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < NT; i++) {
            send[i] = (double *)cc_alloc(counts[i] * 8);
            recv[i] = i % 2 ? send[i] : (double *)cc_alloc(counts[i] * 8);
            for (size_t e = 0; e < counts[i]; e++)
                cc_put(GS_F64, GS_AVG, rank, e + (size_t)i * 10, &send[i][e]);
            t[i] = (gs_tensor){.sendbuf = send[i], .recvbuf = recv[i], .count = counts[i]};
        }
        if (round == 1) {
            gs_req *req;
            GS_ASSERT_OK(gs_iallreduce_multi(comm, t, NT, GS_F64, GS_AVG, &req));
            GS_ASSERT_OK(gs_req_wait(req));
        } else {
            GS_ASSERT_OK(gs_allreduce_multi(comm, t, NT, GS_F64, GS_AVG));
        }
        for (int i = 0; i < NT; i++) {
            for (size_t e = 0; e < counts[i]; e++) {
                double want;
                cc_expect(GS_F64, GS_AVG, n, e + (size_t)i * 10, &want);
                GS_ASSERT(recv[i][e] == want);
            }
            cc_check_guard((uint8_t *)recv[i], counts[i] * 8, "fused tensor");
            if (recv[i] != send[i])
                free(recv[i]);
            free(send[i]);
        }
    }
    cc_close(comm, tp);
}

GS_TEST_TP(allreduce_multi_fuses_tensors)
{
    cc_arg a = {.transport = transport};
    gs_test_run_ranks(3, multi_body, &a, 60000);
}

/* Different tensor lists with the same total are a mismatch. */
static void multi_mismatch_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float x[16] = {0};
    gs_tensor t[2] = {{x, x, rank == 0 ? 4 : 6}, {x + 6, x + 6, rank == 0 ? 6 : 4}};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    GS_ASSERT_STATUS(gs_allreduce_multi(comm, t, 2, GS_F32, GS_SUM), GS_ERR_MISMATCH);
    GS_ASSERT_CONTAINS(gs_last_error(), "tensor list");
    cc_close(comm, tp);
}

GS_TEST_TP(allreduce_multi_checks_the_tensor_list)
{
    cc_arg a = {.transport = transport};
    gs_test_run_ranks(2, multi_mismatch_body, &a, 30000);
}

/* ---- argument checks ------------------------------------------------------------ */

static void args_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float buf[64] = {0};
    gs_req *req;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    (void)rank;
    GS_ASSERT_STATUS(gs_allreduce(NULL, buf, buf, 4, GS_F32, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 4, (gs_dtype)99, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "data type");
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 4, GS_F32, (gs_redop)-1), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_allreduce(comm, NULL, buf, 4, GS_F32, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf + 1, 4, GS_F32, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "overlap");
    GS_ASSERT_STATUS(gs_broadcast(comm, buf, buf, 4, GS_F32, 7), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, SIZE_MAX / 2, GS_F32, GS_SUM), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_allgather(comm, buf, buf + 1, 4, GS_F32), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_iallreduce(comm, buf, buf, 4, GS_F32, GS_SUM, NULL), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_req_wait(NULL), GS_ERR_INVALID);
    /* none of that reached the wire: the next call works on every rank */
    GS_ASSERT_OK(gs_iallreduce(comm, buf, buf, 64, GS_F32, GS_SUM, &req));
    GS_ASSERT_OK(gs_req_wait(req));
    GS_ASSERT_OK(gs_allreduce(comm, NULL, NULL, 0, GS_F32, GS_SUM));
    GS_ASSERT_EQ(gs_comm_size(comm), gs_ctx_size(ctx));
    GS_ASSERT_EQ(gs_comm_rank(comm), gs_ctx_rank(ctx));
    GS_ASSERT(gs_comm_tp(comm) == tp);
    cc_close(comm, tp);
}

GS_TEST_TP(bad_arguments_are_refused_locally)
{
    cc_arg a = {.transport = transport};
    gs_test_run_ranks(2, args_body, &a, 30000);
}

/* The communicator opens (and closes) its own transport when given none. */
static void own_tp_body(gs_ctx *ctx, int rank, void *argp)
{
    (void)argp;
    gs_comm *comm;
    int32_t v = rank + 1;
    GS_ASSERT_OK(gs_comm_create(ctx, NULL, &comm));
    GS_ASSERT_OK(gs_allreduce(comm, &v, &v, 1, GS_I32, GS_PROD));
    GS_ASSERT_EQ(v, 6);
    GS_ASSERT_OK(gs_comm_destroy(comm));
}

GS_TEST(comm_opens_the_default_transport)
{
    gs_test_run_ranks(3, own_tp_body, NULL, 30000);
}
