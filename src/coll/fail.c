/*
 * A communicator's failure: the calls it ends, the peers it tells, and the
 * one sentence every later call returns as gs_last_error():
 *
 *   rank 2: allreduce #14: rank 1 lost (connection reset by peer): did it exit or crash?
 *
 * The sentence names this rank, the call and its sequence number, then the
 * detail, each once: the detail is the text of the layer that found the
 * error without its own "rank R: " (the transport's sentence for a lost
 * peer), and a text that already names the call (a timeout, a mismatch)
 * keeps its words. A failure a peer reported keeps the peer's name: a lost
 * rank "seen by rank T", anything else "rank T reports: ...".
 */
#include "coll/coll.h"

#include "util/log.h"
#include "util/trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Tells every peer, best effort: they fail their call at once instead of
 * waiting for their deadline. */
static void tell_peers(gs_comm *comm, gs_status status, uint64_t seq, const char *text)
{
    gs_coll_abort *a = (gs_coll_abort *)comm->abort_src;
    size_t len = strlen(text);
    if (len >= sizeof(a->text))
        len = sizeof(a->text) - 1;
    memset(a, 0, offsetof(gs_coll_abort, text));
    a->version = GS_COLL_PROTO_VERSION;
    a->status = (int32_t)status;
    a->rank = (uint32_t)comm->rank;
    a->len = (uint32_t)len;
    a->seq = seq;
    memcpy(a->text, text, len);
    a->text[len] = '\0';
    for (int p = 0; p < comm->size; p++) {
        if (p == comm->rank)
            continue;
        const gs_chan *ch = &comm->chans[p];
        gs_status st = gs_ep_write_imm(
            gs_tp_ep(comm->tp, p), a, comm->outbox, offsetof(gs_coll_abort, text) + len + 1,
            &comm->peer_inbox[p], ch->remote_off + GS_COLL_SLOTS * comm->slot_stride + GS_COLL_LINE,
            GS_COLL_IMM(GS_COLL_IMM_ABORT, 0, 0), GS_WR_ID(GS_WR_ABORT, p, 0), GS_OP_SIGNALED);
        if (st != GS_OK)
            gs_log_debug(COLL, "rank %d: could not tell rank %d about the failure: %s", comm->rank, p,
                         gs_status_name(st));
    }
}

/* Past a leading "<word> #seq: " of text (a peer's sentence names the
 * call first); the word into word (empty when there is none). */
static const char *skip_call(const char *text, uint64_t seq, char *word, size_t cap)
{
    char tag[32];
    const char *hash;
    word[0] = '\0';
    snprintf(tag, sizeof(tag), " #%" PRIu64 ": ", seq);
    hash = strstr(text, tag);
    if (!hash || hash == text || (size_t)(hash - text) >= cap || memchr(text, ' ', (size_t)(hash - text)))
        return text;
    snprintf(word, cap, "%.*s", (int)(hash - text), text);
    return hash + strlen(tag);
}

/* The kind of call seq while it is queued, else NULL. */
static const char *queued_kind(const gs_comm *comm, uint64_t seq)
{
    for (const gs_coll_req *r = comm->head; r; r = r->next)
        if (r->op.seq == seq)
            return gs_coll_kind_name(r->op.kind);
    return NULL;
}

/* Whether text names call seq itself ("#seq" then no digit, as the
 * mismatch and timeout texts do). */
static bool names_call(const char *text, uint64_t seq)
{
    char tag[32];
    size_t n = (size_t)snprintf(tag, sizeof(tag), "#%" PRIu64, seq);
    for (const char *p = strstr(text, tag); p; p = strstr(p + 1, tag))
        if (p[n] < '0' || p[n] > '9')
            return true;
    return false;
}

/* Whether text is about the teller itself ("rank T ..."). */
static bool names_self(const char *text, int teller)
{
    char head[24];
    int n = snprintf(head, sizeof(head), "rank %d ", teller);
    return strncmp(text, head, (size_t)n) == 0;
}

/* The sentence of the failure of call seq (see the top of the file) into
 * comm->failed_text, from comm->failed_raw and failed_teller (the rank that
 * reported it, -1 when this rank found it); kind: the call's, if known. */
