/* Parameters, roles, creation and teardown of a gs_ps, its control region and tx ring. */
#include "ps/ps.h"

#include "bootstrap/boot.h"
#include "ps/optim.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GS_PS_SHARD_BYTES_MAX (1ull << 30)
#define GS_PS_TX_RECORDS      1024

static unsigned create_count; /* store tags: every rank creates its gs_ps in the same order */

void gs_ps_params_init(const gs_ctx *ctx, gs_ps_params *p)
{
    const gs_config *cfg = &ctx->cfg;
    memset(p, 0, sizeof(*p));
    p->role = cfg->role == GS_ROLE_SERVER   ? GS_PS_ROLE_SERVER
              : cfg->role == GS_ROLE_WORKER ? GS_PS_ROLE_WORKER
                                            : GS_PS_ROLE_AUTO;
    p->servers = (int)cfg->ps_servers;
    p->transport = NULL;
    p->mode = cfg->ps_mode == GS_PS_ASYNC ? GS_PS_MODE_ASYNC : GS_PS_MODE_SYNC;
    p->staleness = (int)cfg->ps_staleness;
    p->agg = cfg->ps_agg == GS_PS_AGG_ATOMIC ? GS_PS_AGG_FETCH_ADD : GS_PS_AGG_WRITE_SLOTS;
    p->atomic_frac_bits = (int)cfg->ps_atomic_frac_bits;
    p->shard_bytes = (size_t)cfg->ps_shard_bytes;
    p->optim = (gs_ps_optim){.kind = GS_PS_SGD,
                             .lr = 0.01f,
                             .momentum = 0.9f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .eps = 1e-8f,
                             .weight_decay = 0.0f};
    p->average = 1;
    p->checkpoint = cfg->ps_checkpoint;
    p->checkpoint_every = (int)cfg->ps_checkpoint_every;
    p->elastic = cfg->ps_elastic ? 1 : 0;
}

void gs_ps_tag(const gs_ps *ps, char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(buf, cap, "gs.ps.%u.g%u.", ps->ns, ps->gen);
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < cap)
        vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

const char *gs_ps_role_name(const gs_ps *ps)
{
    return ps->is_server ? "server" : "worker";
}

int gs_ps_is_server(const gs_ps *ps)
{
    return ps && ps->is_server;
}

int gs_ps_index(const gs_ps *ps)
{
    return ps ? ps->index : -1;
}

int gs_ps_num_workers(const gs_ps *ps)
{
    return ps ? ps->nworkers : 0;
}

int gs_ps_num_servers(const gs_ps *ps)
{
    return ps ? ps->nservers : 0;
}

/* ---- parameters ------------------------------------------------------------------ */

static gs_status check_params(const gs_ctx *ctx, const gs_ps_params *p)
{
    const char *why = NULL;
    if (p->servers < 1 || p->servers >= ctx->size)
        why = "GS_PS_SERVERS must leave at least one server and one worker";
    else if ((unsigned)p->mode > GS_PS_MODE_ASYNC || (unsigned)p->agg > GS_PS_AGG_FETCH_ADD ||
             (unsigned)p->role > GS_PS_ROLE_SERVER)
        why = "role, mode or agg is not one of its enum values";
    else if (p->shard_bytes < GS_PS_ALIGN || p->shard_bytes > GS_PS_SHARD_BYTES_MAX)
        why = "GS_PS_SHARD_BYTES must be between 64 bytes and 1 GiB";
    else if (p->staleness < -1)
        why = "GS_PS_STALENESS must be -1 (none) or a number of steps >= 0";
    else if (p->agg == GS_PS_AGG_FETCH_ADD && p->mode == GS_PS_MODE_ASYNC)
        why = "GS_PS_AGG=atomic needs GS_PS_MODE=sync (the accumulator is drained between steps; NIC atomics "
              "are not atomic against the server CPU draining it concurrently)";
    else if (p->elastic && (p->mode != GS_PS_MODE_SYNC || p->agg != GS_PS_AGG_WRITE_SLOTS))
        why =
            "GS_PS_ELASTIC=1 needs GS_PS_MODE=sync and GS_PS_AGG=write (async already goes on without a lost "
            "worker; the atomic accumulator counts every worker's arrival)";
    else if (p->checkpoint_every < 0)
        why = "GS_PS_CHECKPOINT_EVERY must be >= 0";
    if (why)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_CONFIG, "rank %d: parameter server: %s (%d ranks)", ctx->rank,
                       why, ctx->size);
    return gs_ps_optim_check(&p->optim);
}

