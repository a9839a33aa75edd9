/*
 * Point-to-point sends and receives: a plane of their own beside the
 * collectives' slots, over the transport's two-sided SEND/RECV.
 *
 *   receiving   every peer has GS_P2P_RECVS receives of GS_P2P_FRAME_MAX
 *               bytes posted at all times (reposted as each is handled), so
 *               the transport never holds a SEND, and with it the
 *               collectives' notifications behind it, waiting for one
 *   sending     envelopes are built in GS_P2P_OUT_SLOTS registered slots;
 *               sends leave in the order they were started
 *   eager       a message of at most GS_P2P_EAGER_MAX bytes travels inside
 *               its envelope: the send is done once it is posted
 *   rendezvous  a larger one: the sender registers its buffer and sends an
 *               RTS with the region; the matching receive registers its own
 *               buffer, READs the message straight into it and answers FIN,
 *               which completes the send (GS_TP_CAP_USER_MEM)
 *   fragments   without user memory: pieces of GS_P2P_EAGER_MAX bytes
 *               inline, copied into the receive buffer as they arrive
 *   matching    a receive takes the earliest message that arrived from its
 *               peer (or any) with its tag; an arriving message takes the
 *               earliest posted receive it fits; messages that arrive before
 *               their receive wait in arrival order (eager payloads copied
 *               out, so the receive slot goes back to the transport)
 *
 * Everything runs under the communicator's lock (its progress thread
 * dispatches completions here too). Failures: a receive that nothing
 * matched within GS_TIMEOUT_MS fails alone; anything with data on the wire
 * (a rendezvous) that stops moving fails the communicator; a failed
 * communicator fails every send and receive with its cause.
 */
#include "coll/coll.h"

#include "transport/tp.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(GS_P2P_FRAME_MAX == GS_SEND_MAX, "a p2p frame is one transport SEND");

#define GS_P2P_RECVS       16         /* receives posted per peer */
#define GS_P2P_OUT_SLOTS   64         /* envelope slots */
#define GS_P2P_READ_CHUNK  (8u << 20) /* a rendezvous READs in pieces of this */
#define GS_P2P_QUICK_TURNS 256        /* a blocking receive's spin on its peer's mailbox, */
#define GS_P2P_QUICK_POLL  4          /* polling the transport every 4th turn */

enum { S_QUEUED = 1, S_WAIT_FIN, R_POSTED, R_READ, R_STREAM, P2P_DONE };

/* A message that arrived before its receive, or a FRAG stream in progress. */
struct gs_p2p_msg {
    gs_p2p_msg *next;
    int src, tag, type;
    gs_dtype dtype;
    uint64_t msg;
    size_t bytes, got;
    uint8_t *data;      /* EAGER / unmatched FRAG: the payload so far (malloc) */
    gs_rmr remote;      /* RTS */
    gs_coll_req *owner; /* FRAG matched: its pieces go to this receive */
    bool discard;       /* FRAG refused by its receive: pieces are dropped */
};

/* A FIN that could not be posted yet. */
typedef struct gs_p2p_ctl {
    struct gs_p2p_ctl *next;
    int peer;
    gs_p2p_env env;
} gs_p2p_ctl;

typedef struct gs_p2p_list {
    gs_coll_req *head, *tail;
} gs_p2p_list;

struct gs_p2p {
    gs_mr *in;  /* [size][GS_P2P_RECVS] receive buffers */
    gs_mr *out; /* [GS_P2P_OUT_SLOTS] envelope slots */
    bool out_busy[GS_P2P_OUT_SLOTS];
    int out_next;
    bool user_mem;      /* GS_TP_CAP_USER_MEM: rendezvous by READ, else fragments */
    bool send_copy;     /* GS_TP_CAP_SEND_COPY: envelopes leave unsignaled, their slot free at once */
    uint8_t gen;        /* communicator id in receive ids (a caller's tp may outlive us) */
    uint64_t *tx_msgs;  /* [size]: messages started to each peer */
    uint64_t *rx_msgs;  /* [size]: messages from each peer begun here (transport or mailbox) */
    gs_mail mail;       /* the mailboxes' positions (with boxes: one host, shm) */
    gs_p2p_list sendq;  /* sends not yet all posted, in start order */
    gs_p2p_list posted; /* receives waiting for a message, in posting order */
    gs_p2p_list active; /* rendezvous sends waiting for FIN, receives reading or streaming */
    gs_p2p_msg *unexp, *unexp_tail;
    gs_p2p_ctl *ctl, *ctl_tail;
    gs_coll_req sync; /* the blocking calls' request */
};

/* ---- small helpers --------------------------------------------------------- */

static void list_push(gs_p2p_list *l, gs_coll_req *req)
{
    req->p2p.next = NULL;
    if (l->tail)
        l->tail->p2p.next = req;
    else
        l->head = req;
    l->tail = req;
}

static void list_remove(gs_p2p_list *l, gs_coll_req *req)
{
    gs_coll_req *prev = NULL;
    for (gs_coll_req *r = l->head; r; prev = r, r = r->p2p.next) {
        if (r != req)
            continue;
        if (prev)
            prev->p2p.next = r->p2p.next;
        else
            l->head = r->p2p.next;
        if (l->tail == r)
            l->tail = prev;
        r->p2p.next = NULL;
        return;
    }
}

/* "send to rank 1 (tag 7)", "recv from any rank (tag 7)" */
static void describe(const gs_p2p_op *op, char *buf, size_t cap)
{
    if (op->kind == GS_P2P_SEND)
        snprintf(buf, cap, "send to rank %d (tag %d, %zu bytes)", op->peer, op->tag, op->bytes);
    else if (op->peer == GS_ANY_SOURCE)
        snprintf(buf, cap, "recv from any rank (tag %d)", op->tag);
    else
        snprintf(buf, cap, "recv from rank %d (tag %d)", op->peer, op->tag);
}

static void finish(gs_coll_req *req, gs_status st)
{
    gs_p2p_op *op = &req->p2p;
    if (op->mr && gs_mr_dereg(op->mr) != GS_OK)
        gs_log_warn(COLL, "rank %d: deregistering a p2p buffer failed: %s", req->comm->rank, gs_last_error());
    op->mr = NULL;
    op->state = P2P_DONE;
    if (op->kind == GS_P2P_RECV && op->status && (st == GS_OK || op->result.source >= 0))
        *op->status = op->result;
    req->status = st;
    if (req->comm->threaded)
        pthread_cond_broadcast(&req->comm->cond);
}

/* Fails req with st; the sentence "rank R: <op>: <fmt...>" is its error. */
static void __attribute__((format(printf, 3, 4)))
fail_req(gs_coll_req *req, gs_status st, const char *fmt, ...)
{
    char what[96], detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    describe(&req->p2p, what, sizeof(what));
    snprintf(req->p2p.err, sizeof(req->p2p.err), "rank %d: %s: %s", req->comm->rank, what, detail);
    gs_fail(GS_SUBSYS_COLL, st, "%s", req->p2p.err);
    finish(req, st);
}

/* ---- posting envelopes ----------------------------------------------------- */

