/* Conformance: two-sided SEND/RECV. */
#include "ct.h"

#include <unistd.h>

/* ---- SEND / RECV ------------------------------------------------------------------------- */

static const size_t ct_send_sizes[] = {0, 1, 7, 8, 48, 49, 1000, GS_SEND_MAX};
#define CT_NSEND (sizeof(ct_send_sizes) / sizeof(ct_send_sizes[0]))

/* Rank 0 sends every size twice: first into receives posted in advance,
 * then (after a barrier) before rank 1 posts any. */
static void send_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    uint8_t *buf;
    size_t slot = GS_SEND_MAX + 64;

    GS_ASSERT_OK(gs_mr_alloc(tp, slot * CT_NSEND * 2, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    memset(buf, CT_FILL, slot * CT_NSEND * 2);
    for (int round = 0; round < 2; round++) {
        if (rank == 1 && round == 0)
            for (size_t i = 0; i < CT_NSEND; i++)
                GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + i * slot + 1, mr, slot - 1, 100 + i));
        GS_ASSERT_OK(gs_store_barrier(ctx, round ? "ct.send.r1" : "ct.send.r0"));
        if (rank == 0) {
            for (size_t i = 0; i < CT_NSEND; i++) {
                uint8_t *src = buf + i * slot + 3;
                ct_fill(src, ct_send_sizes[i], (uint32_t)(round * 100 + i));
                CT_POST(tp, gs_ep_send(gs_tp_ep(tp, 1), src, mr, ct_send_sizes[i], i, GS_OP_SIGNALED));
                GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_SEND, 1).wr_id, i);
            }
        } else {
            if (round == 1) { /* the sends are on their way or buffered: post now */
                usleep(20000);
                for (size_t i = 0; i < CT_NSEND; i++)
                    GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + (CT_NSEND + i) * slot, mr, slot, 200 + i));
            }
            for (size_t i = 0; i < CT_NSEND; i++) {
                gs_wc wc = ct_expect(tp, GS_WC_RECV, 0);
                uint8_t *dst = round ? buf + (CT_NSEND + i) * slot : buf + i * slot + 1;
                GS_ASSERT_U64_EQ(wc.wr_id, (round ? 200u : 100u) + i); /* in posting order */
                GS_ASSERT_EQ(wc.len, ct_send_sizes[i]);
                GS_ASSERT_EQ(ct_check(dst, ct_send_sizes[i], (uint32_t)(round * 100 + i)), ct_send_sizes[i]);
                GS_ASSERT_EQ(dst[ct_send_sizes[i]], CT_FILL);
            }
        }
    }
    ct_finish(ctx, "ct.send.done", tp, mr, NULL);
}

GS_TEST_TP(send_recv_every_size_posted_before_and_after_arrival)
{
    ct_run(2, send_body, transport, 0, NULL);
}

/* ---- SEND streams and receives posted late ------------------------------------------------------ */

#define CT_STREAM 1500

/* Rank 0 streams SENDs of sizes 0 .. GS_SEND_MAX; rank 1 keeps 8 receives
 * posted; every message arrives whole and in order. */
static void send_stream_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    uint8_t *buf;
    const size_t slot = GS_SEND_MAX;

    GS_ASSERT_OK(gs_mr_alloc(tp, slot * 8, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 1)
        for (uint32_t k = 0; k < 8; k++)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + k * slot, mr, slot, k));
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.stream.ready"));
    for (uint32_t m = 0; m < CT_STREAM; m++) {
        size_t len = (m * 977u) % (GS_SEND_MAX + 1);
        if (rank == 0) {
            ct_fill(buf, len, m);
            CT_POST(tp, gs_ep_send(gs_tp_ep(tp, 1), buf, mr, len, m, (m % 8 == 7) ? GS_OP_SIGNALED : 0));
            if (m % 8 == 7) /* the buffer is reused: wait until the SEND is done with it */
                ct_expect(tp, GS_WC_SEND, 1);
        } else {
            gs_wc wc = ct_expect(tp, GS_WC_RECV, 0);
            GS_ASSERT_U64_EQ(wc.wr_id, m % 8);
            GS_ASSERT_EQ(wc.len, len);
            GS_ASSERT_EQ(ct_check(buf + (m % 8) * slot, len, m), len);
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + (m % 8) * slot, mr, slot, m % 8));
        }
    }
    ct_finish(ctx, "ct.stream.done", tp, mr, NULL);
}

GS_TEST_TP(send_stream_of_mixed_sizes_arrives_whole_and_in_order)
{
    ct_run(2, send_stream_body, transport, 0, NULL);
}

/* 200 SENDs before rank 1 posts any receive: none is lost or reordered. */
static void send_early_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    const uint32_t msgs = 200;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    uint32_t *buf;

    GS_ASSERT_OK(gs_mr_alloc(tp, msgs * sizeof(uint32_t) * 2, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 0) {
        for (uint32_t m = 0; m < msgs; m++) {
            buf[m] = m * 3 + 1;
            CT_POST(tp, gs_ep_send(gs_tp_ep(tp, 1), &buf[m], mr, sizeof(uint32_t), m, 0));
        }
    } else {
        usleep(100000);
        for (uint32_t m = 0; m < msgs; m++)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), &buf[m], mr, sizeof(uint32_t), m));
        for (uint32_t m = 0; m < msgs; m++) {
            gs_wc wc = ct_expect(tp, GS_WC_RECV, 0);
            GS_ASSERT_U64_EQ(wc.wr_id, m);
            GS_ASSERT_EQ(buf[m], m * 3 + 1);
        }
    }
    ct_finish(ctx, "ct.early.done", tp, mr, NULL);
}

GS_TEST_TP(sends_before_any_receive_is_posted_are_kept_in_order)
{
    ct_run(2, send_early_body, transport, 0, NULL);
}
