/*
 * The verbs transport against device faults and a data path that does not
 * work: the open's data-path probe, GS_TRANSPORT=auto falling back to tcp
 * when it fails, asynchronous device events (a port really taken down, and
 * events injected into the handler the progress path calls for real ones),
 * and a control operation the device refuses.
 *
 * Each case runs real ranks over a verbs device: on a machine without one
 * they skip (counted). In the Soft-RoCE guest (tests/rxe-vm/ci.sh runs this
 * binary last) some cases change the guest's network as root: take rxe0's
 * netdev down and up, or add a second rxe device on its own dummy netdev;
 * each puts things back before it ends.
 */
#include "gs_test.h"
#include "multirank.h"
#define GS_TPC_VERBS
#include "tp_check.h"

#ifdef GS_TP_BUILT_VERBS
#include "bootstrap/boot.h"
#include "transport/verbs/verbs.h"
#include "util/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RANK_TIMEOUT_MS 5000 /* each rank's GS_TIMEOUT_MS: QP retries of about 1.9 s (GS_IB_TIMEOUT 16) */
#define RUN_TIMEOUT_MS  90000

/* Runs a shell command (the guest runs as root), failing the test if it fails. */
static void run(int n, gs_test_rank_fn fn, const char *const *env)
{
    tpc_run(n, fn, NULL, env, RANK_TIMEOUT_MS, RUN_TIMEOUT_MS);
}

static void shell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void shell(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    int rc;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    rc = system(cmd);
    if (rc != 0)
        gs_test_fail_here(__FILE__, __LINE__, "`%s` failed (status %d)", cmd, rc);
}

/* Polls the port until it is ACTIVE (or not), up to 20 s. */
static void wait_port(struct ibv_context *dctx, uint8_t port, bool active)
{
    uint64_t deadline = gs_deadline_after_ms(20000);
    for (;;) {
        struct ibv_port_attr attr;
        GS_ASSERT_EQ(ibv_query_port(dctx, port, &attr), 0);
        if ((attr.state == IBV_PORT_ACTIVE) == active)
            return;
        GS_ASSERT(!gs_deadline_passed(deadline));
        usleep(20000);
    }
}

/* ---- the data-path probe of the open ----------------------------------------------------------- */

static void probe_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    (void)arg;
    for (int peer = 0; peer < gs_ctx_size(ctx); peer++) {
        gs_verbs_ep *ep = (gs_verbs_ep *)gs_tp_ep(tp, peer);
        if (peer == rank)
            continue;
        /* the probe READ was the first work request of every queue pair, and it completed */
        GS_ASSERT(ep->sq_posted >= 1);
        GS_ASSERT(ep->slots[0].kind == GS_VERBS_SLOT_PROBE);
        GS_ASSERT(!ep->probe_outstanding);
        GS_ASSERT_EQ(ep->state, GS_VERBS_EP_READY);
    }
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(the_open_probes_every_peer_over_the_data_path)
{
    tpc_need_device();
    run(3, probe_body, NULL);
}

/* ---- a data path that does not work: auto falls back to tcp, explicit verbs fails ---------------- */

/*
 * A second Soft-RoCE device on its own dummy netdev and subnet. Its ports are
 * ACTIVE and the store works, but RoCE packets from rxe0 to its address are
 * routed to the local host through lo, where no rxe device listens, so they
 * are dropped: two fabrics that do not meet. Rank 0 uses rxe0, rank 1 this one.
 */
#define SECOND_DEV "gsrxe1"
#define SECOND_IF  "gsdummy1"

static pid_t second_owner;

static void second_device_remove(void)
{
    if (getpid() != second_owner)
        return; /* a forked rank inherits atexit handlers */
    if (system("rdma link delete " SECOND_DEV " 2>/dev/null; ip link delete " SECOND_IF " 2>/dev/null") != 0)
        fprintf(stderr, "removing %s and %s failed\n", SECOND_DEV, SECOND_IF);
}

static void second_device_add(void)
{
    struct ibv_device **list;
    int n = 0;
    second_owner = getpid();
    second_device_remove(); /* a leftover of an earlier run */
    atexit(second_device_remove);
    shell("ip link add " SECOND_IF " type dummy && ip addr add 10.78.0.1/24 dev " SECOND_IF
          " && ip link set " SECOND_IF " up && rdma link add " SECOND_DEV " type rxe netdev " SECOND_IF);
    list = ibv_get_device_list(&n);
    GS_ASSERT(list);
    for (int i = 0; i < n; i++) {
        if (strcmp(ibv_get_device_name(list[i]), SECOND_DEV) == 0) {
            struct ibv_context *dctx = ibv_open_device(list[i]);
            GS_ASSERT(dctx);
            wait_port(dctx, 1, true);
            ibv_close_device(dctx);
        }
    }
    ibv_free_device_list(list);
}

