/* Conformance: FETCH_ADD and CMP_SWAP. */
#include "ct.h"

/* ---- atomics ------------------------------------------------------------------------------- */

static void atomic_basic_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint64_t *words;

    if (!(ct_caps(tp) & GS_TP_CAP_ATOMIC)) {
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("the transport has no atomics");
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    words = gs_mr_addr(mr);
    words[0] = 1000;
    words[1] = 5;
    all = ct_exchange(ctx, "ct.atomic.rmr", mr);
    if (rank == 0) {
        gs_ep *ep = gs_tp_ep(tp, 1);
        CT_POST(tp, gs_ep_fetch_add(ep, &words[8], mr, &all[1], 0, 42, 1, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_FETCH_ADD, 1).wr_id, 1);
        GS_ASSERT_U64_EQ(words[8], 1000);
        CT_POST(tp, gs_ep_fetch_add(ep, &words[8], mr, &all[1], 0, (uint64_t)-2, 2, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_FETCH_ADD, 1);
        GS_ASSERT_U64_EQ(words[8], 1042);
        /* A failing compare returns the current value and changes nothing. */
        CT_POST(tp, gs_ep_cmp_swap(ep, &words[9], mr, &all[1], 8, 6, 99, 3, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_CMP_SWAP, 1);
        GS_ASSERT_U64_EQ(words[9], 5);
        CT_POST(tp,
                gs_ep_cmp_swap(ep, &words[9], mr, &all[1], 8, 5, 0xffffffffffffffffull, 4, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_CMP_SWAP, 1);
        GS_ASSERT_U64_EQ(words[9], 5);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.atomic.done"));
    if (rank == 1) {
        GS_ASSERT_U64_EQ(words[0], 1040);
        GS_ASSERT_U64_EQ(words[1], 0xffffffffffffffffull);
    }
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(atomics_return_the_old_value)
{
    ct_run(2, atomic_basic_body, transport, 0, NULL);
}

#define CT_ATOMIC_ITERS 300

/* Every rank adds to every other rank's counter (word 0) with FETCH_ADD and
 * with a CMP_SWAP loop (word 1); the old values a rank saw on one counter
 * never repeat across ranks, so their sums add up exactly. */
static void atomic_contention_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx);
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint64_t *words, *sums, *all_sums;

    if (!(ct_caps(tp) & GS_TP_CAP_ATOMIC)) {
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("the transport has no atomics");
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    words = gs_mr_addr(mr);
    sums = calloc((size_t)size, sizeof(*sums));
    all_sums = calloc((size_t)size * (size_t)size, sizeof(*all_sums));
    GS_ASSERT(sums && all_sums);
    all = ct_exchange(ctx, "ct.contend.rmr", mr);
    for (int i = 0; i < CT_ATOMIC_ITERS; i++) {
        for (int p = 0; p < size; p++) {
            uint64_t seen;
            if (p == rank)
                continue;
            CT_POST(tp, gs_ep_fetch_add(gs_tp_ep(tp, p), &words[16], mr, &all[p], 0, 1, 0, GS_OP_SIGNALED));
            ct_expect(tp, GS_WC_FETCH_ADD, p);
            sums[p] += words[16];
            /* compare-and-swap increment: retry with the value it returned */
            seen = 0;
            for (;;) {
                CT_POST(tp, gs_ep_cmp_swap(gs_tp_ep(tp, p), &words[17], mr, &all[p], 8, seen, seen + 3, 0,
                                           GS_OP_SIGNALED));
                ct_expect(tp, GS_WC_CMP_SWAP, p);
                if (words[17] == seen)
                    break;
                seen = words[17];
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.contend.done"));
    GS_ASSERT_U64_EQ(words[0], (uint64_t)(size - 1) * CT_ATOMIC_ITERS);
    GS_ASSERT_U64_EQ(words[1], (uint64_t)(size - 1) * CT_ATOMIC_ITERS * 3);
    GS_ASSERT_OK(gs_store_allgather(ctx, "ct.contend.sums", sums, (size_t)size * sizeof(*sums), all_sums));
    {
        /* the old values seen on my counter are exactly 0 .. N-1 */
        uint64_t total = 0, n = (uint64_t)(size - 1) * CT_ATOMIC_ITERS;
        for (int r = 0; r < size; r++)
            total += all_sums[(size_t)r * (size_t)size + (size_t)rank];
        GS_ASSERT_U64_EQ(total, n * (n - 1) / 2);
    }
    free(sums);
    free(all_sums);
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(atomics_under_contention_from_2_3_4_ranks_count_exactly)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, atomic_contention_body, transport, 0, NULL);
}
