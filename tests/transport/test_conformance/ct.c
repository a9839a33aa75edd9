/* The conformance suite's helpers (ct.h). */
#include "ct.h"

#include <sys/wait.h>

const char *const ct_env_spin[] = {"GS_POLL=spin", NULL};
const char *const ct_env_event[] = {"GS_POLL=event", NULL};
const char *const ct_env_hybrid[] = {"GS_POLL=hybrid", "GS_SPIN_US=20", NULL};

gs_tp *ct_open(gs_ctx *ctx, const char *transport)
{
    gs_tp *tp = NULL;
    GS_ASSERT_OK(gs_tp_open(ctx, transport, &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), transport);
    return tp;
}

unsigned ct_caps(gs_tp *tp)
{
    return tp->ops->caps(tp);
}

gs_rmr *ct_exchange(gs_ctx *ctx, const char *tag, const gs_mr *mr)
{
    gs_rmr mine, *all = calloc((size_t)gs_ctx_size(ctx), sizeof(*all));
    GS_ASSERT(all);
    gs_mr_pack(mr, &mine);
    GS_ASSERT_OK(gs_store_allgather(ctx, tag, &mine, sizeof(mine), all));
    return all;
}

gs_rmr *ct_region(gs_ctx *ctx, gs_tp *tp, size_t len, const char *tag, gs_mr **mr_p)
{
    GS_ASSERT_OK(gs_mr_alloc(tp, len, GS_ACCESS_ALL, mr_p));
    return ct_exchange(ctx, tag, *mr_p);
}

uint8_t ct_byte(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 131u + i * 7u + (i >> 8) + 1u);
}

void ct_fill(void *buf, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        ((uint8_t *)buf)[i] = ct_byte(seed, i);
}

size_t ct_check(const void *buf, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        if (((const uint8_t *)buf)[i] != ct_byte(seed, i))
            return i;
    return len;
}

size_t ct_check_const(const void *buf, size_t len, uint8_t value)
{
    for (size_t i = 0; i < len; i++)
        if (((const uint8_t *)buf)[i] != value)
            return i;
    return len;
}

/* Completions that arrived while waiting for another one. */
static gs_wc ct_stash[512];
static int ct_stashed;

static bool ct_match(const gs_wc *wc, gs_wc_opcode op, int peer, uint64_t wr_id, bool any_id)
{
    return wc->opcode == op && (peer < 0 || wc->peer == peer) && (any_id || wc->wr_id == wr_id);
}

gs_wc ct_next(gs_tp *tp, gs_wc_opcode op, int peer, uint64_t wr_id, bool any_id)
{
    for (int i = 0; i < ct_stashed; i++) {
        if (ct_match(&ct_stash[i], op, peer, wr_id, any_id)) {
            gs_wc wc = ct_stash[i];
            memmove(&ct_stash[i], &ct_stash[i + 1], (size_t)(ct_stashed - i - 1) * sizeof(gs_wc));
            ct_stashed--;
            return wc;
        }
    }
    for (;;) {
        gs_wc wcs[16];
        int n = 0;
        gs_wc found = {.opcode = 0};
        GS_ASSERT_OK(gs_tp_wait(tp, wcs, 16, &n, -1));
        for (int i = 0; i < n; i++) {
            if (!found.opcode && ct_match(&wcs[i], op, peer, wr_id, any_id)) {
                found = wcs[i];
                continue;
            }
            GS_ASSERT(ct_stashed < (int)(sizeof(ct_stash) / sizeof(ct_stash[0])));
            ct_stash[ct_stashed++] = wcs[i];
        }
        if (found.opcode)
            return found;
    }
}

gs_wc ct_expect(gs_tp *tp, gs_wc_opcode op, int peer)
{
    gs_wc wc = ct_next(tp, op, peer, 0, true);
    if (wc.status != GS_OK)
        gs_test_fail_here(__FILE__, __LINE__, "completion (opcode %d, peer %d, wr_id %llu) has status %s: %s",
                          op, wc.peer, (unsigned long long)wc.wr_id, gs_status_name(wc.status),
                          gs_last_error());
    return wc;
}

gs_status ct_outcome(gs_tp *tp, gs_status posted, gs_wc_opcode op, int peer, uint64_t wr_id)
{
    if (posted != GS_OK)
        return posted;
    return ct_next(tp, op, peer, wr_id, false).status;
}

void ct_poll_into_stash(gs_tp *tp)
{
    gs_wc wcs[8];
    int n = 0;
    GS_ASSERT_OK(gs_tp_poll(tp, wcs, 8, &n));
    for (int i = 0; i < n; i++) {
        GS_ASSERT(ct_stashed < (int)(sizeof(ct_stash) / sizeof(ct_stash[0])));
        ct_stash[ct_stashed++] = wcs[i];
    }
}

void ct_finish(gs_ctx *ctx, const char *tag, gs_tp *tp, gs_mr *mr, gs_rmr *all)
{
    GS_ASSERT_OK(gs_store_barrier(ctx, tag));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

void ct_run(int n, gs_test_rank_fn fn, const char *transport, int param, const char *const *env)
{
    ct_arg arg = {.transport = transport, .param = param};
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = CT_TIMEOUT_MS, .rank_timeout_ms = 20000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    char text[64];
    int skipped = 0;
    if (gs_test_run_ranks_opts(&opts, fn, &arg, status) == n)
        return;
    for (int r = 0; r < n; r++)
        skipped += WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 77;
    if (skipped == n)
        GS_SKIP("every rank skipped (see the reason above)");
    for (int r = 0; r < n; r++)
        fprintf(stderr, "  rank %d: %s\n", r, gs_test_status_text(status[r], text, sizeof(text)));
    gs_test_fail_here(__FILE__, __LINE__, "%s: not every one of %d ranks exited 0", transport, n);
}
