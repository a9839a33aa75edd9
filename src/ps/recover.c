/*
 * Recovery from a lost server, by rebuilding the job's transport.
 *
 * The transport layer connects every rank to every other when it opens and
 * cannot reconnect one endpoint, so a server that died and was restarted
 * (same rank, GS_REJOIN=1) cannot simply be dialled again. Instead every
 * rank takes part in a recovery round, numbered by the generation G (0 at
 * creation, +1 per recovery):
 *
 *   restarted server      rejoins the store in its rank's place, reads the
 *                         roles and G-1 from the store, loads its checkpoint
 *                         (the key list comes from there), says "back".
 *   workers               (gs_ps_recover, after GS_ERR_PEER_LOST) wait for
 *                         every lost server to be back, then send RECOVER to
 *                         the live servers, which pass it on to every worker
 *                         (so a worker that never talks to the lost server
 *                         learns of it too: its next call fails and it calls
 *                         gs_ps_recover as well).
 *   everyone              meets in the store (allgather "rec"), opens a new
 *                         transport (the store tags of that open are agreed
 *                         from G), moves its registered memory onto it (copy,
 *                         then the old regions and transport are closed),
 *                         and re-exchanges every key's descriptors and state.
 *
 * What makes it exact. A server publishes, per shard and worker, how many
 * pushes it has received (a live server's count; a restarted server's is
 * what its checkpoint had applied). Each worker keeps every push that no
 * checkpoint covers yet in its replay log (GS_PS_CHECKPOINT_EVERY + 2
 * entries per key; a push waits rather than overwrite an entry still
 * needed), so after the rebuild it re-sends exactly steps [received,
 * pushed): nothing the server applied is applied twice, nothing is lost. The
 * call that failed with GS_ERR_PEER_LOST is repeated by the caller; shards
 * that did receive that step skip it. Atomic mode drops partially
 * accumulated steps on the live servers (their workers re-send them whole).
 *
 * Limits: one lost server at a time; the store must outlive it (rank 0, a
 * worker, or the launcher serves it); every rank must take part.
 */
#include "ps/ps.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECOVERY_TP_BASE 0x10000u /* transport open count of recovery G: G * this + 256 * ns */

/* ---- moving the state onto a new transport ------------------------------------------------ */

static gs_status move_region(gs_tp *tp, gs_mr **mrp)
{
    gs_mr *old = *mrp, *fresh = NULL;
    gs_status st;
    if (!old)
        return GS_OK;
    st = gs_mr_alloc(tp, gs_mr_len(old), old->access, &fresh);
    if (st != GS_OK)
        return st;
    memcpy(gs_mr_addr(fresh), gs_mr_addr(old), gs_mr_len(old));
    gs_mr_dereg(old);
    *mrp = fresh;
    return GS_OK;
}

/* Atomic mode: a step partly accumulated before the loss is dropped; its
 * workers send it again whole. */
static void drop_partial_step(gs_ps *ps, gs_ps_sshard *sh)
{
    gs_ps_acc_head *ah = gs_mr_addr(sh->acc);
    uint64_t *arrived = (uint64_t *)((char *)ah + sizeof(*ah));
    gs_ps_wstate *ws = gs_ps_wstate_of(sh);
    uint64_t version = gs_ps_head_of(sh)->version;
    memset((char *)ah + gs_ps_acc_data_off((uint32_t)ps->nworkers), 0, sh->count * sizeof(int64_t));
    ah->arrivals = 0;
    ah->overflow = 0;
    for (int w = 0; w < ps->nworkers; w++) {
        arrived[w] = version;
        ws[w].received = ws[w].applied;
    }
}

