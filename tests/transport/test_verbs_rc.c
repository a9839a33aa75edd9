/*
 * What the conformance suite cannot see from outside the verbs transport:
 * selective signaling and send-queue accounting, receive credits (no RNR),
 * inline sends, fences, the registration cache, RLIMIT_MEMLOCK errors, a
 * clean close that is not mistaken for a lost peer, fork safety.
 *
 * Each case runs real ranks over a verbs device: on a machine without one
 * they skip (counted); tests/rxe-vm/ci.sh runs them in the Soft-RoCE guest.
 */
#include "gs_test.h"
#include "multirank.h"
#define GS_TPC_VERBS
#include "tp_check.h"

#ifdef GS_TP_BUILT_VERBS
#include "bootstrap/boot.h"
#include "transport/verbs/verbs.h"
#include "util/clock.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define RANK_TIMEOUT_MS 20000
#define RUN_TIMEOUT_MS  60000

/* Waits for one completion of op (others are counted in *others_p if given). */
static void run(int n, gs_test_rank_fn fn, const char *const *env)
{
    tpc_run(n, fn, NULL, env, RANK_TIMEOUT_MS, RUN_TIMEOUT_MS);
}

static gs_wc wait_for(gs_tp *tp, gs_wc_opcode op, int *others_p)
{
    for (;;) {
        gs_wc wc;
        int n = 0;
        GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &n, -1));
        GS_ASSERT_EQ(n, 1);
        if (wc.opcode == op)
            return wc;
        GS_ASSERT(others_p != NULL);
        (*others_p)++;
    }
}

/* Posts, polling while the transport says GS_ERR_AGAIN; counts completions seen meanwhile. */
#define POST(tp, call, seen_p)                                                                               \
    do {                                                                                                     \
        gs_status st_;                                                                                       \
        while ((st_ = (call)) == GS_ERR_AGAIN) {                                                             \
            gs_wc w_[8];                                                                                     \
            int n_ = 0;                                                                                      \
            GS_ASSERT_OK(gs_tp_poll(tp, w_, 8, &n_));                                                        \
            *(seen_p) += n_;                                                                                 \
        }                                                                                                    \
        GS_ASSERT_STATUS(st_, GS_OK);                                                                        \
    } while (0)

/* ---- selective signaling: exactly one completion per signaled op ----------------------------- */

#define UNSIGNALED_OPS 2000

static void signaling_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint64_t *words;
    int seen = 0;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    words = gs_mr_addr(mr);
    all = tpc_exchange(ctx, "sig.rmr", mr);
    if (rank == 0) {
        gs_verbs_ep *ep = (gs_verbs_ep *)gs_tp_ep(tp, 1);
        for (uint64_t i = 0; i < UNSIGNALED_OPS; i++) {
            words[i % 64] = i;
            POST(tp, gs_ep_write(&ep->base, &words[i % 64], mr, 8, &all[1], (i % 64) * 8, i, 0), &seen);
            /* the accounting never lets more than sq_depth be outstanding */
            GS_ASSERT_LE(ep->sq_posted - ep->sq_done, vt->sq_depth);
        }
        words[100] = 4242;
        POST(tp, gs_ep_write(&ep->base, &words[100], mr, 8, &all[1], 800, 77, GS_OP_SIGNALED), &seen);
        GS_ASSERT_EQ(seen, 0); /* nothing unsignaled ever completes visibly */
        GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_WRITE, NULL).wr_id, 77);
        GS_ASSERT_U64_EQ(ep->sq_done, ep->sq_posted); /* the signaled one retired everything before it */
        {
            gs_wc extra[4];
            int n = 0;
            usleep(100000);
            GS_ASSERT_OK(gs_tp_poll(tp, extra, 4, &n));
            GS_ASSERT_EQ(n, 0);
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "sig.done"));
    if (rank == 1)
        GS_ASSERT_U64_EQ(words[100], 4242);
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(unsignaled_ops_complete_silently_and_the_send_queue_never_overflows)
{
    tpc_need_device();
    run(2, signaling_body, NULL);
}

/* ---- credits: SENDs beyond the receive queue wait for the receiver, never RNR ----------------- */

#define FLOOD_SENDS 200 /* beyond the receive queue, within the user receives an endpoint queues */

