/*
 * The survivors' agreement, the rank's side. With gradsync's own store the
 * member list (the root store's ranks of ctx's ranks) goes to the store
 * server, which decides (store_agree.c); the answer is ctx's ranks that
 * are in. With an external store, which has no connections to watch, one
 * asker decides, chosen by the store's add (the first to count 1):
 *
 *   every asker  set <key>/alive.<rank> (a byte per member: 1 for those its
 *                transport found lost), then add(<key>/decider, 1);
 *   the decider  waits until every member asked or is marked lost by a
 *                member that asked, or its deadline (a member missing then
 *                is out), then sets <key>/decision (a byte per member);
 *   the others   wait for the decision (the deadline plus a grace).
 *
 * A rank that asks after the decision gets it too (and is out). Without
 * connection state a dead member no survivor's transport saw die is known
 * only at the deadline, and a
 * decider that dies before deciding fails the agreement at the others'
 * deadline (docs/elastic.md).
 */
#include "bootstrap/store_client.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <time.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gs_ctx *root_of(gs_ctx *ctx)
{
    while (ctx->parent)
        ctx = ctx->parent;
    return ctx;
}

/* The store's failure, said as what it means for the caller. */
static gs_status store_gone(gs_ctx *ctx, const gs_ctx *root, gs_status st)
{
    char why[512], head[32];
    const char *text = gs_last_error();
    int n = snprintf(head, sizeof(head), "rank %d: ", ctx->rank);
    if (strncmp(text, head, (size_t)n) == 0) /* said once, at the front */
        text += n;
    snprintf(why, sizeof(why), "%s", text);
    return gs_fail(GS_SUBSYS_BOOT, st,
                   "rank %d: shrink: the store is gone (%s), so the survivors cannot agree: %s; a job "
                   "that must survive the loss of rank 0 needs a store that outlives it (gsrun serves "
                   "one, or pass an external store in gs_ctx_params)",
                   ctx->rank, why,
                   root->boot.store_external ? "the launcher served it"
                                             : "world rank 0 served it and is probably the rank lost");
}

#define EXT_DECISION_GRACE_MS 2000

/* Whether key is in the external store now (no error logged: polled),
 * its first cap bytes in buf. */
static bool ext_has(gs_ctx *root, const char *key, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    gs_status st;
    memset(buf, 0, cap);
    pthread_mutex_lock(&root->ext_lock);
    st = root->ext.get(root->ext.arg, key, buf, cap, &len, 1);
    pthread_mutex_unlock(&root->ext_lock);
    return st == GS_OK;
}

/* The decider: who of the members said they are alive by the deadline,
 * not waiting for those an asker saw lost. */
static gs_status ext_decide(gs_ctx *ctx, gs_ctx *root, const char *key, int timeout_ms, uint8_t *in)
{
    char k[GS_STORE_KEY_MAX + 32]; /* key is at most GS_STORE_KEY_MAX - 24 (gs_boot_survivors) */
    uint64_t deadline = gs_deadline_after_ms(timeout_ms);
    struct timespec nap = {0, 2000000};
    uint8_t *lost = gs_calloc((size_t)ctx->size, 1), *seen = gs_calloc((size_t)ctx->size, 1);
    int count = 0;
    gs_status st;
    if (!lost || !seen) {
        free(lost);
        free(seen);
        return GS_ERR_NOMEM;
    }
    memset(in, 0, (size_t)ctx->size);
    for (bool waiting = true; waiting && !gs_deadline_passed(deadline);) {
        waiting = false;
        for (int r = 0; r < ctx->size; r++) {
            snprintf(k, sizeof(k), "%s/alive.%d", key, r);
            if (!in[r] && ext_has(root, k, seen, (size_t)ctx->size)) {
                in[r] = 1;
                count++;
                for (int q = 0; q < ctx->size; q++)
                    lost[q] |= seen[q];
            }
        }
        for (int r = 0; r < ctx->size; r++)
            waiting |= !in[r] && !lost[r];
        if (waiting)
            nanosleep(&nap, NULL);
    }
    free(lost);
    free(seen);
    gs_log_info(BOOT, "rank %d: survivors '%s' decided here (external store): %d of %d members in", ctx->rank,
                key, count, ctx->size);
    snprintf(k, sizeof(k), "%s/decision", key);
    st = gs_boot_kv_put(ctx, k, in, (size_t)ctx->size);
    return st;
}

