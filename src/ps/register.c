/*
 * Registration of a key, collective over every rank:
 *   1. every rank adds the key to its copy of the plan (the same everywhere);
 *   2. servers allocate their shards' regions (restoring them from a
 *      checkpoint when one holds them), workers their staging and notice
 *      regions;
 *   3. servers publish their shards' descriptors and state through the store,
 *      workers their notice regions;
 *   4. the first worker writes the initial values into its slot of every
 *      shard not restored (WRITE_IMM, CTRL INIT) and the servers copy them in;
 *   5. everyone meets at a barrier.
 */
#include "ps/ps.h"

#include "ps/optim.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a server publishes per shard of a key. */
typedef struct shard_desc {
    gs_rmr param, slots, acc;
    uint64_t restored;
    uint64_t version;
    uint64_t min_step;
    uint64_t epoch;
} shard_desc;

/* What a worker publishes per key. */
typedef struct worker_desc {
    gs_rmr notice;
    uint64_t has_init;
} worker_desc;

static void key_tag(char *buf, size_t cap, const gs_ps *ps, uint64_t key, const char *what, int index)
{
    gs_ps_tag(ps, buf, cap, "k%llx.%s%d", (unsigned long long)key, what, index);
}

/* A worker's progress on a shard, as a server publishes it. */
typedef struct wprogress {
    uint64_t received, applied, saved;
} wprogress;

/* ---- server side --------------------------------------------------------------- */

static gs_status alloc_server_shard(gs_ps *ps, gs_ps_sshard *sh)
{
    uint32_t W = (uint32_t)ps->nworkers;
    size_t nslots = ps->params.agg == GS_PS_AGG_FETCH_ADD ? 1 : W;
    int nstate = gs_ps_optim_nstate(ps->params.optim.kind);
    gs_status st = gs_mr_alloc(ps->tp, gs_ps_param_region_bytes(W, sh->count),
                               GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_READ, &sh->param);
    if (st == GS_OK)
        st = gs_mr_alloc(ps->tp, nslots * gs_ps_slot_bytes(sh->count),
                         GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE, &sh->slots);
    if (st == GS_OK && ps->params.agg == GS_PS_AGG_FETCH_ADD)
        st = gs_mr_alloc(ps->tp, gs_ps_acc_region_bytes(W, sh->count),
                         GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_ATOMIC, &sh->acc);
    for (int s = 0; st == GS_OK && s < nstate; s++)
        st = gs_pages_alloc(sh->count * sizeof(float), (void **)&sh->state[s]);
    if (st == GS_OK && !(sh->notice = gs_calloc(W, sizeof(gs_rmr))))
        st = GS_ERR_NOMEM;
    if (st == GS_OK && !(sh->dirty = gs_calloc(W, 1)))
        st = GS_ERR_NOMEM;
    sh->status_about = -1;
    return st;
}

static void free_server_shard(gs_ps *ps, gs_ps_sshard *sh)
{
    int nstate = gs_ps_optim_nstate(ps->params.optim.kind);
    if (sh->param)
        gs_mr_dereg(sh->param);
    if (sh->slots)
        gs_mr_dereg(sh->slots);
    if (sh->acc)
        gs_mr_dereg(sh->acc);
    for (int s = 0; s < nstate; s++)
        gs_pages_free(sh->state[s], sh->count * sizeof(float));
    free(sh->notice);
    free(sh->dirty);
    memset(sh, 0, sizeof(*sh));
}

void gs_ps_server_free_keys(gs_ps *ps)
{
    for (uint32_t i = 0; i < ps->srv.nshards; i++)
        free_server_shard(ps, &ps->srv.shards[i]);
    ps->srv.nshards = 0;
}

static void init_head(gs_ps *ps, gs_ps_sshard *sh)
{
    gs_ps_head *h = gs_ps_head_of(sh);
    memset(h, 0, gs_ps_param_data_off((uint32_t)ps->nworkers));
    h->layout = GS_PS_LAYOUT_VERSION;
    h->workers = (uint32_t)ps->nworkers;
    h->count = sh->count;
    h->data_off = gs_ps_param_data_off((uint32_t)ps->nworkers);
    h->epoch = ps->srv.epoch;
}