static uint64_t recv_id(const gs_p2p *p, int peer, int i)
{
    return ((uint64_t)GS_WR_P2P_RECV << 56) | ((uint64_t)p->gen << 48) | ((uint64_t)(uint32_t)peer << 16) |
           (uint64_t)(uint16_t)i;
}

static uint8_t *recv_buf(gs_comm *comm, int peer, int i)
{
    return (uint8_t *)gs_mr_addr(comm->p2p->in) +
           ((size_t)peer * GS_P2P_RECVS + (size_t)i) * GS_P2P_FRAME_MAX;
}

static gs_status repost(gs_comm *comm, int peer, int i)
{
    return gs_ep_recv(gs_tp_ep(comm->tp, peer), recv_buf(comm, peer, i), comm->p2p->in, GS_P2P_FRAME_MAX,
                      recv_id(comm->p2p, peer, i));
}

static int take_slot(gs_p2p *p)
{
    for (int k = 0; k < GS_P2P_OUT_SLOTS; k++) {
        int i = (p->out_next + k) % GS_P2P_OUT_SLOTS;
        if (!p->out_busy[i]) {
            p->out_next = (i + 1) % GS_P2P_OUT_SLOTS;
            return i;
        }
    }
    return -1;
}

/* Sends env + len payload bytes to peer. GS_ERR_AGAIN: nothing posted
 * (no slot or the transport's queue is full). */
/* Where a frame's payload starts: an EAGER frame's envelope ends before its offset field. */
static size_t frame_hdr_bytes(unsigned type)
{
    return type == GS_P2P_EAGER ? GS_P2P_EAGER_HDR_BYTES : GS_P2P_ENV_BYTES;
}

static gs_status post_env(gs_comm *comm, int peer, const gs_p2p_env *env, const void *payload, size_t len)
{
    gs_p2p *p = comm->p2p;
    int i = take_slot(p);
    if (i < 0)
        return GS_ERR_AGAIN;
    uint8_t *slot = (uint8_t *)gs_mr_addr(p->out) + (size_t)i * GS_P2P_FRAME_MAX;
    size_t hdr = frame_hdr_bytes(env->type);
    memcpy(slot, env, hdr);
    if (len)
        memcpy(slot + hdr, payload, len);
    /* a transport that copies the frame before it returns needs no
     * completion to give the slot back */
    gs_status st = gs_ep_send(gs_tp_ep(comm->tp, peer), slot, p->out, hdr + len,
                              GS_WR_ID(GS_WR_P2P_SEND, i, 0), p->send_copy ? 0u : GS_OP_SIGNALED);
    if (st == GS_OK && !p->send_copy)
        p->out_busy[i] = true;
    return st;
}

static gs_p2p_env make_env(const gs_comm *comm, int type, const gs_p2p_op *op)
{
    return (gs_p2p_env){.version = GS_P2P_PROTO_VERSION,
                        .type = (uint8_t)type,
                        .dtype = (uint8_t)op->dtype,
                        .tag = op->tag,
                        .sender = (uint32_t)comm->rank,
                        .msg = op->msg,
                        .bytes = op->bytes};
}

/* Posts a control envelope (FIN, WAKE) to peer, or queues it behind the
 * ones waiting (flush posts them in order). */
static gs_status post_ctl(gs_comm *comm, int peer, const gs_p2p_env *env)
{
    gs_p2p *p = comm->p2p;
    gs_status st = p->ctl ? GS_ERR_AGAIN : post_env(comm, peer, env, NULL, 0);
    if (st != GS_ERR_AGAIN)
        return st;
    gs_p2p_ctl *c = gs_calloc(1, sizeof(*c));
    if (!c)
        return GS_ERR_NOMEM;
    c->peer = peer;
    c->env = *env;
    if (p->ctl_tail)
        p->ctl_tail->next = c;
    else
        p->ctl = c;
    p->ctl_tail = c;
    return GS_OK;
}

/* Tells peer that this rank is done with its message msg (status: how). */
static gs_status send_fin(gs_comm *comm, int peer, uint64_t msg, gs_status status, size_t cap)
{
    gs_p2p_env env = {.version = GS_P2P_PROTO_VERSION,
                      .type = GS_P2P_FIN,
                      .sender = (uint32_t)comm->rank,
                      .status = (int32_t)status,
                      .msg = msg,
                      .offset = cap};
    return post_ctl(comm, peer, &env);
}

/* Wakes peer, which blocks in the transport while a message waits for it
 * in this rank's mailbox. */
static gs_status send_wake(gs_comm *comm, int peer)
{
    gs_p2p_env env = {.version = GS_P2P_PROTO_VERSION, .type = GS_P2P_WAKE, .sender = (uint32_t)comm->rank};
    return post_ctl(comm, peer, &env);
}

/* ---- sending ------------------------------------------------------------------ */

/* Posts what it can of the next pieces of a FRAG send. */
static gs_status post_frags(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p_op *op = &req->p2p;
    while (op->done < op->bytes) {
        size_t n = op->bytes - op->done < GS_P2P_EAGER_MAX ? op->bytes - op->done : GS_P2P_EAGER_MAX;
        gs_p2p_env env = make_env(comm, GS_P2P_FRAG, op);
        env.offset = op->done;
        gs_status st = post_env(comm, op->peer, &env, op->sbuf + op->done, n);
        if (st != GS_OK)
            return st;
        op->done += n;
        op->last_ns = gs_now_ns();
    }
    finish(req, GS_OK);
    return GS_OK;
}

/* Posts a rendezvous send's RTS (its buffer registered first). */
static gs_status post_rts(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p_op *op = &req->p2p;
    gs_rmr rmr;
    gs_p2p_env env = make_env(comm, GS_P2P_RTS, op);
    gs_mr_pack(op->mr, &rmr);
    gs_status st = post_env(comm, op->peer, &env, &rmr, sizeof(rmr));
    if (st != GS_OK)
        return st;
    op->state = S_WAIT_FIN; /* flush moves it to the active list */
    op->last_ns = gs_now_ns();
    return GS_OK;
}

/* Moves the send at the head of the queue on: GS_OK when all of it is
 * posted (done, or waiting for FIN), GS_ERR_AGAIN to come back later. */
static gs_status advance_send(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p_op *op = &req->p2p;
    if (op->bytes <= GS_P2P_EAGER_MAX) {
        gs_p2p_env env = make_env(comm, GS_P2P_EAGER, op);
        gs_status st = post_env(comm, op->peer, &env, op->sbuf, op->bytes);
        if (st == GS_OK)
            finish(req, GS_OK);
        return st;
    }
    if (comm->p2p->user_mem && !op->mr && op->done == 0 &&
        gs_mr_reg(comm->tp, (void *)op->sbuf, op->bytes, GS_ACCESS_REMOTE_READ, &op->mr) != GS_OK) {
        gs_log_debug(COLL, "rank %d: registering a send buffer failed (%s): sending it in pieces", comm->rank,
                     gs_last_error());
        op->mr = NULL;
    }
    return op->mr ? post_rts(comm, req) : post_frags(comm, req);
}

