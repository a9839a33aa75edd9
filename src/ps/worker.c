/*
 * The worker: requests (push, pull, push_pull; blocking ones are a start
 * and a wait) and the progress engine that drives them.
 *
 * Each key keeps its requests in a queue; only the oldest advances, shard by
 * shard, through the phases of worker_push.c and worker_pull.c. Progress
 * polls the transport, applies what arrived (notices from the servers, our
 * own completions) and advances every key's oldest request.
 */
#include "ps/ps.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

gs_status gs_ps_worker_init(gs_ps *ps)
{
    ps->wrk.server_lost = gs_calloc((size_t)ps->nservers, sizeof(bool));
    return ps->wrk.server_lost ? GS_OK : GS_ERR_NOMEM;
}

void gs_ps_worker_fini(gs_ps *ps)
{
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        while (ps->wrk.keys[k].head) {
            gs_ps_req *r = ps->wrk.keys[k].head;
            ps->wrk.keys[k].head = r->next;
            free(r);
        }
    free(ps->wrk.keys);
    free(ps->wrk.shards);
    free(ps->wrk.server_lost);
    memset(&ps->wrk, 0, sizeof(ps->wrk));
}

/* ---- notices ----------------------------------------------------------------- */

#define MERGE_MAX(field) ws->seen.field = n->field > ws->seen.field ? n->field : ws->seen.field

void gs_ps_worker_merge_notice(gs_ps_wshard *ws, const gs_ps_notice *n)
{
    if (n->epoch < ws->seen.epoch)
        return; /* from an incarnation that is gone */
    MERGE_MAX(version);
    MERGE_MAX(min_step);
    MERGE_MAX(received);
    MERGE_MAX(applied);
    MERGE_MAX(saved);
    MERGE_MAX(epoch);
    /* A step's error is news once per version (a lost worker is the job's
     * error, kept apart: see on_notice). */
    if (n->status != GS_OK && n->status != GS_ERR_PEER_LOST && n->status != GS_ERR_TIMEOUT &&
        n->version + 1 > ws->error_version) {
        ws->error = (gs_status)n->status;
        ws->error_version = n->version + 1;
        ws->seen.worker = n->worker;
    }
}

gs_status gs_ps_worker_take_error(gs_ps *ps, gs_ps_wshard *ws, const char *during)
{
    gs_status st = ws->error;
    char about[48] = "";
    ws->error = GS_OK;
    if (ws->seen.worker >= 0)
        snprintf(about, sizeof(about), " about worker %d", ws->seen.worker);
    return gs_fail(GS_SUBSYS_PS, st,
                   "rank %d: worker %d: key %llu shard %u: server rank %d reports %s%s (%s)", ps->rank,
                   ps->index, (unsigned long long)ps->wrk.keys[ws->keyi].key, ws->kindex, ws->server_rank,
                   gs_status_name(st), about, during);
}

static void on_notice(gs_ps *ps, uint32_t gid)
{
    gs_ps_wshard *ws;
    gs_ps_notice n;
    if (gid >= ps->plan.nshards) {
        gs_log_error(PS, "rank %d: notice for shard %u of %zu (ignored)", ps->rank, gid, ps->plan.nshards);
        return;
    }
    ws = &ps->wrk.shards[gid];
    memcpy(&n, (char *)gs_mr_addr(ps->wrk.keys[ws->keyi].notice) + ws->kindex * sizeof(n), sizeof(n));
    gs_ps_worker_merge_notice(ws, &n);
    /* A sync job without one of its workers cannot go on: what still needs
     * that worker fails (see advance_key); what it already did completes. */
    if ((n.status == GS_ERR_PEER_LOST || n.status == GS_ERR_TIMEOUT) && ps->wrk.fatal == GS_OK) {
        ps->wrk.fatal =
            gs_fail(GS_SUBSYS_PS, (gs_status)n.status,
                    "rank %d: worker %d: server rank %d reports worker %d %s; this sync job cannot go on",
                    ps->rank, ps->index, ws->server_rank, n.worker,
                    n.status == GS_ERR_PEER_LOST ? "lost" : "missing its deadline");
        snprintf(ps->wrk.fatal_why, sizeof(ps->wrk.fatal_why), "%s", gs_last_error());
    }
}

