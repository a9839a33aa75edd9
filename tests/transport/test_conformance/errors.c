/* Conformance: access violations, bad arguments, a peer killed mid-stream. */
#include "ct.h"

#include <signal.h>
#include <sys/wait.h>

/* ---- access violations: GS_ERR_REMOTE_ACCESS and nothing touched ------------------------------------- */

enum {
    CT_BAD_KEY,
    CT_OUT_OF_BOUNDS,
    CT_FORGED_LENGTH,
    CT_NO_WRITE_PERMISSION,
    CT_FORGED_PERMISSION,
    CT_NO_READ_PERMISSION,
    CT_NO_ATOMIC_PERMISSION,
    CT_DEREGISTERED,
    CT_VIOLATIONS
};

static const char *const ct_violation_names[] = {"bad key",          "out of bounds",      "forged length",
                                                 "no write access",  "forged permission",  "no read access",
                                                 "no atomic access", "deregistered region"};

static unsigned ct_violation_access(int v)
{
    switch (v) {
    case CT_NO_WRITE_PERMISSION:
    case CT_FORGED_PERMISSION: return GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_READ;
    case CT_NO_READ_PERMISSION:
        return GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_ATOMIC;
    case CT_NO_ATOMIC_PERMISSION:
        return GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_READ;
    default: return GS_ACCESS_ALL;
    }
}

/* Rank 0 attempts violation v against rank 1's 4 KiB region; one fresh
 * transport per case (a verbs endpoint does not survive an access error). */
static void violation_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int v = arg->param;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all, bad;
    gs_rmr_head head;
    uint8_t *buf;
    gs_status st = GS_OK;

    if (v == CT_NO_ATOMIC_PERMISSION && !(ct_caps(tp) & GS_TP_CAP_ATOMIC)) {
        if (rank == 0)
            fprintf(stderr, "  case not run: the transport has no atomics\n");
        GS_ASSERT_OK(gs_tp_close(tp));
        return;
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, ct_violation_access(v), &mr));
    buf = gs_mr_addr(mr);
    ct_fill(buf, 4096, (uint32_t)(rank + 10));
    all = ct_exchange(ctx, "ct.viol.rmr", mr);
    if (rank == 1 && v == CT_DEREGISTERED) {
        GS_ASSERT_OK(gs_mr_dereg(mr));
        mr = NULL;
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.viol.ready"));
    if (rank == 0) {
        gs_ep *ep = gs_tp_ep(tp, 1);
        bad = all[1];
        memcpy(&head, bad.bytes, sizeof(head));
        if (v == CT_BAD_KEY)
            head.key ^= 0x5a5a0001ull;
        if (v == CT_FORGED_LENGTH)
            head.len = 8192;
        if (v == CT_FORGED_PERMISSION)
            head.access |= GS_ACCESS_REMOTE_WRITE;
        memcpy(bad.bytes, &head, sizeof(head));
        switch (v) {
        case CT_NO_READ_PERMISSION:
            st = ct_outcome(tp, gs_ep_read(ep, buf + 64, mr, 64, &bad, 0, 9, GS_OP_SIGNALED), GS_WC_READ, 1,
                            9);
            GS_ASSERT_EQ(ct_check(buf, 4096, 10), 4096); /* nothing read into my buffer */
            break;
        case CT_NO_ATOMIC_PERMISSION:
            st = ct_outcome(
                tp, gs_ep_fetch_add(ep, (uint64_t *)(void *)(buf + 512), mr, &bad, 64, 1, 9, GS_OP_SIGNALED),
                GS_WC_FETCH_ADD, 1, 9);
            GS_ASSERT_EQ(ct_check(buf, 4096, 10), 4096);
            break;
        default:
            st = ct_outcome(tp,
                            gs_ep_write(ep, buf, mr, 64, &bad,
                                        v == CT_OUT_OF_BOUNDS   ? 4096 - 32
                                        : v == CT_FORGED_LENGTH ? 4096 + 64
                                                                : 128,
                                        9, GS_OP_SIGNALED),
                            GS_WC_WRITE, 1, 9);
        }
        if (st != GS_ERR_REMOTE_ACCESS)
            gs_test_fail_here(__FILE__, __LINE__, "%s: got %s, expected GS_ERR_REMOTE_ACCESS (%s)",
                              ct_violation_names[v], gs_status_name(st), gs_last_error());
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.viol.done"));
    if (rank == 1 && mr) /* the target is untouched */
        GS_ASSERT_EQ(ct_check(buf, 4096, 11), 4096);
    free(all);
    if (mr)
        GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(access_violations_fail_with_remote_access_and_touch_nothing)
{
    for (int v = 0; v < CT_VIOLATIONS; v++) {
        fprintf(stderr, "  case: %s\n", ct_violation_names[v]);
        ct_run(2, violation_body, transport, v, NULL);
    }
}

/* ---- local argument checks --------------------------------------------------------------------------- */

static void args_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL, *ro = NULL;
    gs_rmr *all, junk;
    uint8_t *buf;
    uint64_t *w;
    gs_ep *ep = gs_tp_ep(tp, 1 - rank);

    GS_ASSERT_OK(gs_mr_alloc(tp, 8192, GS_ACCESS_ALL, &mr));
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_REMOTE_READ, &ro));
    buf = gs_mr_addr(mr);
    w = (uint64_t *)(void *)buf;
    all = ct_exchange(ctx, "ct.args.rmr", mr);
    /* the caller's own rank has no endpoint */
    GS_ASSERT_STATUS(gs_ep_write(gs_tp_ep(tp, rank), buf, mr, 8, &all[rank], 0, 0, 0), GS_ERR_INVALID);
    /* local buffer outside its region */
    GS_ASSERT_STATUS(gs_ep_write(ep, buf + 8190, mr, 8, &all[1 - rank], 0, 0, 0), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_ep_write(ep, buf, NULL, 8, &all[1 - rank], 0, 0, 0), GS_ERR_INVALID);
    /* READ into a region without local write access */
    GS_ASSERT_STATUS(gs_ep_read(ep, gs_mr_addr(ro), ro, 8, &all[1 - rank], 0, 0, 0), GS_ERR_INVALID);
    /* a descriptor of my own region on the endpoint to the peer */
    GS_ASSERT_STATUS(gs_ep_write(ep, buf, mr, 8, &all[rank], 0, 0, 0), GS_ERR_INVALID);
    /* not a descriptor at all */
    memset(&junk, 0x33, sizeof(junk));
    GS_ASSERT_STATUS(gs_ep_write(ep, buf, mr, 8, &junk, 0, 0, 0), GS_ERR_INVALID);
    /* atomics: misaligned remote word and misaligned result */
    GS_ASSERT_STATUS(gs_ep_fetch_add(ep, &w[2], mr, &all[1 - rank], 4, 1, 0, 0), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_ep_cmp_swap(ep, (uint64_t *)(void *)(buf + 3), mr, &all[1 - rank], 0, 0, 1, 0, 0),
                     GS_ERR_INVALID);
    /* SEND larger than GS_SEND_MAX */
    GS_ASSERT_STATUS(gs_ep_send(ep, buf, mr, GS_SEND_MAX + 1, 0, 0), GS_ERR_INVALID);
    /* unknown access bits, bad poll arguments */
    GS_ASSERT_STATUS(gs_mr_alloc(tp, 64, 0x100, &ro), GS_ERR_INVALID);
    {
        int n = -1;
        GS_ASSERT_STATUS(gs_tp_poll(tp, NULL, 4, &n), GS_ERR_INVALID);
        GS_ASSERT_EQ(n, -1);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.args.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_mr_dereg(ro));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(bad_arguments_are_rejected_before_anything_moves)
{
    ct_run(2, args_body, transport, 0, NULL);
}

