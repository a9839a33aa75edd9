/* verbs_probe: check, on one device, every RC operation gradsync's verbs
 * transport relies on, and print the limits that matter to it.
 *
 * Two RC queue pairs in this process are connected to each other through the
 * device (on rxe: loopback over its netdev). From QP a to QP b's memory it runs
 * WRITE, WRITE_WITH_IMM (completion through a completion channel), READ,
 * FETCH_AND_ADD, COMPARE_AND_SWAP, SEND/RECV (inline when possible) and a WRITE
 * with a wrong rkey, which must fail with a remote access error and leave the
 * target untouched, then flush the next request.
 *
 * usage: verbs_probe [device [gid_index]]   (defaults: rxe0 0); exit 0 if all pass
 */
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROBE_LEN        4096 /* one page per area */
#define PROBE_DEPTH      16
#define PROBE_TIMEOUT_MS 10000

enum { AREA_SRC, AREA_DST, AREA_BACK, AREA_ATOMIC, AREA_RECV, AREA_COUNT };

struct probe {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq_a, *cq_b; /* cq_b is armed through chan */
    struct ibv_qp *qp_a, *qp_b;
    struct ibv_mr *mr;
    char *buf; /* AREA_COUNT pages */
    int gid_index;
    union ibv_gid gid;
    enum ibv_mtu mtu;
    uint32_t max_inline;
};

static int failures;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "probe: FAIL %s:%d: ", __FILE__, __LINE__);                                      \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

static char *area(struct probe *p, int which)
{
    return p->buf + which * PROBE_LEN;
}

static struct ibv_context *open_device(const char *name)
{
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = NULL;

    for (int i = 0; list && list[i]; i++)
        if (strcmp(ibv_get_device_name(list[i]), name) == 0)
            ctx = ibv_open_device(list[i]);
    if (list)
        ibv_free_device_list(list);
    return ctx;
}

static void print_limits(struct probe *p)
{
    struct ibv_device_attr dev;
    struct ibv_port_attr port;

    if (ibv_query_device(p->ctx, &dev) || ibv_query_port(p->ctx, 1, &port))
        return;
    printf("atomic_cap %d (0 none, 1 HCA, 2 GLOB)\n", dev.atomic_cap);
    printf("max_qp_wr %d max_sge %d max_cqe %d max_mr_size 0x%llx\n", dev.max_qp_wr, dev.max_sge, dev.max_cqe,
           (unsigned long long)dev.max_mr_size);
    printf("max_qp_rd_atom %d max_qp_init_rd_atom %d\n", dev.max_qp_rd_atom, dev.max_qp_init_rd_atom);
    printf("port state %d active_mtu %d (3=1024 5=4096) max_msg_sz %u link_layer %d\n", port.state,
           port.active_mtu, port.max_msg_sz, port.link_layer);
    for (int i = 0; i < port.gid_tbl_len && i < 8; i++) {
        union ibv_gid g;
        char s[64];
        if (ibv_query_gid(p->ctx, 1, i, &g) || !g.global.interface_id)
            break;
        for (int k = 0; k < 16; k += 2)
            sprintf(s + k / 2 * 5, "%02x%02x%s", g.raw[k], g.raw[k + 1], k < 14 ? ":" : "");
        printf("gid[%d] %s\n", i, s);
    }
    p->mtu = port.active_mtu;
}

static struct ibv_qp *create_qp(struct probe *p, struct ibv_cq *cq, uint32_t inline_len)
{
    struct ibv_qp_init_attr attr = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = PROBE_DEPTH,
                .max_recv_wr = PROBE_DEPTH,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = inline_len},
        .qp_type = IBV_QPT_RC,
    };
    return ibv_create_qp(p->pd, &attr);
}