static gs_status post_reads(gs_comm *comm, gs_coll_req *req);

/* Posts whatever waits: FINs, queued sends, READs of rendezvous receives. */
static gs_status flush(gs_comm *comm)
{
    gs_p2p *p = comm->p2p;
    gs_status st = GS_OK;
    while (p->ctl && st == GS_OK) {
        gs_p2p_ctl *c = p->ctl;
        st = post_env(comm, c->peer, &c->env, NULL, 0);
        if (st == GS_OK) {
            p->ctl = c->next;
            if (!p->ctl)
                p->ctl_tail = NULL;
            free(c);
        }
    }
    while (p->sendq.head && st == GS_OK) {
        gs_coll_req *req = p->sendq.head;
        st = advance_send(comm, req);
        if (st != GS_OK)
            break;
        list_remove(&p->sendq, req);
        if (req->p2p.state == S_WAIT_FIN)
            list_push(&p->active, req);
    }
    for (gs_coll_req *r = p->active.head, *next; r && (st == GS_OK || st == GS_ERR_AGAIN); r = next) {
        next = r->p2p.next;
        if (r->p2p.state == R_READ && r->p2p.posted < r->p2p.bytes)
            st = post_reads(comm, r);
    }
    return st == GS_ERR_AGAIN ? GS_OK : st;
}

/* ---- receiving ---------------------------------------------------------------- */

/* Whether a message from src with tag may go to op, and if so checks its
 * type and size: GS_OK, or fails req (the message is consumed). */
static gs_status check_fit(gs_coll_req *req, int src, int tag, gs_dtype dtype, size_t bytes, uint64_t msg)
{
    gs_p2p_op *op = &req->p2p;
    size_t es = gs_dtype_size(op->dtype);
    op->result = (gs_p2p_status){.source = src, .tag = tag, .count = bytes / es};
    op->msg = msg;
    if (dtype != op->dtype) {
        fail_req(req, GS_ERR_MISMATCH, "rank %d sent %s, the receive takes %s", src, gs_dtype_name(dtype),
                 gs_dtype_name(op->dtype));
        return GS_ERR_MISMATCH;
    }
    if (bytes > op->bytes) {
        fail_req(req, GS_ERR_MISMATCH,
                 "rank %d's message of %zu bytes is longer than the receive buffer of %zu bytes (%zu %s)",
                 src, bytes, op->bytes, op->bytes / es, gs_dtype_name(op->dtype));
        return GS_ERR_MISMATCH;
    }
    return GS_OK;
}

static bool matches(const gs_p2p_op *op, int src, int tag)
{
    return op->tag == tag && (op->peer == GS_ANY_SOURCE || op->peer == src);
}

/* The earliest posted receive a message from src with tag goes to (taken
 * off the list), or NULL. */
static gs_coll_req *take_posted(gs_p2p *p, int src, int tag)
{
    for (gs_coll_req *r = p->posted.head; r; r = r->p2p.next)
        if (matches(&r->p2p, src, tag)) {
            list_remove(&p->posted, r);
            return r;
        }
    return NULL;
}

static void take_eager(gs_coll_req *req, int src, const gs_p2p_env *env, const void *payload)
{
    if (check_fit(req, src, env->tag, (gs_dtype)env->dtype, env->bytes, env->msg) != GS_OK)
        return;
    if (env->bytes)
        memcpy(req->p2p.rbuf, payload, env->bytes);
    finish(req, GS_OK);
}

static uint64_t read_id(const gs_coll_req *req)
{
    return ((uint64_t)GS_WR_P2P_READ << 56) | ((uint64_t)(uintptr_t)req & 0x00ffffffffffffffull);
}

static gs_status post_reads(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p_op *op = &req->p2p;
    gs_ep *ep = gs_tp_ep(comm->tp, op->result.source);
    while (op->posted < op->bytes) {
        size_t n = op->bytes - op->posted < GS_P2P_READ_CHUNK ? op->bytes - op->posted : GS_P2P_READ_CHUNK;
        gs_status st = gs_ep_read(ep, op->rbuf + op->posted, op->mr, n, &op->remote, op->posted, read_id(req),
                                  GS_OP_SIGNALED);
        if (st != GS_OK)
            return st;
        op->posted += n;
        op->reads++;
    }
    return GS_OK;
}

/* A receive matched an RTS: READ the message into its buffer. */
static gs_status start_rts(gs_comm *comm, gs_coll_req *req, int src, const gs_p2p_env *env,
                           const gs_rmr *remote)
{
    gs_p2p_op *op = &req->p2p;
    gs_status st = check_fit(req, src, env->tag, (gs_dtype)env->dtype, env->bytes, env->msg);
    if (st != GS_OK)
        return send_fin(comm, src, env->msg, st, op->bytes);
    st = gs_mr_reg(comm->tp, op->rbuf, env->bytes, GS_ACCESS_LOCAL_WRITE, &op->mr);
    if (st != GS_OK) {
        op->mr = NULL;
        fail_req(req, st, "registering the receive buffer for rank %d's message of %zu bytes failed: %s", src,
                 (size_t)env->bytes, gs_error_skip_rank(gs_last_error(), &(int){0}));
        return send_fin(comm, src, env->msg, st, op->bytes);
    }
    op->bytes = env->bytes; /* from here: the bytes to read */
    op->remote = *remote;
    op->posted = 0;
    op->reads = 0;
    op->state = R_READ;
    op->last_ns = gs_now_ns();
    list_push(&comm->p2p->active, req);
    st = post_reads(comm, req);
    return st == GS_ERR_AGAIN ? GS_OK : st;
}

static void unexp_push(gs_p2p *p, gs_p2p_msg *m)
{
    if (p->unexp_tail)
        p->unexp_tail->next = m;
    else
        p->unexp = m;
    p->unexp_tail = m;
}

static void unexp_remove(gs_p2p *p, gs_p2p_msg *m)
{
    gs_p2p_msg *prev = NULL;
    for (gs_p2p_msg *x = p->unexp; x; prev = x, x = x->next) {
        if (x != m)
            continue;
        if (prev)
            prev->next = x->next;
        else
            p->unexp = x->next;
        if (p->unexp_tail == x)
            p->unexp_tail = prev;
        free(x->data);
        free(x);
        return;
    }
}

/* A message that no receive takes yet, queued in arrival order. */
static gs_p2p_msg *queue_msg(gs_p2p *p, int src, const gs_p2p_env *env, const void *payload, size_t len)
{
    gs_p2p_msg *m = gs_calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    *m = (gs_p2p_msg){.src = src,
                      .tag = env->tag,
                      .type = env->type,
                      .dtype = (gs_dtype)env->dtype,
                      .msg = env->msg,
                      .bytes = env->bytes};
    if (env->type == GS_P2P_RTS) {
        memcpy(&m->remote, payload, sizeof(m->remote));
    } else if (env->type != GS_P2P_FRAG || len) {
        size_t cap = env->type == GS_P2P_FRAG ? env->bytes : len;
        m->data = malloc(cap ? cap : 1);
        if (!m->data) {
            free(m);
            return NULL;
        }
        if (len)
            memcpy(m->data, payload, len);
        m->got = len;
    }
    unexp_push(p, m);
    return m;
}

