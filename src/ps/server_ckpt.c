/*
 * A server's checkpoints: every GS_PS_CHECKPOINT_EVERY versions of any of
 * its shards, on a worker's request, and when serving ends; restored at
 * registration (a job resumed) or at a restart (GS_REJOIN=1).
 *
 * What makes a restart exact: the file records, per shard, the version and
 * how many pushes of each worker are applied. A server writes it between
 * two updates (its loop is single-threaded), so the file is one consistent
 * state. Workers keep every push not yet covered by a checkpoint (they learn
 * `saved` from the notices) and, after a restart, re-push exactly the ones
 * the restored state has not applied: nothing is lost or applied twice.
 */
#include "ps/ps.h"

#include "ps/optim.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdlib.h>
#include <string.h>

static gs_status check_meta(const gs_ps *ps, const char *path, const gs_ps_ckpt_meta *m)
{
    const char *what = NULL;
    if (m->servers != (uint32_t)ps->nservers || m->server != (uint32_t)ps->index)
        what = "server count or index";
    else if (m->workers != (uint32_t)ps->nworkers)
        what = "worker count";
    else if (m->shard_bytes != ps->plan.shard_bytes)
        what = "GS_PS_SHARD_BYTES";
    else if (m->optim.kind != ps->params.optim.kind)
        what = "optimizer";
    else if (m->mode != ps->params.mode)
        what = "GS_PS_MODE";
    if (what)
        return gs_fail(
            GS_SUBSYS_PS, GS_ERR_CONFIG,
            "rank %d: checkpoint %s was written by a job with another %s; run with the same settings "
            "or remove the file",
            ps->rank, path, what);
    return GS_OK;
}

gs_status gs_ps_server_load_checkpoint(gs_ps *ps)
{
    char path[GS_CONFIG_STR_MAX + 32];
    gs_status st;
    if (!ps->checkpoint[0])
        return GS_OK;
    gs_ps_ckpt_path(path, sizeof(path), ps->checkpoint, (uint32_t)ps->index);
    st = gs_ps_ckpt_read(path, &ps->srv.restore);
    if (st == GS_OK && ps->srv.restore)
        st = check_meta(ps, path, &ps->srv.restore->meta);
    if (st == GS_OK && ps->srv.restore) {
        ps->srv.epoch = ps->srv.restore->meta.epoch + 1;
        gs_log_info(PS, "rank %d: server %d restores from %s (step %llu, %u shards, incarnation %u)",
                    ps->rank, ps->index, path, (unsigned long long)ps->srv.restore->meta.step,
                    ps->srv.restore->nshards, ps->srv.epoch);
    }
    return st;
}

gs_status gs_ps_server_restore_shard(gs_ps *ps, gs_ps_sshard *sh)
{
    const gs_ps_ckpt *ck = ps->srv.restore;
    int nstate = gs_ps_optim_nstate(ps->params.optim.kind);
    for (uint32_t i = 0; ck && i < ck->nshards; i++) {
        const gs_ps_ckpt_view *v = &ck->shards[i];
        gs_ps_head *h = gs_ps_head_of(sh);
        gs_ps_wstate *ws = gs_ps_wstate_of(sh);
        if (v->rec.key != sh->key || v->rec.index != sh->kindex)
            continue;
        if (v->rec.count != sh->count)
            return gs_fail(
                GS_SUBSYS_PS, GS_ERR_CONFIG,
                "rank %d: checkpoint holds key %llu shard %u with %llu elements, the job registered %zu",
                ps->rank, (unsigned long long)sh->key, sh->kindex, (unsigned long long)v->rec.count,
                sh->count);
        memcpy(gs_ps_params_of(sh), v->params, sh->count * sizeof(float));
        for (int s = 0; s < nstate; s++)
            memcpy(sh->state[s], v->state[s], sh->count * sizeof(float));
        h->version = v->rec.version;
        sh->opt_steps = v->rec.opt_steps;
        sh->saved_version = v->rec.version;
        for (int w = 0; w < ps->nworkers; w++)
            ws[w].received = ws[w].applied = ws[w].saved = v->applied[w];
        h->min_step = gs_ps_min_step(ps, sh);
        sh->restored = true;
        return GS_OK;
    }
    return GS_OK;
}

