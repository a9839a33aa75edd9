/*
 * gs_comm_grow: a communicator of comm's ranks and the processes waiting
 * to join, at a point comm's ranks choose.
 *
 * A joiner is a process of the job's store whose job rank is not among
 * comm's (under gsrun a restarted rank: GS_REJOIN=1 takes a lost rank's
 * place in the store, which checked its job token at the hello). It calls
 * gs_comm_grow(ctx, NULL, &newcomm):
 *   1. puts grow/want.<w> = a fresh random nonce (w: its job rank);
 *   2. waits (GS_TIMEOUT_MS) for grow/admit.<w>.<nonce>: the new group's
 *      tag, the transport's name and the member list.
 * comm's ranks call gs_comm_grow(NULL, comm, &newcomm) together:
 *   1. comm's rank 0 probes grow/want.<w> of each job rank w not in comm
 *      (without waiting) and skips a nonce already admitted (its admit key
 *      exists: that joiner joined before and is gone again);
 *   2. broadcasts the candidates (w, nonce) over comm; none: *newcomm_p =
 *      NULL, and nothing else happens;
 *   3. rank 0 puts each candidate's admit key.
 * Then everyone, old and new, agrees through the store on who of the list
 * is alive (the survivors' agreement of gs_comm_shrink: a joiner or an old
 * rank lost meanwhile is out, never waited for) and builds a communicator
 * of those in, comm's ranks first in their order, then the joiners in job
 * rank order, over a transport of comm's kind (split.c's way).
 */
#include "coll/coll.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/alloc.h"
#include "util/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define TAG_MAX 24
#define TP_MAX  32

/* What a joiner is told: the group's tag, the transport, the member list. */
typedef struct admit_head {
    char tag[TAG_MAX];
    char tp[TP_MAX];
    uint32_t n;
} admit_head;

static gs_ctx *root_ctx(gs_ctx *ctx)
{
    while (ctx->parent)
        ctx = ctx->parent;
    return ctx;
}

static void want_key(const gs_ctx *root, int w, char *key, size_t cap)
{
    snprintf(key, cap, "%sgrow/want.%d", root->prefix, w);
}

static void admit_key(const gs_ctx *root, int w, uint64_t nonce, char *key, size_t cap)
{
    snprintf(key, cap, "%sgrow/admit.%d.%016llx", root->prefix, w, (unsigned long long)nonce);
}

/* Agrees with the others of members[0..n) (job ranks) on who is alive and
 * builds the communicator of those in; me: this process's index. */
static gs_status build(gs_ctx *root, const char *tag, const char *tp, const int *members, int n,
                       gs_comm **newcomm_p)
{
    char sub[TAG_MAX + 4];
    uint8_t *in = gs_calloc((size_t)n, 1);
    int *alive = gs_calloc((size_t)n, sizeof(*alive)), count = 0;
    gs_ctx *all = NULL, *group = NULL;
    gs_status st;
    if (!in || !alive) {
        st = GS_ERR_NOMEM;
        goto out;
    }
    snprintf(sub, sizeof(sub), "%sa", tag);
    st = gs_boot_ctx_group(root, sub, members, n, &all);
    if (st == GS_OK)
        st = gs_boot_survivors(all, "grow", (int)root->cfg.timeout_ms, NULL, true, in);
    if (st != GS_OK)
        goto out;
    for (int i = 0; i < n; i++)
        if (in[i])
            alive[count++] = members[i];
    snprintf(sub, sizeof(sub), "%sb", tag);
    st = gs_boot_ctx_group(root, sub, alive, count, &group);
    if (st == GS_OK)
        st = gs_coll_group_build(group, tp, newcomm_p); /* it owns group, also on failure */
    if (st == GS_OK)
        gs_log_info(COLL, "rank %d: grow '%s': %d of %d ranks in the new communicator", (*newcomm_p)->rank,
                    tag, count, n);
out:
    gs_ctx_destroy(all);
    free(in);
    free(alive);
    return st;
}