static void credit_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    gs_mr *mr = NULL;
    uint32_t *buf;
    int seen = 0;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, FLOOD_SENDS * 64, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    GS_ASSERT_LT(vt->rq_depth, FLOOD_SENDS);
    if (rank == 0) {
        int again = 0;
        for (uint32_t m = 0; m < FLOOD_SENDS; m++) {
            gs_status st;
            buf[m * 16] = m;
            while ((st = gs_ep_send(gs_tp_ep(tp, 1), &buf[m * 16], mr, 64, m, 0)) == GS_ERR_AGAIN) {
                gs_wc w[4];
                int n = 0;
                again++;
                GS_ASSERT_OK(gs_tp_poll(tp, w, 4, &n));
                seen += n;
            }
            GS_ASSERT_OK(st);
        }
        GS_ASSERT_GT(again, 0); /* the receiver's late receives held the sender back */
        fprintf(stderr, "  sender waited for credits %d times\n", again);
    } else {
        usleep(300000); /* everything the receive queue holds arrives; then no more credits */
        for (uint32_t m = 0; m < FLOOD_SENDS; m++)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), &buf[m * 16], mr, 64, 1000 + m));
        for (uint32_t m = 0; m < FLOOD_SENDS; m++) {
            gs_wc wc = wait_for(tp, GS_WC_RECV, NULL);
            GS_ASSERT_OK(wc.status);
            GS_ASSERT_U64_EQ(wc.wr_id, 1000 + m);
            GS_ASSERT_EQ(buf[m * 16], m);
        }
    }
    GS_ASSERT_EQ(seen, 0);
    GS_ASSERT_OK(gs_store_barrier(ctx, "credit.done"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(sends_beyond_the_receive_queue_wait_for_credits_without_rnr)
{
    tpc_need_device();
    run(2, credit_body, NULL);
}

/* ---- inline: the source may change as soon as the post returns -------------------------------- */

static void inline_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    size_t len;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 8192, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    all = tpc_exchange(ctx, "inline.rmr", mr);
    if (vt->max_inline == 0) {
        GS_ASSERT_OK(gs_store_barrier(ctx, "inline.done"));
        GS_SKIP("the device offers no inline data");
    }
    len = vt->max_inline < 128 ? vt->max_inline : 128;
    if (rank == 0) {
        memset(buf, 0x11, len);
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 1), buf, mr, len, &all[1], 4096, 1, 0, 0));
        memset(buf, 0x22, len); /* the data went with the work request */
        GS_ASSERT_EQ(wait_for(tp, GS_WC_RECV_IMM, NULL).imm, 2);
    } else {
        gs_wc wc = wait_for(tp, GS_WC_RECV_IMM, NULL);
        GS_ASSERT_EQ(wc.len, len);
        for (size_t i = 0; i < len; i++)
            GS_ASSERT_EQ(buf[4096 + i], 0x11);
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 0), NULL, NULL, 0, &all[0], 0, 2, 0, 0));
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "inline.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(small_writes_go_inline)
{
    tpc_need_device();
    run(2, inline_body, NULL);
}

/* ---- QoS and partition: GS_IB_SL, GS_IB_TC, GS_IB_PKEY, GS_IB_TIMEOUT on the queue pairs ---------- */