/* Largest max_inline_data a QP accepts (binary search up to 64 KiB). */
static uint32_t find_max_inline(struct probe *p)
{
    uint32_t lo = 0, hi = 65536;

    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        struct ibv_qp *qp = create_qp(p, p->cq_a, mid);
        if (qp) {
            ibv_destroy_qp(qp);
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

static int setup(struct probe *p, const char *dev_name)
{
    int access =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

    p->ctx = open_device(dev_name);
    if (!p->ctx)
        return fprintf(stderr, "probe: cannot open device %s\n", dev_name), -1;
    print_limits(p);
    p->pd = ibv_alloc_pd(p->ctx);
    p->chan = ibv_create_comp_channel(p->ctx);
    p->cq_a = ibv_create_cq(p->ctx, 2 * PROBE_DEPTH, NULL, NULL, 0);
    p->cq_b = ibv_create_cq(p->ctx, 2 * PROBE_DEPTH, NULL, p->chan, 0);
    if (!p->pd || !p->chan || !p->cq_a || !p->cq_b)
        return fprintf(stderr, "probe: pd/channel/cq creation failed\n"), -1;
    p->max_inline = find_max_inline(p);
    printf("max_inline_data %u (largest accepted at QP creation)\n", p->max_inline);
    p->qp_a = create_qp(p, p->cq_a, p->max_inline < 256 ? p->max_inline : 256);
    p->qp_b = create_qp(p, p->cq_b, 0);
    if (posix_memalign((void **)&p->buf, 4096, AREA_COUNT * PROBE_LEN))
        return -1;
    memset(p->buf, 0, AREA_COUNT * PROBE_LEN);
    p->mr = ibv_reg_mr(p->pd, p->buf, AREA_COUNT * PROBE_LEN, access);
    if (!p->qp_a || !p->qp_b || !p->mr)
        return fprintf(stderr, "probe: qp or mr creation failed\n"), -1;
    if (ibv_query_gid(p->ctx, 1, p->gid_index, &p->gid))
        return fprintf(stderr, "probe: no gid %d\n", p->gid_index), -1;
    return 0;
}

/* RESET -> INIT -> RTR -> RTS towards remote QP number dest_qpn. */
static int connect_qp(struct probe *p, struct ibv_qp *qp, uint32_t dest_qpn)
{
    struct ibv_qp_attr init = {
        .qp_state = IBV_QPS_INIT,
        .port_num = 1,
        .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
    };
    struct ibv_qp_attr rtr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = p->mtu,
        .dest_qp_num = dest_qpn,
        .rq_psn = 0,
        .max_dest_rd_atomic = 16,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1,
                    .port_num = 1,
                    .grh = {.dgid = p->gid, .sgid_index = p->gid_index, .hop_limit = 1}},
    };
    struct ibv_qp_attr rts = {
        .qp_state = IBV_QPS_RTS,
        .timeout = 14,
        .retry_cnt = 7,
        .rnr_retry = 7,
        .sq_psn = 0,
        .max_rd_atomic = 16,
    };

    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return fprintf(stderr, "probe: INIT failed\n"), -1;
    if (ibv_modify_qp(qp, &rtr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return fprintf(stderr, "probe: RTR failed\n"), -1;
    if (ibv_modify_qp(qp, &rts,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC))
        return fprintf(stderr, "probe: RTS failed\n"), -1;
    return 0;
}

/* Busy-poll one completion from cq, with a deadline. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
    for (long spins = 0; spins < 200L * 1000 * 1000; spins++) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n != 0)
            return n == 1 ? 0 : -1;
    }
    fprintf(stderr, "probe: no completion (timeout)\n");
    return -1;
}

/* Wait for one completion on cq_b through the completion channel. */
static int wait_event(struct probe *p, struct ibv_wc *wc)
{
    struct pollfd pfd = {.fd = p->chan->fd, .events = POLLIN};
    struct ibv_cq *cq;
    void *cq_ctx;

    if (ibv_poll_cq(p->cq_b, 1, wc) == 1) /* already there */
        return 0;
    if (poll(&pfd, 1, PROBE_TIMEOUT_MS) != 1)
        return fprintf(stderr, "probe: no completion event (timeout)\n"), -1;
    if (ibv_get_cq_event(p->chan, &cq, &cq_ctx))
        return -1;
    ibv_ack_cq_events(cq, 1);
    ibv_req_notify_cq(cq, 0);
    return poll_one(p->cq_b, wc);
}

static int post_recv(struct probe *p, uint64_t wr_id)
{
    struct ibv_sge sge = {(uintptr_t)area(p, AREA_RECV), PROBE_LEN, p->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(p->qp_b, &wr, &bad);
}

/* Post one signaled request from qp_a; return its completion status. */
static int post_a(struct probe *p, struct ibv_send_wr *wr, struct ibv_sge *sge, struct ibv_wc *wc)
{
    struct ibv_send_wr *bad;

    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->send_flags |= IBV_SEND_SIGNALED;
    if (ibv_post_send(p->qp_a, wr, &bad))
        return fprintf(stderr, "probe: ibv_post_send failed\n"), -1;
    if (poll_one(p->cq_a, wc))
        return -1;
    return wc->status;
}

static void test_write_read(struct probe *p)
{
    struct ibv_sge sge = {(uintptr_t)area(p, AREA_SRC), PROBE_LEN, p->mr->lkey};
    struct ibv_send_wr wr = {
        .wr_id = 1, .opcode = IBV_WR_RDMA_WRITE, .wr.rdma = {(uintptr_t)area(p, AREA_DST), p->mr->rkey}};
    struct ibv_wc wc;

    for (int i = 0; i < PROBE_LEN; i++)
        area(p, AREA_SRC)[i] = (char)(i * 7 + 1);
    CHECK(post_a(p, &wr, &sge, &wc) == IBV_WC_SUCCESS, "WRITE: %s", ibv_wc_status_str(wc.status));
    CHECK(!memcmp(area(p, AREA_SRC), area(p, AREA_DST), PROBE_LEN), "WRITE: data differs");

    struct ibv_sge back = {(uintptr_t)area(p, AREA_BACK), PROBE_LEN, p->mr->lkey};
    struct ibv_send_wr rd = {
        .wr_id = 2, .opcode = IBV_WR_RDMA_READ, .wr.rdma = {(uintptr_t)area(p, AREA_DST), p->mr->rkey}};
    CHECK(post_a(p, &rd, &back, &wc) == IBV_WC_SUCCESS, "READ: %s", ibv_wc_status_str(wc.status));
    CHECK(wc.opcode == IBV_WC_RDMA_READ, "READ: opcode %d", wc.opcode);
    CHECK(!memcmp(area(p, AREA_SRC), area(p, AREA_BACK), PROBE_LEN), "READ: data differs");
    printf("WRITE, READ: %s\n", failures ? "FAIL" : "ok");
}

static void test_write_imm(struct probe *p)
{
    struct ibv_sge sge = {(uintptr_t)area(p, AREA_SRC), 512, p->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 3,
                             .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .imm_data = htobe32(0xC0FFEE),
                             .wr.rdma = {(uintptr_t)area(p, AREA_DST), p->mr->rkey}};
    struct ibv_wc wc, rwc;
    int before = failures;

    memset(area(p, AREA_SRC), 0x5A, 512);
    CHECK(post_recv(p, 30) == 0, "WRITE_IMM: post_recv");
    CHECK(ibv_req_notify_cq(p->cq_b, 0) == 0, "req_notify_cq");
    CHECK(post_a(p, &wr, &sge, &wc) == IBV_WC_SUCCESS, "WRITE_IMM: %s", ibv_wc_status_str(wc.status));
    CHECK(wait_event(p, &rwc) == 0, "WRITE_IMM: no target completion");
    CHECK(rwc.status == IBV_WC_SUCCESS && rwc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
              (rwc.wc_flags & IBV_WC_WITH_IMM) && be32toh(rwc.imm_data) == 0xC0FFEE,
          "WRITE_IMM: target completion status %d opcode %d imm 0x%x", rwc.status, rwc.opcode,
          be32toh(rwc.imm_data));
    CHECK(rwc.wr_id == 30 && rwc.byte_len == 512, "WRITE_IMM: wr_id %llu byte_len %u",
          (unsigned long long)rwc.wr_id, rwc.byte_len);
    CHECK(!memcmp(area(p, AREA_SRC), area(p, AREA_DST), 512), "WRITE_IMM: data differs");
    printf("WRITE_WITH_IMM + completion channel: %s\n", failures > before ? "FAIL" : "ok");
}

static uint64_t atomic_op(struct probe *p, enum ibv_wr_opcode op, uint64_t a, uint64_t b)
{
    uint64_t *old = (uint64_t *)area(p, AREA_BACK);
    struct ibv_sge sge = {(uintptr_t)old, 8, p->mr->lkey};
    struct ibv_send_wr wr = {
        .wr_id = 4, .opcode = op, .wr.atomic = {(uintptr_t)area(p, AREA_ATOMIC), a, b, p->mr->rkey}};
    struct ibv_wc wc;

    *old = 0xdeadbeef;
    CHECK(post_a(p, &wr, &sge, &wc) == IBV_WC_SUCCESS, "atomic %d: %s", op, ibv_wc_status_str(wc.status));
    return *old;
}

static void test_atomics(struct probe *p)
{
    uint64_t *target = (uint64_t *)area(p, AREA_ATOMIC);
    int before = failures;

    *target = 10;
    CHECK(atomic_op(p, IBV_WR_ATOMIC_FETCH_AND_ADD, 5, 0) == 10, "FETCH_ADD: old value");
    CHECK(*target == 15, "FETCH_ADD: target %llu", (unsigned long long)*target);
    CHECK(atomic_op(p, IBV_WR_ATOMIC_CMP_AND_SWP, 15, 99) == 15, "CMP_SWAP: old value");
    CHECK(*target == 99, "CMP_SWAP: target %llu", (unsigned long long)*target);
    CHECK(atomic_op(p, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 2) == 99, "CMP_SWAP miss: old value");
    CHECK(*target == 99, "CMP_SWAP miss changed the target");
    printf("FETCH_AND_ADD, COMPARE_AND_SWAP: %s\n", failures > before ? "FAIL" : "ok");
}

static void test_send_recv(struct probe *p)
{
    struct ibv_sge sge = {(uintptr_t)area(p, AREA_SRC), 64, p->mr->lkey};
    struct ibv_send_wr wr = {
        .wr_id = 5, .opcode = IBV_WR_SEND, .send_flags = p->max_inline >= 64 ? IBV_SEND_INLINE : 0};
    struct ibv_wc wc, rwc;
    int before = failures;

    memcpy(area(p, AREA_SRC), "hello over rxe", 15);
    CHECK(post_recv(p, 50) == 0, "SEND: post_recv");
    CHECK(post_a(p, &wr, &sge, &wc) == IBV_WC_SUCCESS, "SEND: %s", ibv_wc_status_str(wc.status));
    CHECK(poll_one(p->cq_b, &rwc) == 0 && rwc.status == IBV_WC_SUCCESS && rwc.opcode == IBV_WC_RECV &&
              rwc.byte_len == 64,
          "RECV: completion");
    CHECK(!strcmp(area(p, AREA_RECV), "hello over rxe"), "RECV: data differs");
    printf("SEND/RECV%s: %s\n", wr.send_flags ? " (inline)" : "", failures > before ? "FAIL" : "ok");
}

/* A wrong rkey: remote access error, target untouched, next request flushed. */
static void test_bad_rkey(struct probe *p)
{
    struct ibv_sge sge = {(uintptr_t)area(p, AREA_SRC), 64, p->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 6,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .wr.rdma = {(uintptr_t)area(p, AREA_DST), p->mr->rkey ^ 0x5500}};
    struct ibv_wc wc;
    int before = failures;

    memset(area(p, AREA_DST), 0, 64);
    memset(area(p, AREA_SRC), 0x77, 64);
    CHECK(post_a(p, &wr, &sge, &wc) == IBV_WC_REM_ACCESS_ERR, "bad rkey: got %s",
          ibv_wc_status_str(wc.status));
    CHECK(area(p, AREA_DST)[0] == 0, "bad rkey: target was written");
    wr.wr.rdma.rkey = p->mr->rkey;
    wr.send_flags = 0;
    CHECK(post_a(p, &wr, &sge, &wc) == IBV_WC_WR_FLUSH_ERR, "after error: got %s",
          ibv_wc_status_str(wc.status));
    printf("bad rkey -> REM_ACCESS_ERR, then WR_FLUSH_ERR: %s\n", failures > before ? "FAIL" : "ok");
}

int main(int argc, char **argv)
{
    struct probe p = {.gid_index = argc > 2 ? atoi(argv[2]) : 0};
    const char *dev = argc > 1 ? argv[1] : "rxe0";

    if (setup(&p, dev) || connect_qp(&p, p.qp_a, p.qp_b->qp_num) || connect_qp(&p, p.qp_b, p.qp_a->qp_num))
        return 2;
    test_write_read(&p);
    test_write_imm(&p);
    test_atomics(&p);
    test_send_recv(&p);
    test_bad_rkey(&p);
    printf("verbs_probe on %s gid %d: %s\n", dev, p.gid_index, failures ? "FAILED" : "all ok");
    return failures ? 1 : 0; /* the process exit releases the verbs objects */
}
