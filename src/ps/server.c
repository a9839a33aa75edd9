/*
 * The serve loop: arrivals of gradients (WRITE_IMM into a worker's slot, or
 * the last worker's notification after its FETCH_ADDs), control messages,
 * deadlines of sync steps, lost workers, checkpoints. Pulls never reach
 * this code: workers READ the parameters by themselves.
 */
#include "ps/ps.h"

#include "ps/pool.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_WAIT_MS    (1 << 30)   /* nothing due: only a completion wakes the loop */
#define PROBE_PERIOD_NS 10000000ull /* 10 ms */

gs_status gs_ps_server_init(gs_ps *ps)
{
    gs_ps_server *srv = &ps->srv;
    srv->lost = gs_calloc((size_t)ps->nworkers, sizeof(bool));
    srv->bye = gs_calloc((size_t)ps->nworkers, sizeof(bool));
    if (!srv->lost || !srv->bye)
        return GS_ERR_NOMEM;
    srv->epoch = 1;
    return gs_ps_server_load_checkpoint(ps);
}

void gs_ps_server_fini(gs_ps *ps)
{
    gs_ps_server *srv = &ps->srv;
    free(srv->lost);
    free(srv->bye);
    free(srv->shards);
    free(srv->dirty_list);
    free(srv->outbox);
    gs_pages_free(srv->scratch, srv->scratch_count * sizeof(float));
    gs_ps_ckpt_free(srv->restore);
    memset(srv, 0, sizeof(*srv));
}

/* ---- control replies ---------------------------------------------------------------- */

void gs_ps_server_reply(gs_ps *ps, int w, uint32_t cmd, uint32_t arg)
{
    gs_ps_server *srv = &ps->srv;
    if (srv->noutbox + 2 > srv->outbox_cap) {
        size_t cap = srv->outbox_cap ? srv->outbox_cap * 2 : 64;
        uint32_t *p = realloc(srv->outbox, cap * sizeof(*p));
        if (!p) {
            gs_log_error(PS, "rank %d: no memory to queue a reply to worker %d", ps->rank, w);
            return;
        }
        srv->outbox = p;
        srv->outbox_cap = cap;
    }
    srv->outbox[srv->noutbox++] = (uint32_t)w << 8 | cmd;
    srv->outbox[srv->noutbox++] = arg;
}

static void flush_outbox(gs_ps *ps)
{
    gs_ps_server *srv = &ps->srv;
    size_t done = 0;
    while (done < srv->noutbox) {
        int w = (int)(srv->outbox[done] >> 8);
        gs_status st = srv->lost[w] ? GS_OK
                                    : gs_ps_ctrl_send(ps, ps->worker_ranks[w], srv->outbox[done] & 0xffu,
                                                      srv->outbox[done + 1]);
        if (st == GS_ERR_AGAIN)
            break;
        if (st != GS_OK && !srv->bye[w]) {
            char why[96];
            snprintf(why, sizeof(why), "cannot be reached (a reply to it failed: %s)", gs_status_name(st));
            gs_ps_server_worker_lost(ps, w, GS_ERR_PEER_LOST, why);
        }
        done += 2;
    }
    if (done > 0)
        memmove(srv->outbox, srv->outbox + done, (srv->noutbox - done) * sizeof(uint32_t));
    srv->noutbox -= done;
}

/* ---- lost workers ------------------------------------------------------------------- */