static void compose(gs_comm *comm, uint64_t seq, const char *kind)
{
    char call[64], word[24], cause[GS_COLL_CTRL_BYTES - 192]; /* room for the rest of the sentence */
    char *out = comm->failed_text;
    size_t cap = sizeof(comm->failed_text);
    int writer, lost, teller = comm->failed_teller;
    const char *detail = gs_error_skip_rank(comm->failed_raw, &writer);
    detail = skip_call(detail, seq, word, sizeof(word)); /* said once, below */
    if (!kind && word[0] && strcmp(word, "call") != 0)
        kind = word;
    comm->failed_named = kind != NULL;
    snprintf(call, sizeof(call), "%s #%" PRIu64, kind ? kind : "call", seq);
    if (teller >= 0 && gs_error_peer_lost_parse(detail, &lost, cause, sizeof(cause)) && lost != comm->rank)
        snprintf(out, cap, "rank %d: %s: rank %d lost (%s%d: %s): did it exit or crash?", comm->rank, call,
                 lost, strncmp(cause, "seen by rank ", 13) == 0 ? "" : "seen by rank ", teller, cause);
    else if (teller >= 0 && names_self(detail, teller))
        snprintf(out, cap, "rank %d: %s: %s", comm->rank, call, detail); /* "rank T aborted ..." */
    else if (teller >= 0 && names_call(detail, seq))
        snprintf(out, cap, "rank %d: rank %d reports: %s", comm->rank, teller, detail);
    else if (teller >= 0)
        snprintf(out, cap, "rank %d: %s: rank %d reports: %s", comm->rank, call, teller, detail);
    else if (names_call(detail, seq))
        snprintf(out, cap, "rank %d: %s", comm->rank, detail);
    else
        snprintf(out, cap, "rank %d: %s: %s", comm->rank, call, detail);
}

static void fail(gs_comm *comm, gs_status status, uint64_t seq, const char *text, int teller)
{
    gs_coll_req **link = &comm->head;
    bool tell = teller == -1; /* -2: found here, nobody to tell */
    if (comm->failed != GS_OK && seq >= comm->failed_seq)
        return; /* already failed from an earlier call on */
    comm->failed = status;
    comm->failed_seq = seq;
    comm->failed_teller = teller < 0 ? -1 : teller;
    snprintf(comm->failed_raw, sizeof(comm->failed_raw), "%s", text);
    compose(comm, seq, queued_kind(comm, seq));
    if (teller >= 0)
        gs_log_info(COLL, "%s", comm->failed_text);
    if (tell)
        tell_peers(comm, status, seq, comm->failed_text);
    if (tell && comm->box)
        gs_box_tell(comm, status, seq, comm->failed_text);
    /* calls before the failed one still finish: their messages were all
     * sent before any rank entered the failed call */
    while (*link && (*link)->op.seq < seq)
        link = &(*link)->next;
    while (*link) {
        gs_coll_req *req = *link;
        *link = req->next;
        req->next = NULL;
        req->status = status;
        gs_coll_user_close(&req->op);
        if (gs_trace_enabled())
            gs_coll_trace_end(&req->op, status);
    }
    if (!comm->head)
        comm->tail = NULL;
    else
        for (comm->tail = comm->head; comm->tail->next;)
            comm->tail = comm->tail->next;
    if (comm->threaded)
        pthread_cond_broadcast(&comm->cond);
}

void gs_engine_fail(gs_comm *comm, gs_status status, uint64_t seq, const char *text, bool tell)
{
    fail(comm, status, seq, text, tell ? -1 : -2);
}

void gs_engine_fail_told(gs_comm *comm, gs_status status, uint64_t seq, int teller, const char *text)
{
    fail(comm, status, seq, text, teller);
}

void gs_engine_fail_name(gs_comm *comm, gs_coll_kind kind)
{
    if (comm->failed != GS_OK && !comm->failed_named && comm->seq_issued + 1 == comm->failed_seq)
        compose(comm, comm->failed_seq, gs_coll_kind_name(kind));
}