static void on_ctrl(gs_ps *ps, int peer, uint32_t imm)
{
    uint32_t cmd = gs_ps_imm_ctrl_cmd(imm), arg = gs_ps_imm_ctrl_arg(imm);
    if ((cmd == GS_PS_CTRL_CKPT_DONE || cmd == GS_PS_CTRL_CKPT_FAILED) &&
        arg == (ps->wrk.ckpt_serial & 0xffffffu) && ps->wrk.ckpt_pending > 0) {
        ps->wrk.ckpt_pending--;
        if (cmd == GS_PS_CTRL_CKPT_FAILED && ps->wrk.ckpt_status == GS_OK)
            ps->wrk.ckpt_status = gs_fail(
                GS_SUBSYS_PS, GS_ERR_IO,
                "rank %d: server rank %d could not write its checkpoint (see its log)", ps->rank, peer);
    } else if (cmd == GS_PS_CTRL_RECOVER) {
        gs_ps_worker_set_fatal(
            ps,
            gs_fail(
                GS_SUBSYS_PS, GS_ERR_PEER_LOST,
                "rank %d: server rank %d started a recovery (a server was restarted, or a worker rejoins); "
                "call gs_ps_recover, then repeat the failed call",
                ps->rank, peer));
    }
}

/* ---- completions --------------------------------------------------------------- */

static gs_ps_wshard *shard_of_wr(gs_ps *ps, uint64_t wr_id)
{
    uint64_t gid = gs_ps_wr_index(wr_id);
    return gid < ps->plan.nshards ? &ps->wrk.shards[gid] : NULL;
}

static void server_gone(gs_ps *ps, int s, const char *how)
{
    if (ps->wrk.server_lost[s])
        return;
    ps->wrk.server_lost[s] = true;
    gs_ps_worker_set_fatal(
        ps, gs_fail(GS_SUBSYS_PS, GS_ERR_PEER_LOST,
                    "rank %d: worker %d: server %d (rank %d) %s; restart it with GS_REJOIN=1 (it "
                    "restores its checkpoint), call gs_ps_recover, then repeat the failed call",
                    ps->rank, ps->index, s, ps->server_ranks[s], how));
}

static void on_own_completion(gs_ps *ps, const gs_wc *wc)
{
    int kind = gs_ps_wr_kind(wc->wr_id);
    gs_ps_wshard *ws;
    if (kind == GS_PS_WR_TX) {
        gs_ps_tx_complete(&ps->wrk.tx, wc->wr_id);
        return;
    }
    if (kind == GS_PS_WR_INIT) {
        ps->wrk.init_pending--;
        if (wc->status != GS_OK)
            gs_ps_worker_set_fatal(ps,
                                   gs_fail(GS_SUBSYS_PS, wc->status,
                                           "rank %d: initial values to rank %d failed", ps->rank, wc->peer));
        return;
    }
    if (!(ws = shard_of_wr(ps, wc->wr_id)))
        return;
    if (kind == GS_PS_WR_PULL)
        gs_ps_pull_completed(ps, &ps->wrk.keys[ws->keyi], ws->kindex, wc);
    else
        gs_ps_push_completed(ps, ws, kind, wc);
}

/* The server of rank peer, or -1. */
static int server_of(const gs_ps *ps, int peer)
{
    for (int s = 0; s < ps->nservers; s++)
        if (ps->server_ranks[s] == peer)
            return s;
    return -1;
}