static gs_status copy_params(gs_ps *ps, const gs_ps_params *p)
{
    ps->params = *p;
    snprintf(ps->transport, sizeof(ps->transport), "%s", p->transport ? p->transport : "auto");
    snprintf(ps->checkpoint, sizeof(ps->checkpoint), "%s", p->checkpoint ? p->checkpoint : "");
    ps->params.transport = ps->transport;
    ps->params.checkpoint = ps->checkpoint;
    if (p->mode == GS_PS_MODE_SYNC && p->staleness >= 0)
        gs_log_info(PS, "rank %d: GS_PS_STALENESS applies to async mode only; sync mode is BSP", ps->rank);
    /* The replay log: enough steps to cover everything not yet checkpointed. */
    ps->log_depth = ps->checkpoint[0] && p->checkpoint_every > 0 ? (uint32_t)p->checkpoint_every + 2 : 1;
    return gs_ps_fixed_init(&ps->fixed, p->atomic_frac_bits, 1);
}

/* ---- roles ------------------------------------------------------------------------ */

static bool my_role_is_server(const gs_ps *ps)
{
    if (ps->params.role != GS_PS_ROLE_AUTO)
        return ps->params.role == GS_PS_ROLE_SERVER;
    return ps->rank >= ps->size - ps->params.servers;
}

/* Lists servers and workers in rank order from one byte per rank (1: server). */
gs_status gs_ps_take_roles(gs_ps *ps, const uint8_t *all)
{
    ps->server_ranks = gs_calloc((size_t)ps->size, sizeof(int));
    ps->worker_ranks = gs_calloc((size_t)ps->size, sizeof(int));
    ps->role_index = gs_calloc((size_t)ps->size, sizeof(int));
    if (!ps->server_ranks || !ps->worker_ranks || !ps->role_index)
        return GS_ERR_NOMEM;
    for (int r = 0; r < ps->size; r++) {
        if (all[r])
            ps->role_index[r] = ps->nservers, ps->server_ranks[ps->nservers++] = r;
        else
            ps->role_index[r] = ps->nworkers, ps->worker_ranks[ps->nworkers++] = r;
    }
    if (ps->nservers == 0 || ps->nworkers == 0)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_CONFIG,
                       "rank %d: parameter server needs at least one server and one worker; GS_ROLE gave %d "
                       "servers and %d workers",
                       ps->rank, ps->nservers, ps->nworkers);
    if (ps->nworkers > (1 << 20) || ps->nservers > 4095)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_CONFIG,
                       "rank %d: %d workers and %d servers: at most 2^20 and 4095", ps->rank, ps->nworkers,
                       ps->nservers);
    ps->is_server = all[ps->rank];
    ps->index = ps->role_index[ps->rank];
    return GS_OK;
}

/* Every rank says what it is; the first worker leaves the roles and the
 * generation in the store for a rank that is restarted later. */
static gs_status assign_roles(gs_ps *ps)
{
    char tag[64];
    uint8_t mine = my_role_is_server(ps), *all = gs_calloc((size_t)ps->size, 1);
    uint32_t gen = 0;
    gs_status st = all ? GS_OK : GS_ERR_NOMEM;
    snprintf(tag, sizeof(tag), "gs.ps.%u.roles", ps->ns);
    if (st == GS_OK)
        st = gs_store_allgather(ps->ctx, tag, &mine, 1, all);
    if (st == GS_OK)
        st = gs_ps_take_roles(ps, all);
    if (st == GS_OK && !ps->is_server && ps->index == 0) {
        snprintf(tag, sizeof(tag), "gs.ps.%u.role_table", ps->ns);
        st = gs_store_put(ps->ctx, tag, all, (size_t)ps->size);
        snprintf(tag, sizeof(tag), "gs.ps.%u.gen", ps->ns);
        if (st == GS_OK)
            st = gs_store_put(ps->ctx, tag, &gen, sizeof(gen));
    }
    free(all);
    return st;
}

/* ---- the tx ring ------------------------------------------------------------------------ */

gs_status gs_ps_tx_init(gs_ps *ps, gs_ps_tx *tx, uint32_t cap)
{
    gs_status st = gs_mr_alloc(ps->tp, (size_t)cap * GS_PS_ALIGN, GS_ACCESS_LOCAL_WRITE, &tx->mr);
    if (st != GS_OK)
        return st;
    tx->free_list = gs_calloc(cap, sizeof(uint32_t));
    tx->dest = gs_calloc(cap, sizeof(int));
    if (!tx->free_list || !tx->dest) {
        gs_ps_tx_free(tx);
        return GS_ERR_NOMEM;
    }
    tx->cap = cap;
    for (uint32_t i = 0; i < cap; i++) {
        tx->free_list[i] = cap - 1 - i;
        tx->dest[i] = -1;
    }
    tx->nfree = cap;
    return GS_OK;
}

void gs_ps_tx_free(gs_ps_tx *tx)
{
    if (tx->mr)
        gs_mr_dereg(tx->mr);
    free(tx->free_list);
    free(tx->dest);
    memset(tx, 0, sizeof(*tx));
}

