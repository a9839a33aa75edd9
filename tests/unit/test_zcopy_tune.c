/* The send-mode choice of large collective calls (coll/zcopy.c) over a
 * transport that offers it (tcp's zcopy_mode, asked through the ops table), driven
 * with made-up call times: both modes are tried first, the faster one
 * runs (by the median of its last three times, with a 5% margin), the other is tried every GS_ZC_EXPLORE
 * calls (GS_ZC_EXPLORE_LATER once settled), a change of the faster mode is followed, and GS_TCP_ZCOPY=on/off
 * and the size floor hold. */
#include "coll/coll.h"
#include "gs_test.h"
#include "transport/tp.h"
#include "util/config.h"

#include <stdlib.h>
#include <string.h>

static const char *no_env(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    return NULL;
}

static gs_comm *tuned_comm(int mode)
{
    gs_comm *comm = calloc(1, sizeof(*comm));
    gs_config *cfg = calloc(1, sizeof(*cfg));
    gs_tp *tp = calloc(1, sizeof(*tp));
    GS_ASSERT(comm && cfg && tp);
    GS_ASSERT_OK(gs_config_parse(cfg, no_env, NULL));
    cfg->tcp_zcopy = mode;
    tp->ops = &gs_tcp_ops; /* only its zcopy_mode is asked */
    tp->cfg = cfg;
    comm->cfg = cfg;
    comm->tp = tp;
    return comm;
}

static void free_comm(gs_comm *comm)
{
    free((void *)comm->cfg);
    free(comm->tp);
    free(comm);
}

/* One call of bytes: returns whether it went by reference; it takes
 * ns_copy or ns_zcopy per byte. */
static bool call(gs_comm *comm, size_t bytes, double ns_copy, double ns_zcopy)
{
    gs_coll_op op = {.comm = comm, .kind = GS_COLL_ALLREDUCE, .count = bytes / 4, .es = 4, .zc_bytes = bytes};
    gs_coll_zc_choose(&op);
    if (op.zc_class >= 0) {
        op.start_ns = 1000;
        gs_coll_zc_record(&op, 1000 + (uint64_t)((double)bytes * (op.zcopy ? ns_zcopy : ns_copy)));
    }
    return op.zcopy;
}

GS_TEST(zcopy_tune_tries_both_then_keeps_the_faster_and_explores)
{
    gs_comm *comm = tuned_comm(GS_TCP_ZCOPY_AUTO);
    size_t bytes = 16u << 20;
    GS_ASSERT(!call(comm, bytes, 0.6, 0.4)); /* copy, zcopy, copy, zcopy first */
    GS_ASSERT(call(comm, bytes, 0.6, 0.4));
    GS_ASSERT(!call(comm, bytes, 0.6, 0.4));
    GS_ASSERT(call(comm, bytes, 0.6, 0.4));
    int copies = 0;
    for (int i = 0; i < 4 * GS_ZC_EXPLORE; i++)
        copies += !call(comm, bytes, 0.6, 0.4);
    GS_ASSERT_EQ(copies, 4); /* the slower mode: once every GS_ZC_EXPLORE calls */
    /* the processes moved: copying is faster now; followed after two tries of it */
    int zcopies = 0;
    for (int i = 0; i < 2 * GS_ZC_EXPLORE; i++)
        call(comm, bytes, 0.3, 0.4);
    for (int i = 0; i < GS_ZC_SETTLE - 4 - 6 * GS_ZC_EXPLORE; i++) /* up to call GS_ZC_SETTLE */
        zcopies += call(comm, bytes, 0.3, 0.4);
    GS_ASSERT_EQ(zcopies, 2);
    /* settled (past GS_ZC_SETTLE calls): tried less often */
    GS_ASSERT_EQ(comm->zc[GS_COLL_ALLREDUCE][2].calls, GS_ZC_SETTLE);
    zcopies = 0;
    for (int i = 0; i < 4 * GS_ZC_EXPLORE_LATER; i++)
        zcopies += call(comm, bytes, 0.3, 0.4);
    GS_ASSERT_EQ(zcopies, 4);
    /* one slow call is noise; a second among the last three is a move,
     * followed without waiting for a try */
    GS_ASSERT(!call(comm, bytes, 0.9, 0.4));
    GS_ASSERT(!call(comm, bytes, 0.3, 0.4));
    GS_ASSERT(!call(comm, bytes, 0.9, 0.4));
    GS_ASSERT(call(comm, bytes, 0.9, 0.4));
    /* within 5% the mode in use stays */
    gs_comm *close = tuned_comm(GS_TCP_ZCOPY_AUTO);
    for (int i = 0; i < 4; i++) /* the first four: copy, zcopy, copy, zcopy */
        call(close, bytes, 0.4, 0.385);
    for (int i = 4; i < GS_ZC_EXPLORE - 1; i++) /* up to the first try */
        GS_ASSERT(!call(close, bytes, 0.4, 0.385));
    free_comm(close);
    /* other sizes and kinds learn on their own */
    GS_ASSERT(!call(comm, 64u << 20, 0.6, 0.4));
    GS_ASSERT(call(comm, 64u << 20, 0.6, 0.4));
    free_comm(comm);
}

GS_TEST(zcopy_tune_obeys_the_setting_and_the_size_floor)
{
    gs_comm *on = tuned_comm(GS_TCP_ZCOPY_ON), *off = tuned_comm(GS_TCP_ZCOPY_OFF);
    gs_comm *auto_ = tuned_comm(GS_TCP_ZCOPY_AUTO);
    for (int i = 0; i < 20; i++) {
        GS_ASSERT(call(on, GS_ZC_MIN_BYTES, 0.6, 0.9));
        GS_ASSERT(!call(off, 64u << 20, 0.9, 0.1));
        GS_ASSERT(!call(on, GS_ZC_MIN_BYTES - 4, 0.9, 0.1));    /* below the floor: copied */
        GS_ASSERT(!call(auto_, GS_ZC_MIN_BYTES - 4, 0.9, 0.1)); /* and not timed */
    }
    auto_->tp->ops = &gs_shm_ops; /* a transport without zcopy_mode: the hint is never given */
    for (int i = 0; i < 20; i++)
        GS_ASSERT(!call(auto_, 64u << 20, 0.9, 0.1));
    free_comm(on);
    free_comm(off);
    free_comm(auto_);
}