/* A FRAG stream's piece at off: into its receive, its buffer or nowhere. */
static void stream_piece(gs_comm *comm, gs_p2p_msg *m, size_t off, const void *piece, size_t n)
{
    if (m->owner) {
        memcpy(m->owner->p2p.rbuf + off, piece, n);
        m->owner->p2p.done = off + n;
        m->owner->p2p.last_ns = gs_now_ns();
    } else if (!m->discard) {
        memcpy(m->data + off, piece, n);
    }
    m->got = off + n;
    if (m->got < m->bytes || (!m->owner && !m->discard))
        return;
    if (m->owner) {
        list_remove(&comm->p2p->active, m->owner);
        finish(m->owner, GS_OK);
    }
    unexp_remove(comm->p2p, m);
}

/* Receive req takes FRAG stream m (its pieces so far, the rest as they come). */
static void take_stream(gs_comm *comm, gs_coll_req *req, gs_p2p_msg *m)
{
    if (check_fit(req, m->src, m->tag, m->dtype, m->bytes, m->msg) != GS_OK) {
        m->discard = true;
    } else {
        if (m->got)
            memcpy(req->p2p.rbuf, m->data, m->got);
        req->p2p.done = m->got;
        req->p2p.state = R_STREAM;
        req->p2p.last_ns = gs_now_ns();
        m->owner = req;
        list_push(&comm->p2p->active, req);
    }
    free(m->data);
    m->data = NULL;
    if (m->got == m->bytes) {
        if (m->owner) {
            list_remove(&comm->p2p->active, req);
            finish(req, GS_OK);
        }
        unexp_remove(comm->p2p, m);
    }
}

/* A new receive looks at what arrived: GS_OK taken (or failed), GS_ERR_AGAIN none. */
static gs_status match_unexp(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p *p = comm->p2p;
    gs_status st = GS_OK;
    for (gs_p2p_msg *m = p->unexp; m; m = m->next) {
        if (m->owner || m->discard || !matches(&req->p2p, m->src, m->tag))
            continue;
        if (m->type == GS_P2P_FRAG) {
            take_stream(comm, req, m);
            return GS_OK;
        }
        gs_p2p_env env = {.type = (uint8_t)m->type,
                          .dtype = (uint8_t)m->dtype,
                          .tag = m->tag,
                          .msg = m->msg,
                          .bytes = m->bytes};
        if (m->type == GS_P2P_RTS)
            st = start_rts(comm, req, m->src, &env, &m->remote);
        else
            take_eager(req, m->src, &env, m->data);
        unexp_remove(p, m);
        return st;
    }
    return GS_ERR_AGAIN;
}

/* ---- arrivals ----------------------------------------------------------------- */

static gs_status malformed(gs_comm *comm, int src, const char *what, size_t len)
{
    return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                   "rank %d: malformed point-to-point message from rank %d (%s, %zu bytes)", comm->rank, src,
                   what, len);
}

/* Whether an envelope of len bytes from src is well formed. */
static bool env_ok(const gs_p2p_env *env, int src, size_t len)
{
    size_t hdr = frame_hdr_bytes(env->type), payload = len - hdr;
    if (len < hdr || env->version != GS_P2P_PROTO_VERSION || env->sender != (uint32_t)src)
        return false;
    switch (env->type) {
    case GS_P2P_EAGER: return env->dtype < GS_DTYPE_COUNT && env->tag >= 0 && payload == env->bytes;
    case GS_P2P_RTS:
        return env->dtype < GS_DTYPE_COUNT && env->tag >= 0 && payload == sizeof(gs_rmr) &&
               env->bytes > GS_P2P_EAGER_MAX;
    case GS_P2P_FRAG:
        return env->dtype < GS_DTYPE_COUNT && env->tag >= 0 && payload > 0 && env->offset <= env->bytes &&
               payload <= env->bytes - env->offset;
    case GS_P2P_FIN:
    case GS_P2P_WAKE: return payload == 0;
    default: return false;
    }
}

static gs_p2p_msg *find_stream(gs_p2p *p, int src, uint64_t msg)
{
    for (gs_p2p_msg *m = p->unexp; m; m = m->next)
        if (m->type == GS_P2P_FRAG && m->src == src && m->msg == msg)
            return m;
    return NULL;
}

static gs_status on_frag(gs_comm *comm, int src, const gs_p2p_env *env, const uint8_t *piece, size_t n)
{
    gs_p2p *p = comm->p2p;
    gs_p2p_msg *m;
    if (env->offset != 0) {
        m = find_stream(p, src, env->msg);
        if (!m || env->offset != m->got)
            return malformed(comm, src, "a piece of no message in progress", n);
        stream_piece(comm, m, env->offset, piece, n);
        return GS_OK;
    }
    gs_coll_req *req = take_posted(p, src, env->tag);
    m = queue_msg(p, src, env, NULL, 0);
    if (!m)
        return GS_ERR_NOMEM;
    if (req)
        take_stream(comm, req, m);
    else if (!(m->data = malloc(m->bytes)))
        return GS_ERR_NOMEM;
    stream_piece(comm, m, 0, piece, n);
    return GS_OK;
}

static gs_status on_fin(gs_comm *comm, int src, const gs_p2p_env *env)
{
    for (gs_coll_req *r = comm->p2p->active.head; r; r = r->p2p.next) {
        if (r->p2p.kind != GS_P2P_SEND || r->p2p.peer != src || r->p2p.msg != env->msg)
            continue;
        list_remove(&comm->p2p->active, r);
        if (env->status == GS_OK)
            finish(r, GS_OK);
        else if (env->status == GS_ERR_MISMATCH)
            fail_req(r, GS_ERR_MISMATCH, "rank %d refused the message: its receive takes %llu bytes", src,
                     (unsigned long long)env->offset);
        else
            fail_req(r, env->status < 0 ? (gs_status)env->status : GS_ERR_PROTOCOL,
                     "rank %d could not receive the message (%s)", src,
                     gs_status_name(env->status < 0 ? (gs_status)env->status : GS_ERR_PROTOCOL));
        return GS_OK;
    }
    return malformed(comm, src, "FIN of no message waiting", GS_P2P_ENV_BYTES);
}

/* An EAGER message from src: to the earliest posted receive it fits, or queued. */
static gs_status deliver_eager(gs_comm *comm, int src, const gs_p2p_env *env, const void *payload)
{
    gs_coll_req *req = take_posted(comm->p2p, src, env->tag);
    if (req)
        take_eager(req, src, env, payload);
    else if (!queue_msg(comm->p2p, src, env, payload, env->bytes))
        return GS_ERR_NOMEM;
    return GS_OK;
}

/* Takes src's oldest mailbox message if it is the next of src's messages:
 * GS_OK delivered, GS_ERR_AGAIN none (or an earlier one still on the
 * transport), or a malformed message's error. */