gs_status gs_ps_tx_send(gs_ps *ps, gs_ps_tx *tx, int rank, const void *rec, const gs_rmr *dst, uint64_t off,
                        uint32_t imm)
{
    uint32_t slot;
    char *buf;
    gs_status st;
    if (tx->nfree == 0)
        return GS_ERR_AGAIN;
    slot = tx->free_list[tx->nfree - 1];
    buf = (char *)gs_mr_addr(tx->mr) + (size_t)slot * GS_PS_ALIGN;
    if (rec)
        memcpy(buf, rec, GS_PS_ALIGN);
    st = gs_ep_write_imm(gs_tp_ep(ps->tp, rank), buf, tx->mr, rec ? GS_PS_ALIGN : 0, dst, off, imm,
                         gs_ps_wr(GS_PS_WR_TX, slot), GS_OP_SIGNALED);
    if (st == GS_OK) {
        tx->nfree--;
        tx->dest[slot] = rank;
    }
    return st;
}

void gs_ps_tx_complete(gs_ps_tx *tx, uint64_t wr_id)
{
    uint64_t slot = gs_ps_wr_index(wr_id);
    if (slot < tx->cap && tx->dest[slot] >= 0) {
        tx->dest[slot] = -1;
        tx->free_list[tx->nfree++] = (uint32_t)slot;
    }
}

bool gs_ps_peer_lost(const gs_ps *ps, int rank)
{
    int i = ps->role_index[rank];
    if (ps->is_server)
        return i < ps->nworkers && ps->worker_ranks[i] == rank && ps->srv.lost[i];
    return i < ps->nservers && ps->server_ranks[i] == rank && ps->wrk.server_lost[i];
}

uint32_t gs_ps_tx_live(const gs_ps *ps, const gs_ps_tx *tx)
{
    uint32_t live = 0;
    if (tx->nfree == tx->cap)
        return 0;
    for (uint32_t slot = 0; slot < tx->cap; slot++)
        live += tx->dest[slot] >= 0 && !gs_ps_peer_lost(ps, tx->dest[slot]);
    return live;
}

gs_status gs_ps_ctrl_send(gs_ps *ps, int rank, uint32_t cmd, uint32_t arg)
{
    gs_ps_tx *tx = ps->is_server ? &ps->srv.tx : &ps->wrk.tx;
    return gs_ps_tx_send(ps, tx, rank, NULL, &ps->ctrl_rmrs[rank], 0, gs_ps_imm_ctrl(cmd, arg));
}

/* ---- connecting --------------------------------------------------------------------------- */

gs_status gs_ps_connect(gs_ps *ps)
{
    char tag[64];
    gs_rmr mine;
    gs_ps_tx *tx = ps->is_server ? &ps->srv.tx : &ps->wrk.tx;
    gs_status st =
        gs_mr_alloc(ps->tp, GS_PS_ALIGN, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE, &ps->ctrl);
    if (st == GS_OK)
        st = gs_ps_tx_init(ps, tx, GS_PS_TX_RECORDS);
    if (st == GS_OK && !ps->ctrl_rmrs && !(ps->ctrl_rmrs = gs_calloc((size_t)ps->size, sizeof(gs_rmr))))
        st = GS_ERR_NOMEM;
    if (st != GS_OK)
        return st;
    gs_mr_pack(ps->ctrl, &mine);
    gs_ps_tag(ps, tag, sizeof(tag), "ctrl");
    return gs_store_allgather(ps->ctx, tag, &mine, sizeof(mine), ps->ctrl_rmrs);
}

void gs_ps_disconnect(gs_ps *ps)
{
    if (ps->is_server)
        gs_ps_server_free_keys(ps);
    else
        gs_ps_worker_free_keys(ps);
    gs_ps_tx_free(ps->is_server ? &ps->srv.tx : &ps->wrk.tx);
    if (ps->ctrl)
        gs_mr_dereg(ps->ctrl);
    ps->ctrl = NULL;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

static void ps_free(gs_ps *ps)
{
    if (ps->tp)
        gs_ps_disconnect(ps);
    if (ps->is_server)
        gs_ps_server_fini(ps);
    else
        gs_ps_worker_fini(ps);
    if (ps->tp)
        gs_tp_close(ps->tp);
    gs_ps_plan_free(&ps->plan);
    free(ps->ctrl_rmrs);
    free(ps->server_ranks);
    free(ps->worker_ranks);
    free(ps->role_index);
    free(ps->incarnation);
    free(ps);
}

static gs_status open_transport(gs_ps *ps)
{
    gs_status st = gs_tp_open(ps->ctx, ps->transport, &ps->tp);
    if (st == GS_OK && ps->params.agg == GS_PS_AGG_FETCH_ADD &&
        !(ps->tp->ops->caps(ps->tp) & GS_TP_CAP_ATOMIC))
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_UNSUPPORTED,
                     "rank %d: GS_PS_AGG=atomic needs remote atomics, which the %s transport lacks here; use "
                     "GS_PS_AGG=write",
                     ps->rank, gs_tp_name(ps->tp));
    return st;
}

