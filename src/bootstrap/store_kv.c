/*
 * The store built from put and get: for an external store (a framework's,
 * given as callbacks) and for groups of a context's ranks, whose ranks
 * gradsync's own server does not count. An allgather is: every rank puts
 * its part under "<prefix>kv.<n>.<tag>.<rank>" (n: the context's count of
 * such calls, the same on every rank since they call in the same order),
 * then gets every other rank's part, waiting within the deadline; a
 * barrier is an allgather of nothing. Keys stay in the store (as c10d's do).
 */
#include "bootstrap/store_client.h"

#include "util/clock.h"
#include "util/log.h"

#include <stdio.h>
#include <string.h>

static gs_ctx *root_of(gs_ctx *ctx)
{
    while (ctx->parent)
        ctx = ctx->parent;
    return ctx;
}

gs_status gs_boot_kv_put(gs_ctx *ctx, const char *key, const void *value, size_t len)
{
    gs_ctx *root = root_of(ctx);
    gs_store_request req = {.type = GS_STORE_PUT, .key = key, .value = value, .len = len};
    gs_status st;
    if (!root->has_ext)
        return gs_boot_client_request(root->store, &req, NULL);
    pthread_mutex_lock(&root->ext_lock);
    st = root->ext.set(root->ext.arg, key, value ? value : "", len); /* never NULL for the caller's code */
    pthread_mutex_unlock(&root->ext_lock);
    if (st != GS_OK)
        return gs_fail(GS_SUBSYS_BOOT, st, "rank %d: setting '%s' (%zu bytes) in the external store failed",
                       ctx->rank, key, len);
    return GS_OK;
}

/* A get on the root store; quiet: a timeout is not logged (a probe). */
static gs_status kv_request(gs_ctx *root, const char *key, void *buf, size_t cap, size_t *len_p,
                            int timeout_ms, bool quiet)
{
    gs_store_request req = {.type = GS_STORE_GET, .key = key, .arg = (uint32_t)timeout_ms, .quiet = quiet};
    gs_store_reply reply = {.buf = buf, .cap = buf ? cap : 0};
    size_t len = 0;
    char none[1];
    gs_status st;
    if (!root->has_ext) {
        st = gs_boot_client_request(root->store, &req, &reply);
        if (st == GS_OK && len_p)
            *len_p = reply.len;
        return st;
    }
    pthread_mutex_lock(&root->ext_lock);
    st = root->ext.get(root->ext.arg, key, buf ? buf : none, buf ? cap : 0, &len, timeout_ms);
    pthread_mutex_unlock(&root->ext_lock);
    if (st == GS_OK && len_p)
        *len_p = len;
    return st;
}

gs_status gs_boot_kv_get(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p, int timeout_ms)
{
    gs_ctx *root = root_of(ctx);
    gs_status st = kv_request(root, key, buf, cap, len_p, timeout_ms, false);
    if (!root->has_ext || st == GS_OK)
        return st;
    if (st == GS_ERR_TIMEOUT)
        return gs_fail(GS_SUBSYS_BOOT, st, "rank %d: '%s' did not appear in the external store within %d ms",
                       ctx->rank, key, timeout_ms);
    return gs_fail(GS_SUBSYS_BOOT, st, "rank %d: getting '%s' from the external store failed", ctx->rank,
                   key);
}

gs_status gs_boot_kv_probe(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p)
{
    return kv_request(root_of(ctx), key, buf, cap, len_p, 1, true);
}

static void part_key(const gs_ctx *ctx, unsigned n, const char *tag, int rank, char *key, size_t cap)
{
    snprintf(key, cap, "%skv.%u.%s.%d", ctx->prefix, n, tag, rank);
}

/* The ranks from `from` on whose part of call n is not there yet, as
 * "3, 5, 7" (at most a few names): what the deadline reports. */
static void missing_ranks(gs_ctx *ctx, unsigned n, const char *tag, int from, char *buf, size_t cap)
{
    size_t used = 0;
    int named = 0;
    buf[0] = '\0';
    for (int r = from; r < ctx->size && used + 16 < cap; r++) {
        char key[GS_STORE_KEY_MAX + 1];
        if (r == ctx->rank)
            continue;
        part_key(ctx, n, tag, r, key, sizeof(key));
        if (r > from && gs_boot_kv_get(ctx, key, NULL, 0, NULL, 1) == GS_OK)
            continue;
        if (named++ == 8) {
            snprintf(buf + used, cap - used, ", ...");
            break;
        }
        used += (size_t)snprintf(buf + used, cap - used, "%s%d", used ? ", " : "", r);
    }
    gs_error_clear();
}

gs_status gs_boot_kv_allgather(gs_ctx *ctx, const char *tag, const void *blob, size_t len, void *out)
{
    char key[GS_STORE_KEY_MAX + 1];
    unsigned n = ctx->kv_seq++;
    uint64_t deadline = gs_deadline_after_ms(ctx->cfg.timeout_ms);
    gs_status st;
    part_key(ctx, n, tag, ctx->rank, key, sizeof(key));
    if (strlen(ctx->prefix) + strlen(tag) + 32 > GS_STORE_KEY_MAX)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "rank %d: store allgather '%s': the tag is too long",
                       ctx->rank, tag);
    st = gs_boot_kv_put(ctx, key, blob, len);
    for (int r = 0; r < ctx->size && st == GS_OK; r++) {
        size_t got = 0;
        uint8_t *part = (uint8_t *)out + (size_t)r * len;
        if (r == ctx->rank) {
            if (len)
                memcpy(part, blob, len);
            continue;
        }
        part_key(ctx, n, tag, r, key, sizeof(key));
        st = gs_boot_kv_get(ctx, key, part, len, &got, gs_deadline_left_ms(deadline));
        if (st == GS_ERR_TIMEOUT) {
            char who[160];
            missing_ranks(ctx, n, tag, r, who, sizeof(who));
            return gs_fail(GS_SUBSYS_BOOT, GS_ERR_TIMEOUT,
                           "rank %d: store %s '%s': rank %s did not come within %lld ms (GS_TIMEOUT_MS)",
                           ctx->rank, len ? "allgather" : "barrier", tag, who,
                           (long long)ctx->cfg.timeout_ms);
        }
        if (st == GS_OK && got != len)
            st = gs_fail(GS_SUBSYS_BOOT, GS_ERR_PROTOCOL,
                         "rank %d: store allgather '%s': rank %d gave %zu bytes, this rank %zu: do all ranks "
                         "run the same program?",
                         ctx->rank, tag, r, got, len);
    }
    return st;
}

gs_status gs_boot_kv_barrier(gs_ctx *ctx, const char *tag)
{
    return gs_boot_kv_allgather(ctx, tag, NULL, 0, NULL);
}