gs_status gs_ps_server_add_key(gs_ps *ps, const gs_ps_key_info *key)
{
    gs_ps_server *srv = &ps->srv;
    gs_status st = GS_OK;
    for (size_t i = 0; st == GS_OK && i < key->nshards; i++) {
        const gs_ps_shard_info *info = &ps->plan.shards[key->first_shard + i];
        if (info->server != (uint32_t)ps->index)
            continue;
        if (srv->nshards == srv->shards_cap) {
            uint32_t cap = srv->shards_cap ? srv->shards_cap * 2 : 16;
            gs_ps_sshard *p = realloc(srv->shards, cap * sizeof(*p));
            if (!p)
                return gs_fail(GS_SUBSYS_PS, GS_ERR_NOMEM, "rank %d: no memory for %u shards", ps->rank, cap);
            srv->shards = p;
            srv->shards_cap = cap;
        }
        gs_ps_sshard *sh = &srv->shards[srv->nshards++];
        memset(sh, 0, sizeof(*sh));
        sh->gid = (uint32_t)(key->first_shard + i);
        sh->kindex = (uint32_t)i;
        sh->key = key->key;
        sh->count = info->count;
        st = alloc_server_shard(ps, sh);
        if (st == GS_OK) {
            init_head(ps, sh);
            st = gs_ps_server_restore_shard(ps, sh);
        }
    }
    return st;
}

/* ---- worker side ---------------------------------------------------------------- */

static gs_status grow_worker_arrays(gs_ps *ps)
{
    gs_ps_worker *wrk = &ps->wrk;
    if (wrk->nkeys == wrk->keys_cap) {
        size_t cap = wrk->keys_cap ? wrk->keys_cap * 2 : 8;
        gs_ps_wkey *p = realloc(wrk->keys, cap * sizeof(*p));
        if (!p)
            return gs_fail(GS_SUBSYS_PS, GS_ERR_NOMEM, "rank %d: no memory for %zu keys", ps->rank, cap);
        wrk->keys = p;
        wrk->keys_cap = cap;
    }
    if (wrk->shards_cap < ps->plan.nshards) {
        size_t cap = ps->plan.shards_cap;
        gs_ps_wshard *p = realloc(wrk->shards, cap * sizeof(*p));
        if (!p)
            return gs_fail(GS_SUBSYS_PS, GS_ERR_NOMEM, "rank %d: no memory for %zu shards", ps->rank, cap);
        wrk->shards = p;
        wrk->shards_cap = cap;
    }
    return GS_OK;
}

static gs_status alloc_worker_key(gs_ps *ps, gs_ps_wkey *wk)
{
    size_t pull_bytes = 0;
    gs_status st;
    wk->depth = ps->log_depth;
    wk->entry_bytes = gs_ps_align_up(wk->count * sizeof(float));
    if (!(wk->pull_off = gs_calloc(wk->nshards, sizeof(size_t))))
        return GS_ERR_NOMEM;
    for (size_t i = 0; i < wk->nshards; i++) {
        wk->pull_off[i] = pull_bytes;
        pull_bytes += gs_ps_pull_stage_bytes((uint32_t)ps->nworkers, ps->plan.shards[wk->first + i].count);
    }
    st = gs_mr_alloc(ps->tp, wk->depth * wk->entry_bytes, GS_ACCESS_LOCAL_WRITE, &wk->log);
    if (st == GS_OK)
        st = gs_mr_alloc(ps->tp, pull_bytes, GS_ACCESS_LOCAL_WRITE, &wk->pull);
    if (st == GS_OK)
        st = gs_mr_alloc(ps->tp, wk->nshards * sizeof(gs_ps_notice),
                         GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE, &wk->notice);
    if (st == GS_OK && ps->params.agg == GS_PS_AGG_FETCH_ADD)
        st = gs_mr_alloc(ps->tp, wk->nshards * (2 * GS_PS_ATOMIC_CHUNK_ELEMS + 8) * sizeof(int64_t),
                         GS_ACCESS_LOCAL_WRITE, &wk->atomic);
    return st;
}

static void free_worker_key(gs_ps_wkey *wk)
{
    if (wk->log)
        gs_mr_dereg(wk->log);
    if (wk->pull)
        gs_mr_dereg(wk->pull);
    if (wk->notice)
        gs_mr_dereg(wk->notice);
    if (wk->atomic)
        gs_mr_dereg(wk->atomic);
    free(wk->pull_off);
    wk->log = wk->pull = wk->notice = wk->atomic = NULL;
    wk->pull_off = NULL;
}

void gs_ps_worker_free_keys(gs_ps *ps)
{
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        free_worker_key(&ps->wrk.keys[k]);
    ps->wrk.nkeys = 0;
}