static void qos_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    const gs_verbs_ep *ep = (const gs_verbs_ep *)gs_tp_ep(tp, 1 - rank);
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    (void)arg;
    memset(&attr, 0, sizeof(attr));
    GS_ASSERT_EQ(
        ibv_query_qp(ep->qp, &attr, IBV_QP_AV | IBV_QP_PKEY_INDEX | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT, &init),
        0);
    if (((const gs_verbs_tp *)tp)->dev.link_layer == IBV_LINK_LAYER_INFINIBAND)
        GS_ASSERT_EQ(attr.ah_attr.sl,
                     3);        /* RoCE has no SL on the wire (rxe reports 0): priority is the DSCP */
    if (attr.ah_attr.is_global) /* RoCE: the traffic class carries the DSCP */
        GS_ASSERT_EQ(attr.ah_attr.grh.traffic_class, 104);
    GS_ASSERT_EQ(attr.pkey_index, ((const gs_verbs_tp *)tp)->dev.pkey_index);
    GS_ASSERT_EQ(attr.timeout, gs_verbs_ack_timeout(tp->cfg));
    GS_ASSERT_EQ(attr.retry_cnt, 6);
    GS_ASSERT_OK(gs_store_barrier(ctx, "qos.done"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(service_level_traffic_class_and_partition_reach_the_queue_pairs)
{
    static const char *const env[] = {"GS_IB_SL=3", "GS_IB_TC=104", "GS_IB_PKEY=0xffff", NULL};
    tpc_need_device();
    run(2, qos_body, env);
}

static void foreign_pkey_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    (void)rank;
    (void)arg;
    GS_ASSERT_STATUS(gs_tp_open(ctx, "verbs", &tp), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_PKEY=0x1234");
    GS_ASSERT_CONTAINS(gs_last_error(), "partition table");
}

GS_TEST(a_partition_key_the_port_lacks_is_refused_naming_it)
{
    static const char *const env[] = {"GS_IB_PKEY=0x1234", NULL};
    tpc_need_device();
    run(1, foreign_pkey_body, env);
}

/* ---- per-peer control keys: rank 0's key reaches its own slot at rank 2, not rank 1's ---------- */

#define SLOT_MARK 0x600dc0deull

/* A descriptor of 8 bytes at addr in rank 2's control slots, under the key rank 2 gave rank 0. */
static gs_rmr ctrl_descriptor(const gs_mr *mr, const gs_verbs_ep *ep, uint64_t addr)
{
    gs_rmr r;
    gs_rmr_head head;
    gs_mr_pack(mr, &r);
    memcpy(&head, r.bytes, sizeof(head));
    head.owner = 2;
    head.addr = addr;
    head.len = 8;
    head.key = ep->rctrl_rkey;
    head.access = GS_ACCESS_ALL;
    memcpy(r.bytes, &head, sizeof(head));
    return r;
}

static void ctrl_key_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    if (rank == 0) {
        const gs_verbs_ep *ep = (const gs_verbs_ep *)gs_tp_ep(tp, 2);
        uint64_t *src = gs_mr_addr(mr);
        /* its own slot (a spare word): allowed */
        gs_rmr own = ctrl_descriptor(mr, ep, ep->rctrl_addr + offsetof(gs_verbs_ctrl, reserved));
        /* rank 1's slot, next to it in the same page: another key's */
        gs_rmr other = ctrl_descriptor(
            mr, ep, ep->rctrl_addr + sizeof(gs_verbs_ctrl) + offsetof(gs_verbs_ctrl, reserved));
        gs_wc wc;
        src[0] = SLOT_MARK;
        GS_ASSERT_OK(gs_ep_write(gs_tp_ep(tp, 2), src, mr, 8, &own, 0, 1, GS_OP_SIGNALED));
        wc = wait_for(tp, GS_WC_WRITE, NULL);
        GS_ASSERT_STATUS(wc.status, GS_OK);
        GS_ASSERT_OK(gs_ep_write(gs_tp_ep(tp, 2), src, mr, 8, &other, 0, 2, GS_OP_SIGNALED));
        wc = wait_for(tp, GS_WC_WRITE, NULL);
        GS_ASSERT_STATUS(wc.status, GS_ERR_REMOTE_ACCESS);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ctrlkey.done"));
    if (rank == 2) {
        const gs_verbs_tp *vt = (const gs_verbs_tp *)tp;
        GS_ASSERT_EQ(vt->ctrl[0].reserved[0], SLOT_MARK);
        GS_ASSERT_EQ(vt->ctrl[1].reserved[0], 0); /* rank 1's slot untouched */
        GS_ASSERT(vt->ctrl_peer_mr[0]->rkey != vt->ctrl_peer_mr[1]->rkey);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ctrlkey.checked"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    gs_tp_close(tp); /* rank 0 and 2's connection broke on the access error */
}

GS_TEST(a_peer_key_reaches_only_that_peers_control_slot)
{
    tpc_need_device();
    run(3, ctrl_key_body, NULL);
}

/* ---- a credit word that exceeds what was sent fails the endpoint -------------------------------- */

static void forged_credit_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    if (rank == 1) { /* writes 10^6 credits into rank 0's slot for it, with the key it was given */
        const gs_verbs_ep *ep = (const gs_verbs_ep *)gs_tp_ep(tp, 0);
        uint64_t *src = gs_mr_addr(mr);
        gs_rmr r;
        gs_rmr_head head;
        gs_wc wc;
        gs_mr_pack(mr, &r);
        memcpy(&head, r.bytes, sizeof(head));
        head.owner = 0;
        head.addr = ep->rctrl_addr + offsetof(gs_verbs_ctrl, credits);
        head.len = 8;
        head.key = ep->rctrl_rkey;
        memcpy(r.bytes, &head, sizeof(head));
        src[0] = 1000000;
        GS_ASSERT_OK(gs_ep_write(gs_tp_ep(tp, 0), src, mr, 8, &r, 0, 1, GS_OP_SIGNALED));
        wc = wait_for(tp, GS_WC_WRITE, NULL);
        GS_ASSERT_STATUS(wc.status, GS_OK);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "forged.written"));
    if (rank == 0) {
        gs_rmr *all = tpc_exchange(ctx, "forged.rmr", mr);
        GS_ASSERT_STATUS(
            gs_ep_write_imm(gs_tp_ep(tp, 1), gs_mr_addr(mr), mr, 8, &all[1], 0, 7, 1, GS_OP_SIGNALED),
            GS_ERR_PROTOCOL);
        GS_ASSERT_CONTAINS(gs_last_error(), "credit word of rank 1 reads 1000000");
        free(all);
    } else {
        free(tpc_exchange(ctx, "forged.rmr", mr));
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "forged.done"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    gs_tp_close(tp);
}

GS_TEST(credits_beyond_what_was_sent_fail_the_endpoint)
{
    tpc_need_device();
    run(2, forged_credit_body, NULL);
}

/* ---- fence: a WRITE after a READ of the same word ---------------------------------------------- */

static void fence_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint64_t *w;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    w = gs_mr_addr(mr);
    w[0] = rank == 1 ? 1111 : 0;
    all = tpc_exchange(ctx, "fence.rmr", mr);
    if (rank == 0) {
        for (uint64_t i = 0; i < 50; i++) {
            w[8] = 5000 + i;
            GS_ASSERT_OK(gs_ep_read(gs_tp_ep(tp, 1), &w[1], mr, 8, &all[1], 0, 1, 0));
            GS_ASSERT_OK(
                gs_ep_write(gs_tp_ep(tp, 1), &w[8], mr, 8, &all[1], 0, 2, GS_OP_SIGNALED | GS_OP_FENCE));
            GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_WRITE, NULL).wr_id, 2);
            GS_ASSERT_U64_EQ(w[1],
                             i == 0 ? 1111 : 5000 + i - 1); /* the READ saw the value before this WRITE */
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "fence.done"));
    if (rank == 1)
        GS_ASSERT_U64_EQ(w[0], 5049);
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(fenced_write_after_read_keeps_the_order)
{
    tpc_need_device();
    run(2, fence_body, NULL);
}