static gs_status mail_take(gs_comm *comm, int src)
{
    gs_p2p *p = comm->p2p;
    gs_mail_msg mm;
    if (!gs_mail_peek(comm, &p->mail, src, &mm))
        return GS_ERR_AGAIN;
    if (mm.msg > p->rx_msgs[src] + 1)
        return GS_ERR_AGAIN;
    if (mm.msg != p->rx_msgs[src] + 1 || mm.bytes > GS_MAIL_MAX || mm.dtype >= GS_DTYPE_COUNT || mm.tag < 0)
        return malformed(comm, src, "bad mailbox message", mm.bytes);
    gs_mail_take(comm, &p->mail, src);
    p->rx_msgs[src] = mm.msg;
    gs_p2p_env env = {.version = GS_P2P_PROTO_VERSION,
                      .type = GS_P2P_EAGER,
                      .dtype = mm.dtype,
                      .tag = mm.tag,
                      .sender = (uint32_t)src,
                      .msg = mm.msg,
                      .bytes = mm.bytes};
    return deliver_eager(comm, src, &env, mm.data);
}

/* Message msg from src arrived through the transport: src's mailbox
 * messages numbered before it are taken first, so every peer's messages
 * are matched in the order they were sent. */
static gs_status mail_before(gs_comm *comm, int src, uint64_t msg)
{
    gs_p2p *p = comm->p2p;
    while (comm->box && p->rx_msgs[src] + 1 < msg) {
        gs_status st = mail_take(comm, src);
        if (st == GS_ERR_AGAIN)
            return malformed(comm, src, "a message numbered past one its mailbox does not hold",
                             GS_P2P_ENV_BYTES);
        if (st != GS_OK)
            return st;
    }
    if (msg > p->rx_msgs[src])
        p->rx_msgs[src] = msg;
    return GS_OK;
}

/* While receives wait: takes what the peers' mailboxes hold for them. */
static gs_status mail_poll(gs_comm *comm)
{
    gs_p2p *p = comm->p2p;
    for (int src = 0; comm->box && src < comm->size; src++) {
        gs_status st = GS_OK;
        while (src != comm->rank && p->posted.head && st == GS_OK)
            st = mail_take(comm, src);
        if (st != GS_OK && st != GS_ERR_AGAIN)
            return st;
    }
    return GS_OK;
}

/* A frame from src arrived in receive buffer i: handled, the buffer posted again. */
static gs_status on_recv(gs_comm *comm, int src, int i, size_t len)
{
    gs_p2p *p = comm->p2p;
    const uint8_t *buf = recv_buf(comm, src, i);
    gs_p2p_env env = {0};
    gs_status st = GS_OK;
    memcpy(&env, buf, len < sizeof(env) ? len : sizeof(env));
    if (env.type == GS_P2P_EAGER)
        env.offset = 0; /* not in its frame: that was payload */
    if (len < GS_P2P_EAGER_HDR_BYTES || !env_ok(&env, src, len))
        return malformed(comm, src, "bad envelope", len);
    const uint8_t *payload = buf + frame_hdr_bytes(env.type);
    gs_coll_req *req;
    bool starts =
        env.type == GS_P2P_EAGER || env.type == GS_P2P_RTS || (env.type == GS_P2P_FRAG && env.offset == 0);
    if (starts && (st = mail_before(comm, src, env.msg)) != GS_OK)
        return st;
    switch (env.type) {
    case GS_P2P_EAGER: st = deliver_eager(comm, src, &env, payload); break;
    case GS_P2P_RTS:
        if ((req = take_posted(p, src, env.tag)))
            st = start_rts(comm, req, src, &env, (const gs_rmr *)(const void *)payload);
        else if (!queue_msg(p, src, &env, payload, sizeof(gs_rmr)))
            st = GS_ERR_NOMEM;
        break;
    case GS_P2P_FRAG: st = on_frag(comm, src, &env, payload, len - GS_P2P_ENV_BYTES); break;
    case GS_P2P_WAKE: break; /* the wait that follows takes the mail */
    default: st = on_fin(comm, src, &env); break;
    }
    if (st == GS_OK)
        st = repost(comm, src, i);
    return st;
}

static gs_status on_read(gs_comm *comm, uint64_t wr_id)
{
    for (gs_coll_req *r = comm->p2p->active.head; r; r = r->p2p.next) {
        if (read_id(r) != wr_id || r->p2p.state != R_READ)
            continue;
        r->p2p.reads--;
        r->p2p.last_ns = gs_now_ns();
        if (r->p2p.reads == 0 && r->p2p.posted == r->p2p.bytes) {
            int src = r->p2p.result.source;
            uint64_t msg = r->p2p.msg;
            list_remove(&comm->p2p->active, r);
            finish(r, GS_OK);
            return send_fin(comm, src, msg, GS_OK, r->p2p.bytes);
        }
        return GS_OK;
    }
    return GS_OK; /* a receive already failed */
}

gs_status gs_p2p_complete(gs_comm *comm, const gs_wc *wc)
{
    gs_p2p *p = comm->p2p;
    unsigned type = (unsigned)(wc->wr_id >> 56);
    gs_status st;
    if (wc->opcode == GS_WC_SEND && type == GS_WR_P2P_SEND) {
        unsigned i = (unsigned)(wc->wr_id >> 16) & 0xffffffffu;
        if (i < GS_P2P_OUT_SLOTS)
            p->out_busy[i] = false;
        st = GS_OK;
    } else if (wc->opcode == GS_WC_RECV && type == GS_WR_P2P_RECV) {
        unsigned gen = (unsigned)(wc->wr_id >> 48) & 0xffu, i = (unsigned)(wc->wr_id & 0xffff);
        if (gen != p->gen || i >= GS_P2P_RECVS)
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                           "rank %d: a point-to-point message from rank %d reached a receive of another "
                           "communicator on this transport (send/recv needs a transport of its own)",
                           comm->rank, wc->peer);
        st = on_recv(comm, wc->peer, (int)i, wc->len);
    } else if (wc->opcode == GS_WC_READ && type == GS_WR_P2P_READ) {
        st = on_read(comm, wc->wr_id);
    } else {
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL, "rank %d: completion with unknown id 0x%llx",
                       comm->rank, (unsigned long long)wc->wr_id);
    }
    return st == GS_OK ? flush(comm) : st;
}

/* ---- failures and deadlines --------------------------------------------------- */

/* The communicator's failure without its "rank R: " and "<call> #N: "
 * (a p2p operation names itself instead). */
static const char *failure_cause(const gs_comm *comm)
{
    int writer;
    const char *t =
        gs_error_skip_rank(comm->failed_teller >= 0 ? comm->failed_text : comm->failed_raw, &writer);
    const char *hash = strstr(t, " #");
    if (hash && !memchr(t, ' ', (size_t)(hash - t)) && hash[2] >= '0' && hash[2] <= '9') {
        const char *end = hash + 2;
        while (*end >= '0' && *end <= '9')
            end++;
        if (end[0] == ':' && end[1] == ' ')
            return end + 2;
    }
    return t;
}

