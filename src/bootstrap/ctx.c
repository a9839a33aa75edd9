/* The context: configuration, rank discovery, the store connection, and on
 * rank 0 (unless a launcher serves it) the store itself. */
#include "bootstrap/boot.h"
#include "bootstrap/store_proto.h"

#include "util/affinity.h"
#include "util/alloc.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>

static const char *process_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

/* Rank 0 serves the store on GS_STORE's port (or an ephemeral loopback
 * port for a single process) before joining it like every rank. */
static gs_status serve_store(gs_ctx *ctx)
{
    gs_boot_info *boot = &ctx->boot;
    gs_store_server_params params = {
        .host = boot->store_port ? boot->store_host : "127.0.0.1",
        .port = boot->store_port,
        .size = ctx->size,
        .token = ctx->cfg.job_token,
        .hello_timeout_ms = (int)ctx->cfg.timeout_ms,
    };
    gs_status status;

    if (!ctx->cfg.job_token[0] && ctx->size > 1)
        gs_log_info(BOOT,
                    "GS_JOB_TOKEN is not set: the store accepts any connection to %s:%d; set the same "
                    "secret GS_JOB_TOKEN in every rank (gsrun does) to keep strangers out",
                    params.host, params.port);
    status = gs_boot_server_listen(&params, &ctx->server);
    if (status == GS_OK)
        status = gs_boot_server_start(ctx->server);
    if (status != GS_OK)
        return status;
    if (!boot->store_port) {
        snprintf(boot->store_host, sizeof(boot->store_host), "127.0.0.1");
        boot->store_port = gs_boot_server_port(ctx->server);
    }
    return GS_OK;
}

gs_status gs_boot_ctx_create(const gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_ctx **ctx_p)
{
    gs_ctx *ctx = gs_calloc(1, sizeof(*ctx));
    gs_status status;

    if (!ctx)
        return GS_ERR_NOMEM;
    ctx->cfg = *cfg;
    status = gs_boot_discover(cfg, getenv_fn, arg, &ctx->boot);
    if (status != GS_OK)
        goto fail;
    ctx->rank = ctx->boot.rank;
    ctx->size = ctx->boot.size;
    gs_log_set_rank(ctx->rank);
    status = gs_affinity_apply(cfg->cpu_affinity, ctx->boot.local_rank, NULL);
    if (status != GS_OK)
        goto fail;
    gs_boot_host_id(ctx->host_id, sizeof(ctx->host_id));
    if (ctx->rank == 0 && !ctx->boot.store_external) {
        status = serve_store(ctx);
        if (status != GS_OK)
            goto fail;
    }
    status =
        gs_boot_client_join(ctx->boot.store_host, ctx->boot.store_port, ctx->rank, ctx->size, cfg->job_token,
                            (int)cfg->timeout_ms, cfg->rejoin ? GS_STORE_HELLO_REJOIN : 0, &ctx->store);
    if (status != GS_OK)
        goto fail;
    gs_log_info(BOOT, "rank %d of %d (from %s, local rank %d), host id %s, store %s:%d", ctx->rank, ctx->size,
                ctx->boot.source, ctx->boot.local_rank, ctx->host_id, ctx->boot.store_host,
                ctx->boot.store_port);
    *ctx_p = ctx;
    return GS_OK;
fail:
    gs_boot_server_stop(ctx->server, 0);
    free(ctx);
    return status;
}

gs_status gs_ctx_create(gs_ctx **ctx_p)
{
    const gs_config *cfg;
    gs_status status;

    if (!ctx_p)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_ctx_create: ctx_p is NULL");
    status = gs_config_get(&cfg);
    if (status != GS_OK)
        return status;
    return gs_boot_ctx_create(cfg, process_getenv, NULL, ctx_p);
}

gs_status gs_ctx_destroy(gs_ctx *ctx)
{
    if (!ctx)
        return GS_OK;
    gs_boot_client_close(ctx->store);
    /* Rank 0 keeps serving until every rank has left, within the deadline. */
    gs_boot_server_stop(ctx->server, (int)ctx->cfg.timeout_ms);
    free(ctx);
    return GS_OK;
}

int gs_ctx_rank(const gs_ctx *ctx)
{
    return ctx ? ctx->rank : -1;
}

int gs_ctx_size(const gs_ctx *ctx)
{
    return ctx ? ctx->size : -1;
}