/* ---- operations longer than the port's message size: split into a chain ---------------------- */

static void long_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    const size_t len = 2 * (size_t)vt->max_msg + 4099, region = len + 8192;
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    int others = 0;

    (void)arg;
    if (vt->max_msg > (64u << 20)) {
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("the port's message size is too large to split in this guest");
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, region, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    for (size_t i = 0; i < region; i++)
        buf[i] = (uint8_t)(i * 7 + (size_t)rank);
    all = tpc_exchange(ctx, "long.rmr", mr);
    if (rank == 0) {
        /* WRITE_IMM of three chunks: the immediate comes once, after all of them */
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 1), buf + 1, mr, len, &all[1], 3, 55, 1, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_WRITE_IMM, NULL).wr_id, 1);
        GS_ASSERT_EQ(wait_for(tp, GS_WC_RECV_IMM, NULL).imm, 56); /* rank 1 checked */
        /* READ it all back into a fresh place */
        memset(buf, 0, region);
        GS_ASSERT_OK(gs_ep_read(gs_tp_ep(tp, 1), buf + 8, mr, len, &all[1], 3, 2, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(wait_for(tp, GS_WC_READ, &others).wr_id, 2);
        for (size_t i = 0; i < len; i++)
            if (buf[8 + i] != (uint8_t)((i + 1) * 7))
                gs_test_fail_here(__FILE__, __LINE__, "byte %zu of the %zu-byte READ differs", i, len);
    } else {
        gs_wc wc = wait_for(tp, GS_WC_RECV_IMM, NULL);
        GS_ASSERT_EQ(wc.imm, 55);
        GS_ASSERT_EQ(wc.len, len % vt->max_msg); /* the last chunk carries the immediate */
        for (size_t i = 0; i < len; i++)
            if (buf[3 + i] != (uint8_t)((i + 1) * 7))
                gs_test_fail_here(__FILE__, __LINE__, "byte %zu of the %zu-byte WRITE_IMM differs", i, len);
        GS_ASSERT_EQ(buf[2], (uint8_t)(2 * 7 + 1));
        GS_ASSERT_EQ(buf[3 + len], (uint8_t)((3 + len) * 7 + 1));
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 0), NULL, NULL, 0, &all[0], 0, 56, 0, 0));
    }
    GS_ASSERT_EQ(others, 0);
    GS_ASSERT_OK(gs_store_barrier(ctx, "long.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(operations_longer_than_the_port_message_size_are_chained)
{
    tpc_need_device();
    run(2, long_body, NULL);
}

/* ---- registration cache ------------------------------------------------------------------------ */

static void cache_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    const size_t len = 64 * 1024;
    uint8_t *mem = aligned_alloc(4096, len);
    gs_mr *a = NULL, *b = NULL, *c = NULL, *local = NULL, *sub = NULL, *src = NULL;
    gs_rmr ra, rb, rc, *all;
    gs_rmr_head ha, hb, hc;
    const unsigned rw = GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE;

    (void)arg;
    GS_ASSERT(mem);
    memset(mem, 0, len);
    GS_ASSERT_OK(gs_mr_reg(tp, mem, len, rw, &a));
    GS_ASSERT_OK(gs_mr_reg(tp, mem, len, rw, &b));                         /* same range and access: shared */
    GS_ASSERT_OK(gs_mr_reg(tp, mem, len, rw | GS_ACCESS_REMOTE_READ, &c)); /* more access: its own */
    GS_ASSERT_OK(gs_mr_reg(tp, mem, len, GS_ACCESS_LOCAL_WRITE, &local));
    GS_ASSERT_OK(
        gs_mr_reg(tp, mem + 4096, 100, GS_ACCESS_LOCAL_WRITE, &sub)); /* inside a local one: shared */
    GS_ASSERT(((gs_verbs_mr *)a)->reg == ((gs_verbs_mr *)b)->reg);
    GS_ASSERT(((gs_verbs_mr *)a)->reg != ((gs_verbs_mr *)c)->reg);
    GS_ASSERT(((gs_verbs_mr *)local)->reg == ((gs_verbs_mr *)sub)->reg);
    gs_mr_pack(a, &ra);
    gs_mr_pack(b, &rb);
    gs_mr_pack(c, &rc);
    memcpy(&ha, ra.bytes, sizeof(ha));
    memcpy(&hb, rb.bytes, sizeof(hb));
    memcpy(&hc, rc.bytes, sizeof(hc));
    GS_ASSERT_U64_EQ(ha.key, hb.key);
    GS_ASSERT_NE(ha.key, hc.key);
    /* Dropping one handle keeps the shared registration for the other. */
    GS_ASSERT_OK(gs_mr_dereg(a));
    all = tpc_exchange(ctx, "cache.rmr", b);
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_LOCAL_WRITE, &src));
    if (rank == 0) {
        memset(gs_mr_addr(src), 0x5c, 256);
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 1), gs_mr_addr(src), src, 256, &all[1], 1000, 3, 0, 0));
    } else {
        GS_ASSERT_EQ(wait_for(tp, GS_WC_RECV_IMM, NULL).imm, 3);
        for (size_t i = 0; i < 256; i++)
            GS_ASSERT_EQ(mem[1000 + i], 0x5c);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "cache.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(b));
    GS_ASSERT_OK(gs_mr_dereg(c));
    GS_ASSERT_OK(gs_mr_dereg(sub));
    GS_ASSERT_OK(gs_mr_dereg(local));
    GS_ASSERT_OK(gs_mr_dereg(src));
    GS_ASSERT((((gs_verbs_tp *)tp)->regs) == NULL); /* the last handle deregistered everything */
    GS_ASSERT_OK(gs_tp_close(tp));
    free(mem);
}