gs_status gs_ps_state_init(gs_ps *ps)
{
    gs_status st = gs_ps_fixed_init(&ps->fixed, ps->params.atomic_frac_bits, ps->nworkers);
    if (st == GS_OK)
        st = gs_ps_plan_init(&ps->plan, ps->nservers, ps->params.shard_bytes, sizeof(float));
    if (st == GS_OK && !(ps->incarnation = gs_calloc((size_t)ps->nservers, sizeof(uint32_t))))
        st = GS_ERR_NOMEM;
    if (st == GS_OK)
        st = ps->is_server ? gs_ps_server_init(ps) : gs_ps_worker_init(ps);
    return st;
}

static gs_status setup(gs_ps *ps)
{
    gs_status st = assign_roles(ps);
    if (st == GS_OK)
        st = gs_ps_state_init(ps);
    if (st == GS_OK)
        st = open_transport(ps);
    if (st == GS_OK)
        st = gs_ps_connect(ps);
    return st;
}

gs_status gs_ps_create(gs_ctx *ctx, const gs_ps_params *params, gs_ps **ps_p)
{
    gs_ps *ps;
    gs_status st;
    if (!ctx || !params || !ps_p)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_create: ctx, params and ps_p must not be NULL");
    st = check_params(ctx, params);
    if (st != GS_OK)
        return st;
    if (!(ps = gs_calloc(1, sizeof(*ps))))
        return GS_ERR_NOMEM;
    ps->ctx = ctx;
    ps->cfg = &ctx->cfg;
    ps->rank = ctx->rank;
    ps->size = ctx->size;
    ps->timeout_ms = ctx->cfg.timeout_ms;
    ps->ns = create_count++;
    st = copy_params(ps, params);
    if (st == GS_OK)
        st = ctx->cfg.rejoin ? gs_ps_restart(ps) : setup(ps);
    if (st != GS_OK) {
        ps_free(ps);
        return st;
    }
    for (int s = 0; s < ps->nservers; s++)
        ps->incarnation[s] = ps->incarnation[s] ? ps->incarnation[s] : 1;
    gs_log_info(PS, "rank %d: parameter server %s %d of %d (%d servers, %d workers, %s, %s aggregation, %s)",
                ps->rank, gs_ps_role_name(ps), ps->index, ps->is_server ? ps->nservers : ps->nworkers,
                ps->nservers, ps->nworkers, ps->params.mode == GS_PS_MODE_SYNC ? "sync" : "async",
                ps->params.agg == GS_PS_AGG_FETCH_ADD ? "atomic" : "write", gs_tp_name(ps->tp));
    *ps_p = ps;
    return GS_OK;
}

/* Workers say BYE to every server; everyone meets once more before closing. */
static gs_status say_goodbye(gs_ps *ps)
{
    char tag[64];
    gs_status st = GS_OK;
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    if (!ps->is_server) {
        for (size_t k = 0; k < ps->wrk.nkeys; k++)
            if (ps->wrk.keys[k].head) {
                gs_ps_worker_fail_all(ps, gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                                                  "rank %d: gs_ps_destroy with requests not waited for",
                                                  ps->rank));
                break;
            }
        for (int s = 0; s < ps->nservers; s++) {
            gs_status sst =
                ps->wrk.server_lost[s] ? GS_OK : gs_ps_worker_ctrl_send(ps, s, GS_PS_CTRL_BYE, 0, deadline);
            st = st != GS_OK ? st : sst;
        }
        /* let the BYEs leave before the barrier (a lost server's records may never come back) */
        while (gs_ps_tx_live(ps, &ps->wrk.tx) > 0 && !gs_deadline_passed(deadline))
            if (gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline)) != GS_OK)
                break;
    }
    gs_ps_tag(ps, tag, sizeof(tag), "bye");
    gs_status bst = gs_store_barrier(ps->ctx, tag);
    return st != GS_OK ? st : bst;
}

gs_status gs_ps_destroy(gs_ps *ps)
{
    gs_status st = GS_OK;
    if (!ps)
        return GS_OK;
    if (ps->thread_started) {
        pthread_join(ps->thread, NULL);
        st = ps->thread_status;
    }
    gs_status bst = say_goodbye(ps);
    if (bst != GS_OK)
        gs_log_warn(PS, "rank %d: parameter server teardown: %s (continuing)", ps->rank, gs_last_error());
    ps_free(ps);
    return st;
}
