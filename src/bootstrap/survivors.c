/*
 * The survivors' agreement, the rank's side: the member list (the root
 * store's ranks of ctx's ranks) goes to the store server, which decides
 * (store_agree.c); the answer is ctx's ranks that are in.
 */
#include "bootstrap/store_client.h"

#include "util/alloc.h"
#include "util/log.h"

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

gs_status gs_boot_survivors(gs_ctx *ctx, const char *tag, int timeout_ms, uint8_t *in)
{
    gs_ctx *root = root_of(ctx);
    size_t len = 4 + (size_t)ctx->size * 4;
    uint8_t *list = gs_calloc(len, 1);
    char key[GS_STORE_KEY_MAX + 1];
    uint32_t n = (uint32_t)ctx->size;
    gs_store_request req = {.type = GS_STORE_SURVIVORS, .key = key, .len = len, .arg = (uint32_t)timeout_ms};
    gs_store_reply reply = {.buf = in, .cap = (size_t)ctx->size};
    gs_status st;
    if (!list)
        return GS_ERR_NOMEM;
    if (root->has_ext) {
        free(list);
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_UNSUPPORTED,
                       "rank %d: shrink: the survivors' agreement needs gradsync's own store (its server "
                       "sees every rank's connection); an external store has no agreement yet "
                       "(docs/elastic.md)",
                       ctx->rank);
    }
    memcpy(list, &n, 4);
    for (int r = 0; r < ctx->size; r++) {
        uint32_t w = (uint32_t)gs_boot_world_rank(ctx, r);
        memcpy(list + 4 + (size_t)r * 4, &w, 4);
    }
    snprintf(key, sizeof(key), "%s%s", ctx->prefix, tag);
    req.value = list;
    st = gs_boot_client_request(root->store, &req, &reply);
    free(list);
    if (st == GS_OK && reply.len != (size_t)ctx->size)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_PROTOCOL,
                       "rank %d: shrink: the store's survivors answer has %zu bytes, expected %d", ctx->rank,
                       reply.len, ctx->size);
    if (st == GS_ERR_PEER_LOST || st == GS_ERR_TIMEOUT || st == GS_ERR_SYSTEM)
        return store_gone(ctx, root, st);
    if (st == GS_OK && !in[ctx->rank])
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_PEER_LOST,
                       "rank %d: shrink: the survivors decided without this rank (it asked after the "
                       "deadline, or its store connection was lost): it is out of the job",
                       ctx->rank);
    return st;
}