void gs_ps_server_worker_lost(gs_ps *ps, int w, gs_status st, const char *why)
{
    gs_ps_server *srv = &ps->srv;
    bool sync_fails = ps->params.mode == GS_PS_MODE_SYNC && !ps->params.elastic;
    if (srv->lost[w] || srv->bye[w])
        return;
    srv->lost[w] = true;
    srv->finished++;
    for (uint32_t i = 0; i < srv->nshards; i++) {
        gs_ps_sshard *sh = &srv->shards[i];
        gs_ps_head *h = gs_ps_head_of(sh);
        uint64_t old_min = h->min_step;
        gs_ps_seq_begin(h);
        gs_ps_wstate_of(sh)[w].flags |= GS_PS_WSTATE_LOST;
        h->min_step = gs_ps_min_step(ps, sh);
        gs_ps_seq_end(h);
        /* the first loss is the cause the notices keep naming (elastic: not an error) */
        if (sync_fails && sh->status != GS_ERR_PEER_LOST && sh->status != GS_ERR_TIMEOUT) {
            sh->status = st;
            sh->status_about = w;
        }
        if (sync_fails || h->min_step != old_min)
            gs_ps_notify_all(ps, sh);
    }
    if (ps->params.elastic) {
        srv->recheck = true; /* rounds waiting only for w complete in the serve loop */
        gs_log_warn(
            PS,
            "rank %d: server %d: worker %d (rank %d) %s; elastic: its pushes count no more, the rounds "
            "go on with the other %d",
            ps->rank, ps->index, w, ps->worker_ranks[w], why, ps->nworkers - srv->finished);
    } else if (ps->params.mode == GS_PS_MODE_SYNC) {
        gs_status verdict =
            gs_fail(GS_SUBSYS_PS, st,
                    "rank %d: server %d: worker %d (rank %d) %s; sync mode cannot go on without it (the "
                    "other workers are told)",
                    ps->rank, ps->index, w, ps->worker_ranks[w], why);
        srv->verdict = srv->verdict != GS_OK ? srv->verdict : verdict;
    } else {
        gs_log_warn(PS, "rank %d: server %d: worker %d (rank %d) %s; async mode goes on with the other %d",
                    ps->rank, ps->index, w, ps->worker_ranks[w], why, ps->nworkers - srv->finished);
    }
}

/* poll/wait said a peer is gone: find which workers (probes are rate limited).
 * A loss already known makes every poll and wait say so at once: unless
 * this is a poll that must not block, sleep a little rather than spin on it. */