static void dispatch(gs_ps *ps, const gs_wc *wcp)
{
    gs_wc refused;
    const gs_wc *wc = wcp;
    /* A push or pull goes only into regions the server announced, checked
     * here against their descriptors: a server that refuses one has lost
     * them, its parameter server or its process gone (Soft-RoCE refuses
     * writes to a killed process's regions before its queue pairs go). */
    if (wc->opcode != GS_WC_RECV_IMM && wc->status == GS_ERR_REMOTE_ACCESS && server_of(ps, wc->peer) >= 0) {
        refused = *wc;
        refused.status = gs_fail_peer_lost(GS_SUBSYS_PS, ps->rank, wc->peer,
                                           "it refused an access to a region it announced: its parameter "
                                           "server or its process is gone");
        wc = &refused;
    }
    if (wc->opcode == GS_WC_RECV_IMM) {
        if (wc->status != GS_OK)
            return;
        if (gs_ps_imm_kind(wc->imm) == GS_PS_IMM_NOTICE)
            on_notice(ps, gs_ps_imm_notice_shard(wc->imm));
        else if (gs_ps_imm_kind(wc->imm) == GS_PS_IMM_CTRL)
            on_ctrl(ps, wc->peer, wc->imm);
        return;
    }
    on_own_completion(ps, wc);
    if ((wc->status == GS_ERR_PEER_LOST || wc->status == GS_ERR_FLUSHED) && server_of(ps, wc->peer) >= 0)
        server_gone(ps, server_of(ps, wc->peer), "is gone (an operation to it failed)");
}

