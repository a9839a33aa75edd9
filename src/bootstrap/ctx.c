/* The context: configuration, rank discovery, the store connection, and on
 * rank 0 (unless a launcher serves it) the store itself. */
#include "bootstrap/boot.h"
#include "bootstrap/store_client.h"
#include "bootstrap/store_proto.h"

#include "util/affinity.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    gs_boot_server_params params = {
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

static gs_status ext_token(gs_ctx *ctx);

/* The context's rank, affinity, host id and store (served, joined, or an
 * external one's token), once ctx->boot is known. */
static gs_status start(gs_ctx *ctx)
{
    const gs_config *cfg = &ctx->cfg;
    gs_status status;
    ctx->rank = ctx->boot.rank;
    ctx->size = ctx->boot.size;
    gs_log_set_rank(ctx->rank);
    status = gs_affinity_apply(cfg->cpu_affinity, ctx->boot.local_rank, NULL);
    if (status != GS_OK)
        return status;
    if (strlen(cfg->host_id) >= sizeof(ctx->host_id))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "rank %d: GS_HOST_ID is %zu bytes long: use at most %zu", ctx->rank,
                       strlen(cfg->host_id), sizeof(ctx->host_id) - 1);
    if (cfg->host_id[0])
        snprintf(ctx->host_id, sizeof(ctx->host_id), "%.127s", cfg->host_id);
    else
        gs_boot_host_id(ctx->host_id, sizeof(ctx->host_id));
    if (ctx->has_ext) {
        status = ext_token(ctx);
        if (status == GS_OK)
            gs_log_info(BOOT, "rank %d of %d (from %s, local rank %d), host id %s, the caller's store",
                        ctx->rank, ctx->size, ctx->boot.source, ctx->boot.local_rank, ctx->host_id);
        return status;
    }
    if (ctx->rank == 0 && !ctx->boot.store_external) {
        status = serve_store(ctx);
        if (status != GS_OK)
            return status;
    }
    status =
        gs_boot_client_join(ctx->boot.store_host, ctx->boot.store_port, ctx->rank, ctx->size, cfg->job_token,
                            (int)cfg->timeout_ms, cfg->rejoin ? GS_STORE_HELLO_REJOIN : 0, &ctx->store);
    if (status != GS_OK)
        return status;
    gs_log_info(BOOT, "rank %d of %d (from %s, local rank %d), host id %s, store %s:%d", ctx->rank, ctx->size,
                ctx->boot.source, ctx->boot.local_rank, ctx->host_id, ctx->boot.store_host,
                ctx->boot.store_port);
    return GS_OK;
}

/* GS_TRACE: this process's clock against the store's, the best of 8 round
 * trips (the store's process itself, and a caller's store: no offset). */
static gs_status trace_start(gs_ctx *ctx)
{
    gs_trace_clock clock = {.source = ctx->store ? "store" : ctx->has_ext ? "none" : "same process"};
    uint64_t best = UINT64_MAX;
    gs_status st = GS_OK;
    if (!ctx->cfg.trace[0])
        return GS_OK;
    if (ctx->server) /* rank 0 serves the store: its clock is the store's */
        clock.source = "same process";
    for (int i = 0; clock.source[0] == 's' && ctx->store && !ctx->server && i < 8 && st == GS_OK; i++) {
        gs_store_request req = {.type = GS_STORE_TIME};
        uint8_t buf[8 + 128] = {0};
        uint64_t server_ns, t0 = gs_now_ns(), t1;
        gs_store_reply reply = {.buf = buf, .cap = sizeof(buf) - 1};
        st = gs_boot_client_request(ctx->store, &req, &reply);
        t1 = gs_now_ns();
        if (st != GS_OK || reply.len < 8)
            continue;
        memcpy(&server_ns, buf, sizeof(server_ns));
        if (strcmp((const char *)buf + 8, ctx->host_id) == 0) { /* one clock: the kernel's */
            clock = (gs_trace_clock){.source = "same host"};
            break;
        }
        if (t1 - t0 < best) {
            best = t1 - t0;
            clock.offset_ns = (int64_t)(server_ns - t0) - (int64_t)(best / 2);
            clock.bound_ns = best / 2 + 1;
        }
    }
    if (st == GS_OK)
        st = gs_trace_open(ctx->cfg.trace, ctx->rank, &clock);
    ctx->traced = st == GS_OK;
    return st;
}

static gs_status finish(gs_ctx *ctx, gs_status status, gs_ctx **ctx_p)
{
    if (status == GS_OK)
        status = start(ctx);
    if (status == GS_OK)
        status = trace_start(ctx);
    if (status == GS_OK) {
        *ctx_p = ctx;
        return GS_OK;
    }
    gs_boot_server_stop(ctx->server, 0);
    if (ctx->has_ext)
        pthread_mutex_destroy(&ctx->ext_lock);
    free(ctx);
    return status;
}