gs_status gs_ps_worker_add_key(gs_ps *ps, const gs_ps_key_info *key)
{
    gs_ps_wkey *wk;
    gs_status st = grow_worker_arrays(ps);
    if (st != GS_OK)
        return st;
    wk = &ps->wrk.keys[ps->wrk.nkeys++];
    memset(wk, 0, sizeof(*wk));
    wk->key = key->key;
    wk->count = key->count;
    wk->first = key->first_shard;
    wk->nshards = key->nshards;
    for (size_t i = 0; i < key->nshards; i++) {
        const gs_ps_shard_info *info = &ps->plan.shards[key->first_shard + i];
        ps->wrk.shards[key->first_shard + i] = (gs_ps_wshard){.gid = (uint32_t)(key->first_shard + i),
                                                              .keyi = (uint32_t)(ps->wrk.nkeys - 1),
                                                              .kindex = (uint32_t)i,
                                                              .server = (int)info->server,
                                                              .server_rank = ps->server_ranks[info->server],
                                                              .offset = info->offset,
                                                              .count = info->count,
                                                              .slot = info->slot};
    }
    return alloc_worker_key(ps, wk);
}

/* ---- the exchange ----------------------------------------------------------------- */

/* Server: descriptors and state of its shards of key, then each worker's notice region. */
static gs_status server_exchange(gs_ps *ps, const gs_ps_key_info *key, bool *init_expected_p)
{
    char tag[GS_STORE_KEY_MAX + 1];
    size_t n = 0, W = (size_t)ps->nworkers;
    shard_desc *descs = gs_calloc(key->nshards, sizeof(*descs));
    wprogress *prog = gs_calloc(key->nshards * W, sizeof(wprogress));
    worker_desc wd;
    gs_status st = descs && prog ? GS_OK : GS_ERR_NOMEM;
    for (uint32_t i = 0; st == GS_OK && i < ps->srv.nshards; i++) {
        gs_ps_sshard *sh = &ps->srv.shards[i];
        if (sh->key != key->key)
            continue;
        gs_mr_pack(sh->param, &descs[n].param);
        gs_mr_pack(sh->slots, &descs[n].slots);
        if (sh->acc)
            gs_mr_pack(sh->acc, &descs[n].acc);
        descs[n].restored = sh->restored;
        descs[n].version = gs_ps_head_of(sh)->version;
        descs[n].min_step = gs_ps_head_of(sh)->min_step;
        descs[n].epoch = gs_ps_head_of(sh)->epoch;
        for (size_t w = 0; w < W; w++) {
            const gs_ps_wstate *ws = &gs_ps_wstate_of(sh)[w];
            prog[n * W + w] =
                (wprogress){__atomic_load_n(&ws->received, __ATOMIC_ACQUIRE), ws->applied, ws->saved};
        }
        n++;
    }
    key_tag(tag, sizeof(tag), ps, key->key, "s", ps->index);
    if (st == GS_OK && n > 0) {
        size_t len = n * sizeof(*descs) + n * W * sizeof(wprogress);
        char *blob = gs_calloc(1, len);
        st = blob ? GS_OK : GS_ERR_NOMEM;
        if (blob) {
            memcpy(blob, descs, n * sizeof(*descs));
            memcpy(blob + n * sizeof(*descs), prog, n * W * sizeof(wprogress));
            st = gs_store_put(ps->ctx, tag, blob, len);
            free(blob);
        }
    }
    for (int w = 0; st == GS_OK && w < ps->nworkers; w++) {
        size_t len;
        key_tag(tag, sizeof(tag), ps, key->key, "w", w);
        st = gs_store_get(ps->ctx, tag, &wd, sizeof(wd), &len);
        for (uint32_t i = 0; st == GS_OK && i < ps->srv.nshards; i++)
            if (ps->srv.shards[i].key == key->key) {
                ps->srv.shards[i].notice[w] = wd.notice;
                if (w == 0 && wd.has_init && !ps->srv.shards[i].restored) {
                    ps->srv.shards[i].init_pending = 1;
                    *init_expected_p = true;
                }
            }
    }
    free(descs);
    free(prog);
    return st;
}

