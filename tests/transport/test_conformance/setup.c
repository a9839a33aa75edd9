/* Conformance: open, an endpoint per peer, caller memory (gs_mr_reg). */
#include "ct.h"

#include <sys/wait.h>

/* ---- open, endpoints, close ---------------------------------------------------- */

static void open_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx);
    gs_tp *tp = ct_open(ctx, arg->transport);

    GS_ASSERT(gs_tp_ep(tp, rank) == NULL);
    GS_ASSERT(gs_tp_ep(tp, -1) == NULL && gs_tp_ep(tp, size) == NULL);
    for (int p = 0; p < size; p++)
        if (p != rank)
            GS_ASSERT(gs_tp_ep(tp, p) != NULL);
    GS_ASSERT_OK(gs_tp_close(tp));
    /* A second instance in the same job opens and closes as well. */
    tp = ct_open(ctx, arg->transport);
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.open.both"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(open_gives_an_endpoint_per_peer_with_2_3_4_ranks)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, open_body, transport, 0, NULL);
}

/* ---- caller memory (gs_mr_reg) --------------------------------------------------------------------- */

static void user_mem_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    const size_t len = 256 * KIB + 5;
    uint8_t *mem = malloc(len + 64), *out = malloc(len);
    gs_mr *mr = NULL, *omr = NULL;
    gs_rmr *all;
    bool can = (ct_caps(tp) & GS_TP_CAP_USER_MEM) != 0;

    GS_ASSERT(mem && out);
    if (!can) {
        GS_ASSERT_STATUS(gs_mr_reg(tp, mem + 1, len, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE, &mr),
                         GS_ERR_UNSUPPORTED);
        free(mem);
        free(out);
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("caller memory cannot be registered for remote access on this host");
    }
    ct_fill(mem + 1, len, (uint32_t)rank);
    GS_ASSERT_OK(gs_mr_reg(tp, mem + 1, len,
                           GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_READ, &mr));
    GS_ASSERT_OK(gs_mr_reg(tp, out, len, GS_ACCESS_LOCAL_WRITE, &omr));
    all = ct_exchange(ctx, "ct.user.rmr", mr);
    if (rank == 0) {
        /* read the peer's memory, then write it back incremented by one pattern */
        CT_POST(tp, gs_ep_read(gs_tp_ep(tp, 1), out, omr, len, &all[1], 0, 1, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_READ, 1);
        GS_ASSERT_EQ(ct_check(out, len, 1), len);
        ct_fill(out, len - 3, 5);
        CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 1), out, omr, len - 3, &all[1], 3, 5, 2, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_WRITE_IMM, 1);
    } else {
        GS_ASSERT_EQ(ct_expect(tp, GS_WC_RECV_IMM, 0).imm, 5);
        GS_ASSERT_EQ(ct_check(mem + 1 + 3, len - 3, 5), len - 3);
        GS_ASSERT_EQ(ct_check(mem + 1, 3, 1), 3);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.user.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_mr_dereg(omr));
    GS_ASSERT_OK(gs_tp_close(tp));
    free(mem);
    free(out);
}

GS_TEST_TP(caller_memory_is_written_and_read_where_supported)
{
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = CT_TIMEOUT_MS, .rank_timeout_ms = 20000};
    ct_arg arg = {.transport = transport};
    int status[2];
    gs_test_run_ranks_opts(&opts, user_mem_body, &arg, status);
    /* both ranks skip together, or both pass */
    if (WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 77 && WIFEXITED(status[1]) &&
        WEXITSTATUS(status[1]) == 77)
        GS_SKIP("caller memory cannot be registered for remote access on this host");
    GS_ASSERT_RANK_EXIT(status[0], 0);
    GS_ASSERT_RANK_EXIT(status[1], 0);
}
