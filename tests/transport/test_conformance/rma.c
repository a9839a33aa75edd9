/* Conformance: one-sided WRITE, WRITE_IMM and READ; ordering and backlog. */
#include "ct.h"

#include <unistd.h>

/* ---- WRITE and WRITE_IMM at every size and alignment ---------------------------- */

static const size_t ct_sizes[] = {0, 1, 7, 8, 4 * KIB, MIB + 3};
static const size_t ct_offsets[] = {0, 3, 4096 + 1, 8};
#define CT_NSIZES (sizeof(ct_sizes) / sizeof(ct_sizes[0]))
#define CT_NOFFS  (sizeof(ct_offsets) / sizeof(ct_offsets[0]))
#define CT_GUARD  64u
#define CT_REGION (MIB + 3 + 8192 + 2 * CT_GUARD)

/* Rank 0 writes into rank 1 (write, or write_imm when arg->param); rank 1
 * checks the bytes and that the guard bytes around them stayed. */
static void write_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    bool imm = (arg->param & 1) != 0;
    unsigned flags = GS_OP_SIGNALED | ((arg->param & 2) ? GS_OP_STREAM : 0u);
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    int peer = 1 - rank;
    uint32_t iter = 0;

    GS_ASSERT_OK(gs_mr_alloc(tp, CT_REGION, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    memset(buf, CT_FILL, CT_REGION);
    all = ct_exchange(ctx, "ct.write.rmr", mr);
    for (size_t s = 0; s < CT_NSIZES; s++) {
        for (size_t o = 0; o < CT_NOFFS; o++, iter++) {
            size_t len = ct_sizes[s], dst_off = CT_GUARD + ct_offsets[o],
                   src_off = ct_offsets[(o + 1) % CT_NOFFS];
            if (rank == 0) {
                ct_fill(buf + src_off, len, iter);
                if (imm) {
                    CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), buf + src_off, mr, len, &all[peer],
                                                dst_off, iter, iter, flags));
                    GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_WRITE_IMM, peer).wr_id, iter);
                } else {
                    CT_POST(tp, gs_ep_write(gs_tp_ep(tp, peer), buf + src_off, mr, len, &all[peer], dst_off,
                                            iter, flags));
                    GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_WRITE, peer).wr_id, iter);
                    /* A zero-byte WRITE_IMM tells rank 1 the write is there. */
                    CT_POST(tp,
                            gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, iter, 0, 0));
                }
                ct_expect(tp, GS_WC_RECV_IMM, peer); /* rank 1 checked it */
            } else {
                gs_wc wc = ct_expect(tp, GS_WC_RECV_IMM, peer);
                GS_ASSERT_EQ(wc.imm, iter);
                GS_ASSERT_EQ(wc.len, imm ? len : 0);
                GS_ASSERT_EQ(ct_check(buf + dst_off, len, iter), len);
                GS_ASSERT_EQ(ct_check_const(buf, dst_off, CT_FILL), dst_off);
                GS_ASSERT_EQ(ct_check_const(buf + dst_off + len, CT_REGION - dst_off - len, CT_FILL),
                             CT_REGION - dst_off - len);
                memset(buf + dst_off, CT_FILL, len);
                CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, iter, 0, 0));
            }
        }
    }
    ct_finish(ctx, "ct.write.done", tp, mr, all);
}

GS_TEST_TP(write_every_size_and_alignment_lands_exactly)
{
    ct_run(2, write_body, transport, 0, NULL);
}

GS_TEST_TP(write_imm_every_size_and_alignment_lands_before_its_notification)
{
    ct_run(2, write_body, transport, 1, NULL);
}

/* GS_OP_STREAM (streaming stores on shm, a hint others ignore): the same bytes. */
GS_TEST_TP(streamed_write_and_write_imm_land_exactly)
{
    ct_run(2, write_body, transport, 2, NULL);
    ct_run(2, write_body, transport, 3, NULL);
}

/* ---- READ ----------------------------------------------------------------------------- */