/* Worker: takes server s's blob for key and fills its shards. */
static gs_status worker_take_blob(gs_ps *ps, gs_ps_wkey *wk, int s, const char *blob, size_t len)
{
    size_t n = 0, W = (size_t)ps->nworkers;
    for (size_t i = 0; i < wk->nshards; i++)
        n += ps->wrk.shards[wk->first + i].server == s;
    size_t want = n * sizeof(shard_desc) + n * W * sizeof(wprogress);
    if (len != want)
        return gs_fail(
            GS_SUBSYS_PS, GS_ERR_MISMATCH,
            "rank %d: register key %llu: server %d described %zu bytes of shards, expected %zu for %zu "
            "shards (do all ranks register the same keys in the same order?)",
            ps->rank, (unsigned long long)wk->key, s, len, want, n);
    const wprogress *prog = (const wprogress *)(blob + n * sizeof(shard_desc));
    size_t j = 0;
    for (size_t i = 0; i < wk->nshards; i++) {
        gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
        shard_desc d;
        if (ws->server != s)
            continue;
        memcpy(&d, blob + j * sizeof(d), sizeof(d));
        ws->param = d.param;
        ws->slots = d.slots;
        ws->acc = d.acc;
        ws->restored = d.restored;
        /* the server's word on what it has of ours: a push it has not received is sent again */
        wprogress p = prog[j * W + (size_t)ps->index];
        ws->pushed = p.received;
        memset(&ws->seen, 0, sizeof(ws->seen));
        ws->seen = (gs_ps_notice){.version = d.version,
                                  .min_step = d.min_step,
                                  .received = p.received,
                                  .applied = p.applied,
                                  .saved = p.saved,
                                  .epoch = d.epoch,
                                  .worker = -1};
        ws->error = GS_OK;
        ws->error_version = 0;
        ws->phase = GS_PS_IDLE;
        j++;
    }
    return GS_OK;
}

static gs_status worker_exchange(gs_ps *ps, gs_ps_wkey *wk, bool has_init, bool *restored_p)
{
    char tag[GS_STORE_KEY_MAX + 1];
    worker_desc mine = {.has_init = has_init};
    gs_status st;
    gs_mr_pack(wk->notice, &mine.notice);
    key_tag(tag, sizeof(tag), ps, wk->key, "w", ps->index);
    st = gs_store_put(ps->ctx, tag, &mine, sizeof(mine));
    for (int s = 0; st == GS_OK && s < ps->nservers; s++) {
        size_t n = 0, cap = 0, len;
        char *blob;
        for (size_t i = 0; i < wk->nshards; i++)
            n += ps->wrk.shards[wk->first + i].server == s;
        if (n == 0)
            continue;
        cap = n * (sizeof(shard_desc) + (size_t)ps->nworkers * sizeof(wprogress));
        if (!(blob = gs_calloc(1, cap)))
            return GS_ERR_NOMEM;
        key_tag(tag, sizeof(tag), ps, wk->key, "s", s);
        st = gs_store_get(ps->ctx, tag, blob, cap, &len);
        if (st == GS_OK)
            st = worker_take_blob(ps, wk, s, blob, len);
        for (size_t i = 0; st == GS_OK && i < n; i++)
            *restored_p = *restored_p || ((shard_desc *)blob)[i].restored;
        free(blob);
    }
    return st;
}

/* Worker 0: the initial values of every shard not restored, into its slot 0. */
static gs_status send_init(gs_ps *ps, gs_ps_wkey *wk, const float *init)
{
    char *stage = gs_mr_addr(wk->log);
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    size_t posted = 0;
    gs_status st = GS_OK;
    memcpy(stage, init, wk->count * sizeof(float));
    for (size_t i = 0; st == GS_OK && i < wk->nshards; i++) {
        gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
        if (ws->restored)
            continue; /* the checkpoint wins */
        for (;;) {    /* a full send queue: take completions, post again */
            st = gs_ep_write_imm(gs_tp_ep(ps->tp, ws->server_rank), stage + ws->offset * sizeof(float),
                                 wk->log, ws->count * sizeof(float), &ws->slots, 0,
                                 gs_ps_imm_ctrl(GS_PS_CTRL_INIT, ws->slot), gs_ps_wr(GS_PS_WR_INIT, ws->gid),
                                 GS_OP_SIGNALED);
            if (st != GS_ERR_AGAIN)
                break;
            if (gs_deadline_passed(deadline)) {
                st = gs_fail(GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                             "rank %d: register key %llu: send queue to server rank "
                             "%d stayed full",
                             ps->rank, (unsigned long long)wk->key, ws->server_rank);
                break;
            }
            gs_ps_worker_progress(ps, 0);
        }
        posted += st == GS_OK;
    }
    ps->wrk.init_pending += posted;
    while (st == GS_OK && ps->wrk.init_pending > 0) {
        if (gs_deadline_passed(deadline))
            st = gs_fail(GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                         "rank %d: register key %llu: initial values not delivered within %lld ms", ps->rank,
                         (unsigned long long)wk->key, (long long)ps->timeout_ms);
        else
            st = gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline));
    }
    return st;
}