/* poll/wait said a peer is gone: is it one of our servers? */
static void find_lost_servers(gs_ps *ps, int wait_ms)
{
    bool *lost = gs_calloc((size_t)ps->nservers, sizeof(bool));
    bool found = false;
    if (lost && gs_now_ns() >= ps->wrk.next_probe_ns) {
        ps->wrk.next_probe_ns = gs_now_ns() + 10000000ull; /* 10 ms */
        gs_ps_find_lost(ps, ps->server_ranks, ps->nservers, ps->wrk.server_lost, lost);
        for (int s = 0; s < ps->nservers; s++)
            if (lost[s]) {
                server_gone(ps, s, "exited");
                found = true;
            }
    }
    free(lost);
    if (!found && wait_ms > 0) { /* another worker died: do not spin on it */
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

/* ---- requests ------------------------------------------------------------------- */

static gs_ps_wkey *find_key(gs_ps *ps, uint64_t key)
{
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        if (ps->wrk.keys[k].key == key)
            return &ps->wrk.keys[k];
    return NULL;
}

/* GS_TRACE: the request's event, from its start to now. */
static void trace_req(const gs_ps *ps, const gs_ps_req *req)
{
    gs_trace_arg args[] = {
        GS_TARG_I("key", req->key->key),
        GS_TARG_I("count", req->key->count),
        GS_TARG_I("bytes", req->key->count * sizeof(float)),
        GS_TARG_I("step", req->step),
        GS_TARG_I("shards", req->key->nshards),
        GS_TARG_I("worker", ps->index),
        GS_TARG_S("transport", gs_tp_name(ps->tp)),
        GS_TARG_S("status", gs_status_name(req->status)),
    };
    gs_trace_event("ps", req->push ? (req->pull ? "push_pull" : "push") : "pull", false,
                   GS_TRACE_PS_KEY(req->key->key), "ps key %llu", req->key->key, req->trace_ns, gs_now_ns(),
                   args, (int)(sizeof(args) / sizeof(args[0])));
}

static void finish(gs_ps *ps, gs_ps_req *req)
{
    gs_ps_wkey *wk = req->key;
    if (req->trace_ns)
        trace_req(ps, req);
    req->done = true;
    ps->wrk.finished++;
    /* A push that failed because the job must recover is repeated by the
     * caller after gs_ps_recover: it keeps its step. (Shards that did get it
     * are skipped then, see gs_ps_push_advance.) */
    if (req->push && !req->replay && req->status != GS_OK && ps->wrk.fatal != GS_OK &&
        req->step < wk->next_step)
        wk->next_step = req->step;
    wk->head = req->next;
    if (!wk->head)
        wk->tail = NULL;
    for (size_t i = 0; i < wk->nshards; i++)
        ps->wrk.shards[wk->first + i].phase = GS_PS_IDLE;
    if (req->grad_mr)
        gs_mr_dereg(req->grad_mr);
    if (req->out_mr)
        gs_mr_dereg(req->out_mr);
    req->grad_mr = req->out_mr = NULL;
    if (req->replay) { /* ours: nobody waits for it */
        if (req->status != GS_OK && ps->wrk.replay_status == GS_OK)
            ps->wrk.replay_status = req->status;
        free(req);
    }
}

/* Big keys: the caller's buffers are registered for this request, so the
 * push reads the gradient and the pull writes the parameters in place. The
 * push keeps staging when the replay log must hold a copy anyway. */
static void register_buffers(gs_ps *ps, gs_ps_req *req)
{
    gs_status st = GS_OK;
    if (ps->wrk.no_zcopy || req->replay || req->key->count * sizeof(float) < GS_PS_ZCOPY_MIN)
        return;
    if (req->push && req->key->depth == 1 && ps->params.agg == GS_PS_AGG_WRITE_SLOTS)
        st = gs_mr_reg(ps->tp, (void *)req->grad, req->key->count * sizeof(float), GS_ACCESS_LOCAL_WRITE,
                       &req->grad_mr);
    if (st == GS_OK && req->pull)
        st =
            gs_mr_reg(ps->tp, req->out, req->key->count * sizeof(float), GS_ACCESS_LOCAL_WRITE, &req->out_mr);
    if (st != GS_OK) {
        gs_log_info(PS,
                    "rank %d: the %s transport does not register caller memory (%s): staging copies instead",
                    ps->rank, gs_tp_name(ps->tp), gs_status_name(st));
        ps->wrk.no_zcopy = true;
        if (req->grad_mr)
            gs_mr_dereg(req->grad_mr);
        req->grad_mr = NULL;
        req->out_mr = NULL;
    }
}

static void activate(gs_ps *ps, gs_ps_req *req)
{
    gs_ps_wkey *wk = req->key;
    register_buffers(ps, req);
    req->active = true;
    req->left = wk->nshards;
    for (size_t i = 0; i < wk->nshards; i++) {
        gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
        ws->phase = req->push ? GS_PS_PUSH_WAIT : GS_PS_PULL_WAIT;
        ws->pull_tries = 0;
        ws->retry_at_ns = 0;
    }
}

/* Whether a signaled operation of the shard is out (its completion will come). */
static bool in_flight(const gs_ps_wshard *ws)
{
    return ws->phase == GS_PS_PUSH_POSTED || ws->phase == GS_PS_PULL_POSTED ||
           ((ws->phase == GS_PS_ATOMIC_ARRIVE || ws->phase == GS_PS_ATOMIC_NOTIFY) && ws->posted);
}

/* Advances the oldest request of wk; true if it finished. */
static bool advance_key(gs_ps *ps, gs_ps_wkey *wk)
{
    gs_ps_req *req = wk->head;
    if (!req)
        return false;
    if (!req->active)
        activate(ps, req);
    for (size_t i = 0; i < wk->nshards; i++) {
        gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
        gs_status st = GS_OK;
        if (ws->phase == GS_PS_DONE)
            continue;
        if (req->status != GS_OK && (ws->phase == GS_PS_PUSH_WAIT || ws->phase == GS_PS_PULL_WAIT)) {
            gs_ps_worker_shard_done(ps, ws); /* the request failed: nothing more is sent for it */
            continue;
        }
        if (ps->wrk.fatal != GS_OK && (ws->phase == GS_PS_PUSH_WAIT ||
                                       (ws->phase == GS_PS_PULL_WAIT && ws->seen.applied < ws->pushed))) {
            req->status = req->status != GS_OK ? req->status : ps->wrk.fatal; /* it would wait forever */
            gs_error_restore(ps->wrk.fatal_why);
            gs_ps_worker_shard_done(ps, ws);
            continue;
        }
        if (ws->phase == GS_PS_PUSH_WAIT || ws->phase == GS_PS_ATOMIC_CHUNK)
            st = gs_ps_push_advance(ps, req, i);
        else if (ws->phase == GS_PS_ATOMIC_ARRIVE || ws->phase == GS_PS_ATOMIC_NOTIFY)
            st = gs_ps_push_retry(ps, ws);
        else if (ws->phase == GS_PS_PULL_WAIT)
            st = gs_ps_pull_advance(ps, req, i);
        if (st == GS_ERR_PEER_LOST || st == GS_ERR_FLUSHED)
            server_gone(ps, ws->server, "is gone (a post to it failed)");
        if (st != GS_OK && req->status == GS_OK)
            req->status = st;
        if (st != GS_OK && ws->phase != GS_PS_DONE && !in_flight(ws))
            gs_ps_worker_shard_done(ps, ws);
    }
    if (req->left > 0)
        return false;
    finish(ps, req);
    return true;
}

/* A shard reached DONE from a completion: count it. */
void gs_ps_worker_shard_done(gs_ps *ps, gs_ps_wshard *ws)
{
    gs_ps_req *req = ps->wrk.keys[ws->keyi].head;
    ws->phase = GS_PS_DONE;
    if (req && req->left > 0)
        req->left--;
}

void gs_ps_worker_set_fatal(gs_ps *ps, gs_status st)
{
    if (ps->wrk.fatal != GS_OK)
        return;
    ps->wrk.fatal = st;
    snprintf(ps->wrk.fatal_why, sizeof(ps->wrk.fatal_why), "%s", gs_last_error());
    gs_ps_worker_fail_all(ps, st);
}

gs_status gs_ps_worker_fatal_status(gs_ps *ps, gs_status st)
{
    if (st == GS_OK || ps->wrk.fatal == GS_OK)
        return st;
    /* what failed with it: the job's error, said once, with what to do */
    if (st == ps->wrk.fatal || st == GS_ERR_PEER_LOST || st == GS_ERR_FLUSHED) {
        gs_error_restore(ps->wrk.fatal_why);
        return ps->wrk.fatal;
    }
    return st;
}

void gs_ps_worker_fail_all(gs_ps *ps, gs_status st)
{
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        for (gs_ps_req *r = ps->wrk.keys[k].head; r; r = r->next)
            if (r->status == GS_OK)
                r->status = st;
}

static void advance_all(gs_ps *ps)
{
    for (size_t k = 0; k < ps->wrk.nkeys; k++)
        while (advance_key(ps, &ps->wrk.keys[k]))
            ;
}

/* Milliseconds until the earliest pull retry is due (wait_ms if none sooner). */
static int next_timer_ms(const gs_ps *ps, int wait_ms)
{
    uint64_t now = 0;
    for (size_t k = 0; k < ps->wrk.nkeys; k++) {
        const gs_ps_wkey *wk = &ps->wrk.keys[k];
        for (size_t i = 0; wk->head && i < wk->nshards; i++) {
            const gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
            if (ws->phase != GS_PS_PULL_WAIT || !ws->retry_at_ns)
                continue;
            now = now ? now : gs_now_ns();
            if (ws->retry_at_ns <= now + GS_PS_MIN_WAIT_MS * 1000000ull)
                return 0; /* due soon: poll rather than time a wait out */
            if ((ws->retry_at_ns - now) / 1000000ull + 1 < (uint64_t)wait_ms)
                wait_ms = (int)((ws->retry_at_ns - now) / 1000000ull + 1);
        }
    }
    return wait_ms;
}

/* What a poll or a wait returned: dispatch it, then advance every request. */
static gs_status take(gs_ps *ps, gs_status st, const gs_wc *wcs, int n, int wait_ms)
{
    if (st == GS_ERR_TIMEOUT) {
        st = GS_OK;
        n = 0;
    } else if (st == GS_ERR_PEER_LOST) {
        find_lost_servers(ps, wait_ms);
        st = GS_OK;
        n = 0;
    }
    for (int i = 0; i < n; i++)
        dispatch(ps, &wcs[i]);
    advance_all(ps);
    return st;
}

gs_status gs_ps_worker_progress(gs_ps *ps, int wait_ms)
{
    gs_wc wcs[64];
    int n = 0;
    uint64_t finished = ps->wrk.finished;
    /* Step 1: what is there, and everything that can be posted now. */
    gs_status st = gs_tp_poll(ps->tp, wcs, 64, &n);
    st = take(ps, st, wcs, n, 0);
    if (st != GS_OK || n > 0 || wait_ms <= 0 || ps->wrk.finished != finished)
        return st;
    if (ps->wrk.again) { /* a post is to be retried: do not block */
        ps->wrk.again = false;
        return st;
    }
    /* Step 2: block until something arrives (or a pull retry is due). */
    wait_ms = next_timer_ms(ps, wait_ms);
    if (wait_ms <= 0)
        return st;
    n = 0;
    st = gs_tp_wait(ps->tp, wcs, 64, &n, wait_ms);
    return take(ps, st, wcs, n, wait_ms);
}

static const gs_req_class ps_req_class;

static gs_status start(gs_ps *ps, uint64_t key, const float *grad, float *out, bool push, bool pull,
                       gs_req **req_p)
{
    gs_ps_wkey *wk;
    gs_ps_req *req;
    gs_status st;
    if (!ps || !req_p || (push && !grad) || (pull && !out))
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_%s: NULL %s",
                       push ? (pull ? "push_pull" : "push") : "pull",
                       !ps             ? "ps"
                       : !req_p        ? "req_p"
                       : push && !grad ? "grad"
                                       : "out");
    if (ps->is_server)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                       "rank %d: push and pull are worker calls; this rank is server %d", ps->rank,
                       ps->index);
    if (!(wk = find_key(ps, key)))
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "rank %d: key %llu is not registered", ps->rank,
                       (unsigned long long)key);
    if (ps->wrk.fatal != GS_OK) {
        gs_error_restore(ps->wrk.fatal_why);
        return ps->wrk.fatal;
    }
    if (push && ps->params.agg == GS_PS_AGG_FETCH_ADD && (st = gs_ps_atomic_check(ps, wk, grad)) != GS_OK)
        return st;
    if (!(req = gs_calloc(1, sizeof(*req))))
        return GS_ERR_NOMEM;
    *req = (gs_ps_req){.base.cls = &ps_req_class,
                       .ps = ps,
                       .key = wk,
                       .push = push,
                       .pull = pull,
                       .grad = grad,
                       .out = out,
                       .step = push ? wk->next_step++ : 0,
                       .trace_ns = gs_trace_enabled() ? gs_now_ns() : 0};
    if (wk->tail)
        wk->tail->next = req;
    else
        wk->head = req;
    wk->tail = req;
    *req_p = &req->base;
    /* Started: a failure from here on is the request's, reported by its test or wait. */
    st = gs_ps_worker_progress(ps, 0);
    if (st != GS_OK)
        gs_ps_worker_set_fatal(ps, st);
    return GS_OK;
}