static gs_status join(gs_ctx *ctx, gs_comm **newcomm_p)
{
    gs_ctx *root = root_ctx(ctx);
    int w = gs_boot_world_rank(ctx, ctx->rank), *members = NULL;
    char key[GS_STORE_KEY_MAX + 1];
    size_t cap = sizeof(admit_head) + (size_t)root->size * 4, len = 0;
    uint8_t *blob = gs_calloc(cap, 1);
    admit_head head;
    uint64_t nonce = 0;
    gs_status st = GS_OK;
    if (!blob)
        return GS_ERR_NOMEM;
    if (getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce))
        st = gs_fail(GS_SUBSYS_COLL, GS_ERR_SYSTEM, "rank %d: gs_comm_grow: getrandom failed: %s", w,
                     strerror(errno));
    nonce |= 1; /* never 0 */
    want_key(root, w, key, sizeof(key));
    if (st == GS_OK)
        st = gs_boot_kv_put(root, key, &nonce, sizeof(nonce));
    admit_key(root, w, nonce, key, sizeof(key));
    if (st == GS_OK)
        st = gs_boot_kv_get(root, key, blob, cap, &len, (int)root->cfg.timeout_ms);
    if (st == GS_ERR_TIMEOUT)
        st = gs_fail(
            GS_SUBSYS_COLL, st,
            "rank %d: gs_comm_grow: no running rank admitted this process within %lld ms (the running "
            "ranks admit joiners when they call gs_comm_grow: is the job still running, and does it "
            "grow that often?)",
            w, (long long)root->cfg.timeout_ms);
    if (st != GS_OK)
        goto out;
    memcpy(&head, blob, sizeof(head));
    if (len < sizeof(head) || head.n == 0 || head.n > (uint32_t)root->size ||
        len != sizeof(head) + (size_t)head.n * 4 || !memchr(head.tag, 0, TAG_MAX) ||
        !memchr(head.tp, 0, TP_MAX)) {
        st = gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                     "rank %d: gs_comm_grow: a malformed admission (%zu bytes)", w, len);
        goto out;
    }
    members = gs_calloc(head.n, sizeof(*members));
    if (!members) {
        st = GS_ERR_NOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < head.n; i++) {
        uint32_t m;
        memcpy(&m, blob + sizeof(head) + i * 4, 4);
        members[i] = (int)m;
    }
    st = build(root, head.tag, head.tp, members, (int)head.n, newcomm_p);
out:
    free(members);
    free(blob);
    return st;
}

/* comm's rank 0: the candidates not yet admitted, as (job rank, nonce)
 * pairs after the count in cand[0]. */
static void find_candidates(gs_comm *comm, gs_ctx *root, const uint8_t *member, int64_t *cand)
{
    char key[GS_STORE_KEY_MAX + 1];
    cand[0] = 0;
    for (int w = 0; w < root->size; w++) {
        uint64_t nonce = 0;
        size_t len = 0;
        if (member[w])
            continue;
        want_key(root, w, key, sizeof(key));
        if (gs_boot_kv_probe(comm->ctx, key, &nonce, sizeof(nonce), &len) != GS_OK || len != sizeof(nonce) ||
            !nonce)
            continue;
        admit_key(root, w, nonce, key, sizeof(key));
        if (gs_boot_kv_probe(comm->ctx, key, NULL, 0, NULL) == GS_OK)
            continue; /* admitted before: that process is in, or gone */
        cand[1 + 2 * cand[0]] = w;
        cand[2 + 2 * cand[0]] = (int64_t)nonce;
        cand[0]++;
    }
}

static uint64_t grow_hash(const gs_comm *comm, unsigned serial, const int64_t *cand)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = comm->ctx->prefix; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h = (h ^ comm->id) * 1099511628211ull;
    h = (h ^ serial) * 1099511628211ull;
    for (int64_t i = 0; i < cand[0]; i++)
        h = (h ^ (uint64_t)cand[2 + 2 * i]) * 1099511628211ull;
    return h;
}