/* The ranks play two hosts (so auto considers verbs, not shm), each on its own device. */
static void split_fabric(gs_ctx *ctx, int rank)
{
    const char *dev = rank == 0 ? (getenv("GS_RXE_DEVICE") ? getenv("GS_RXE_DEVICE") : "rxe0") : SECOND_DEV;
    snprintf(ctx->cfg.ib_dev, sizeof(ctx->cfg.ib_dev), "%s", dev);
    size_t len = strlen(ctx->host_id);
    if (len > sizeof(ctx->host_id) - 8)
        len = sizeof(ctx->host_id) - 8;
    snprintf(ctx->host_id + len, sizeof(ctx->host_id) - len, "/h%d", rank);
}

static void fallback_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    uint64_t t0;
    (void)arg;
    split_fabric(ctx, rank);
    GS_ASSERT_OK(gs_tp_open(ctx, "auto", &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), "tcp");
    GS_ASSERT_OK(gs_tp_close(tp));

    t0 = gs_now_ns();
    GS_ASSERT_STATUS(gs_tp_open(ctx, "verbs", &tp), GS_ERR_UNSUPPORTED);
    /* every rank names the rank whose probe failed first, its peer and its device */
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 0: the data-path probe (an 8-byte READ of peer rank 1's");
    GS_ASSERT_CONTAINS(gs_last_error(), "rxe");
    GS_ASSERT_CONTAINS(gs_last_error(), "port 1 failed");
    if (rank == 1)
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 1: verbs cannot be used: rank 0:");
    GS_ASSERT_LT(gs_now_ns() - t0, (uint64_t)RANK_TIMEOUT_MS * 1000000ull + 2000000000ull);
}

GS_TEST(a_data_path_that_does_not_work_makes_auto_choose_tcp_and_explicit_verbs_fail)
{
    tpc_need_device();
    second_device_add();
    run(2, fallback_body, NULL);
    second_device_remove();
}

/* ---- device events injected into the handler of real ones --------------------------------------- */

static void inject(gs_tp *tp, enum ibv_event_type type, struct ibv_qp *qp)
{
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    struct ibv_async_event ev = {.event_type = type};
    if (qp)
        ev.element.qp = qp;
    else
        ev.element.port_num = vt->dev.port;
    gs_verbs_async_event(vt, &ev);
}

/* A device-wide event fails every endpoint at once, with GS_ERR_IO naming device and port. */
static void device_wide(gs_ctx *ctx, int rank, enum ibv_event_type type, const char *name)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    gs_mr *mr = NULL;
    gs_wc wc;
    int n = 0;
    char where[96], done[64];

    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    GS_ASSERT_OK(gs_store_barrier(ctx, name));
    snprintf(done, sizeof(done), "%s.done", name);
    if (rank == 0) {
        uint64_t t0 = gs_now_ns();
        snprintf(where, sizeof(where), "device %s", vt->dev.name);
        inject(tp, type, NULL);
        for (int peer = 1; peer < gs_ctx_size(ctx); peer++)
            GS_ASSERT_EQ(((gs_verbs_ep *)gs_tp_ep(tp, peer))->state, GS_VERBS_EP_FAILED);
        /* a wait reports it at once, not at its deadline */
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 4000), GS_ERR_IO);
        GS_ASSERT_LT(gs_now_ns() - t0, 1000000000ull);
        GS_ASSERT_CONTAINS(gs_last_error(), where);
        GS_ASSERT_CONTAINS(gs_last_error(), name);
        /* the wait reported the endpoint to rank 1; the one to rank 2 tells its own on the next post */
        GS_ASSERT_STATUS(gs_ep_send(gs_tp_ep(tp, 2), gs_mr_addr(mr), mr, 8, 1, GS_OP_SIGNALED), GS_ERR_IO);
        GS_ASSERT_CONTAINS(gs_last_error(), "port 1");
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 2");
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, done));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

static void fatal_body(gs_ctx *ctx, int rank, void *arg)
{
    (void)arg;
    device_wide(ctx, rank, IBV_EVENT_DEVICE_FATAL, "IBV_EVENT_DEVICE_FATAL");
    device_wide(ctx, rank, IBV_EVENT_CQ_ERR, "IBV_EVENT_CQ_ERR");
}

GS_TEST(device_fatal_and_cq_error_events_fail_every_endpoint_with_io_errors)
{
    tpc_need_device();
    run(3, fatal_body, NULL);
}