/* The communicator failed: every send and receive ends with its cause. */
static void fail_all(gs_comm *comm)
{
    gs_p2p *p = comm->p2p;
    const char *detail = failure_cause(comm);
    gs_p2p_list *lists[] = {&p->sendq, &p->posted, &p->active};
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++)
        while (lists[l]->head) {
            gs_coll_req *r = lists[l]->head;
            list_remove(lists[l], r);
            fail_req(r, comm->failed, "%s", detail);
        }
}

/* req made no progress for GS_TIMEOUT_MS: a receive nothing matched fails
 * alone; anything with data on the wire fails the communicator. */
static void time_out(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p_op *op = &req->p2p;
    long long ms = (long long)comm->cfg->timeout_ms;
    int state = op->state;
    if (state == R_POSTED) {
        list_remove(&comm->p2p->posted, req);
        fail_req(req, GS_ERR_TIMEOUT, "no message came for %lld ms (GS_TIMEOUT_MS): did the sender send it?",
                 ms);
        return;
    }
    list_remove(state == S_QUEUED ? &comm->p2p->sendq : &comm->p2p->active, req);
    fail_req(req, GS_ERR_TIMEOUT, "%s for %lld ms (GS_TIMEOUT_MS)",
             state == S_WAIT_FIN ? "the receiver did not take the message"
             : state == S_QUEUED ? "the message could not leave"
                                 : "the message stopped arriving",
             ms);
    if (state != S_QUEUED)
        gs_engine_fail(comm, GS_ERR_TIMEOUT, gs_engine_current_seq(comm), op->err, true);
}

static bool overdue(const gs_comm *comm, const gs_coll_req *req)
{
    return comm->cfg->timeout_ms >= 0 && req->p2p.last_ns != 0 &&
           gs_now_ns() - req->p2p.last_ns > (uint64_t)comm->cfg->timeout_ms * 1000000ull;
}

/* Posts what waits; a post that fails (a lost peer) fails the communicator. */
/* st of a step of progress: not GS_OK fails the communicator; a failed
 * communicator fails every send and receive. */
static void fail_on(gs_comm *comm, gs_status st)
{
    if (st != GS_OK)
        gs_engine_fail(comm, st, gs_engine_current_seq(comm), gs_last_error(), true);
    if (comm->failed != GS_OK)
        fail_all(comm);
}

static void flush_or_fail(gs_comm *comm)
{
    fail_on(comm, comm->failed == GS_OK ? flush(comm) : GS_OK);
}

bool gs_p2p_busy(const gs_comm *comm)
{
    const gs_p2p *p = comm->p2p;
    if (!p)
        return false;
    if (p->ctl || p->sendq.head)
        return true;
    for (const gs_coll_req *r = p->active.head; r; r = r->p2p.next)
        if (r->p2p.state == R_READ && r->p2p.posted < r->p2p.bytes)
            return true;
    return false;
}

gs_status gs_p2p_progress(gs_comm *comm)
{
    gs_status st = mail_poll(comm);
    return st == GS_OK && gs_p2p_busy(comm) ? flush(comm) : st;
}

/* One round of progress for req's communicator (lock held): the mailboxes
 * first (no transport poll when the message is there). */
static void advance(gs_comm *comm, gs_coll_req *req)
{
    if (comm->failed == GS_OK && comm->box) {
        fail_on(comm, mail_poll(comm));
        if (req->status != GS_INPROGRESS)
            return;
    }
    if (comm->failed == GS_OK)
        gs_engine_progress(comm);
    flush_or_fail(comm);
    if (req->status == GS_INPROGRESS && overdue(comm, req))
        time_out(comm, req);
}

gs_status gs_p2p_test(gs_coll_req *req)
{
    gs_comm *comm = req->comm;
    gs_status st;
    gs_engine_lock(comm);
    if (req->status == GS_INPROGRESS)
        advance(comm, req);
    st = req->status;
    if (st != GS_OK && st != GS_INPROGRESS)
        gs_error_restore(req->p2p.err);
    gs_engine_unlock(comm);
    return st;
}

/* Whether a wait that began at since_ns (0: not yet) spins on: with
 * mailboxes, the first GS_SPIN_US of it (GS_POLL=spin: all of it), as the
 * transport's hybrid wait does, since blocking in the transport closes
 * them (every sender then also wakes this rank through the transport). */
static bool mail_spins(const gs_comm *comm, uint64_t since_ns, uint64_t now)
{
    if (!comm->box || comm->cfg->poll == GS_POLL_EVENT)
        return false;
    return comm->cfg->poll == GS_POLL_SPIN || since_ns == 0 ||
           now - since_ns < (uint64_t)comm->cfg->spin_us * 1000u;
}

/* Blocks in the transport for at most timeout_ms, the mailboxes closed. */
static void block(gs_comm *comm, gs_coll_req *req, int timeout_ms)
{
    if (!comm->box) {
        gs_engine_block(comm, timeout_ms);
        return;
    }
    gs_mail_set_closed(comm, true);
    fail_on(comm, mail_poll(comm)); /* what came before the senders could see it closed */
    if (req->status == GS_INPROGRESS && comm->failed == GS_OK)
        gs_engine_block(comm, timeout_ms);
    gs_mail_set_closed(comm, false);
}

gs_status gs_p2p_wait(gs_coll_req *req)
{
    gs_comm *comm = req->comm;
    gs_status st;
    uint64_t spin_from = 0;
    gs_engine_lock(comm);
    while (req->status == GS_INPROGRESS) {
        advance(comm, req);
        if (req->status != GS_INPROGRESS)
            break;
        /* with collectives queued (they may wait on shared-memory boxes,
         * not on the transport) every turn polls; else block in the
         * transport (GS_POLL's spin, event or hybrid) until a completion
         * or the deadline */
        uint64_t now = gs_now_ns();
        if (req->p2p.last_ns == 0) /* a blocking call's: its clock starts when it first waits */
            req->p2p.last_ns = now;
        int64_t left_ms = comm->cfg->timeout_ms < 0
                              ? 60000
                              : comm->cfg->timeout_ms - (int64_t)((now - req->p2p.last_ns) / 1000000u);
        if (left_ms <= 0) {
            time_out(comm, req);
            break;
        }
        if (spin_from == 0)
            spin_from = now;
        if (!comm->head && !gs_p2p_busy(comm) && left_ms >= 3 && !mail_spins(comm, spin_from, now))
            block(comm, req, (int)left_ms - 1);
        else if (comm->oversubscribed)
            sched_yield();
        else
            gs_cpu_relax();
    }
    st = req->status;
    if (st != GS_OK)
        gs_error_restore(req->p2p.err);
    gs_engine_unlock(comm);
    return st;
}

/* ---- the calls ------------------------------------------------------------------ */

