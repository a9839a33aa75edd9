/*
 * Several queue pairs per peer (GS_IB_QPS_PER_PEER, verbs_stripe.c): large
 * WRITEs, WRITE_IMMs and READs are striped across the lanes and land exactly,
 * a striped WRITE_IMM's notification reports its whole length, a signaled
 * completion still means every earlier operation on the endpoint is done, and
 * both sides must open the same number of queue pairs.
 *
 * Each case runs real ranks over a verbs device: on a machine without one
 * they skip (counted); tests/rxe-vm/ci.sh runs them in the Soft-RoCE guest.
 * The conformance suite runs over 4 lanes there too (GS_IB_QPS_PER_PEER=4).
 */
#include "gs_test.h"
#include "multirank.h"
#define GS_TPC_VERBS
#include "tp_check.h"

#ifdef GS_TP_BUILT_VERBS
#include "bootstrap/boot.h"
#include "transport/verbs/verbs.h"

#include <stdlib.h>
#include <string.h>

#define RANK_TIMEOUT_MS 30000
#define RUN_TIMEOUT_MS  90000
#define LANES           4
#define BIG             ((size_t)(1u << 20) + 3) /* striped at the default GS_IB_STRIPE_MIN (256 KiB) */

static void run(int n, gs_test_rank_fn fn, const char *const *env)
{
    tpc_run(n, fn, NULL, env, RANK_TIMEOUT_MS, RUN_TIMEOUT_MS);
}

static gs_wc wait_for(gs_tp *tp, gs_wc_opcode op)
{
    gs_wc wc;
    int n = 0;
    GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &n, -1));
    GS_ASSERT_EQ(n, 1);
    GS_ASSERT_STATUS(wc.status, GS_OK);
    GS_ASSERT_EQ(wc.opcode, op);
    return wc;
}

/* Posts, driving progress while the transport says GS_ERR_AGAIN. */
#define POST(tp, call)                                                                                       \
    do {                                                                                                     \
        gs_status st_;                                                                                       \
        while ((st_ = (call)) == GS_ERR_AGAIN) {                                                             \
            GS_ASSERT_OK(gs_verbs_progress((gs_verbs_tp *)(tp))); /* completions stay queued for later */    \
        }                                                                                                    \
        GS_ASSERT_STATUS(st_, GS_OK);                                                                        \
    } while (0)

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)((i * 131u + seed) >> 3);
}

/* The first byte where p differs from fill(seed), or len. */
static size_t check(const uint8_t *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)((i * 131u + seed) >> 3))
            return i;
    return len;
}

static uint64_t side_posted(gs_verbs_ep *ep)
{
    uint64_t n = 0;
    for (uint32_t l = 1; l < ep->lanes; l++)
        n += ep->side[l - 1]->sq_posted;
    return n;
}

static bool sides_idle(gs_verbs_ep *ep)
{
    for (uint32_t l = 1; l < ep->lanes; l++)
        if (ep->side[l - 1]->sq_posted != ep->side[l - 1]->sq_done)
            return false;
    return true;
}

/* Rank 0: region [0, BIG) source, [BIG, 2 BIG) READ landing; rank 1: [0, BIG) WRITE target, [BIG, 2 BIG)
 * WRITE_IMM target, [2 BIG, 3 BIG) READ source. */