static gs_status server_wait_init(gs_ps *ps, uint64_t key)
{
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    gs_status st = GS_OK;
    for (;;) {
        int pending = 0;
        for (uint32_t i = 0; i < ps->srv.nshards; i++)
            pending += ps->srv.shards[i].key == key && ps->srv.shards[i].init_pending;
        if (pending == 0 || st != GS_OK)
            return st;
        if (gs_deadline_passed(deadline))
            return gs_fail(GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                           "rank %d: register key %llu: %d shards never got their initial values from worker "
                           "rank %d within %lld ms",
                           ps->rank, (unsigned long long)key, pending, ps->worker_ranks[0],
                           (long long)ps->timeout_ms);
        st = gs_ps_server_progress(ps, gs_ps_wait_ms(deadline));
    }
}

gs_status gs_ps_exchange_key(gs_ps *ps, size_t ki, const float *init)
{
    const gs_ps_key_info *key = &ps->plan.keys[ki];
    char tag[GS_STORE_KEY_MAX + 1];
    gs_status st;
    if (ps->is_server) {
        bool init_expected = false;
        st = server_exchange(ps, key, &init_expected);
        if (st == GS_OK && init_expected)
            st = server_wait_init(ps, key->key);
    } else {
        gs_ps_wkey *wk = &ps->wrk.keys[ki];
        bool restored = false, has_init = ps->index == 0 && init != NULL;
        st = worker_exchange(ps, wk, has_init, &restored);
        if (st == GS_OK && has_init)
            st = send_init(ps, wk, init);
    }
    key_tag(tag, sizeof(tag), ps, key->key, "ready", 0);
    if (st == GS_OK)
        st = gs_store_barrier(ps->ctx, tag);
    return st;
}

/* A key restored from a checkpoint goes on from the step its servers hold
 * (the lowest, if shards differ: those ahead skip the steps they have). */
void gs_ps_worker_start_at_servers(gs_ps *ps, gs_ps_wkey *wk)
{
    uint64_t step = UINT64_MAX;
    for (size_t i = 0; i < wk->nshards; i++)
        if (ps->wrk.shards[wk->first + i].pushed < step)
            step = ps->wrk.shards[wk->first + i].pushed;
    wk->next_step = step;
}

/* Elastic: the key list in the store (key, count per key), for a worker
 * that rejoins later (gs_ps_restart). */
static gs_status publish_keys(gs_ps *ps)
{
    char tag[64];
    uint64_t *list = gs_calloc(2 * ps->plan.nkeys, sizeof(uint64_t));
    gs_status st = list ? GS_OK : GS_ERR_NOMEM;
    for (size_t k = 0; list && k < ps->plan.nkeys; k++) {
        list[2 * k] = ps->plan.keys[k].key;
        list[2 * k + 1] = ps->plan.keys[k].count;
    }
    snprintf(tag, sizeof(tag), "gs.ps.%u.keys", ps->ns);
    if (st == GS_OK)
        st = gs_store_put(ps->ctx, tag, list, 2 * ps->plan.nkeys * sizeof(uint64_t));
    free(list);
    return st;
}

gs_status gs_ps_register(gs_ps *ps, uint64_t key, size_t count, const float *init)
{
    const gs_ps_key_info *info;
    gs_status st;
    if (!ps)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_register: ps is NULL");
    if (ps->thread_started)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                       "rank %d: gs_ps_register after gs_ps_serve_start: register every key first", ps->rank);
    if (ps->restarted) { /* the keys came from the checkpoint (a rejoined worker: from the store) */
        info = gs_ps_plan_find(&ps->plan, key);
        if (info && info->count == count)
            return GS_OK;
        return gs_fail(
            GS_SUBSYS_PS, GS_ERR_MISMATCH, "rank %d: restarted %s %d: key %llu (%zu elements) is not in %s%s",
            ps->rank, gs_ps_role_name(ps), ps->index, (unsigned long long)key, count,
            ps->is_server ? "its checkpoint" : "the job's key list", info ? " with that size" : "");
    }
    st = gs_ps_plan_add(&ps->plan, key, count);
    if (st != GS_OK)
        return st;
    info = gs_ps_plan_find(&ps->plan, key);
    st = ps->is_server ? gs_ps_server_add_key(ps, info) : gs_ps_worker_add_key(ps, info);
    if (st == GS_OK)
        st = gs_ps_exchange_key(ps, ps->plan.nkeys - 1, init);
    if (st == GS_OK && !ps->is_server)
        gs_ps_worker_start_at_servers(ps, &ps->wrk.keys[ps->wrk.nkeys - 1]);
    if (st == GS_OK && ps->params.elastic && !ps->is_server && ps->index == 0)
        st = publish_keys(ps);
    if (st == GS_OK)
        gs_log_debug(PS, "rank %d: key %llu registered: %zu elements in %zu shards", ps->rank,
                     (unsigned long long)key, count, info->nshards);
    return st;
}