GS_TEST(registration_cache_shares_only_what_is_safe)
{
    tpc_need_device();
    run(2, cache_body, NULL);
}

/* ---- RLIMIT_MEMLOCK: the error quotes the limit ------------------------------------------------- */

/* Drops CAP_IPC_LOCK (root ignores the limit with it) from the effective set. */
static void drop_ipc_lock(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    GS_ASSERT_EQ(syscall(SYS_capget, &hdr, data), 0);
    data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    GS_ASSERT_EQ(syscall(SYS_capset, &hdr, data), 0);
}

static void memlock_body(gs_ctx *ctx, int rank, void *arg)
{
    struct rlimit lim = {.rlim_cur = 4u << 20, .rlim_max = 4u << 20};
    gs_tp *tp;
    gs_mr *mr = NULL;

    (void)arg;
    (void)rank;
    drop_ipc_lock();
    GS_ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &lim), 0);
    tp = tpc_open_verbs(ctx);
    GS_ASSERT_STATUS(gs_mr_alloc(tp, 64u << 20, GS_ACCESS_ALL, &mr), GS_ERR_NOMEM);
    GS_ASSERT_CONTAINS(gs_last_error(), "RLIMIT_MEMLOCK (ulimit -l) is 4096 KiB");
    GS_ASSERT_CONTAINS(gs_last_error(), "ulimit -l unlimited");
    GS_ASSERT_OK(gs_mr_alloc(tp, 64 * 1024, GS_ACCESS_ALL, &mr)); /* small ones still fit */
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(registration_beyond_memlock_names_the_limit)
{
    tpc_need_device();
    run(1, memlock_body, NULL);
}