gs_status gs_boot_ctx_create(const gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_ctx **ctx_p)
{
    gs_ctx *ctx = gs_calloc(1, sizeof(*ctx));
    if (!ctx)
        return GS_ERR_NOMEM;
    ctx->cfg = *cfg;
    return finish(ctx, gs_boot_discover(cfg, getenv_fn, arg, &ctx->boot), ctx_p);
}

/* ---- a context from the caller's parameters ------------------------------ */

void gs_ctx_params_init(gs_ctx_params *params)
{
    if (params)
        *params = (gs_ctx_params)GS_CTX_PARAMS_INIT;
}

/* With an external store the job token of the transports' connections
 * comes through it: rank 0 draws one, the others wait for it. */
static gs_status ext_token(gs_ctx *ctx)
{
    static const char key[] = "gs.job_token";
    char token[GS_CONFIG_STR_MAX];
    size_t len = 0;
    gs_status st;
    if (ctx->cfg.job_token[0] || ctx->size == 1)
        return GS_OK;
    if (ctx->rank == 0) {
        st = gs_boot_token_generate(token, sizeof(token));
        if (st == GS_OK)
            st = gs_boot_kv_put(ctx, key, token, strlen(token));
    } else {
        st = gs_boot_kv_get(ctx, key, token, sizeof(token) - 1, &len, (int)ctx->cfg.timeout_ms);
        if (st == GS_OK && (len == 0 || len >= sizeof(token)))
            st = gs_fail(GS_SUBSYS_BOOT, GS_ERR_PROTOCOL,
                         "rank %d: the external store's '%s' holds %zu bytes, not a job token", ctx->rank,
                         key, len);
        if (st == GS_OK)
            token[len] = '\0';
    }
    if (st == GS_OK)
        snprintf(ctx->cfg.job_token, sizeof(ctx->cfg.job_token), "%s", token);
    return st;
}

static gs_status check_params(const gs_ctx_params *p)
{
    if (!p)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_ctx_create_with: params is NULL");
    if (p->version != GS_CTX_PARAMS_VERSION || p->size < sizeof(gs_ctx_params))
        return gs_fail(
            GS_SUBSYS_BOOT, GS_ERR_INVALID,
            "gs_ctx_create_with: params of version %u and %zu bytes, this library knows version %d "
            "of %zu bytes: start from gs_ctx_params_init() and rebuild against this gradsync.h",
            p->version, p->size, GS_CTX_PARAMS_VERSION, sizeof(gs_ctx_params));
    if ((p->rank >= 0) != (p->world_size > 0) || (p->world_size > 0 && p->rank >= p->world_size))
        return gs_fail(
            GS_SUBSYS_BOOT, GS_ERR_INVALID,
            "gs_ctx_create_with: rank %d of world_size %d: give both (0 <= rank < world_size) or neither",
            p->rank, p->world_size);
    if (p->local_size > 0 && (p->local_rank < 0 || p->local_rank >= p->local_size))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_ctx_create_with: local_rank %d of local_size %d",
                       p->local_rank, p->local_size);
    if (p->store && (!p->store->set || !p->store->get))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "gs_ctx_create_with: the external store needs set and get");
    if (p->store && p->rank < 0)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "gs_ctx_create_with: with an external store give rank and world_size too");
    return GS_OK;
}

/* The caller's configuration fields over the environment's. */
static gs_status apply_params(gs_ctx *ctx, const gs_ctx_params *p)
{
    gs_boot_info *boot = &ctx->boot;
    if (p->timeout_ms >= 0)
        ctx->cfg.timeout_ms = p->timeout_ms;
    if (p->job_token)
        snprintf(ctx->cfg.job_token, sizeof(ctx->cfg.job_token), "%s", p->job_token);
    if (p->store_addr)
        snprintf(ctx->cfg.store, sizeof(ctx->cfg.store), "%s", p->store_addr);
    if (p->store) {
        ctx->has_ext = true;
        ctx->ext = *p->store;
        pthread_mutex_init(&ctx->ext_lock, NULL);
        ctx->cfg.store[0] = '\0';
        *boot = (gs_boot_info){.rank = p->rank,
                               .size = p->world_size,
                               .local_rank = -1,
                               .local_size = -1,
                               .source = "parameters"};
    } else if (p->rank >= 0 && p->world_size > 1 && !ctx->cfg.store[0]) {
        return gs_fail(
            GS_SUBSYS_BOOT, GS_ERR_CONFIG,
            "gs_ctx_create_with: %d ranks need a store: give store_addr, an external store, or GS_STORE",
            p->world_size);
    } else {
        gs_status st = gs_boot_discover(&ctx->cfg, process_getenv, NULL, boot);
        if (st != GS_OK)
            return st;
        if (p->rank >= 0) {
            boot->rank = p->rank;
            boot->size = p->world_size;
            boot->source = "parameters";
        }
    }
    if (p->local_rank >= 0)
        boot->local_rank = p->local_rank;
    if (p->local_size > 0)
        boot->local_size = p->local_size;
    if (p->route_hint && !p->store_addr) {
        int port = 1; /* a route, not a connection: any port */
        if (gs_boot_parse_hostport(p->route_hint, boot->store_host, sizeof(boot->store_host), &port) != GS_OK)
            snprintf(boot->store_host, sizeof(boot->store_host), "%s", p->route_hint);
        if (p->store)
            boot->store_port = port;
    }
    return GS_OK;
}

