/*
 * What the transport tests (test_shm, test_verbs_*) share: running ranks
 * with a rank deadline and an environment, and every rank's descriptor of
 * a region. The verbs tests also need a device (one is in the Soft-RoCE
 * guest, none on the build machine).
 */
#ifndef GS_TESTS_TP_CHECK_H
#define GS_TESTS_TP_CHECK_H

#include "gs_test.h"
#include "multirank.h"

#include "transport/tp.h"

#include <stdbool.h>
#include <stdlib.h>

/* n ranks of fn(arg) with env (NULL-terminated "NAME=VALUE", or NULL);
 * every one must exit 0 within rank_ms, all within run_ms. */
static inline void tpc_run(int n, gs_test_rank_fn fn, void *arg, const char *const *env, int rank_ms,
                           int run_ms)
{
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = run_ms, .rank_timeout_ms = rank_ms, .env = env};
    gs_test_run_ranks_ok(&opts, fn, arg);
}

/* Every rank's descriptor of mr, through the store under tag (free it). */
static inline gs_rmr *tpc_exchange(gs_ctx *ctx, const char *tag, const gs_mr *mr)
{
    gs_rmr mine, *all = calloc((size_t)gs_ctx_size(ctx), sizeof(*all));
    GS_ASSERT(all);
    gs_mr_pack(mr, &mine);
    GS_ASSERT_OK(gs_store_allgather(ctx, tag, &mine, sizeof(mine), all));
    return all;
}

#ifdef GS_TPC_VERBS
#include <infiniband/verbs.h>

/* Whether this machine has a verbs device. */
static inline bool tpc_have_device(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (list)
        ibv_free_device_list(list);
    return list && n > 0;
}

/* Skips the case unless it has one. */
static inline void tpc_need_device(void)
{
    if (!tpc_have_device())
        GS_SKIP("no verbs device on this machine (runs in the Soft-RoCE guest: tests/rxe-vm/ci.sh)");
}

static inline gs_tp *tpc_open_verbs(gs_ctx *ctx)
{
    gs_tp *tp = NULL;
    GS_ASSERT_OK(gs_tp_open(ctx, "verbs", &tp));
    return tp;
}
#endif

#endif