static gs_status move_server(gs_ps *ps)
{
    gs_status st = GS_OK;
    for (uint32_t i = 0; st == GS_OK && i < ps->srv.nshards; i++) {
        gs_ps_sshard *sh = &ps->srv.shards[i];
        st = move_region(ps->tp, &sh->param);
        if (st == GS_OK)
            st = move_region(ps->tp, &sh->slots);
        if (st == GS_OK)
            st = move_region(ps->tp, &sh->acc);
        if (st == GS_OK && sh->acc)
            drop_partial_step(ps, sh);
        /* a step still incomplete starts its deadline again */
        sh->waiting_since_ns = sh->waiting_since_ns ? gs_now_ns() : 0;
    }
    return st;
}

static gs_status move_worker(gs_ps *ps)
{
    gs_status st = GS_OK;
    for (size_t k = 0; st == GS_OK && k < ps->wrk.nkeys; k++) {
        gs_ps_wkey *wk = &ps->wrk.keys[k];
        st = move_region(ps->tp, &wk->log);
        if (st == GS_OK)
            st = move_region(ps->tp, &wk->pull);
        if (st == GS_OK)
            st = move_region(ps->tp, &wk->notice);
        if (st == GS_OK)
            st = move_region(ps->tp, &wk->atomic);
    }
    return st;
}

/* A restarted server builds its shards from the checkpoint's keys, a
 * rejoining worker its keys from the job's key list. */
static gs_status build_restarted(gs_ps *ps)
{
    gs_status st = GS_OK;
    for (size_t k = 0; st == GS_OK && k < ps->plan.nkeys; k++)
        st = ps->is_server ? gs_ps_server_add_key(ps, &ps->plan.keys[k])
                           : gs_ps_worker_add_key(ps, &ps->plan.keys[k]);
    return st;
}

/* Opens the new transport and moves (or, restarted, builds) everything onto it. */
static gs_status new_transport(gs_ps *ps, bool restarted)
{
    gs_tp *old = ps->tp, *tp = NULL;
    gs_ps_tx *tx = ps->is_server ? &ps->srv.tx : &ps->wrk.tx;
    gs_status st;
    gs_boot_tp_count_set(ps->ctx, RECOVERY_TP_BASE * ps->gen + 0x100u * (ps->ns & 0xffu));
    st = gs_tp_open(ps->ctx, ps->transport, &tp);
    if (st != GS_OK)
        return st;
    ps->tp = tp;
    if (restarted)
        st = build_restarted(ps);
    else
        st = ps->is_server ? move_server(ps) : move_worker(ps);
    if (old) {
        gs_ps_tx_free(tx);
        if (ps->ctrl)
            gs_mr_dereg(ps->ctrl);
        ps->ctrl = NULL;
        gs_tp_close(old);
    }
    return st;
}

/* ---- the round --------------------------------------------------------------------------- */

/* Everyone meets, learns the servers' incarnations, and rebuilds. Collective. */
static gs_status rebuild(gs_ps *ps, uint32_t gen, bool restarted)
{
    char tag[GS_STORE_KEY_MAX + 1];
    uint32_t mine = ps->is_server ? ps->srv.epoch : 0, *all = gs_calloc((size_t)ps->size, sizeof(uint32_t));
    uint64_t t0 = gs_now_ns();
    gs_status st = all ? GS_OK : GS_ERR_NOMEM;
    ps->gen = gen;
    gs_ps_tag(ps, tag, sizeof(tag), "rec");
    if (st == GS_OK)
        st = gs_store_allgather(ps->ctx, tag, &mine, sizeof(mine), all);
    for (int s = 0; st == GS_OK && s < ps->nservers; s++)
        ps->incarnation[s] = all[ps->server_ranks[s]];
    free(all);
    if (st == GS_OK)
        st = new_transport(ps, restarted);
    if (st == GS_OK)
        st = gs_ps_connect(ps);
    for (size_t k = 0; st == GS_OK && k < ps->plan.nkeys; k++)
        st = gs_ps_exchange_key(ps, k, NULL);
    if (st == GS_OK && !ps->is_server && ps->index == 0) {
        char key[64];
        snprintf(key, sizeof(key), "gs.ps.%u.gen", ps->ns);
        st = gs_store_put(ps->ctx, key, &gen, sizeof(gen));
    }
    if (st == GS_OK)
        gs_log_warn(
            PS, "rank %d: %s %d: recovery %u done in %.1f ms (transport rebuilt, %zu keys re-exchanged)",
            ps->rank, gs_ps_role_name(ps), ps->index, gen, (double)(gs_now_ns() - t0) / 1e6, ps->plan.nkeys);
    return st;
}