static gs_status build_views(gs_ps *ps, gs_ps_ckpt_view *views, uint64_t *applied, gs_ps_ckpt_key *keys,
                             uint64_t *step_p)
{
    uint64_t step = UINT64_MAX;
    for (size_t k = 0; k < ps->plan.nkeys; k++)
        keys[k] = (gs_ps_ckpt_key){ps->plan.keys[k].key, ps->plan.keys[k].count};
    for (uint32_t i = 0; i < ps->srv.nshards; i++) {
        gs_ps_sshard *sh = &ps->srv.shards[i];
        const gs_ps_shard_info *info = &ps->plan.shards[sh->gid];
        uint64_t *a = applied + (size_t)i * (size_t)ps->nworkers;
        for (int w = 0; w < ps->nworkers; w++)
            a[w] = gs_ps_wstate_of(sh)[w].applied;
        views[i] = (gs_ps_ckpt_view){.rec = {.key = sh->key,
                                             .index = sh->kindex,
                                             .offset = info->offset,
                                             .count = sh->count,
                                             .version = gs_ps_head_of(sh)->version,
                                             .opt_steps = sh->opt_steps},
                                     .applied = a,
                                     .params = gs_ps_params_of(sh),
                                     .state = {sh->state[0], sh->state[1]}};
        if (views[i].rec.version < step)
            step = views[i].rec.version;
    }
    *step_p = step == UINT64_MAX ? 0 : step;
    return GS_OK;
}

/* After a good write: what each worker must keep for a replay shrinks. */
static void mark_saved(gs_ps *ps)
{
    for (uint32_t i = 0; i < ps->srv.nshards; i++) {
        gs_ps_sshard *sh = &ps->srv.shards[i];
        gs_ps_wstate *ws = gs_ps_wstate_of(sh);
        gs_ps_seq_begin(gs_ps_head_of(sh));
        for (int w = 0; w < ps->nworkers; w++)
            ws[w].saved = ws[w].applied;
        gs_ps_seq_end(gs_ps_head_of(sh));
        sh->saved_version = gs_ps_head_of(sh)->version;
        gs_ps_notify_all(ps, sh);
    }
}

gs_status gs_ps_server_checkpoint(gs_ps *ps)
{
    char path[GS_CONFIG_STR_MAX + 32];
    uint32_t n = ps->srv.nshards;
    gs_ps_ckpt_view *views = gs_calloc(n ? n : 1, sizeof(*views));
    uint64_t *applied = gs_calloc((size_t)(n ? n : 1) * (size_t)ps->nworkers, sizeof(uint64_t));
    gs_ps_ckpt_key *keys = gs_calloc(ps->plan.nkeys ? ps->plan.nkeys : 1, sizeof(*keys));
    gs_ps_ckpt_meta meta = {.optim = ps->params.optim,
                            .mode = ps->params.mode,
                            .server = (uint32_t)ps->index,
                            .servers = (uint32_t)ps->nservers,
                            .workers = (uint32_t)ps->nworkers,
                            .epoch = ps->srv.epoch,
                            .shard_bytes = ps->plan.shard_bytes,
                            .keys = keys,
                            .nkeys = (uint32_t)ps->plan.nkeys};
    gs_status st = views && applied && keys ? GS_OK : GS_ERR_NOMEM;
    if (st == GS_OK && !ps->checkpoint[0])
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_CONFIG,
                     "rank %d: checkpoint requested but GS_PS_CHECKPOINT is not set", ps->rank);
    if (st == GS_OK)
        st = build_views(ps, views, applied, keys, &meta.step);
    if (st == GS_OK) {
        uint64_t t0 = gs_now_ns();
        gs_ps_ckpt_path(path, sizeof(path), ps->checkpoint, (uint32_t)ps->index);
        st = gs_ps_ckpt_write(path, &meta, views, n);
        if (st == GS_OK) {
            mark_saved(ps);
            gs_log_info(PS, "rank %d: server %d checkpoint at step %llu written to %s in %.1f ms", ps->rank,
                        ps->index, (unsigned long long)meta.step, path, (double)(gs_now_ns() - t0) / 1e6);
        }
    }
    free(views);
    free(applied);
    free(keys);
    return st;
}

gs_status gs_ps_server_maybe_checkpoint(gs_ps *ps)
{
    uint64_t every = (uint64_t)ps->params.checkpoint_every;
    if (!ps->checkpoint[0] || every == 0)
        return GS_OK;
    for (uint32_t i = 0; i < ps->srv.nshards; i++) {
        const gs_ps_sshard *sh = &ps->srv.shards[i];
        if (gs_ps_head_of(sh)->version - sh->saved_version >= every)
            return gs_ps_server_checkpoint(ps);
    }
    return GS_OK;
}