static gs_status admit(gs_comm *comm, gs_ctx *root, const char *tag, const int *members, int n,
                       const int64_t *cand)
{
    char key[GS_STORE_KEY_MAX + 1];
    size_t len = sizeof(admit_head) + (size_t)n * 4;
    uint8_t *blob = gs_calloc(len, 1);
    admit_head head = {.n = (uint32_t)n};
    gs_status st = GS_OK;
    if (!blob)
        return GS_ERR_NOMEM;
    snprintf(head.tag, sizeof(head.tag), "%s", tag);
    snprintf(head.tp, sizeof(head.tp), "%s", gs_tp_name(comm->tp));
    memcpy(blob, &head, sizeof(head));
    for (int i = 0; i < n; i++) {
        uint32_t m = (uint32_t)members[i];
        memcpy(blob + sizeof(head) + (size_t)i * 4, &m, 4);
    }
    for (int64_t i = 0; i < cand[0] && st == GS_OK; i++) {
        admit_key(root, (int)cand[1 + 2 * i], (uint64_t)cand[2 + 2 * i], key, sizeof(key));
        st = gs_boot_kv_put(comm->ctx, key, blob, len);
    }
    free(blob);
    return st;
}

static gs_status grow(gs_comm *comm, gs_comm **newcomm_p)
{
    gs_ctx *root = root_ctx(comm->ctx);
    size_t slots = 1 + 2 * (size_t)(root->size - comm->size);
    int64_t *cand = NULL;
    uint8_t *member = NULL;
    int *members = NULL, n = 0;
    char tag[TAG_MAX];
    unsigned serial = comm->grows++;
    gs_status st;
    *newcomm_p = NULL;
    if (root->size == comm->size)
        return GS_OK; /* every job rank is in comm: nobody can join */
    cand = gs_calloc(slots, sizeof(*cand));
    member = gs_calloc((size_t)root->size, 1);
    members = gs_calloc((size_t)root->size, sizeof(*members));
    if (!cand || !member || !members) {
        st = GS_ERR_NOMEM;
        goto out;
    }
    for (int r = 0; r < comm->size; r++) {
        members[n++] = gs_boot_world_rank(comm->ctx, r);
        member[members[n - 1]] = 1;
    }
    if (comm->rank == 0)
        find_candidates(comm, root, member, cand);
    st = gs_broadcast(comm, cand, cand, slots, GS_I64, 0);
    if (st != GS_OK || cand[0] == 0)
        goto out;
    if (cand[0] < 0 || (size_t)(1 + 2 * cand[0]) > slots) {
        st = gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL, "rank %d: gs_comm_grow: %lld candidates", comm->rank,
                     (long long)cand[0]);
        goto out;
    }
    for (int64_t i = 0; i < cand[0]; i++)
        members[n++] = (int)cand[1 + 2 * i]; /* found in job rank order */
    snprintf(tag, sizeof(tag), "y%016llx", (unsigned long long)grow_hash(comm, serial, cand));
    if (comm->rank == 0 && (st = admit(comm, root, tag, members, n, cand)) != GS_OK)
        goto out;
    gs_log_info(COLL, "rank %d: grow of communicator %u: %lld joiner%s", comm->rank, comm->id,
                (long long)cand[0], cand[0] == 1 ? "" : "s");
    st = build(root, tag, gs_tp_name(comm->tp), members, n, newcomm_p);
out:
    free(cand);
    free(member);
    free(members);
    return st;
}

gs_status gs_comm_grow(gs_ctx *ctx, gs_comm *comm, gs_comm **newcomm_p)
{
    gs_status st;
    if (!newcomm_p || (!ctx && !comm))
        return gs_fail(
            GS_SUBSYS_COLL, GS_ERR_INVALID,
            "gs_comm_grow: newcomm_p and one of ctx (a joiner) or comm (a running rank) must be given");
    *newcomm_p = NULL;
    st = comm ? grow(comm, newcomm_p) : join(ctx, newcomm_p);
    if (st != GS_OK && st != GS_ERR_NOMEM) {
        char why[512];
        snprintf(why, sizeof(why), "%s", gs_last_error());
        st = gs_fail(GS_SUBSYS_COLL, st, "gs_comm_grow (%s) failed: %s", comm ? "a running rank" : "a joiner",
                     why);
    }
    return st;
}