/* ---- servers --------------------------------------------------------------------------- */

static bool joiner_waits(gs_ps *ps, int w, uint32_t gen);
static void readmit(gs_ps *ps, int w);

gs_status gs_ps_recover_server(gs_ps *ps)
{
    uint32_t gen = ps->gen + 1;
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    ps->srv.recover_asked = false;
    if (ps->srv.recover_arg != (gen & 0xffffffu)) {
        gs_log_warn(PS, "rank %d: server %d: recovery request for generation %u while at %u (ignored)",
                    ps->rank, ps->index, ps->srv.recover_arg, ps->gen);
        return GS_OK;
    }
    /* every worker hears of it, also those that never talk to the lost server */
    for (int w = 0; w < ps->nworkers; w++)
        if (!ps->srv.lost[w] && !ps->srv.bye[w])
            gs_ps_server_reply(ps, w, GS_PS_CTRL_RECOVER, gen & 0xffffffu);
    while ((ps->srv.noutbox || gs_ps_tx_live(ps, &ps->srv.tx) > 0) && !gs_deadline_passed(deadline))
        if (gs_ps_server_progress(ps, gs_ps_wait_ms(deadline)) != GS_OK)
            break;
    for (int w = 0; ps->params.elastic && w < ps->nworkers; w++)
        if (ps->srv.lost[w] && joiner_waits(ps, w, gen))
            readmit(ps, w);
    return rebuild(ps, gen, false);
}

/* ---- elastic: a worker rejoining ------------------------------------------------------- */

/* Whether a process waits to rejoin in lost worker w's place at recovery gen. */
static bool joiner_waits(gs_ps *ps, int w, uint32_t gen)
{
    char key[128], full[GS_STORE_KEY_MAX + 1]; /* prefix: at most 95 */
    uint32_t cur = ps->gen, got = 0;
    size_t len = 0;
    ps->gen = gen;
    gs_ps_tag(ps, key, sizeof(key), "join.w%d", w);
    ps->gen = cur;
    snprintf(full, sizeof(full), "%s%s", ps->ctx->prefix, key);
    return gs_boot_kv_probe(ps->ctx, full, &got, sizeof(got), &len) == GS_OK && len == sizeof(got);
}

/* Worker w is back: its pushes count from each shard's pending round on
 * (nothing of its earlier incarnation is waited for or applied). */
static void readmit(gs_ps *ps, int w)
{
    gs_ps_server *srv = &ps->srv;
    srv->lost[w] = false;
    srv->finished--;
    for (uint32_t i = 0; i < srv->nshards; i++) {
        gs_ps_sshard *sh = &srv->shards[i];
        gs_ps_head *h = gs_ps_head_of(sh);
        gs_ps_wstate *ws = &gs_ps_wstate_of(sh)[w];
        gs_ps_seq_begin(h);
        ws->received = ws->applied = h->version;
        ws->flags &= ~(uint64_t)GS_PS_WSTATE_LOST;
        h->min_step = gs_ps_min_step(ps, sh);
        gs_ps_seq_end(h);
    }
    gs_log_warn(PS,
                "rank %d: server %d: worker %d (rank %d) rejoins at recovery %u; its pushes count from each "
                "shard's next round",
                ps->rank, ps->index, w, ps->worker_ranks[w], ps->gen + 1);
}

#define JOIN_PROBE_NS 50000000ull /* 50 ms */

