/* Conformance: completion modes (spin, event, hybrid) and wait deadlines. */
#include "ct.h"

#include <sys/resource.h>
#include <unistd.h>

/* ---- every rank to every rank, 2 to 4 ranks, each completion mode --------------------------------- */

#define CT_A2A_ROUNDS 50

static void all_to_all_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx);
    const size_t chunk = 1000;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;

    GS_ASSERT_OK(gs_mr_alloc(tp, chunk * (size_t)size * 2, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    all = ct_exchange(ctx, "ct.a2a.rmr", mr);
    for (uint32_t round = 0; round < CT_A2A_ROUNDS; round++) {
        uint8_t *src = buf + chunk * (size_t)size; /* second half: my outgoing chunk */
        ct_fill(src, chunk, round * 64 + (uint32_t)rank);
        for (int p = 0; p < size; p++)
            if (p != rank)
                CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, p), src, mr, chunk, &all[p], chunk * (size_t)rank,
                                            round, 0, 0));
        for (int i = 0; i < size - 1; i++) {
            gs_wc wc = ct_expect(tp, GS_WC_RECV_IMM, -1);
            GS_ASSERT_EQ(wc.imm, round);
            GS_ASSERT_EQ(ct_check(buf + chunk * (size_t)wc.peer, chunk, round * 64 + (uint32_t)wc.peer),
                         chunk);
        }
        /* Nobody overwrites a chunk before its owner has checked it. */
        for (int p = 0; p < size; p++)
            if (p != rank)
                CT_POST(tp, gs_ep_send(gs_tp_ep(tp, p), NULL, NULL, 0, 0, 0));
        for (int i = 0; i < size - 1; i++) {
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, (rank + 1 + i) % size), NULL, NULL, 0, 0));
        }
        for (int i = 0; i < size - 1; i++)
            ct_expect(tp, GS_WC_RECV, -1);
    }
    ct_finish(ctx, "ct.a2a.done", tp, mr, all);
}

static void all_to_all_in_mode(const char *transport, const char *const *env)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, all_to_all_body, transport, 0, env);
}

GS_TEST_TP(all_to_all_with_2_3_4_ranks_in_spin_mode)
{
    all_to_all_in_mode(transport, ct_env_spin);
}

GS_TEST_TP(all_to_all_with_2_3_4_ranks_in_event_mode)
{
    all_to_all_in_mode(transport, ct_env_event);
}

GS_TEST_TP(all_to_all_with_2_3_4_ranks_in_hybrid_mode)
{
    all_to_all_in_mode(transport, ct_env_hybrid);
}

/* In event mode a waiter sleeps: 300 ms of waiting costs little CPU. */
static void event_sleeps_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;

    all = ct_region(ctx, tp, 4096, "ct.sleep.rmr", &mr);
    if (rank == 1) {
        usleep(300000);
        CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 0), NULL, NULL, 0, &all[0], 0, 7, 0, 0));
    } else {
        struct rusage r0, r1;
        uint64_t t0 = gs_now_ns();
        double cpu_ms, wall_ms;
        getrusage(RUSAGE_SELF, &r0);
        GS_ASSERT_EQ(ct_expect(tp, GS_WC_RECV_IMM, 1).imm, 7);
        getrusage(RUSAGE_SELF, &r1);
        wall_ms = (double)(gs_now_ns() - t0) / 1e6;
        cpu_ms =
            (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) *
                1e3 +
            (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) /
                1e3;
        fprintf(stderr, "  rank 0 waited %.1f ms using %.1f ms of CPU\n", wall_ms, cpu_ms);
        GS_ASSERT(wall_ms >= 200);
        GS_ASSERT(cpu_ms < wall_ms / 4);
    }
    ct_finish(ctx, "ct.sleep.done", tp, mr, all);
}

GS_TEST_TP(event_mode_waits_without_burning_cpu)
{
    ct_run(2, event_sleeps_body, transport, 0, ct_env_event);
}

/* A wait with nothing coming ends at its timeout, naming the rank. */
static void timeout_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    char who[32];
    gs_wc wc;
    int n = 0;
    uint64_t t0 = gs_now_ns(), ms;

    GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 150), GS_ERR_TIMEOUT);
    ms = (gs_now_ns() - t0) / 1000000ull;
    GS_ASSERT_GE(ms, 140);
    GS_ASSERT_LT(ms, 2000);
    snprintf(who, sizeof(who), "rank %d", rank);
    GS_ASSERT_CONTAINS(gs_last_error(), who);
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.timeout.done"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(wait_with_nothing_coming_times_out_naming_the_rank)
{
    static const char *const event[] = {"GS_POLL=event", NULL};
    ct_run(2, timeout_body, transport, 0, NULL);
    ct_run(2, timeout_body, transport, 0, event);
}