/* ---- a peer killed mid-stream ----------------------------------------------------------------------- */

/* The last rank streams WRITE_IMMs to every other rank and is killed
 * (SIGKILL) after a few hundred; the others must get GS_ERR_PEER_LOST naming
 * it well within their deadline, having received what it sent. */
static void killed_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx), victim = size - 1;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;

    GS_ASSERT_OK(gs_mr_alloc(tp, 64 * KIB, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    /* a receive posted for a SEND that never comes; posted before the
     * exchange lets the victim start, so it cannot already be gone */
    if (rank != victim)
        GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, victim), buf + 8192, mr, 128, 4242));
    all = ct_exchange(ctx, "ct.kill.rmr", mr);
    if (rank == victim) {
        for (uint32_t m = 0; m < 300; m++)
            for (int p = 0; p < size - 1; p++)
                CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, p), buf, mr, 4096, &all[p], 0, m, 0, 0));
        raise(SIGKILL);
    } else {
        char why[64];
        uint64_t t0 = gs_now_ns();
        uint32_t got = 0;
        gs_status st = GS_OK;
        gs_wc wc;
        int n = 0;
        while (st == GS_OK) {
            st = gs_tp_wait(tp, &wc, 1, &n, -1);
            if (st != GS_OK)
                break;
            if (wc.opcode == GS_WC_RECV_IMM && wc.status == GS_OK) {
                GS_ASSERT_EQ(wc.imm, got);
                got++;
            } else {
                /* the posted receive comes back flushed (or peer lost) */
                GS_ASSERT_EQ(wc.opcode, GS_WC_RECV);
                GS_ASSERT_U64_EQ(wc.wr_id, 4242);
                GS_ASSERT(wc.status == GS_ERR_FLUSHED || wc.status == GS_ERR_PEER_LOST);
            }
        }
        fprintf(stderr, "  rank %d: %u notifications, then %s after %.0f ms\n", rank, got, gs_status_name(st),
                (double)(gs_now_ns() - t0) / 1e6);
        GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
        snprintf(why, sizeof(why), "rank %d", victim);
        GS_ASSERT_CONTAINS(gs_last_error(), why);
        GS_ASSERT(gs_now_ns() - t0 < 10000ull * 1000000ull); /* the deadline is 20 s */
        GS_ASSERT_EQ(got, 300);
        /* later posts to it fail instead of vanishing */
        st = gs_ep_write(gs_tp_ep(tp, victim), buf, mr, 8, &all[victim], 0, 1, GS_OP_SIGNALED);
        GS_ASSERT(st == GS_ERR_PEER_LOST || st == GS_ERR_FLUSHED);
        GS_ASSERT_OK(gs_mr_dereg(mr));
        GS_ASSERT_OK(gs_tp_close(tp));
        free(all);
    }
}

static void ct_run_killed(const char *transport, int n, const char *const *env)
{
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = CT_TIMEOUT_MS, .rank_timeout_ms = 20000, .env = env};
    ct_arg arg = {.transport = transport};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, killed_body, &arg, status);
    for (int r = 0; r < n - 1; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
    GS_ASSERT_RANK_SIGNAL(status[n - 1], SIGKILL);
}

GS_TEST_TP(a_peer_killed_mid_stream_is_reported_lost_in_every_mode)
{
    ct_run_killed(transport, 2, ct_env_spin);
    ct_run_killed(transport, 2, ct_env_event);
    ct_run_killed(transport, 3, ct_env_hybrid);
}