void gs_ps_server_check_joiners(gs_ps *ps)
{
    gs_ps_server *srv = &ps->srv;
    uint64_t now = gs_now_ns();
    int lost = 0, waiting = 0;
    if (!ps->params.elastic || srv->recover_asked || now < srv->next_join_probe_ns)
        return;
    srv->next_join_probe_ns = now + JOIN_PROBE_NS;
    for (int w = 0; w < ps->nworkers; w++)
        if (srv->lost[w]) {
            lost++;
            waiting += joiner_waits(ps, w, ps->gen + 1);
        }
    /* the recovery's meeting needs every rank of the job: only once every lost one is replaced */
    if (lost > 0 && waiting == lost) {
        srv->recover_asked = true;
        srv->recover_arg = (ps->gen + 1) & 0xffffffu;
    }
}

static gs_status get_u32(gs_ps *ps, const char *key, void *buf, size_t len)
{
    size_t got = 0;
    gs_status st = gs_store_get(ps->ctx, key, buf, len, &got);
    if (st == GS_OK && got != len)
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_PROTOCOL, "rank %d: store key %s holds %zu bytes, expected %zu",
                     ps->rank, key, got, len);
    return st;
}

/* A rejoined worker's calls go on from the lowest round any of its shards
 * is at, for every key alike: the application's step t is round t of every
 * key, and a shard already past it skips that push (its round completed
 * without this worker). */
static void start_at_lowest_round(gs_ps *ps)
{
    uint64_t lowest = UINT64_MAX;
    for (size_t i = 0; i < ps->plan.nshards; i++)
        lowest = ps->wrk.shards[i].pushed < lowest ? ps->wrk.shards[i].pushed : lowest;
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        ps->wrk.keys[k].next_step = lowest == UINT64_MAX ? 0 : lowest;
}

/* Elastic: a process started with GS_REJOIN=1 in a lost worker's place. It
 * takes the job's keys from the store, says it waits (join.w<i> of the next
 * generation), and meets the others in the recovery the servers then start
 * (the live workers join it from their failed call, gs_ps_recover). */
static gs_status rejoin_worker(gs_ps *ps)
{
    char key[GS_STORE_KEY_MAX + 1];
    uint64_t *list = NULL;
    size_t len = 0, cap = 2 * 4096 * sizeof(uint64_t);
    uint32_t gen = 0;
    gs_status st;
    snprintf(key, sizeof(key), "gs.ps.%u.gen", ps->ns);
    st = get_u32(ps, key, &gen, sizeof(gen));
    if (st == GS_OK)
        st = gs_ps_state_init(ps);
    if (st == GS_OK && !(list = gs_calloc(1, cap)))
        st = GS_ERR_NOMEM;
    snprintf(key, sizeof(key), "gs.ps.%u.keys", ps->ns);
    if (st == GS_OK)
        st = gs_store_get(ps->ctx, key, list, cap, &len);
    for (size_t k = 0; st == GS_OK && k < len / (2 * sizeof(uint64_t)); k++)
        st = gs_ps_plan_add(&ps->plan, list[2 * k], (size_t)list[2 * k + 1]);
    free(list);
    ps->gen = gen + 1;
    ps->restarted = true;
    gs_ps_tag(ps, key, sizeof(key), "join.w%d", ps->index);
    if (st == GS_OK)
        st = gs_store_put(ps->ctx, key, &gen, sizeof(gen));
    if (st == GS_OK)
        gs_log_warn(PS, "rank %d: worker %d rejoins (%zu keys); waiting for recovery %u", ps->rank, ps->index,
                    ps->plan.nkeys, ps->gen);
    if (st == GS_OK)
        st = rebuild(ps, ps->gen, true);
    if (st == GS_OK)
        start_at_lowest_round(ps);
    return st;
}