gs_status gs_ps_ipush(gs_ps *ps, uint64_t key, const float *grad, gs_req **req_p)
{
    return start(ps, key, grad, NULL, true, false, req_p);
}

gs_status gs_ps_ipull(gs_ps *ps, uint64_t key, float *out, gs_req **req_p)
{
    return start(ps, key, NULL, out, false, true, req_p);
}

gs_status gs_ps_ipush_pull(gs_ps *ps, uint64_t key, const float *grad, float *out, gs_req **req_p)
{
    return start(ps, key, grad, out, true, true, req_p);
}

int gs_ps_key_workers(gs_ps *ps, uint64_t key)
{
    const gs_ps_wkey *wk = ps && !ps->is_server ? find_key(ps, key) : NULL;
    uint32_t fewest = UINT32_MAX;
    for (size_t i = 0; wk && i < wk->nshards; i++) {
        uint32_t n = ps->wrk.shards[wk->first + i].counted;
        fewest = n < fewest ? n : fewest;
    }
    return wk && fewest > 0 && fewest != UINT32_MAX ? (int)fewest : -1;
}

int64_t gs_ps_key_round(gs_ps *ps, uint64_t key)
{
    const gs_ps_wkey *wk = ps && !ps->is_server ? find_key(ps, key) : NULL;
    return wk ? (int64_t)wk->next_step : -1;
}