gs_status gs_ctx_create_with(const gs_ctx_params *params, gs_ctx **ctx_p)
{
    const gs_config *cfg;
    gs_ctx *ctx;
    gs_status status = check_params(params);
    if (status == GS_OK && !ctx_p)
        status = gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_ctx_create_with: ctx_p is NULL");
    if (status == GS_OK)
        status = gs_config_get(&cfg);
    if (status != GS_OK)
        return status;
    if (!(ctx = gs_calloc(1, sizeof(*ctx))))
        return GS_ERR_NOMEM;
    ctx->cfg = *cfg;
    return finish(ctx, apply_params(ctx, params), ctx_p);
}

/* ---- groups ----------------------------------------------------------------- */

int gs_boot_world_rank(const gs_ctx *ctx, int r)
{
    return ctx->world ? ctx->world[r] : r;
}

gs_status gs_boot_ctx_group(gs_ctx *parent, const char *tag, const int *members, int n, gs_ctx **ctx_p)
{
    gs_ctx *ctx;
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (members[i] < 0 || members[i] >= parent->size)
            return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "rank %d: group '%s': rank %d is not in 0..%d",
                           parent->rank, tag, members[i], parent->size - 1);
        for (int j = 0; j < i; j++)
            if (members[j] == members[i])
                return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "rank %d: group '%s': rank %d is listed twice",
                               parent->rank, tag, members[i]);
        if (members[i] == parent->rank)
            me = i;
    }
    if (me < 0)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "rank %d: group '%s' of %d ranks does not list this rank", parent->rank, tag, n);
    if (!(ctx = gs_calloc(1, sizeof(*ctx))) || !(ctx->world = gs_calloc((size_t)n, sizeof(int)))) {
        free(ctx);
        return GS_ERR_NOMEM;
    }
    ctx->cfg = parent->cfg;
    ctx->boot = parent->boot;
    ctx->boot.local_rank = ctx->boot.local_size = -1; /* the communicator counts them from the hosts */
    ctx->boot.source = "group";
    ctx->rank = me;
    ctx->size = n;
    memcpy(ctx->host_id, parent->host_id, sizeof(ctx->host_id));
    ctx->parent = parent;
    for (int i = 0; i < n; i++)
        ctx->world[i] = gs_boot_world_rank(parent, members[i]);
    if ((size_t)snprintf(ctx->prefix, sizeof(ctx->prefix), "%sg.%s/", parent->prefix, tag) >=
        sizeof(ctx->prefix)) {
        free(ctx->world);
        free(ctx);
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "rank %d: group '%s': groups nested too deep",
                       parent->rank, tag);
    }
    *ctx_p = ctx;
    return GS_OK;
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
    if (ctx->parent) { /* a group: the store is the parent's */
        free(ctx->world);
        free(ctx);
        return GS_OK;
    }
    if (ctx->has_ext)
        pthread_mutex_destroy(&ctx->ext_lock);
    if (ctx->traced)
        gs_trace_close();
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

int gs_ctx_local_rank(const gs_ctx *ctx)
{
    return ctx ? ctx->boot.local_rank : -1;
}

int gs_ctx_local_size(const gs_ctx *ctx)
{
    return ctx ? ctx->boot.local_size : -1;
}

const char *gs_ctx_host(const gs_ctx *ctx)
{
    return ctx ? ctx->host_id : "";
}

gs_status gs_ctx_param(const gs_ctx *ctx, const char *name, char *buf, size_t cap)
{
    if (!ctx)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_ctx_param: NULL ctx");
    return gs_config_param_value(&ctx->cfg, "gs_ctx_param", name, buf, cap);
}

void gs_boot_tp_count_set(gs_ctx *ctx, unsigned next)
{
    ctx->tp_next = next;
}