/* A process started with GS_REJOIN=1 in a lost server's place. */
gs_status gs_ps_restart(gs_ps *ps)
{
    char key[GS_STORE_KEY_MAX + 1];
    uint8_t *roles = gs_calloc((size_t)ps->size, 1);
    uint32_t gen = 0;
    gs_status st = roles ? GS_OK : GS_ERR_NOMEM;
    /* Step 1: what the job looks like, from the store. */
    snprintf(key, sizeof(key), "gs.ps.%u.role_table", ps->ns);
    if (st == GS_OK)
        st = get_u32(ps, key, roles, (size_t)ps->size);
    if (st == GS_OK)
        st = gs_ps_take_roles(ps, roles);
    free(roles);
    if (st == GS_OK && !ps->is_server && !ps->params.elastic)
        st = gs_fail(
            GS_SUBSYS_PS, GS_ERR_CONFIG,
            "rank %d: GS_REJOIN=1 restarts a parameter server, but this rank is a worker of the job (a "
            "worker rejoins only in elastic mode: GS_PS_ELASTIC=1)",
            ps->rank);
    if (st == GS_OK && !ps->is_server)
        return rejoin_worker(ps);
    snprintf(key, sizeof(key), "gs.ps.%u.gen", ps->ns);
    if (st == GS_OK)
        st = get_u32(ps, key, &gen, sizeof(gen));
    /* Step 2: our state, from our checkpoint. */
    if (st == GS_OK)
        st = gs_ps_state_init(ps); /* a server: checked above */
    if (st == GS_OK && !ps->srv.restore)
        st = gs_fail(GS_SUBSYS_PS, GS_ERR_CONFIG,
                     "rank %d: server %d restarted (GS_REJOIN=1) without a checkpoint to restore: set "
                     "GS_PS_CHECKPOINT to the prefix the lost server wrote",
                     ps->rank, ps->index);
    for (uint32_t k = 0; st == GS_OK && k < ps->srv.restore->meta.nkeys; k++)
        st =
            gs_ps_plan_add(&ps->plan, ps->srv.restore->meta.keys[k].key, ps->srv.restore->meta.keys[k].count);
    /* Step 3: back; everyone else rebuilds with us. */
    ps->gen = gen + 1;
    ps->restarted = true;
    gs_ps_tag(ps, key, sizeof(key), "back.s%d", ps->index);
    if (st == GS_OK)
        st = gs_store_put(ps->ctx, key, &ps->srv.epoch, sizeof(ps->srv.epoch));
    if (st == GS_OK)
        gs_log_warn(PS,
                    "rank %d: server %d restarted (incarnation %u) from its checkpoint at step %llu; joining "
                    "recovery %u",
                    ps->rank, ps->index, ps->srv.epoch, (unsigned long long)ps->srv.restore->meta.step,
                    ps->gen);
    return st == GS_OK ? rebuild(ps, ps->gen, true) : st;
}

/* ---- workers ----------------------------------------------------------------------------- */

static bool requests_pending(const gs_ps *ps)
{
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        if (ps->wrk.keys[k].head)
            return true;
    return false;
}

/* Waits for each lost server to be back, then tells the live ones. */
static gs_status gather(gs_ps *ps, uint32_t gen)
{
    char key[GS_STORE_KEY_MAX + 1];
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    uint32_t epoch;
    gs_status st = GS_OK;
    uint32_t old_gen = ps->gen;
    ps->gen = gen;
    for (int s = 0; st == GS_OK && s < ps->nservers; s++) {
        if (!ps->wrk.server_lost[s])
            continue;
        gs_ps_tag(ps, key, sizeof(key), "back.s%d", s);
        gs_log_warn(PS, "rank %d: worker %d waits for server %d (rank %d) to be restarted", ps->rank,
                    ps->index, s, ps->server_ranks[s]);
        st = get_u32(ps, key, &epoch, sizeof(epoch));
    }
    ps->gen = old_gen;
    for (int s = 0; st == GS_OK && s < ps->nservers; s++) {
        gs_status sst;
        if (ps->wrk.server_lost[s])
            continue;
        sst = gs_ps_worker_ctrl_send(ps, s, GS_PS_CTRL_RECOVER, gen & 0xffffffu, deadline);
        if (sst != GS_OK)
            gs_log_info(
                PS, "rank %d: recovery request to server rank %d not sent (%s): it may be recovering already",
                ps->rank, ps->server_ranks[s], gs_status_name(sst));
    }
    while (st == GS_OK && gs_ps_tx_live(ps, &ps->wrk.tx) > 0 && !gs_deadline_passed(deadline))
        gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline));
    return st;
}