static gs_status check_args(gs_comm *comm, const char *fn, const void *buf, size_t count, gs_dtype dtype,
                            int peer, int tag, bool any_ok)
{
    size_t bytes;
    if (!comm)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: the communicator is NULL", fn);
    if ((unsigned)dtype >= GS_DTYPE_COUNT)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: %s: unknown data type %d", comm->rank, fn,
                       (int)dtype);
    if ((peer < 0 || peer >= comm->size) && !(any_ok && peer == GS_ANY_SOURCE))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: %s: peer %d is not a rank (0..%d%s)",
                       comm->rank, fn, peer, comm->size - 1, any_ok ? " or GS_ANY_SOURCE" : "");
    if (tag < 0)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: %s: tag %d is negative", comm->rank, fn,
                       tag);
    if (__builtin_mul_overflow(count, gs_dtype_size(dtype), &bytes))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: %s: count %zu is too large", comm->rank, fn,
                       count);
    if (count && !buf)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: %s: NULL buffer with count %zu", comm->rank,
                       fn, count);
    return GS_OK;
}

/* started_ns: when the call began, or 0 for a blocking call (gs_p2p_wait
 * reads the clock when it first has to wait). */
static void init_op(gs_coll_req *req, gs_comm *comm, int kind, size_t count, gs_dtype dtype, int peer,
                    int tag, uint64_t started_ns)
{
    gs_p2p_op *op = &req->p2p;
    memset(op, 0, offsetof(gs_p2p_op, err)); /* the sentence is written when it fails */
    op->err[0] = '\0';
    req->comm = comm;
    req->status = GS_INPROGRESS;
    req->next = NULL;
    op->kind = kind;
    op->peer = peer;
    op->tag = tag;
    op->dtype = dtype;
    op->bytes = count * gs_dtype_size(dtype);
    op->result.source = -1;
    op->last_ns = started_ns;
}

/* A send to this rank itself: straight into a posted receive, or queued as
 * an eager copy. */
static gs_status send_self(gs_comm *comm, gs_coll_req *req)
{
    gs_p2p_op *op = &req->p2p;
    gs_p2p_env env = make_env(comm, GS_P2P_EAGER, op);
    gs_coll_req *r = take_posted(comm->p2p, comm->rank, op->tag);
    if (r)
        take_eager(r, comm->rank, &env, op->sbuf);
    else if (!queue_msg(comm->p2p, comm->rank, &env, op->sbuf, op->bytes))
        return GS_ERR_NOMEM;
    finish(req, GS_OK);
    return GS_OK;
}

/* The communicator failed before the call: it fails with the cause. */
static void refuse(gs_comm *comm, gs_coll_req *req)
{
    fail_req(req, comm->failed, "%s", failure_cause(comm));
}

/* Message msg to peer through the mailbox, where it fits (nothing queued
 * before it: the caller checks); false: not sent. */
static bool mail_send(gs_comm *comm, int peer, uint64_t msg, int tag, gs_dtype dtype, const void *buf,
                      size_t bytes)
{
    if (!comm->box || bytes > GS_MAIL_MAX ||
        !gs_mail_post(comm, &comm->p2p->mail, peer, msg, tag, dtype, buf, bytes))
        return false;
    if (gs_mail_peer_closed(comm, peer))
        fail_on(comm, send_wake(comm, peer));
    return true;
}

/* Starts a send; a failure is the request's status. */
static void start_send(gs_comm *comm, gs_coll_req *req, const void *buf)
{
    gs_p2p *p = comm->p2p;
    req->p2p.sbuf = buf;
    req->p2p.state = S_QUEUED;
    gs_engine_lock(comm);
    if (comm->failed != GS_OK) {
        refuse(comm, req);
    } else if (req->p2p.peer == comm->rank) {
        if (send_self(comm, req) != GS_OK)
            fail_req(req, GS_ERR_NOMEM, "out of memory queueing a message to itself");
    } else {
        gs_p2p_op *op = &req->p2p;
        op->msg = ++p->tx_msgs[op->peer];
        if (!p->sendq.head && mail_send(comm, op->peer, op->msg, op->tag, op->dtype, buf, op->bytes)) {
            if (comm->failed == GS_OK)
                finish(req, GS_OK);
            else
                refuse(comm, req); /* waking the peer failed */
        } else {
            list_push(&p->sendq, req);
            flush_or_fail(comm);
        }
    }
    gs_engine_unlock(comm);
}

/* Starts a receive; a failure is the request's status. */
static void start_recv(gs_comm *comm, gs_coll_req *req, void *buf, gs_p2p_status *status)
{
    req->p2p.rbuf = buf;
    req->p2p.status = status;
    req->p2p.state = R_POSTED;
    gs_engine_lock(comm);
    if (comm->failed != GS_OK)
        refuse(comm, req);
    else if (match_unexp(comm, req) == GS_ERR_AGAIN)
        list_push(&comm->p2p->posted, req);
    else
        flush_or_fail(comm); /* a FIN it owes */
    gs_engine_unlock(comm);
}

/* The common blocking send: eager, to another rank, nothing queued before
 * it. Into the peer's mailbox, or one envelope posted, under the lock, no
 * request. false: not taken (nothing posted, the message number given
 * back), the queued path sends. */
static bool send_now(gs_comm *comm, const void *buf, size_t count, gs_dtype dtype, int peer, int tag)
{
    gs_p2p *p = comm->p2p;
    size_t bytes = count * gs_dtype_size(dtype);
    bool sent = false;
    if (bytes > GS_P2P_EAGER_MAX || peer == comm->rank)
        return false;
    gs_engine_lock(comm);
    if (comm->failed == GS_OK && !p->sendq.head) {
        uint64_t msg = ++p->tx_msgs[peer];
        if (mail_send(comm, peer, msg, tag, dtype, buf, bytes)) {
            sent = true;
        } else if (!p->ctl) {
            gs_p2p_env env = {.version = GS_P2P_PROTO_VERSION,
                              .type = GS_P2P_EAGER,
                              .dtype = (uint8_t)dtype,
                              .tag = tag,
                              .sender = (uint32_t)comm->rank,
                              .msg = msg,
                              .bytes = bytes};
            sent = post_env(comm, peer, &env, buf, bytes) == GS_OK;
        }
        if (!sent)
            p->tx_msgs[peer]--;
    }
    gs_engine_unlock(comm);
    return sent;
}

gs_status gs_send(gs_comm *comm, const void *buf, size_t count, gs_dtype dtype, int peer, int tag)
{
    gs_status st = check_args(comm, "gs_send", buf, count, dtype, peer, tag, false);
    if (st != GS_OK)
        return st;
    if (send_now(comm, buf, count, dtype, peer, tag) && comm->failed == GS_OK)
        return GS_OK; /* sent; if waking the peer failed the communicator, the queued path says why */
    gs_coll_req *req = &comm->p2p->sync;
    init_op(req, comm, GS_P2P_SEND, count, dtype, peer, tag, 0);
    start_send(comm, req, buf);
    if (req->status == GS_OK)
        return GS_OK; /* eager: the message is out */
    return gs_p2p_wait(req);
}

/* The common blocking receive of a small message (a buffer of at most
 * GS_MAIL_MAX bytes), from one peer that shares the boxes with nothing
 * queued or posted here: spins on that peer's mailbox (the
 * transport polled every GS_P2P_QUICK_POLL turns). GS_OK: received;
 * GS_ERR_AGAIN: the general path takes over (anything else came first, the
 * message does not fit as it is, or it did not come soon). */