static gs_status ext_survivors(gs_ctx *ctx, gs_ctx *root, const char *key, int timeout_ms,
                               const uint8_t *seen_lost, uint8_t *in)
{
    char k[GS_STORE_KEY_MAX + 32]; /* key is at most GS_STORE_KEY_MAX - 24 (gs_boot_survivors) */
    int64_t order = 0;
    size_t len = 0;
    gs_status st;
    if (!root->ext.add)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_UNSUPPORTED,
                       "rank %d: shrink over an external store needs its add callback (to choose who "
                       "decides); this store has none",
                       ctx->rank);
    snprintf(k, sizeof(k), "%s/alive.%d", key, ctx->rank);
    if (seen_lost)
        st = gs_boot_kv_put(ctx, k, seen_lost, (size_t)ctx->size);
    else
        st = gs_boot_kv_put(ctx, k, "", 0);
    if (st == GS_OK) {
        snprintf(k, sizeof(k), "%s/decider", key);
        pthread_mutex_lock(&root->ext_lock);
        st = root->ext.add(root->ext.arg, k, 1, &order);
        pthread_mutex_unlock(&root->ext_lock);
        if (st != GS_OK)
            st = gs_fail(GS_SUBSYS_BOOT, st, "rank %d: shrink: adding to '%s' in the external store failed",
                         ctx->rank, k);
    }
    if (st == GS_OK && order == 1)
        return ext_decide(ctx, root, key, timeout_ms, in);
    if (st != GS_OK)
        return st;
    snprintf(k, sizeof(k), "%s/decision", key);
    st = gs_boot_kv_get(ctx, k, in, (size_t)ctx->size, &len, timeout_ms + EXT_DECISION_GRACE_MS);
    if (st == GS_ERR_TIMEOUT)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_TIMEOUT,
                       "rank %d: shrink: no decision '%s' in the external store within %d ms: the rank that "
                       "took the decision (the first asker) was lost before it decided",
                       ctx->rank, k, timeout_ms + EXT_DECISION_GRACE_MS);
    if (st == GS_OK && len != (size_t)ctx->size)
        st = gs_fail(GS_SUBSYS_BOOT, GS_ERR_PROTOCOL,
                     "rank %d: shrink: the decision '%s' has %zu bytes, expected %d", ctx->rank, k, len,
                     ctx->size);
    return st;
}

static gs_status server_survivors(gs_ctx *ctx, gs_ctx *root, const char *key, int timeout_ms, bool grow,
                                  uint8_t *in)
{
    size_t len = 4 + (size_t)ctx->size * 4;
    uint8_t *list = gs_calloc(len, 1);
    uint32_t n = (uint32_t)ctx->size;
    gs_store_request req = {.type = GS_STORE_SURVIVORS,
                            .key = key,
                            .len = len,
                            .arg = (uint32_t)timeout_ms,
                            .flags = grow ? GS_STORE_SURVIVORS_GROW : 0};
    gs_store_reply reply = {.buf = in, .cap = (size_t)ctx->size};
    gs_status st;
    if (!list)
        return GS_ERR_NOMEM;
    memcpy(list, &n, 4);
    for (int r = 0; r < ctx->size; r++) {
        uint32_t w = (uint32_t)gs_boot_world_rank(ctx, r);
        memcpy(list + 4 + (size_t)r * 4, &w, 4);
    }
    req.value = list;
    st = gs_boot_client_request(root->store, &req, &reply);
    free(list);
    if (st == GS_OK && reply.len != (size_t)ctx->size)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_PROTOCOL,
                       "rank %d: shrink: the store's survivors answer has %zu bytes, expected %d", ctx->rank,
                       reply.len, ctx->size);
    if (st == GS_ERR_PEER_LOST || st == GS_ERR_TIMEOUT || st == GS_ERR_SYSTEM)
        return store_gone(ctx, root, st);
    return st;
}

gs_status gs_boot_survivors(gs_ctx *ctx, const char *tag, int timeout_ms, const uint8_t *seen_lost, bool grow,
                            uint8_t *in)
{
    char key[GS_STORE_KEY_MAX + 1];
    gs_ctx *root = root_of(ctx);
    gs_status st;
    if ((size_t)snprintf(key, sizeof(key), "%s%s", ctx->prefix, tag) + 24 > sizeof(key))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "rank %d: shrink: the agreement's key '%s' is too long", ctx->rank, key);
    st = root->has_ext ? ext_survivors(ctx, root, key, timeout_ms, seen_lost, in)
                       : server_survivors(ctx, root, key, timeout_ms, grow, in);
    if (st == GS_OK && !in[ctx->rank])
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_PEER_LOST,
                       "rank %d: shrink: the survivors decided without this rank (it asked after the "
                       "deadline, or its store connection was lost): it is out of the job",
                       ctx->rank);
    return st;
}