static void find_lost_workers(gs_ps *ps, bool may_sleep)
{
    gs_ps_server *srv = &ps->srv;
    bool *skip = gs_calloc((size_t)ps->nworkers, sizeof(bool)), *lost = gs_calloc((size_t)ps->nworkers, 1);
    bool found = false;
    if (skip && lost && gs_now_ns() >= srv->next_probe_ns) {
        for (int w = 0; w < ps->nworkers; w++)
            skip[w] = srv->lost[w] || srv->bye[w];
        gs_ps_find_lost(ps, ps->worker_ranks, ps->nworkers, skip, lost);
        for (int w = 0; w < ps->nworkers; w++)
            if (lost[w]) {
                gs_ps_server_worker_lost(ps, w, GS_ERR_PEER_LOST, "exited (its transport reports it gone)");
                found = true;
            }
        srv->next_probe_ns = gs_now_ns() + PROBE_PERIOD_NS;
    }
    free(skip);
    free(lost);
    if (!found && may_sleep) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

/* ---- arrivals ---------------------------------------------------------------------------- */

/* Sync: every worker's gradient of the pending step is in. A lost worker's
 * never will be: the step does not complete without it (pushes that arrive
 * after the loss, even while the notices of it leave, apply nothing, and
 * the notices keep saying who is lost). Elastic: every live worker's is in
 * (a lost worker's push of the step counts if it arrived before the loss
 * was known, see gs_ps_apply_sync; it is never waited for). */
static bool sync_complete(const gs_ps *ps, const gs_ps_sshard *sh)
{
    const gs_ps_wstate *ws = gs_ps_wstate_of(sh);
    uint64_t version = gs_ps_head_of(sh)->version;
    int counted = 0;
    for (int w = 0; w < ps->nworkers; w++) {
        if (ps->srv.lost[w] && ps->params.elastic) {
            counted += ws[w].received > version;
            continue;
        }
        if (ps->srv.lost[w] || ws[w].received <= version)
            return false;
        counted++;
    }
    return counted > 0;
}

/* Elastic: after a loss, the rounds that waited only for the lost worker. */
static void complete_waiting_rounds(gs_ps *ps)
{
    ps->srv.recheck = false;
    for (uint32_t i = 0; i < ps->srv.nshards; i++)
        if (!ps->srv.shards[i].init_pending && sync_complete(ps, &ps->srv.shards[i]))
            gs_ps_apply_sync(ps, &ps->srv.shards[i]);
}

static gs_ps_sshard *shard_at(gs_ps *ps, uint32_t slot, int peer, const char *what)
{
    if (slot < ps->srv.nshards)
        return &ps->srv.shards[slot];
    gs_log_error(
        PS, "rank %d: server %d: %s from rank %d for shard %u, but this server holds %u shards (ignored)",
        ps->rank, ps->index, what, peer, slot, ps->srv.nshards);
    return NULL;
}

static int worker_of(const gs_ps *ps, int peer)
{
    if (peer < 0 || peer >= ps->size)
        return -1;
    for (int s = 0; s < ps->nservers; s++)
        if (ps->server_ranks[s] == peer)
            return -1;
    return ps->role_index[peer];
}

static void on_push(gs_ps *ps, int w, uint32_t imm)
{
    gs_ps_sshard *sh = shard_at(ps, gs_ps_imm_shard(imm), ps->worker_ranks[w], "a gradient");
    gs_ps_head *h;
    gs_ps_wstate *ws;
    if (!sh || ps->srv.lost[w])
        return;
    h = gs_ps_head_of(sh);
    ws = &gs_ps_wstate_of(sh)[w];
    if ((ws->received & GS_PS_IMM_STEP_MASK) != gs_ps_imm_step(imm) ||
        (ps->params.mode == GS_PS_MODE_SYNC && ws->received != h->version)) {
        gs_log_error(
            PS,
            "rank %d: server %d: key %llu shard %u: worker %d pushed step %u (mod 4096), expected %llu "
            "(version %llu); ignored",
            ps->rank, ps->index, (unsigned long long)sh->key, sh->kindex, w, gs_ps_imm_step(imm),
            (unsigned long long)ws->received, (unsigned long long)h->version);
        sh->status = GS_ERR_PROTOCOL;
        sh->status_about = w;
        gs_ps_notify(ps, sh, w);
        return;
    }
    gs_log_trace(PS, "rank %d: server %d: key %llu shard %u: worker %d step %llu arrived (version %llu)",
                 ps->rank, ps->index, (unsigned long long)sh->key, sh->kindex, w,
                 (unsigned long long)ws->received, (unsigned long long)h->version);
    /* outside the seqlock: a pull needs params and version consistent, not this count */
    __atomic_store_n(&ws->received, ws->received + 1, __ATOMIC_RELEASE);
    if (ps->params.mode == GS_PS_MODE_ASYNC) {
        gs_ps_apply_async(ps, sh, w);
        return;
    }
    if (!sh->waiting_since_ns)
        sh->waiting_since_ns = gs_now_ns();
    if (sync_complete(ps, sh))
        gs_ps_apply_sync(ps, sh);
}

static void on_atomic(gs_ps *ps, int w, uint32_t imm)
{
    gs_ps_sshard *sh = shard_at(ps, gs_ps_imm_shard(imm), ps->worker_ranks[w], "an atomic arrival");
    gs_ps_acc_head *ah;
    if (!sh || !sh->acc)
        return;
    ah = gs_mr_addr(sh->acc);
    if (__atomic_load_n(&ah->arrivals, __ATOMIC_ACQUIRE) != (uint64_t)ps->nworkers ||
        (gs_ps_head_of(sh)->version & GS_PS_IMM_STEP_MASK) != gs_ps_imm_step(imm)) {
        gs_log_error(
            PS,
            "rank %d: server %d: key %llu shard %u: worker %d says step %u is complete but %llu of %d "
            "arrived at version %llu; ignored",
            ps->rank, ps->index, (unsigned long long)sh->key, sh->kindex, w, gs_ps_imm_step(imm),
            (unsigned long long)ah->arrivals, ps->nworkers, (unsigned long long)gs_ps_head_of(sh)->version);
        return;
    }
    gs_ps_apply_atomic(ps, sh);
}

static void on_init(gs_ps *ps, int w, uint32_t slot)
{
    gs_ps_sshard *sh = shard_at(ps, slot, ps->worker_ranks[w], "initial values");
    if (!sh || !sh->init_pending)
        return;
    gs_ps_seq_begin(gs_ps_head_of(sh));
    memcpy(gs_ps_params_of(sh), gs_mr_addr(sh->slots), sh->count * sizeof(float));
    gs_ps_seq_end(gs_ps_head_of(sh));
    sh->init_pending = 0;
}

static void on_ctrl(gs_ps *ps, int w, uint32_t imm)
{
    uint32_t arg = gs_ps_imm_ctrl_arg(imm);
    gs_status st;
    switch (gs_ps_imm_ctrl_cmd(imm)) {
    case GS_PS_CTRL_BYE:
        if (!ps->srv.bye[w] && !ps->srv.lost[w]) {
            ps->srv.bye[w] = true;
            ps->srv.finished++;
        }
        break;
    case GS_PS_CTRL_CKPT:
        st = gs_ps_server_checkpoint(ps);
        gs_ps_server_reply(ps, w, st == GS_OK ? GS_PS_CTRL_CKPT_DONE : GS_PS_CTRL_CKPT_FAILED, arg);
        break;
    case GS_PS_CTRL_INIT: on_init(ps, w, arg); break;
    case GS_PS_CTRL_FIRST:
        if (arg < ps->srv.nshards && !ps->srv.shards[arg].waiting_since_ns)
            ps->srv.shards[arg].waiting_since_ns = gs_now_ns();
        break;
    case GS_PS_CTRL_RECOVER:
        ps->srv.recover_asked = true;
        ps->srv.recover_arg = arg;
        break;
    default:
        gs_log_error(PS, "rank %d: server %d: unknown control command %u from worker %d (ignored)", ps->rank,
                     ps->index, gs_ps_imm_ctrl_cmd(imm), w);
    }
}

static void on_arrival(gs_ps *ps, const gs_wc *wc)
{
    int w = worker_of(ps, wc->peer);
    if (w < 0) {
        gs_log_error(PS, "rank %d: server %d: message from rank %d, which is not a worker (ignored)",
                     ps->rank, ps->index, wc->peer);
        return;
    }
    switch (gs_ps_imm_kind(wc->imm)) {
    case GS_PS_IMM_PUSH: on_push(ps, w, wc->imm); break;
    case GS_PS_IMM_ATOMIC: on_atomic(ps, w, wc->imm); break;
    case GS_PS_IMM_CTRL: on_ctrl(ps, w, wc->imm); break;
    default:
        gs_log_error(PS, "rank %d: server %d: unexpected immediate 0x%08x from rank %d (ignored)", ps->rank,
                     ps->index, wc->imm, wc->peer);
    }
}

static void dispatch(gs_ps *ps, const gs_wc *wc)
{
    if (wc->opcode == GS_WC_RECV_IMM) {
        if (wc->status == GS_OK)
            on_arrival(ps, wc);
        return;
    }
    if (gs_ps_wr_kind(wc->wr_id) == GS_PS_WR_TX)
        gs_ps_tx_complete(&ps->srv.tx, wc->wr_id);
    if (wc->status != GS_OK) {
        int w = worker_of(ps, wc->peer);
        if (w >= 0 && (wc->status == GS_ERR_PEER_LOST || wc->status == GS_ERR_FLUSHED))
            gs_ps_server_worker_lost(ps, w, GS_ERR_PEER_LOST, "is gone (a notice to it failed)");
        else
            gs_log_warn(PS, "rank %d: server %d: an operation to rank %d failed: %s", ps->rank, ps->index,
                        wc->peer, gs_status_name(wc->status));
    }
}

gs_status gs_ps_server_progress(gs_ps *ps, int wait_ms)
{
    gs_wc wcs[32];
    int n = 0;
    gs_status st;
    /* Notices or replies that met GS_ERR_AGAIN wait for room that may come back without any
     * completion here (a verbs credit return is a WRITE into our control slot, a shm ring
     * frees when the peer polls): poll and retry, never block on them. */
    bool owed = ps->srv.ndirty || ps->srv.noutbox;
    if (owed)
        wait_ms = 0;
    st = wait_ms > 0 ? gs_tp_wait(ps->tp, wcs, 32, &n, wait_ms) : gs_tp_poll(ps->tp, wcs, 32, &n);
    if (owed && st == GS_OK && n == 0)
        sched_yield(); /* the peer that frees the room may need this CPU */
    if (st == GS_ERR_TIMEOUT) {
        st = GS_OK;
        n = 0;
    } else if (st == GS_ERR_PEER_LOST) {
        find_lost_workers(ps, wait_ms > 0 || owed); /* owed: retrying sends, not a poll for the caller */
        st = GS_OK;
        n = 0;
    }
    /* Each arrival's notices leave before the next arrival is handled: a
     * batch may complete many shards, and a worker can pull each one while
     * the server applies the next (not after the whole batch). */
    for (int i = 0; i < n; i++) {
        dispatch(ps, &wcs[i]);
        if (st == GS_OK && ps->srv.ndirty)
            st = gs_ps_flush_notices(ps);
    }
    if (st == GS_OK)
        st = gs_ps_flush_notices(ps);
    flush_outbox(ps);
    return st;
}

/* ---- deadlines ------------------------------------------------------------------------------ */

static bool arrived(const gs_ps_sshard *sh, int w)
{
    uint64_t version = gs_ps_head_of(sh)->version;
    if (sh->acc) {
        const uint64_t *words =
            (const uint64_t *)((const char *)gs_mr_addr(sh->acc) + sizeof(gs_ps_acc_head));
        return __atomic_load_n(&words[w], __ATOMIC_ACQUIRE) > version;
    }
    return gs_ps_wstate_of(sh)[w].received > version;
}

/* Sync: a step whose first gradient came more than GS_TIMEOUT_MS ago is
 * missing someone; report who, never wait forever. */
static void check_deadlines(gs_ps *ps)
{
    uint64_t now = gs_now_ns();
    if (ps->params.mode != GS_PS_MODE_SYNC)
        return;
    for (uint32_t i = 0; i < ps->srv.nshards && ps->srv.verdict == GS_OK; i++) {
        gs_ps_sshard *sh = &ps->srv.shards[i];
        if (!sh->waiting_since_ns || now - sh->waiting_since_ns < (uint64_t)ps->timeout_ms * 1000000ull)
            continue;
        for (int w = 0; w < ps->nworkers; w++) {
            char why[160];
            if (arrived(sh, w) || ps->srv.lost[w])
                continue;
            snprintf(why, sizeof(why), "sent no gradient of step %llu (key %llu) within GS_TIMEOUT_MS=%lld",
                     (unsigned long long)gs_ps_head_of(sh)->version, (unsigned long long)sh->key,
                     (long long)ps->timeout_ms);
            gs_ps_server_worker_lost(ps, w, GS_ERR_TIMEOUT, why);
        }
    }
}

/* ---- the loop ------------------------------------------------------------------------------------ */

/* How long the loop may block: until the earliest step deadline (sync) or
 * a completion. A transport logs
 * every wait that times out, so the loop never sets one that need not. */
static int serve_wait_ms(const gs_ps *ps)
{
    uint64_t now = gs_now_ns(), next = UINT64_MAX, timeout_ns = (uint64_t)ps->timeout_ms * 1000000ull;
    if (ps->params.mode != GS_PS_MODE_SYNC)
        return IDLE_WAIT_MS;
    if (ps->params.elastic && ps->srv.finished > 0)
        next = ps->srv.next_join_probe_ns; /* elastic: look for rejoining workers */
    for (uint32_t i = 0; i < ps->srv.nshards; i++) {
        const gs_ps_sshard *sh = &ps->srv.shards[i];
        if (sh->waiting_since_ns && sh->waiting_since_ns + timeout_ns < next)
            next = sh->waiting_since_ns + timeout_ns;
    }
    if (next == UINT64_MAX)
        return IDLE_WAIT_MS;
    if (next <= now + GS_PS_MIN_WAIT_MS * 1000000ull)
        return 0; /* due soon: poll */
    return (int)((next - now) / 1000000ull) + 1;
}

/* Whether the loop's end must wait: notices or replies owed, or (the job
 * failed) live workers that have not said BYE yet: they may still read the
 * steps that did complete, so the regions stay up until they leave. */
static bool draining(const gs_ps *ps)
{
    const gs_ps_server *srv = &ps->srv;
    return srv->ndirty || srv->noutbox || gs_ps_tx_live(ps, &srv->tx) > 0 ||
           (srv->verdict != GS_OK && srv->finished < ps->nworkers);
}

/* Lets the notices and replies owed leave before the loop ends (at most GS_TIMEOUT_MS). */
static void drain(gs_ps *ps)
{
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    while (draining(ps) && !gs_deadline_passed(deadline))
        if (gs_ps_server_progress(ps, gs_ps_wait_ms(deadline)) != GS_OK)
            break;
}

gs_status gs_ps_serve(gs_ps *ps)
{
    gs_ps_server *srv;
    if (!ps || !ps->is_server)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_serve: called on %s",
                       ps ? "a worker rank" : "a NULL gs_ps");
    srv = &ps->srv;
    srv->verdict = GS_OK;
    if (ps->cfg->ps_apply_threads > 1 && !srv->pool)
        srv->verdict = gs_ps_pool_create(ps->rank, (int)ps->cfg->ps_apply_threads - 1, &srv->pool);
    /* the keys and step 0 on disk: a restart needs the key list */
    if (srv->verdict == GS_OK && ps->checkpoint[0] && !ps->restarted)
        srv->verdict = gs_ps_server_checkpoint(ps);
    while (srv->finished < ps->nworkers && srv->verdict == GS_OK) {
        gs_status st = gs_ps_server_progress(ps, serve_wait_ms(ps));
        if (st == GS_OK)
            check_deadlines(ps);
        if (st == GS_OK && srv->recheck)
            complete_waiting_rounds(ps);
        if (st == GS_OK && ps->params.elastic && srv->finished > 0)
            gs_ps_server_check_joiners(ps);
        if (st == GS_OK && srv->verdict == GS_OK)
            st = gs_ps_server_maybe_checkpoint(ps);
        if (st == GS_OK && srv->recover_asked)
            st = gs_ps_recover_server(ps);
        if (st != GS_OK && srv->verdict == GS_OK)
            srv->verdict = st;
    }
    drain(ps);
    if (srv->verdict == GS_OK && ps->checkpoint[0])
        srv->verdict = gs_ps_server_checkpoint(ps);
    gs_ps_pool_destroy(srv->pool);
    srv->pool = NULL;
    gs_log_info(PS, "rank %d: server %d done serving: %s", ps->rank, ps->index, gs_status_name(srv->verdict));
    return srv->verdict;
}

static void *serve_thread(void *arg)
{
    gs_ps *ps = arg;
    ps->thread_status = gs_ps_serve(ps);
    return NULL;
}

gs_status gs_ps_serve_start(gs_ps *ps)
{
    int err;
    if (!ps || !ps->is_server || ps->thread_started)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_serve_start: %s",
                       !ps              ? "ps is NULL"
                       : !ps->is_server ? "called on a worker rank"
                                        : "already serving");
    err = pthread_create(&ps->thread, NULL, serve_thread, ps);
    if (err)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_SYSTEM, "rank %d: cannot start the server thread: %s", ps->rank,
                       strerror(err));
    ps->thread_started = true;
    return GS_OK;
}