static gs_status recv_now(gs_comm *comm, void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                          gs_p2p_status *status)
{
    gs_p2p *p = comm->p2p;
    gs_status st = GS_ERR_AGAIN;
    size_t es = gs_dtype_size(dtype);
    if (!comm->box || comm->oversubscribed || comm->cfg->poll == GS_POLL_EVENT || peer == GS_ANY_SOURCE ||
        peer == comm->rank ||
        count * es > GS_MAIL_MAX) /* a larger buffer's message may well come by the transport */
        return GS_ERR_AGAIN;
    gs_engine_lock(comm);
    for (unsigned turn = 1; turn <= GS_P2P_QUICK_TURNS; turn++) {
        gs_mail_msg mm;
        if (comm->failed != GS_OK || p->unexp || p->posted.head)
            break;
        if (gs_mail_peek(comm, &p->mail, peer, &mm)) {
            if (mm.msg != p->rx_msgs[peer] + 1 || mm.tag != tag || mm.dtype != (uint8_t)dtype ||
                mm.bytes > GS_MAIL_MAX || mm.bytes > count * es)
                break;
            memcpy(buf, mm.data, mm.bytes);
            gs_mail_take(comm, &p->mail, peer);
            p->rx_msgs[peer] = mm.msg;
            if (status)
                *status = (gs_p2p_status){.source = peer, .tag = tag, .count = mm.bytes / es};
            st = GS_OK;
            break;
        }
        if (turn % GS_P2P_QUICK_POLL == 0)
            gs_engine_progress(comm); /* a frame for this receive waits as unexpected: the next turn leaves */
        gs_cpu_relax();
    }
    gs_engine_unlock(comm);
    return st;
}

gs_status gs_recv(gs_comm *comm, void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                  gs_p2p_status *status)
{
    gs_status st = check_args(comm, "gs_recv", buf, count, dtype, peer, tag, true);
    if (st != GS_OK)
        return st;
    if (recv_now(comm, buf, count, dtype, peer, tag, status) == GS_OK)
        return GS_OK;
    gs_coll_req *req = &comm->p2p->sync;
    init_op(req, comm, GS_P2P_RECV, count, dtype, peer, tag, 0);
    start_recv(comm, req, buf, status);
    return gs_p2p_wait(req);
}

gs_status gs_isend(gs_comm *comm, const void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                   gs_req **req_p)
{
    gs_status st = check_args(comm, "gs_isend", buf, count, dtype, peer, tag, false);
    if (st == GS_OK && !req_p)
        st = gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: gs_isend: req_p is NULL", comm->rank);
    if (st != GS_OK)
        return st;
    gs_coll_req *req = gs_coll_req_get(comm);
    if (!req)
        return GS_ERR_NOMEM;
    init_op(req, comm, GS_P2P_SEND, count, dtype, peer, tag, gs_now_ns());
    start_send(comm, req, buf);
    *req_p = &req->base;
    return GS_OK;
}

gs_status gs_irecv(gs_comm *comm, void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                   gs_p2p_status *status, gs_req **req_p)
{
    gs_status st = check_args(comm, "gs_irecv", buf, count, dtype, peer, tag, true);
    if (st == GS_OK && !req_p)
        st = gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "rank %d: gs_irecv: req_p is NULL", comm->rank);
    if (st != GS_OK)
        return st;
    gs_coll_req *req = gs_coll_req_get(comm);
    if (!req)
        return GS_ERR_NOMEM;
    init_op(req, comm, GS_P2P_RECV, count, dtype, peer, tag, gs_now_ns());
    start_recv(comm, req, buf, status);
    *req_p = &req->base;
    return GS_OK;
}

/* ---- setup and teardown --------------------------------------------------------- */

gs_status gs_p2p_open(gs_comm *comm)
{
    gs_p2p *p = gs_calloc(1, sizeof(*p));
    size_t in_len = (size_t)comm->size * GS_P2P_RECVS * GS_P2P_FRAME_MAX;
    gs_status st;
    if (!p)
        return GS_ERR_NOMEM;
    comm->p2p = p;
    p->sync.comm = comm;
    p->gen = (uint8_t)comm->id;
    unsigned caps = comm->tp->ops->caps ? comm->tp->ops->caps(comm->tp) : 0u;
    p->user_mem = caps & GS_TP_CAP_USER_MEM;
    p->send_copy = caps & GS_TP_CAP_SEND_COPY;
    p->tx_msgs = gs_calloc((size_t)comm->size, sizeof(uint64_t));
    p->rx_msgs = gs_calloc((size_t)comm->size, sizeof(uint64_t));
    if (!p->tx_msgs || !p->rx_msgs || gs_mail_open(&p->mail, comm->size) != GS_OK)
        return GS_ERR_NOMEM;
    st = gs_mr_alloc(comm->tp, in_len, GS_ACCESS_LOCAL_WRITE, &p->in);
    if (st == GS_OK)
        st = gs_mr_alloc(comm->tp, (size_t)GS_P2P_OUT_SLOTS * GS_P2P_FRAME_MAX, GS_ACCESS_LOCAL_WRITE,
                         &p->out);
    for (int peer = 0; peer < comm->size && st == GS_OK; peer++)
        for (int i = 0; i < GS_P2P_RECVS && st == GS_OK && peer != comm->rank; i++)
            st = repost(comm, peer, i);
    return st;
}

void gs_p2p_force_fragments(gs_comm *comm)
{
    comm->p2p->user_mem = false;
}

void gs_p2p_close(gs_comm *comm)
{
    gs_p2p *p = comm->p2p;
    if (!p)
        return;
    while (p->unexp)
        unexp_remove(p, p->unexp);
    while (p->ctl) {
        gs_p2p_ctl *c = p->ctl;
        p->ctl = c->next;
        free(c);
    }
    gs_p2p_list *lists[] = {&p->sendq, &p->posted, &p->active};
    /* requests still in flight are abandoned, as the collectives' */
    for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++)
        for (gs_coll_req *r = lists[l]->head, *next; r; r = next) {
            next = r->p2p.next;
            if (r->p2p.mr && gs_mr_dereg(r->p2p.mr) != GS_OK)
                gs_log_warn(COLL, "rank %d: deregistering a p2p buffer failed: %s", comm->rank,
                            gs_last_error());
            if (r->pooled) {
                gs_pages_free(r->fused, r->fused_cap);
                free(r);
            }
        }
    /* receives stay posted until the transport closes: a caller's transport
     * keeps their buffers (it frees what is still registered) */
    if (comm->own_tp) {
        if (p->in && gs_mr_dereg(p->in) != GS_OK)
            gs_log_warn(COLL, "rank %d: deregistering the p2p receive buffers failed: %s", comm->rank,
                        gs_last_error());
        if (p->out && gs_mr_dereg(p->out) != GS_OK)
            gs_log_warn(COLL, "rank %d: deregistering the p2p send slots failed: %s", comm->rank,
                        gs_last_error());
    }
    free(p->tx_msgs);
    free(p->rx_msgs);
    gs_mail_close(&p->mail);
    free(p);
    comm->p2p = NULL;
}