static void stripes_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 3 * BIG, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 1)
        fill(buf + 2 * BIG, BIG, 3);
    all = tpc_exchange(ctx, "lanes.rmr", mr);
    if (rank == 0) {
        gs_verbs_ep *ep = (gs_verbs_ep *)gs_tp_ep(tp, 1);
        uint64_t before;
        GS_ASSERT_EQ(ep->lanes, LANES);
        fill(buf, BIG, 1);
        before = side_posted(ep);
        /* an unsignaled striped WRITE, then a small signaled one on lane 0: its completion means both done */
        POST(tp, gs_ep_write(&ep->base, buf, mr, BIG, &all[1], 0, 1, 0));
        GS_ASSERT_U64_EQ(side_posted(ep) - before, LANES - 1); /* one stripe on each side lane */
        POST(tp, gs_ep_write(&ep->base, buf, mr, 8, &all[1], 0, 2, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_WRITE).wr_id, 2);
        GS_ASSERT(sides_idle(ep));
        /* a striped WRITE_IMM: the notification comes after every stripe, with the whole length */
        fill(buf, BIG, 2);
        before = side_posted(ep);
        POST(tp, gs_ep_write_imm(&ep->base, buf, mr, BIG, &all[1], BIG, 0xfeed, 3, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(side_posted(ep) - before, LANES - 1);
        GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_WRITE_IMM).wr_id, 3);
        /* a striped READ */
        memset(buf + BIG, 0, BIG);
        POST(tp, gs_ep_read(&ep->base, buf + BIG, mr, BIG, &all[1], 2 * BIG, 4, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_READ).wr_id, 4);
        GS_ASSERT_EQ(check(buf + BIG, BIG, 3), BIG);
    } else {
        gs_wc wc = wait_for(tp, GS_WC_RECV_IMM);
        GS_ASSERT_EQ(wc.imm, 0xfeed);
        GS_ASSERT_EQ(wc.len, BIG);
        GS_ASSERT_EQ(check(buf, BIG, 1), BIG); /* the striped WRITE, whole */
        GS_ASSERT_EQ(check(buf + BIG, BIG, 2), BIG);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "lanes.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(large_writes_write_imms_and_reads_are_striped_and_land_exactly)
{
    static const char *const env[] = {"GS_IB_QPS_PER_PEER=4", NULL};
    tpc_need_device();
    run(2, stripes_body, env);
}

/* Many striped WRITEs, each followed by a small WRITE_IMM naming it: when the notification arrives the
 * whole WRITE is there (the WRITE_IMM waited for the side lanes), and notifications keep their order. */
#define ORDER_MSGS 200
#define ORDER_SLOT ((size_t)96 * 1024)

static void order_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4 * ORDER_SLOT, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    all = tpc_exchange(ctx, "lanes.order.rmr", mr);
    for (uint32_t m = 0; m < ORDER_MSGS; m++) {
        size_t at = (m % 4) * ORDER_SLOT, len = ORDER_SLOT - (m % 7) * 4099;
        if (rank == 0) {
            if (m >= 4)
                GS_ASSERT_EQ(wait_for(tp, GS_WC_RECV_IMM).imm, m - 4); /* rank 1 checked slot m % 4 */
            fill(buf + at, len, m);
            POST(tp, gs_ep_write(gs_tp_ep(tp, 1), buf + at, mr, len, &all[1], at, 0, 0));
            POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 1), NULL, NULL, 0, &all[1], 0, m, 0, 0));
        } else {
            gs_wc wc = wait_for(tp, GS_WC_RECV_IMM);
            GS_ASSERT_EQ(wc.imm, m);
            if (check(buf + at, len, m) != len)
                gs_test_fail_here(__FILE__, __LINE__, "message %u: %zu bytes incomplete at byte %zu", m, len,
                                  check(buf + at, len, m));
            POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 0), NULL, NULL, 0, &all[0], 0, m, 0, 0));
        }
    }
    if (rank == 0)
        for (uint32_t m = ORDER_MSGS - 4; m < ORDER_MSGS; m++)
            GS_ASSERT_EQ(wait_for(tp, GS_WC_RECV_IMM).imm, m);
    GS_ASSERT_OK(gs_store_barrier(ctx, "lanes.order.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_write_imm_after_striped_writes_arrives_after_all_their_stripes)
{
    static const char *const env[] = {"GS_IB_QPS_PER_PEER=4", "GS_IB_STRIPE_MIN=16K", NULL};
    tpc_need_device();
    run(2, order_body, env);
}

static void mismatch_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    (void)arg;
    ctx->cfg.ib_qps_per_peer = rank == 0 ? 2 : 4;
    GS_ASSERT_STATUS(gs_tp_open(ctx, "verbs", &tp), GS_ERR_CONFIG);
    /* every rank gives the first refusing rank's words: both counts named */
    GS_ASSERT_CONTAINS(gs_last_error(), "queue pairs per peer (GS_IB_QPS_PER_PEER), this rank");
    GS_ASSERT(strstr(gs_last_error(), "opened 4") || strstr(gs_last_error(), "opened 2"));
    GS_ASSERT(strstr(gs_last_error(), "this rank 2") || strstr(gs_last_error(), "this rank 4"));
}

GS_TEST(ranks_with_different_queue_pairs_per_peer_are_refused_naming_both)
{
    tpc_need_device();
    run(2, mismatch_body, NULL);
}

#else
GS_TEST(verbs_not_built)
{
    GS_SKIP("built without the verbs transport");
}
#endif