/* What the oldest request of req's key still waits for, for the timeout message. */
static void describe_wait(const gs_ps *ps, const gs_ps_req *req, char *buf, size_t cap)
{
    const gs_ps_wkey *wk = req->key;
    snprintf(buf, cap, "nothing");
    for (size_t i = 0; i < wk->nshards; i++) {
        const gs_ps_wshard *ws = &ps->wrk.shards[wk->first + i];
        if (ws->phase == GS_PS_DONE || ws->phase == GS_PS_IDLE)
            continue;
        snprintf(
            buf, cap,
            "shard %zu on server %d (rank %d): phase %d, step %llu, server applied %llu of ours, slowest "
            "worker at %llu",
            i, ws->server, ws->server_rank, (int)ws->phase, (unsigned long long)ws->pushed,
            (unsigned long long)ws->seen.applied, (unsigned long long)ws->seen.min_step);
        return;
    }
}

/* gs_req_wait of a PS request: until it finished (GS_TIMEOUT_MS), then free it. */
static gs_status ps_req_wait(gs_req *base)
{
    gs_ps_req *req = (gs_ps_req *)base;
    gs_ps *ps = req->ps;
    /* Elastic: the servers leave a missing worker out GS_TIMEOUT_MS after a
     * round's first push, so a live worker's round may take that long and
     * then some; its own wait must not end first. */
    int64_t wait_ms = ps->params.elastic ? 2 * ps->timeout_ms : ps->timeout_ms;
    uint64_t deadline;
    gs_status st = GS_OK;
    deadline = gs_deadline_after_ms(wait_ms);
    while (!req->done && st == GS_OK) {
        int left = gs_deadline_left_ms(deadline);
        if (left == 0) {
            char what[256];
            describe_wait(ps, req, what, sizeof(what));
            st = gs_fail(
                GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                "rank %d: worker %d: key %llu not done within %lld ms (GS_TIMEOUT_MS=%lld%s); waiting "
                "for %s",
                ps->rank, ps->index, (unsigned long long)req->key->key, (long long)wait_ms,
                (long long)ps->timeout_ms, ps->params.elastic ? ", twice for elastic" : "", what);
            gs_ps_worker_set_fatal(ps, st);
            break;
        }
        st = gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline));
    }
    /* A failed request may still have operations in flight: let them finish. */
    deadline += (uint64_t)ps->timeout_ms * 1000000ull;
    while (!req->done && !gs_deadline_passed(deadline))
        if (gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline)) != GS_OK)
            break;
    /* not done: leaked on purpose, the transport may still write into what it names */
    if (!req->done)
        return gs_ps_worker_fatal_status(ps, st);
    if (st == GS_OK)
        st = req->status;
    free(req);
    return gs_ps_worker_fatal_status(ps, st);
}

