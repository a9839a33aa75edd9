/* The public store calls: argument checks, then one request each. */
#include "bootstrap/store_client.h"

#include "util/clock.h"
#include "util/log.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint32_t timeout_arg(const gs_ctx *ctx)
{
    return ctx->cfg.timeout_ms > UINT32_MAX - 60000 ? UINT32_MAX - 60000 : (uint32_t)ctx->cfg.timeout_ms;
}

static gs_status check_key(const gs_ctx *ctx, const char *what, const char *key)
{
    if (!ctx || (!ctx->store && !gs_boot_kv_built(ctx)))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "store %s: no context (call gs_ctx_create first)",
                       what);
    if (!key || !*key || strlen(key) > GS_STORE_KEY_MAX)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "rank %d: store %s: the key must be 1 to %d bytes long (got %zu)", ctx->rank, what,
                       GS_STORE_KEY_MAX, key ? strlen(key) : 0);
    return GS_OK;
}

static gs_status check_value(const gs_ctx *ctx, const char *what, const char *key, const void *value,
                             size_t len)
{
    if (len > GS_STORE_VALUE_MAX)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "rank %d: store %s '%s': %zu bytes is more than GS_STORE_VALUE_MAX (%u); exchange "
                       "large data over a transport instead",
                       ctx->rank, what, key, len, GS_STORE_VALUE_MAX);
    if (len && !value)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "rank %d: store %s '%s': NULL value of %zu bytes",
                       ctx->rank, what, key, len);
    return GS_OK;
}

/* key under ctx's prefix (a group's keys live apart from the parent's). */
static gs_status full_key(const gs_ctx *ctx, const char *what, const char *key, char *buf, size_t cap)
{
    if ((size_t)snprintf(buf, cap, "%s%s", ctx->prefix, key) >= cap)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "rank %d: store %s: the key '%s' is too long in a group", ctx->rank, what, key);
    return GS_OK;
}

gs_status gs_store_put(gs_ctx *ctx, const char *key, const void *value, size_t len)
{
    gs_store_request req = {.type = GS_STORE_PUT, .key = key, .value = value, .len = len};
    char full[GS_STORE_KEY_MAX + 1];
    gs_status status = check_key(ctx, "put", key);
    if (status == GS_OK)
        status = check_value(ctx, "put", key, value, len);
    if (status == GS_OK && gs_boot_kv_built(ctx)) {
        status = full_key(ctx, "put", key, full, sizeof(full));
        return status == GS_OK ? gs_boot_kv_put(ctx, full, value, len) : status;
    }
    if (status == GS_OK)
        status = gs_boot_client_request(ctx->store, &req, NULL);
    return status;
}

gs_status gs_store_get(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p)
{
    uint32_t ms = timeout_arg(ctx);
    return gs_boot_store_get_ms(ctx, key, buf, cap, len_p, ms > INT32_MAX ? INT32_MAX : (int)ms);
}

gs_status gs_boot_store_get_ms(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p,
                               int timeout_ms)
{
    gs_store_reply reply = {.buf = buf, .cap = buf ? cap : 0};
    gs_store_request req = {.type = GS_STORE_GET, .key = key};
    char full[GS_STORE_KEY_MAX + 1];
    gs_status status = check_key(ctx, "get", key);

    if (status != GS_OK)
        return status;
    if (timeout_ms < 1)
        timeout_ms = 1;
    if (gs_boot_kv_built(ctx)) {
        status = full_key(ctx, "get", key, full, sizeof(full));
        return status == GS_OK ? gs_boot_kv_get(ctx, full, buf, cap, len_p, timeout_ms) : status;
    }
    req.arg = (uint32_t)timeout_ms;
    status = gs_boot_client_request(ctx->store, &req, &reply);
    if (status == GS_OK && len_p)
        *len_p = reply.len;
    return status;
}

gs_status gs_store_allgather(gs_ctx *ctx, const char *tag, const void *blob, size_t len, void *out)
{
    gs_store_reply reply;
    gs_store_request req = {.type = GS_STORE_ALLGATHER, .key = tag, .value = blob, .len = len};
    gs_status status = check_key(ctx, "allgather", tag);

    if (status == GS_OK)
        status = check_value(ctx, "allgather", tag, blob, len);
    if (status == GS_OK && len && !out)
        status = gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "rank %d: store allgather '%s': NULL output buffer",
                         ctx->rank, tag);
    if (status != GS_OK)
        return status;
    if (gs_boot_kv_built(ctx))
        return gs_boot_kv_allgather(ctx, tag, blob, len, out);
    req.arg = timeout_arg(ctx);
    reply = (gs_store_reply){.buf = out, .cap = (size_t)ctx->size * len};
    status = gs_boot_client_request(ctx->store, &req, &reply);
    if (status == GS_OK && reply.len != (size_t)ctx->size * len)
        status = gs_fail(GS_SUBSYS_BOOT, GS_ERR_PROTOCOL,
                         "rank %d: store allgather '%s': got %zu bytes, expected %d ranks x %zu", ctx->rank,
                         tag, reply.len, ctx->size, len);
    return status;
}

gs_status gs_store_barrier(gs_ctx *ctx, const char *tag)
{
    gs_store_request req = {.type = GS_STORE_BARRIER, .key = tag};
    gs_status status = check_key(ctx, "barrier", tag);
    if (status != GS_OK)
        return status;
    if (gs_boot_kv_built(ctx))
        return gs_boot_kv_barrier(ctx, tag);
    req.arg = timeout_arg(ctx);
    return gs_boot_client_request(ctx->store, &req, NULL);
}