/* A queue pair's fatal event fails its endpoint only (after the CQ is polled once more). */
static void qp_fatal_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_mr *mr = NULL;
    gs_rmr mine, all[3];
    gs_wc wc;
    int n = 0;
    (void)arg;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    gs_mr_pack(mr, &mine);
    GS_ASSERT_OK(gs_store_allgather(ctx, "qpf.rmr", &mine, sizeof(mine), all));
    if (rank == 0) {
        gs_verbs_ep *ep1 = (gs_verbs_ep *)gs_tp_ep(tp, 1);
        inject(tp, IBV_EVENT_QP_FATAL, ep1->qp);
        GS_ASSERT_EQ(ep1->state, GS_VERBS_EP_READY); /* applied by the next progress pass */
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 4000), GS_ERR_IO);
        GS_ASSERT_CONTAINS(gs_last_error(), "queue pair to rank 1");
        GS_ASSERT_CONTAINS(gs_last_error(), "fatal");
        GS_ASSERT_EQ(ep1->state, GS_VERBS_EP_FAILED);
        /* rank 2 is unaffected */
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 2), NULL, NULL, 0, &all[2], 0, 7, 0, 0));
    } else if (rank == 2) {
        GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &n, 4000));
        GS_ASSERT_EQ(wc.opcode, GS_WC_RECV_IMM);
        GS_ASSERT_EQ(wc.imm, 7);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "qpf.done"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_queue_pair_fatal_event_fails_that_endpoint_only)
{
    tpc_need_device();
    run(3, qp_fatal_body, NULL);
}

/* Exchanges one WRITE_IMM each way between ranks 0 and 1: the endpoints still work. */
static void round_trip(gs_ctx *ctx, gs_tp *tp, int rank, const char *tag)
{
    gs_mr *mr = NULL;
    gs_rmr mine, all[2];
    gs_wc wc;
    int n = 0;
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    gs_mr_pack(mr, &mine);
    GS_ASSERT_OK(gs_store_allgather(ctx, tag, &mine, sizeof(mine), all));
    GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, 1 - rank), NULL, NULL, 0, &all[1 - rank], 0,
                                 40u + (unsigned)rank, 0, 0));
    GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &n, 4000));
    GS_ASSERT_EQ(wc.opcode, GS_WC_RECV_IMM);
    GS_ASSERT_EQ(wc.imm, 41u - (unsigned)rank);
    GS_ASSERT_OK(gs_mr_dereg(mr));
}

/* A port that stays down past the grace (the QP retry budget) fails every endpoint, even idle ones whose
 * heartbeats still get through (here the event is injected; the port is in fact up). */
static void port_grace_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    gs_wc wc;
    int n = 0;
    (void)arg;
    if (rank == 0) {
        uint64_t t0 = gs_now_ns();
        inject(tp, IBV_EVENT_PORT_ERR, NULL);
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 4 * RANK_TIMEOUT_MS), GS_ERR_IO);
        GS_ASSERT_GE(gs_now_ns() - t0, vt->port_grace_ns);
        GS_ASSERT_CONTAINS(gs_last_error(), "was not ACTIVE again within");
        GS_ASSERT_CONTAINS(gs_last_error(), "port 1");
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "grace.done"));
    GS_ASSERT_OK(gs_tp_close(tp));

    /* down and ACTIVE again within the grace: ridden out */
    tp = tpc_open_verbs(ctx);
    vt = (gs_verbs_tp *)tp;
    if (rank == 0) {
        inject(tp, IBV_EVENT_PORT_ERR, NULL);
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, (int)(vt->port_grace_ns / 2000000u)), GS_ERR_TIMEOUT);
        inject(tp, IBV_EVENT_PORT_ACTIVE, NULL);
        GS_ASSERT_U64_EQ(vt->port_down_ns, 0);
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, (int)(vt->port_grace_ns / 1000000u)), GS_ERR_TIMEOUT);
    }
    round_trip(ctx, tp, rank, "grace.rmr");
    GS_ASSERT_OK(gs_store_barrier(ctx, "grace.done2"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_port_error_is_ridden_out_for_the_retry_budget_then_fails_the_endpoints)
{
    tpc_need_device();
    run(2, port_grace_body, NULL);
}

/* ---- a control operation the device refuses fails the endpoint ---------------------------------- */

static void ctrl_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    (void)arg;
    GS_ASSERT_OK(gs_store_barrier(ctx, "ctrl.start"));
    if (rank == 0) {
        gs_verbs_ep *ep = (gs_verbs_ep *)gs_tp_ep(tp, 1);
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RESET};
        gs_wc wc;
        int n = 0;
        /* a queue pair in RESET takes no work request: ibv_post_send fails */
        GS_ASSERT_EQ(ibv_modify_qp(ep->qp, &attr, IBV_QP_STATE), 0);
        GS_ASSERT_STATUS(gs_verbs_post_ctrl(ep, GS_VERBS_SLOT_HEARTBEAT), GS_ERR_IO);
        GS_ASSERT_EQ(ep->state, GS_VERBS_EP_FAILED);
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 4000), GS_ERR_IO);
        GS_ASSERT_CONTAINS(gs_last_error(), "heartbeat could not be posted");
        GS_ASSERT_CONTAINS(gs_last_error(), "port 1");
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ctrl.done"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_heartbeat_the_device_refuses_fails_the_endpoint)
{
    tpc_need_device();
    run(2, ctrl_body, NULL);
}