/* gs_req_test of a PS request: progress without blocking; once it finished
 * (or the progress failed) collect it as ps_req_wait does. */
static gs_status ps_req_test(gs_req *base)
{
    gs_ps_req *req = (gs_ps_req *)base;
    gs_status st = req->done ? GS_OK : gs_ps_worker_progress(req->ps, 0);
    if (st != GS_OK)
        gs_ps_worker_set_fatal(req->ps, st);
    else if (!req->done)
        return GS_INPROGRESS;
    return ps_req_wait(base);
}

static const gs_req_class ps_req_class = {
    .layer = "ps",
    .test = ps_req_test,
    .wait = ps_req_wait,
};

static gs_status blocking(gs_ps *ps, uint64_t key, const float *grad, float *out, bool push, bool pull)
{
    gs_req *req = NULL;
    gs_status st = start(ps, key, grad, out, push, pull, &req);
    return st == GS_OK ? ps_req_wait(req) : st;
}

gs_status gs_ps_push(gs_ps *ps, uint64_t key, const float *grad)
{
    return blocking(ps, key, grad, NULL, true, false);
}

gs_status gs_ps_pull(gs_ps *ps, uint64_t key, float *out)
{
    return blocking(ps, key, NULL, out, false, true);
}

gs_status gs_ps_push_pull(gs_ps *ps, uint64_t key, const float *grad, float *out)
{
    return blocking(ps, key, grad, out, true, true);
}