static void read_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    unsigned flags = GS_OP_SIGNALED | (arg->param ? GS_OP_STREAM : 0u);
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    uint32_t iter = 0;

    GS_ASSERT_OK(gs_mr_alloc(tp, CT_REGION, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 1)
        ct_fill(buf, CT_REGION, 77);
    else
        memset(buf, CT_FILL, CT_REGION);
    all = ct_exchange(ctx, "ct.read.rmr", mr);
    if (rank == 0) {
        for (size_t s = 0; s < CT_NSIZES; s++) {
            for (size_t o = 0; o < CT_NOFFS; o++, iter++) {
                size_t len = ct_sizes[s], src_off = ct_offsets[o],
                       dst_off = CT_GUARD + ct_offsets[(o + 1) % CT_NOFFS];
                CT_POST(tp,
                        gs_ep_read(gs_tp_ep(tp, 1), buf + dst_off, mr, len, &all[1], src_off, iter, flags));
                GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_READ, 1).wr_id, iter);
                for (size_t i = 0; i < len; i++)
                    if (buf[dst_off + i] != ct_byte(77, src_off + i))
                        gs_test_fail_here(__FILE__, __LINE__, "read of %zu bytes at %zu: byte %zu differs",
                                          len, src_off, i);
                GS_ASSERT_EQ(ct_check_const(buf, dst_off, CT_FILL), dst_off);
                GS_ASSERT_EQ(ct_check_const(buf + dst_off + len, CT_REGION - dst_off - len, CT_FILL),
                             CT_REGION - dst_off - len);
                memset(buf + dst_off, CT_FILL, len);
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.read.done"));
    if (rank == 1) /* READ never changes the target */
        GS_ASSERT_EQ(ct_check(buf, CT_REGION, 77), CT_REGION);
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(read_every_size_and_alignment_returns_the_target_bytes)
{
    ct_run(2, read_body, transport, 0, NULL);
}

GS_TEST_TP(streamed_read_returns_the_target_bytes)
{
    ct_run(2, read_body, transport, 1, NULL);
}

/* ---- ordering: WRITE then WRITE_IMM under load ------------------------------------------------ */

#define CT_ORDER_SLOTS 16
#define CT_ORDER_MSGS  2000

/* Rank 0 streams unsignaled WRITEs of sequence-stamped chunks followed by a
 * zero-byte WRITE_IMM naming them; rank 1 must find each chunk whole when
 * its notification arrives. Credits (WRITE_IMM back) keep rank 0 from
 * reusing a slot rank 1 has not checked. Chunk sizes vary up to 64 KiB. */
static void order_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    const size_t slot = 64 * KIB;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    int peer = 1 - rank;

    GS_ASSERT_OK(gs_mr_alloc(tp, slot * CT_ORDER_SLOTS, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    all = ct_exchange(ctx, "ct.order.rmr", mr);
    if (rank == 0) {
        int credits = CT_ORDER_SLOTS;
        for (uint32_t m = 0; m < CT_ORDER_MSGS; m++) {
            size_t len = (m * 2654435761u) % slot + 1, at = (m % CT_ORDER_SLOTS) * slot;
            while (credits == 0) {
                ct_expect(tp, GS_WC_RECV_IMM, peer);
                credits++;
            }
            credits--;
            ct_fill(buf + at, len, m);
            CT_POST(tp, gs_ep_write(gs_tp_ep(tp, peer), buf + at, mr, len, &all[peer], at, 0, 0));
            CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, m, 0,
                                        (m % 64 == 63) ? GS_OP_SIGNALED : 0));
            if (m % 64 == 63)
                ct_expect(tp, GS_WC_WRITE_IMM, peer);
        }
        while (credits < CT_ORDER_SLOTS) {
            ct_expect(tp, GS_WC_RECV_IMM, peer);
            credits++;
        }
    } else {
        for (uint32_t m = 0; m < CT_ORDER_MSGS; m++) {
            gs_wc wc = ct_expect(tp, GS_WC_RECV_IMM, peer);
            size_t len = (m * 2654435761u) % slot + 1, at = (m % CT_ORDER_SLOTS) * slot;
            GS_ASSERT_EQ(wc.imm, m);
            if (ct_check(buf + at, len, m) != len)
                gs_test_fail_here(__FILE__, __LINE__, "message %u: %zu-byte chunk incomplete at byte %zu", m,
                                  len, ct_check(buf + at, len, m));
            CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, m, 0, 0));
        }
    }
    ct_finish(ctx, "ct.order.done", tp, mr, all);
}

GS_TEST_TP(write_then_write_imm_is_ordered_under_load)
{
    ct_run(2, order_body, transport, 0, NULL);
}

/* A receiver that polls late: the sender's notifications back up (it may see
 * GS_ERR_AGAIN and must retry) and still all arrive, in order. */
static void backlog_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    const uint32_t msgs = 6000;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;

    all = ct_region(ctx, tp, 4096, "ct.backlog.rmr", &mr);
    if (rank == 0) {
        for (uint32_t m = 0; m < msgs; m++)
            CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 1), NULL, NULL, 0, &all[1], 0, m, 0, 0));
    } else {
        usleep(100000);
        for (uint32_t m = 0; m < msgs; m++)
            GS_ASSERT_EQ(ct_expect(tp, GS_WC_RECV_IMM, 0).imm, m);
    }
    ct_finish(ctx, "ct.backlog.done", tp, mr, all);
}

GS_TEST_TP(notifications_to_a_late_poller_back_up_and_arrive_in_order)
{
    ct_run(2, backlog_body, transport, 0, NULL);
}
