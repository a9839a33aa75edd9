/*
 * The store server as a launcher runs it (gradsync.h, "Store server"; gsrun
 * is one): the public calls, checking their arguments and drawing the job
 * token, around the server of store_server.c. Knows nothing of contexts:
 * the launcher is no rank.
 */
#include "bootstrap/boot.h"
#include "bootstrap/store_server.h"

#include "util/log.h"

#include <stddef.h>
#include <string.h>

void gs_store_server_params_init(gs_store_server_params *params)
{
    if (params)
        *params = (gs_store_server_params)GS_STORE_SERVER_PARAMS_INIT;
}

static gs_status check_params(const gs_store_server_params *p)
{
    if (!p)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_store_server_create: params is NULL");
    if (p->version != GS_STORE_SERVER_PARAMS_VERSION || p->size < sizeof(gs_store_server_params))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "gs_store_server_create: params of version %u and %zu bytes, this library knows "
                       "version %d of %zu bytes: start from gs_store_server_params_init() and rebuild "
                       "against this gradsync.h",
                       p->version, p->size, GS_STORE_SERVER_PARAMS_VERSION, sizeof(gs_store_server_params));
    if (p->world_size < 1 || p->port < 0 || p->port > 65535)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "gs_store_server_create: world_size %d and port %d: expected world_size >= 1 and a "
                       "port 0-65535 (0: ephemeral)",
                       p->world_size, p->port);
    if (p->timeout_ms < 1 && p->timeout_ms != -1)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "gs_store_server_create: timeout_ms %d: expected milliseconds >= 1, or -1 for "
                       "GS_TIMEOUT_MS",
                       p->timeout_ms);
    if (p->job_token && strlen(p->job_token) > GS_STORE_TOKEN_MAX)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID,
                       "gs_store_server_create: a job token of %zu bytes; at most %d", strlen(p->job_token),
                       GS_STORE_TOKEN_MAX);
    return GS_OK;
}

gs_status gs_store_server_create(const gs_store_server_params *params, gs_store_server **server_p)
{
    char drawn[GS_STORE_TOKEN_MAX + 1];
    const gs_config *cfg;
    gs_boot_server_params serve;
    gs_status st = check_params(params);

    if (st == GS_OK && !server_p)
        st = gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_store_server_create: server_p is NULL");
    if (st != GS_OK)
        return st;
    serve = (gs_boot_server_params){
        .host = params->host ? params->host : "127.0.0.1",
        .port = params->port,
        .size = params->world_size,
        .token = params->job_token,
        .hello_timeout_ms = params->timeout_ms,
    };
    if (params->timeout_ms == -1) {
        if ((st = gs_config_get(&cfg)) != GS_OK)
            return st;
        serve.hello_timeout_ms = cfg->timeout_ms > 0x7fffffff ? 0x7fffffff : (int)cfg->timeout_ms;
    }
    if (!params->job_token) {
        if ((st = gs_boot_token_generate(drawn, sizeof(drawn))) != GS_OK)
            return st;
        serve.token = drawn;
    }
    return gs_boot_server_listen(&serve, server_p);
}

int gs_store_server_port(const gs_store_server *server)
{
    return server ? gs_boot_server_port(server) : 0;
}

const char *gs_store_server_token(const gs_store_server *server)
{
    return server ? server->token : "";
}

gs_status gs_store_server_start(gs_store_server *server)
{
    if (!server)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_store_server_start: server is NULL");
    if (server->started)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_INVALID, "gs_store_server_start: already serving");
    return gs_boot_server_start(server);
}

void gs_store_server_destroy(gs_store_server *server, int drain_ms)
{
    gs_boot_server_stop(server, drain_ms);
}