/* ---- a clean close is not a lost peer ------------------------------------------------------------ */

static void close_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    gs_rmr *all;

    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    all = tpc_exchange(ctx, "close.rmr", mr);
    if (rank == 1) {
        GS_ASSERT_OK(gs_mr_dereg(mr));
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_ASSERT_OK(gs_store_barrier(ctx, "close.closed"));
        sleep(4); /* stays alive a while */
        GS_ASSERT_OK(gs_store_barrier(ctx, "close.done"));
        free(all);
        return;
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "close.closed"));
    if (rank == 0) {
        gs_wc wc;
        int n = 0;
        uint64_t t0 = gs_now_ns();
        /* Waiting (for rank 2, which sends nothing) only times out: rank 1 left cleanly. */
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 3000), GS_ERR_TIMEOUT);
        GS_ASSERT_GE(gs_now_ns() - t0, 2900ull * 1000000ull);
        GS_ASSERT_STATUS(gs_ep_write(gs_tp_ep(tp, 1), gs_mr_addr(mr), mr, 8, &all[1], 0, 1, GS_OP_SIGNALED),
                         GS_ERR_PEER_LOST);
        GS_ASSERT_CONTAINS(gs_last_error(), "closed");
        /* rank 2 is still there */
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 2), NULL, NULL, 0, &all[2], 0, 9, 0, 0));
    } else {
        GS_ASSERT_EQ(wait_for(tp, GS_WC_RECV_IMM, NULL).imm, 9);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "close.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_peer_that_closed_cleanly_is_not_reported_lost)
{
    static const char *const env[] = {"GS_POLL=event", NULL};
    tpc_need_device();
    run(3, close_body, env);
}

/* ---- fork safety and the single-rank job ---------------------------------------------------------- */

static void fork_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    pid_t pid;
    int status = 0;
    (void)arg;
    (void)rank;
    GS_ASSERT_EQ(gs_tp_ep(tp, 0), NULL);
    GS_ASSERT_OK(gs_mr_alloc(tp, 1 << 20, GS_ACCESS_ALL, &mr));
    ((uint8_t *)gs_mr_addr(mr))[0] = 1;
    pid = fork();
    if (pid == 0)
        _exit(0); /* a child (think: a data loader) that never touches verbs */
    GS_ASSERT_GT(pid, 0);
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ((uint8_t *)gs_mr_addr(mr))[0] = 2; /* the parent's registered page is still its own */
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(fork_safe_mode_opens_and_survives_a_fork)
{
    static const char *const env[] = {"GS_IB_FORK_SAFE=1", NULL};
    tpc_need_device();
    run(1, fork_body, env);
}

/* ---- without a device ------------------------------------------------------------------------------ */

static void no_device_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    (void)rank;
    (void)arg;
    GS_ASSERT_STATUS(gs_tp_open(ctx, "verbs", &tp), GS_ERR_UNSUPPORTED);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 0");
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_TRANSPORT=tcp");
}

GS_TEST(without_a_device_open_says_what_to_do)
{
    if (tpc_have_device())
        GS_SKIP("this machine has a verbs device");
    run(1, no_device_body, NULL);
}

#else
GS_TEST(verbs_not_built)
{
    GS_SKIP("built without libibverbs");
}
#endif