/* Re-sends, key by key, the steps a server has not received. */
static gs_status queue_replays(gs_ps *ps, gs_ps_wkey *wk)
{
    uint64_t lo = UINT64_MAX, hi = wk->next_step;
    for (size_t i = 0; i < wk->nshards; i++)
        if (ps->wrk.shards[wk->first + i].pushed < lo)
            lo = ps->wrk.shards[wk->first + i].pushed;
    if (lo >= hi)
        return GS_OK;
    if (hi - lo >= wk->depth)
        return gs_fail(
            GS_SUBSYS_PS, GS_ERR_IO,
            "rank %d: worker %d: key %llu: a server restored step %llu, but this worker keeps its pushes "
            "from "
            "step %llu on only: %llu updates are lost (set GS_PS_CHECKPOINT_EVERY >= 1 so that workers keep "
            "what the checkpoints do not cover)",
            ps->rank, ps->index, (unsigned long long)wk->key, (unsigned long long)lo,
            (unsigned long long)(hi - wk->depth + 1), (unsigned long long)(hi - lo));
    for (uint64_t t = lo; t < hi; t++) {
        gs_ps_req *req = gs_calloc(1, sizeof(*req));
        if (!req)
            return GS_ERR_NOMEM;
        *req = (gs_ps_req){.ps = ps, .key = wk, .push = true, .replay = true, .step = t};
        if (wk->tail)
            wk->tail->next = req;
        else
            wk->head = req;
        wk->tail = req;
    }
    gs_log_warn(PS, "rank %d: worker %d: key %llu: re-sending steps %llu to %llu", ps->rank, ps->index,
                (unsigned long long)wk->key, (unsigned long long)lo, (unsigned long long)(hi - 1));
    return GS_OK;
}

static gs_status replay(gs_ps *ps)
{
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    gs_status st = GS_OK;
    ps->wrk.replay_status = GS_OK;
    for (size_t k = 0; st == GS_OK && k < ps->wrk.nkeys; k++)
        st = queue_replays(ps, &ps->wrk.keys[k]);
    while (st == GS_OK && requests_pending(ps)) {
        if (gs_deadline_passed(deadline))
            st = gs_fail(
                GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                "rank %d: worker %d: re-sent pushes not applied within GS_TIMEOUT_MS=%lld (are all workers "
                "recovering?)",
                ps->rank, ps->index, (long long)ps->timeout_ms);
        else
            st = gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline));
    }
    if (st == GS_OK)
        st = ps->wrk.replay_status;
    if (st != GS_OK)
        gs_ps_worker_set_fatal(ps, st);
    return st;
}

gs_status gs_ps_recover(gs_ps *ps)
{
    uint32_t gen;
    gs_status st;
    if (!ps || ps->is_server)
        return gs_fail(
            GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_recover: %s",
            ps ? "a worker call (a restarted server recovers in gs_ps_create, the others in gs_ps_serve)"
               : "ps is NULL");
    if (requests_pending(ps))
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "rank %d: gs_ps_recover: wait for every request first",
                       ps->rank);
    if (ps->wrk.fatal == GS_OK)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "rank %d: gs_ps_recover: nothing to recover from",
                       ps->rank);
    gen = ps->gen + 1;
    st = gather(ps, gen);
    if (st == GS_OK)
        st = rebuild(ps, gen, false);
    if (st != GS_OK)
        return st; /* still fatal: the job cannot go on */
    memset(ps->wrk.server_lost, 0, (size_t)ps->nservers * sizeof(bool));
    ps->wrk.fatal = GS_OK;
    ps->wrk.fatal_why[0] = '\0';
    return replay(ps);
}