/* ---- the port really going down: ip link set <netdev> down under rxe ----------------------------- */

/* The netdev under our GID (Soft-RoCE: the one rdma link add named). */
static void netdev_of(const gs_verbs_tp *vt, char *buf, size_t cap)
{
    char path[256];
    FILE *f;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gid_attrs/ndevs/%d", vt->dev.name,
             vt->dev.port, vt->dev.gid_index);
    f = fopen(path, "r");
    GS_ASSERT(f != NULL);
    GS_ASSERT(fgets(buf, (int)cap, f) != NULL);
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    GS_ASSERT_GT(strlen(buf), 0);
}

static void port_down_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    char ndev[64], where[96];
    gs_wc wc;
    int n = 0;
    uint64_t t0;
    (void)arg;
    netdev_of(vt, ndev, sizeof(ndev));
    snprintf(where, sizeof(where), "device %s port %u", vt->dev.name, vt->dev.port);
    GS_ASSERT_OK(gs_store_barrier(ctx, "down.start"));
    t0 = gs_now_ns();
    if (rank == 0)
        shell("ip link set dev %s down", ndev);
    /* idle endpoints: the event (or the heartbeat failing while the port is down) ends the wait */
    GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 4 * RANK_TIMEOUT_MS), GS_ERR_IO);
    fprintf(stderr, "rank %d: GS_ERR_IO after %.0f ms: %s\n", rank, (double)(gs_now_ns() - t0) / 1e6,
            gs_last_error());
    GS_ASSERT_LT(gs_now_ns() - t0, (uint64_t)RANK_TIMEOUT_MS * 1000000ull);
    GS_ASSERT_CONTAINS(gs_last_error(), where);
    GS_ASSERT_CONTAINS(gs_last_error(), "IBV_EVENT_PORT_ERR");
    GS_ASSERT(vt->port_down_ns != 0);
    GS_ASSERT_OK(gs_store_barrier(ctx, "down.seen"));
    if (rank == 0)
        shell("ip link set dev %s up", ndev);
    wait_port(vt->dev.ctx, vt->dev.port, true);
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_port_that_goes_down_fails_its_endpoints_with_io_errors_naming_it)
{
    static const char *const env[] = {"GS_POLL=event", NULL};
    tpc_need_device();
    run(2, port_down_body, env);
}

/* A real flap: down for 300 ms with nothing posted, then up; the endpoints carry on. (On Soft-RoCE a
 * work request posted while the netdev is down fails at once, with no route: so nothing is posted then.) */
static void flap_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = tpc_open_verbs(ctx);
    gs_verbs_tp *vt = (gs_verbs_tp *)tp;
    char ndev[64];
    (void)arg;
    netdev_of(vt, ndev, sizeof(ndev));
    round_trip(ctx, tp, rank, "flap.rmr1"); /* every endpoint just proved alive: no heartbeat due soon */
    if (rank == 0)
        shell("ip link set dev %s down && sleep 0.3 && ip link set dev %s up", ndev, ndev);
    GS_ASSERT_OK(gs_store_barrier(ctx, "flap.up"));
    wait_port(vt->dev.ctx, vt->dev.port, true);
    round_trip(ctx, tp, rank, "flap.rmr2");
    GS_ASSERT_U64_EQ(vt->port_down_ns, 0); /* PORT_ERR and PORT_ACTIVE were both seen, in that order */
    GS_ASSERT_OK(gs_store_barrier(ctx, "flap.done"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_link_flap_shorter_than_the_retry_budget_is_ridden_out)
{
    static const char *const env[] = {"GS_POLL=event", NULL};
    tpc_need_device();
    run(2, flap_body, env);
}

#else
GS_TEST(verbs_not_built)
{
    GS_SKIP("built without libibverbs");
}
#endif
