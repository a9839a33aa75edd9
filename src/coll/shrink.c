/*
 * gs_comm_shrink: the survivors' communicator after a lost rank.
 *
 *   1. agree: every survivor asks the store which of comm's ranks are in
 *      (bootstrap/survivors.c; the store server decides, store_agree.c);
 *   2. renumber: the ranks that are in, in comm's rank order;
 *   3. rebuild: a group context of those ranks, a transport of comm's kind
 *      with fresh connections and a communicator on it (split.c's way).
 *
 * The group context hangs from the root context (the application's), not
 * from comm's: a communicator shrunk from a shrunk one outlives its parent.
 * Its name hashes comm's place (its context's prefix and id) and the
 * shrink's number, the same on every survivor.
 */
#include "coll/coll.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>

static gs_ctx *root_ctx(gs_ctx *ctx)
{
    while (ctx->parent)
        ctx = ctx->parent;
    return ctx;
}

static uint64_t shrink_hash(const gs_comm *comm, unsigned serial)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = comm->ctx->prefix; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h = (h ^ comm->id) * 1099511628211ull;
    return (h ^ serial) * 1099511628211ull;
}

/* The root context's ranks of the survivors, in comm's order; their count. */
static int survivors(const gs_comm *comm, const uint8_t *in, int *members)
{
    int n = 0;
    for (int r = 0; r < comm->size; r++)
        if (in[r])
            members[n++] = gs_boot_world_rank(comm->ctx, r);
    return n;
}

/* The peers comm's transport found lost (the external store's agreement
 * then need not wait for them). A refused write counts, as it does for the
 * collectives (chan.c): every write of a communicator lands in the peer's
 * inbox, so a refusal means the peer is gone (rxe refuses writes to a
 * killed process before its queue pair goes). */
static void seen_lost(gs_comm *comm, uint8_t *lost)
{
    char why[16];
    for (int r = 0; r < comm->size; r++) {
        gs_status st = r == comm->rank ? GS_OK : gs_tp_ep_error(gs_tp_ep(comm->tp, r), why, sizeof(why));
        lost[r] = st == GS_ERR_PEER_LOST || st == GS_ERR_REMOTE_ACCESS;
    }
}

static void log_lost(const gs_comm *comm, const uint8_t *in, int n)
{
    char lost[256];
    size_t used = 0;
    lost[0] = '\0';
    for (int r = 0; r < comm->size && used + 16 < sizeof(lost); r++)
        if (!in[r])
            used += (size_t)snprintf(lost + used, sizeof(lost) - used, "%s%d", used ? ", " : "", r);
    gs_log_info(COLL, "rank %d: shrink of communicator %u: %d of %d ranks continue%s%s", comm->rank, comm->id,
                n, comm->size, used ? "; out: " : "", lost);
}

gs_status gs_comm_shrink(gs_comm *comm, gs_comm **newcomm_p)
{
    char tag[64];
    uint8_t *in, *lost;
    int *members, n;
    unsigned serial;
    uint64_t t0 = gs_now_ns(), t1;
    gs_ctx *ctx = NULL;
    gs_status st;
    if (!comm || !newcomm_p)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "gs_comm_shrink: comm and newcomm_p must not be NULL");
    serial = comm->shrinks++;
    in = gs_calloc((size_t)comm->size, 1);
    lost = gs_calloc((size_t)comm->size, 1);
    members = gs_calloc((size_t)comm->size, sizeof(*members));
    if (!in || !lost || !members) {
        st = GS_ERR_NOMEM;
        goto out;
    }
    snprintf(tag, sizeof(tag), "coll/%u/shrink/%u", comm->id, serial);
    seen_lost(comm, lost);
    st = gs_boot_survivors(comm->ctx, tag, (int)comm->cfg->timeout_ms, lost, false, in);
    if (st != GS_OK)
        goto out;
    t1 = gs_now_ns();
    n = survivors(comm, in, members);
    log_lost(comm, in, n);
    snprintf(tag, sizeof(tag), "x%016llx", (unsigned long long)shrink_hash(comm, serial));
    st = gs_boot_ctx_group(root_ctx(comm->ctx), tag, members, n, &ctx);
    if (st == GS_OK)
        st = gs_coll_group_build(ctx, gs_tp_name(comm->tp), newcomm_p);
    if (st != GS_OK) {
        char why[512];
        snprintf(why, sizeof(why), "%s", gs_last_error());
        st = gs_fail(GS_SUBSYS_COLL, st,
                     "rank %d: shrink of communicator %u to %d ranks: building the new communicator failed "
                     "(another rank lost during the rebuild? shrink again): %s",
                     comm->rank, comm->id, n, why);
        goto out;
    }
    (*newcomm_p)->shrink_agree_ns = t1 - t0;
    (*newcomm_p)->shrink_build_ns = gs_now_ns() - t1;
out:
    free(in);
    free(lost);
    free(members);
    return st;
}

void gs_comm_shrink_times(const gs_comm *comm, uint64_t *agree_ns, uint64_t *rebuild_ns)
{
    if (agree_ns)
        *agree_ns = comm ? comm->shrink_agree_ns : 0;
    if (rebuild_ns)
        *rebuild_ns = comm ? comm->shrink_build_ns : 0;
}