/* ---- control messages ---------------------------------------------------------------- */

gs_status gs_ps_worker_ctrl_send(gs_ps *ps, int s, uint32_t cmd, uint32_t arg, uint64_t deadline)
{
    gs_status st;
    while ((st = gs_ps_ctrl_send(ps, ps->server_ranks[s], cmd, arg)) == GS_ERR_AGAIN &&
           !ps->wrk.server_lost[s]) {
        if (gs_deadline_passed(deadline))
            return gs_fail(GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                           "rank %d: worker %d: no room to send control message %u to server %d (rank %d) "
                           "within GS_TIMEOUT_MS=%lld (is it serving?)",
                           ps->rank, ps->index, cmd, s, ps->server_ranks[s], (long long)ps->timeout_ms);
        gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline));
    }
    if (st == GS_ERR_AGAIN) /* the server is gone: its records will not come back */
        st = gs_ps_worker_fatal_status(ps, GS_ERR_PEER_LOST);
    return st;
}

/* ---- checkpoint on request ---------------------------------------------------------- */

static gs_status worker_checkpoint(gs_ps *ps)
{
    uint64_t deadline = gs_deadline_after_ms(ps->timeout_ms);
    gs_status st = ps->wrk.fatal;
    uint32_t serial = ++ps->wrk.ckpt_serial & 0xffffffu;
    ps->wrk.ckpt_pending = 0;
    ps->wrk.ckpt_status = GS_OK;
    for (int s = 0; st == GS_OK && s < ps->nservers; s++) {
        st = gs_ps_worker_ctrl_send(ps, s, GS_PS_CTRL_CKPT, serial, deadline);
        ps->wrk.ckpt_pending += st == GS_OK;
    }
    while (st == GS_OK && ps->wrk.ckpt_pending > 0) {
        if (gs_deadline_passed(deadline))
            st = gs_fail(GS_SUBSYS_PS, GS_ERR_TIMEOUT,
                         "rank %d: %d servers did not confirm their checkpoint within %lld ms", ps->rank,
                         ps->wrk.ckpt_pending, (long long)ps->timeout_ms);
        else
            st = gs_ps_worker_progress(ps, gs_ps_wait_ms(deadline));
        if (st == GS_OK && ps->wrk.fatal != GS_OK)
            st = ps->wrk.fatal;
    }
    return st == GS_OK ? ps->wrk.ckpt_status : gs_ps_worker_fatal_status(ps, st);
}

gs_status gs_ps_checkpoint(gs_ps *ps)
{
    if (!ps)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "gs_ps_checkpoint: ps is NULL");
    if (ps->is_server) {
        if (ps->thread_started)
            return gs_fail(
                GS_SUBSYS_PS, GS_ERR_INVALID,
                "rank %d: gs_ps_checkpoint on a server whose loop runs in a thread; ask from a worker",
                ps->rank);
        return gs_ps_server_checkpoint(ps);
    }
    return worker_checkpoint(ps);
}
