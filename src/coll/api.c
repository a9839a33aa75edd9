/*
 * The public collective calls: argument checks, the call's descriptor and
 * algorithm, requests (a small pool, grown only when more are in flight
 * than ever before), and the fused allreduce.
 */
#include "coll/coll.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One call's arguments. */
typedef struct gs_call {
    const char *fn;
    gs_coll_kind kind;
    const void *send;
    void *recv;
    size_t count;
    gs_dtype dtype;
    gs_redop redop;
    int root;
    const gs_tensor *tensors;
    size_t ntensors;
    const size_t *scounts, *sdispls, *rcounts, *rdispls; /* the v-variants */
} gs_call;

static bool is_reduction(gs_coll_kind kind)
{
    return kind == GS_COLL_ALLREDUCE || kind == GS_COLL_REDUCE_SCATTER || kind == GS_COLL_ALLREDUCE_MULTI ||
           kind == GS_COLL_REDUCE || kind == GS_COLL_REDUCE_SCATTER_V;
}

static bool is_rooted(gs_coll_kind kind)
{
    return kind == GS_COLL_BROADCAST || kind == GS_COLL_REDUCE || kind == GS_COLL_GATHER ||
           kind == GS_COLL_SCATTER;
}

/* Whether [a, a+alen) and [b, b+blen) overlap. */
static bool overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* A buffer of one block (bytes) that overlaps one of n blocks (whole) must
 * be its block at rank: the call in place. */
static gs_status check_block(const gs_call *c, const void *whole, const char *whole_name, const void *block,
                             const char *block_name, size_t n, size_t bytes, int rank)
{
    if ((const uint8_t *)block != (const uint8_t *)whole + (size_t)rank * bytes &&
        overlap(whole, n * bytes, block, bytes))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID,
                       "%s: the %s buffer overlaps the %s buffer but is not its block %d (in place)", c->fn,
                       block_name, whole_name, rank);
    return GS_OK;
}

static gs_status check_buffers(const gs_comm *comm, const gs_call *c, size_t es)
{
    size_t n = (size_t)comm->size, bytes = c->count * es;
    bool need_send = c->kind != GS_COLL_BROADCAST || c->root == comm->rank;
    if (c->count && ((need_send && !c->send) || !c->recv))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: NULL buffer with count %zu", c->fn, c->count);
    switch (c->kind) {
    case GS_COLL_ALLREDUCE:
        if (c->send != c->recv && overlap(c->send, bytes, c->recv, bytes))
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID,
                           "%s: send and receive buffers overlap without being the same (in place)", c->fn);
        break;
    case GS_COLL_REDUCE_SCATTER:
        return check_block(c, c->send, "send", c->recv, "receive", n, bytes, comm->rank);
    case GS_COLL_ALLGATHER: return check_block(c, c->recv, "receive", c->send, "send", n, bytes, comm->rank);
    case GS_COLL_BROADCAST:
        if (need_send && c->send != c->recv && overlap(c->send, bytes, c->recv, bytes))
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID,
                           "%s: send and receive buffers overlap without being the same", c->fn);
        break;
    default: break;
    }
    return GS_OK;
}

/* ---- the newer collectives' buffers ------------------------------------------ */

/* The elements of the send and receive buffers the call touches on this
 * rank, and where the receive buffer must start relative to the send
 * buffer (in elements, *in_place_p; SIZE_MAX: no in-place form) for the
 * call to be in place. */
typedef struct span {
    size_t send, recv;
    bool recv_at_send; /* in place: recv == send + at (else send == recv + at) */
    size_t at;
} span;

static size_t end_of(const size_t *counts, const size_t *displs, int n)
{
    size_t end = 0;
    for (int q = 0; q < n; q++)
        if (counts[q] && displs[q] + counts[q] > end)
            end = displs[q] + counts[q];
    return end;
}

static size_t prefix_sum(const size_t *counts, int q)
{
    size_t sum = 0;
    for (int i = 0; i < q; i++)
        sum += counts[i];
    return sum;
}

static span span_of(const gs_comm *comm, const gs_call *c)
{
    int n = comm->size, r = comm->rank;
    bool root = r == c->root;
    size_t k = c->count, all = k * (size_t)n;
    switch (c->kind) {
    case GS_COLL_REDUCE: return (span){.send = k, .recv = root ? k : 0, .at = 0};
    case GS_COLL_GATHER: return (span){.send = k, .recv = root ? all : 0, .at = (size_t)r * k};
    case GS_COLL_SCATTER:
        return (span){.send = root ? all : 0, .recv = k, .recv_at_send = true, .at = (size_t)r * k};
    case GS_COLL_ALLTOALL: return (span){.send = all, .recv = all, .at = 0};
    case GS_COLL_ALLTOALLV:
        return (span){.send = end_of(c->scounts, c->sdispls, n),
                      .recv = end_of(c->rcounts, c->rdispls, n),
                      .at = SIZE_MAX};
    case GS_COLL_ALLGATHERV:
        return (span){.send = c->rcounts[r], .recv = end_of(c->rcounts, c->rdispls, n), .at = c->rdispls[r]};
    default: /* reduce_scatter_v */
        return (span){
            .send = c->count, .recv = c->rcounts[r], .recv_at_send = true, .at = prefix_sum(c->rcounts, r)};
    }
}

/* The count arrays: present, and their sums and ends within size_t. */
static gs_status check_vectors(const gs_comm *comm, gs_call *c, size_t es)
{
    bool all4 = c->kind == GS_COLL_ALLTOALLV, displs = all4 || c->kind == GS_COLL_ALLGATHERV;
    size_t limit = SIZE_MAX / es, total = 0;
    if (!c->rcounts || (displs && !c->rdispls) || (all4 && (!c->scounts || !c->sdispls)))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: a count or displacement array is NULL", c->fn);
    for (int q = 0; q < comm->size; q++) {
        bool bad = c->rcounts[q] > limit - total || (displs && c->rdispls[q] > limit - c->rcounts[q]) ||
                   (all4 && (c->scounts[q] > limit || c->sdispls[q] > limit - c->scounts[q]));
        if (bad)
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: the counts for rank %d are too large", c->fn,
                           q);
        total += c->rcounts[q];
    }
    if (c->kind != GS_COLL_ALLTOALLV)
        c->count = total; /* the descriptor's count: every rank's sum */
    return GS_OK;
}

static gs_status check_blocks(const gs_comm *comm, const gs_call *c, size_t es)
{
    span sp = span_of(comm, c);
    const uint8_t *s = c->send, *r = c->recv;
    if ((sp.send && !s) || (sp.recv && !r))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: NULL %s buffer with %zu elements to %s", c->fn,
                       sp.send && !s ? "send" : "receive", sp.send && !s ? sp.send : sp.recv,
                       sp.send && !s ? "send" : "receive");
    bool in_place = sp.at != SIZE_MAX && (sp.recv_at_send ? r == s + sp.at * es : s == r + sp.at * es);
    if (!in_place && overlap(s, sp.send * es, r, sp.recv * es))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID,
                       sp.at == SIZE_MAX ? "%s: send and receive buffers overlap (there is no in-place form)"
                                         : "%s: send and receive buffers overlap without being in place (see "
                                           "gradsync.h)",
                       c->fn);
    return GS_OK;
}

static gs_status check_call(const gs_comm *comm, gs_call *c)
{
    if (!comm)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: the communicator is NULL", c->fn);
    if (c->kind == GS_COLL_BARRIER)
        return GS_OK;
    if ((unsigned)c->dtype >= GS_DTYPE_COUNT)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: unknown data type %d", c->fn, (int)c->dtype);
    if (is_reduction(c->kind) && !gs_red_valid(c->dtype, c->redop))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: %s %s: %s", c->fn, gs_redop_name(c->redop),
                       gs_dtype_name(c->dtype), gs_red_invalid_why(c->dtype, c->redop));
    if (is_rooted(c->kind) && (c->root < 0 || c->root >= comm->size))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: root %d is not a rank (0..%d)", c->fn, c->root,
                       comm->size - 1);
    size_t es = gs_dtype_size(c->dtype), total;
    bool vector =
        c->kind == GS_COLL_ALLTOALLV || c->kind == GS_COLL_ALLGATHERV || c->kind == GS_COLL_REDUCE_SCATTER_V;
    gs_status st = vector ? check_vectors(comm, c, es) : GS_OK;
    if (st != GS_OK)
        return st;
    if (!vector && __builtin_mul_overflow(c->count, es * (size_t)comm->size, &total))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: count %zu is too large", c->fn, c->count);
    return gs_block_kind(c->kind) ? check_blocks(comm, c, es) : check_buffers(comm, c, es);
}

/* ---- fusion ---------------------------------------------------------------- */

/* FNV-1a of the tensor counts: ranks with different lists disagree. */
static int32_t list_hash(const gs_tensor *t, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            h = (h ^ (uint8_t)(t[i].count >> (8 * b))) * 16777619u;
    return (int32_t)(h & 0x7fffffff);
}

static gs_status check_tensors(const gs_comm *comm, gs_call *c)
{
    size_t total = 0, es;
    if (!comm || (c->ntensors && !c->tensors))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: NULL communicator or tensor list", c->fn);
    if ((unsigned)c->dtype >= GS_DTYPE_COUNT || (unsigned)c->redop >= GS_REDOP_COUNT)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: unknown data type %d or operator %d", c->fn,
                       (int)c->dtype, (int)c->redop);
    if (!gs_red_valid(c->dtype, c->redop))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: %s %s: %s", c->fn, gs_redop_name(c->redop),
                       gs_dtype_name(c->dtype), gs_red_invalid_why(c->dtype, c->redop));
    es = gs_dtype_size(c->dtype);
    for (size_t i = 0; i < c->ntensors; i++) {
        const gs_tensor *t = &c->tensors[i];
        if (t->count && (!t->sendbuf || !t->recvbuf))
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: tensor %zu has a NULL buffer", c->fn, i);
        if (t->count > SIZE_MAX / es / (size_t)comm->size - total)
            return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: the tensors are too large together", c->fn);
        total += t->count;
    }
    c->count = total;
    c->root = list_hash(c->tensors, c->ntensors);
    return GS_OK;
}

/* Copies the tensors into the request's fused buffer (grown when needed). */
static gs_status pack(gs_coll_req *req, const gs_call *c, size_t es)
{
    size_t need = c->count * es;
    if (need > req->fused_cap) {
        void *buf;
        gs_status st = gs_pages_alloc(need, &buf);
        if (st != GS_OK)
            return st;
        gs_pages_free(req->fused, req->fused_cap);
        req->fused = buf;
        req->fused_cap = need;
    }
    uint8_t *dst = req->fused;
    for (size_t i = 0; i < c->ntensors; i++) {
        size_t bytes = c->tensors[i].count * es;
        if (bytes)
            memcpy(dst, c->tensors[i].sendbuf, bytes);
        dst += bytes;
    }
    return GS_OK;
}

/* ---- starting calls -------------------------------------------------------- */

/* FNV-1a of a count array: ranks with different arrays disagree. */
static int32_t counts_hash(const size_t *counts, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            h = (h ^ (uint8_t)((uint64_t)counts[i] >> (8 * b))) * 16777619u;
    return (int32_t)(h & 0x7fffffff);
}

static size_t call_bytes(const gs_comm *comm, const gs_call *c, size_t es)
{
    size_t bytes = c->count * es;
    if (gs_block_kind(c->kind)) {
        span sp = span_of(comm, c);
        return (sp.send > sp.recv ? sp.send : sp.recv) * es;
    }
    if (c->kind == GS_COLL_REDUCE_SCATTER || c->kind == GS_COLL_ALLGATHER)
        bytes *= (size_t)comm->size;
    return c->kind == GS_COLL_BARRIER ? 0 : bytes;
}

/* Fills req's op for call c (descriptor, algorithm, its schedule). */
static gs_status prepare(gs_comm *comm, gs_coll_req *req, const gs_call *c)
{
    gs_coll_op *op = &req->op;
    size_t es = c->kind == GS_COLL_BARRIER ? 1 : gs_dtype_size(c->dtype);
    memset(op, 0, sizeof(*op));
    op->comm = comm;
    op->kind = c->kind;
    op->dtype = c->kind == GS_COLL_BARRIER ? GS_F32 : c->dtype;
    op->redop = is_reduction(c->kind) ? c->redop : GS_SUM;
    op->root = is_rooted(c->kind) || c->kind == GS_COLL_ALLREDUCE_MULTI ? c->root : -1;
    if (c->kind == GS_COLL_ALLGATHERV || c->kind == GS_COLL_REDUCE_SCATTER_V)
        op->root = counts_hash(c->rcounts, comm->size);
    op->count = c->kind == GS_COLL_BARRIER || c->kind == GS_COLL_ALLTOALLV ? 0 : c->count;
    op->scounts = c->scounts;
    op->sdispls = c->sdispls;
    op->rcounts = c->rcounts;
    op->rdispls = c->rdispls;
    op->es = es;
    op->send = c->send;
    op->recv = c->recv;
    op->last_out_slot = -1;
    if (c->kind == GS_COLL_ALLREDUCE_MULTI) {
        gs_status st = pack(req, c, es);
        if (st != GS_OK)
            return st;
        op->send = op->recv = req->fused;
        op->tensors = c->tensors;
        op->ntensors = c->ntensors;
    }
    /* a result larger than the caches is streamed to memory */
    size_t out_bytes = c->kind == GS_COLL_ALLGATHER ? call_bytes(comm, c, es)
                       : gs_block_kind(c->kind)     ? span_of(comm, c).recv * es
                                                    : op->count * es;
    op->nt = out_bytes >= comm->nt_bytes;
    op->algo = gs_coll_select(comm, c->kind, call_bytes(comm, c, es));
    op->zc_bytes = call_bytes(comm, c, es); /* the send mode is chosen when the call starts */
    op->zc_class = -1;
    op->algo->start(op);
    return GS_OK;
}

static gs_status start(gs_comm *comm, gs_coll_req *req, const gs_call *c)
{
    gs_status st = prepare(comm, req, c);
    return st == GS_OK ? gs_engine_submit(comm, req) : st;
}

static const gs_req_class coll_req_class;

static gs_coll_req *req_get(gs_comm *comm)
{
    gs_coll_req *req = comm->free_reqs;
    if (req) {
        comm->free_reqs = req->next;
        req->next = NULL;
    } else if ((req = gs_calloc(1, sizeof(*req)))) {
        req->pooled = true;
        req->comm = comm;
        req->all_next = comm->all_reqs;
        comm->all_reqs = req;
    }
    if (req)
        req->base.cls = &coll_req_class;
    return req;
}

gs_coll_req *gs_coll_req_get(gs_comm *comm)
{
    return req_get(comm);
}

static void req_put(gs_comm *comm, gs_coll_req *req)
{
    req->p2p.kind = GS_P2P_NONE;
    req->next = comm->free_reqs;
    comm->free_reqs = req;
}

/* GS_TRACE: the event of a call the tiny path finished. */
static void tiny_traced(const gs_comm *comm, const gs_call *c, uint64_t start_ns, gs_status st)
{
    gs_coll_trace_event(comm, gs_coll_kind_name(c->kind), "tiny", comm->seq_issued, c->count,
                        c->count * gs_dtype_size(c->dtype), c->dtype, c->redop, c->root, start_ns, 0, st);
}

/* The engine finishes a call the tiny path posted but could not finish
 * (begun at t0_ns for GS_TRACE, 0: not traced). */
static gs_status tiny_resume(gs_comm *comm, gs_call *c, uint64_t t0_ns)
{
    gs_status st = prepare(comm, &comm->sync_req, c);
    comm->tiny_resumed++;
    if (st != GS_OK)
        return st;
    comm->trace_t0 = t0_ns; /* its event starts there, not at the resume */
    return gs_engine_resume(comm, &comm->sync_req);
}

static gs_status run_nonblocking(gs_comm *comm, gs_call *c, gs_req **req_p);
static gs_status run_blocking(gs_comm *comm, gs_call *c);

/* What became of call c on the tiny path (st; begun at t0_ns for GS_TRACE):
 * done, posted for the engine to finish, or not taken (GS_ERR_AGAIN: the
 * usual path runs it). */
static gs_status tiny_then(gs_comm *comm, gs_call *c, uint64_t t0_ns, gs_status st)
{
    if (st == GS_INPROGRESS)
        return tiny_resume(comm, c, t0_ns);
    if (st == GS_ERR_AGAIN)
        return run_blocking(comm, c);
    if (t0_ns)
        tiny_traced(comm, c, t0_ns, st);
    return st;
}

static gs_status run_blocking(gs_comm *comm, gs_call *c)
{
    gs_status st = c->kind == GS_COLL_ALLREDUCE_MULTI ? check_tensors(comm, c) : check_call(comm, c);
    if (st == GS_OK && c->kind != GS_COLL_ALLREDUCE_MULTI && gs_engine_quick_fits(comm)) {
        st = prepare(comm, &comm->sync_req, c);
        return st == GS_OK ? gs_engine_quick(comm, &comm->sync_req) : st;
    }
    if (st == GS_OK)
        st = start(comm, &comm->sync_req, c);
    if (st == GS_OK)
        st = gs_engine_wait(comm, &comm->sync_req);
    return st;
}

static gs_status run_nonblocking(gs_comm *comm, gs_call *c, gs_req **req_p)
{
    gs_coll_req *req;
    gs_status st = c->kind == GS_COLL_ALLREDUCE_MULTI ? check_tensors(comm, c) : check_call(comm, c);
    if (st == GS_OK && !req_p)
        st = gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "%s: req_p is NULL", c->fn);
    if (st != GS_OK)
        return st;
    req = req_get(comm);
    if (!req)
        return GS_ERR_NOMEM;
    st = start(comm, req, c);
    if (st != GS_OK) {
        req_put(comm, req);
        return st;
    }
    *req_p = &req->base;
    return GS_OK;
}

/* ---- the calls --------------------------------------------------------------- */

#define ALLREDUCE_CALL(name)                                                                                 \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_ALLREDUCE, .send = sendbuf, .recv = recvbuf, .count = count,             \
        .dtype = dtype, .redop = op, .root = -1                                                              \
    }

gs_status gs_allreduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                       gs_redop op)
{
    gs_call c = ALLREDUCE_CALL("gs_allreduce");
    if (!comm || !gs_tiny_ready(comm)) /* the tiny path: 2 ranks over the boxes, <= 256 bytes */
        return run_blocking(comm, &c);
    uint64_t t0 = gs_trace_enabled() ? gs_now_ns() : 0;
    return tiny_then(comm, &c, t0, gs_tiny_allreduce(comm, sendbuf, recvbuf, count, dtype, op));
}

gs_status gs_iallreduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                        gs_redop op, gs_req **req_p)
{
    gs_call c = ALLREDUCE_CALL("gs_iallreduce");
    return run_nonblocking(comm, &c, req_p);
}

#define REDUCE_SCATTER_CALL(name)                                                                            \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_REDUCE_SCATTER, .send = sendbuf, .recv = recvbuf, .count = recvcount,    \
        .dtype = dtype, .redop = op, .root = -1                                                              \
    }

gs_status gs_reduce_scatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                            gs_dtype dtype, gs_redop op)
{
    gs_call c = REDUCE_SCATTER_CALL("gs_reduce_scatter");
    return run_blocking(comm, &c);
}

gs_status gs_ireduce_scatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                             gs_dtype dtype, gs_redop op, gs_req **req_p)
{
    gs_call c = REDUCE_SCATTER_CALL("gs_ireduce_scatter");
    return run_nonblocking(comm, &c, req_p);
}

/* allgather and alltoall take the same arguments (count elements to and
 * from every rank); blocking, or into *req_p. */
static gs_status run_allgather_alltoall(const char *fn, gs_coll_kind kind, gs_comm *comm, const void *sendbuf,
                                        void *recvbuf, size_t count, gs_dtype dtype, bool blocking,
                                        gs_req **req_p)
{
    gs_call c = {
        .fn = fn, .kind = kind, .send = sendbuf, .recv = recvbuf, .count = count, .dtype = dtype, .root = -1};
    return blocking ? run_blocking(comm, &c) : run_nonblocking(comm, &c, req_p);
}

gs_status gs_allgather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount, gs_dtype dtype)
{
    return run_allgather_alltoall("gs_allgather", GS_COLL_ALLGATHER, comm, sendbuf, recvbuf, sendcount, dtype,
                                  true, NULL);
}

gs_status gs_iallgather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount, gs_dtype dtype,
                        gs_req **req_p)
{
    return run_allgather_alltoall("gs_iallgather", GS_COLL_ALLGATHER, comm, sendbuf, recvbuf, sendcount,
                                  dtype, false, req_p);
}

#define BROADCAST_CALL(name)                                                                                 \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_BROADCAST, .send = sendbuf, .recv = recvbuf, .count = count,             \
        .dtype = dtype, .root = root                                                                         \
    }

gs_status gs_broadcast(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                       int root)
{
    gs_call c = BROADCAST_CALL("gs_broadcast");
    return run_blocking(comm, &c);
}

gs_status gs_ibroadcast(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                        int root, gs_req **req_p)
{
    gs_call c = BROADCAST_CALL("gs_ibroadcast");
    return run_nonblocking(comm, &c, req_p);
}

gs_status gs_barrier(gs_comm *comm)
{
    gs_call c = {.fn = "gs_barrier", .kind = GS_COLL_BARRIER, .root = -1};
    if (!comm || !gs_tiny_ready(comm))
        return run_blocking(comm, &c);
    uint64_t t0 = gs_trace_enabled() ? gs_now_ns() : 0;
    return tiny_then(comm, &c, t0, gs_tiny_barrier(comm));
}

gs_status gs_ibarrier(gs_comm *comm, gs_req **req_p)
{
    gs_call c = {.fn = "gs_ibarrier", .kind = GS_COLL_BARRIER, .root = -1};
    return run_nonblocking(comm, &c, req_p);
}

#define ALLREDUCE_MULTI_CALL(name)                                                                           \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_ALLREDUCE_MULTI, .tensors = tensors, .ntensors = n, .dtype = dtype,      \
        .redop = op                                                                                          \
    }

gs_status gs_allreduce_multi(gs_comm *comm, const gs_tensor *tensors, size_t n, gs_dtype dtype, gs_redop op)
{
    gs_call c = ALLREDUCE_MULTI_CALL("gs_allreduce_multi");
    return run_blocking(comm, &c);
}

gs_status gs_iallreduce_multi(gs_comm *comm, const gs_tensor *tensors, size_t n, gs_dtype dtype, gs_redop op,
                              gs_req **req_p)
{
    gs_call c = ALLREDUCE_MULTI_CALL("gs_iallreduce_multi");
    return run_nonblocking(comm, &c, req_p);
}

/* ---- reduce, gather, scatter, alltoall(v), allgatherv, reduce_scatter_v -------- */

#define ROOTED_CALL(name, k, cnt, o)                                                                         \
    {                                                                                                        \
        .fn = name, .kind = k, .send = sendbuf, .recv = recvbuf, .count = cnt, .dtype = dtype, .redop = o,   \
        .root = root                                                                                         \
    }

gs_status gs_reduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                    gs_redop op, int root)
{
    gs_call c = ROOTED_CALL("gs_reduce", GS_COLL_REDUCE, count, op);
    if (!comm || !gs_tiny_ready(comm))
        return run_blocking(comm, &c);
    uint64_t t0 = gs_trace_enabled() ? gs_now_ns() : 0;
    return tiny_then(comm, &c, t0, gs_tiny_reduce(comm, sendbuf, recvbuf, count, dtype, op, root));
}

gs_status gs_ireduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                     gs_redop op, int root, gs_req **req_p)
{
    gs_call c = ROOTED_CALL("gs_ireduce", GS_COLL_REDUCE, count, op);
    return run_nonblocking(comm, &c, req_p);
}

/* gather and scatter take the same arguments (count elements to or from
 * every rank, at root); blocking, or into *req_p. Their wrappers below in
 * the header's order: the blocking calls, then the non-blocking ones. */
static gs_status run_gather_scatter(const char *fn, gs_coll_kind kind, gs_comm *comm, const void *sendbuf,
                                    void *recvbuf, size_t count, gs_dtype dtype, int root, bool blocking,
                                    gs_req **req_p)
{
    gs_call c = ROOTED_CALL(fn, kind, count, GS_SUM);
    return blocking ? run_blocking(comm, &c) : run_nonblocking(comm, &c, req_p);
}

gs_status gs_gather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount, gs_dtype dtype,
                    int root)
{
    return run_gather_scatter("gs_gather", GS_COLL_GATHER, comm, sendbuf, recvbuf, sendcount, dtype, root,
                              true, NULL);
}

gs_status gs_scatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount, gs_dtype dtype,
                     int root)
{
    return run_gather_scatter("gs_scatter", GS_COLL_SCATTER, comm, sendbuf, recvbuf, recvcount, dtype, root,
                              true, NULL);
}

gs_status gs_igather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount, gs_dtype dtype,
                     int root, gs_req **req_p)
{
    return run_gather_scatter("gs_igather", GS_COLL_GATHER, comm, sendbuf, recvbuf, sendcount, dtype, root,
                              false, req_p);
}

gs_status gs_iscatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount, gs_dtype dtype,
                      int root, gs_req **req_p)
{
    return run_gather_scatter("gs_iscatter", GS_COLL_SCATTER, comm, sendbuf, recvbuf, recvcount, dtype, root,
                              false, req_p);
}

gs_status gs_alltoall(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype)
{
    return run_allgather_alltoall("gs_alltoall", GS_COLL_ALLTOALL, comm, sendbuf, recvbuf, count, dtype, true,
                                  NULL);
}

gs_status gs_ialltoall(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                       gs_req **req_p)
{
    return run_allgather_alltoall("gs_ialltoall", GS_COLL_ALLTOALL, comm, sendbuf, recvbuf, count, dtype,
                                  false, req_p);
}

#define ALLTOALLV_CALL(name)                                                                                 \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_ALLTOALLV, .send = sendbuf, .recv = recvbuf, .dtype = dtype, .root = -1, \
        .scounts = sendcounts, .sdispls = sdispls, .rcounts = recvcounts, .rdispls = rdispls                 \
    }

gs_status gs_alltoallv(gs_comm *comm, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                       void *recvbuf, const size_t *recvcounts, const size_t *rdispls, gs_dtype dtype)
{
    gs_call c = ALLTOALLV_CALL("gs_alltoallv");
    return run_blocking(comm, &c);
}

gs_status gs_ialltoallv(gs_comm *comm, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                        void *recvbuf, const size_t *recvcounts, const size_t *rdispls, gs_dtype dtype,
                        gs_req **req_p)
{
    gs_call c = ALLTOALLV_CALL("gs_ialltoallv");
    return run_nonblocking(comm, &c, req_p);
}

#define ALLGATHERV_CALL(name)                                                                                \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_ALLGATHERV, .send = sendbuf, .recv = recvbuf, .dtype = dtype,            \
        .root = -1, .rcounts = recvcounts, .rdispls = displs                                                 \
    }

gs_status gs_allgatherv(gs_comm *comm, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                        const size_t *displs, gs_dtype dtype)
{
    gs_call c = ALLGATHERV_CALL("gs_allgatherv");
    return run_blocking(comm, &c);
}

gs_status gs_iallgatherv(gs_comm *comm, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                         const size_t *displs, gs_dtype dtype, gs_req **req_p)
{
    gs_call c = ALLGATHERV_CALL("gs_iallgatherv");
    return run_nonblocking(comm, &c, req_p);
}

#define REDUCE_SCATTER_V_CALL(name)                                                                          \
    {                                                                                                        \
        .fn = name, .kind = GS_COLL_REDUCE_SCATTER_V, .send = sendbuf, .recv = recvbuf, .dtype = dtype,      \
        .redop = op, .root = -1, .rcounts = recvcounts                                                       \
    }

gs_status gs_reduce_scatter_v(gs_comm *comm, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                              gs_dtype dtype, gs_redop op)
{
    gs_call c = REDUCE_SCATTER_V_CALL("gs_reduce_scatter_v");
    return run_blocking(comm, &c);
}

gs_status gs_ireduce_scatter_v(gs_comm *comm, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                               gs_dtype dtype, gs_redop op, gs_req **req_p)
{
    gs_call c = REDUCE_SCATTER_V_CALL("gs_ireduce_scatter_v");
    return run_nonblocking(comm, &c, req_p);
}

/* ---- requests ---------------------------------------------------------------- */

static gs_status coll_req_test(gs_req *base)
{
    gs_coll_req *req = gs_coll_req_of(base);
    gs_status st = req->p2p.kind != GS_P2P_NONE ? gs_p2p_test(req) : gs_engine_test(req->comm, req);
    if (st != GS_INPROGRESS)
        req_put(req->comm, req);
    return st;
}

static gs_status coll_req_wait(gs_req *base)
{
    gs_coll_req *req = gs_coll_req_of(base);
    gs_status st = req->p2p.kind != GS_P2P_NONE ? gs_p2p_wait(req) : gs_engine_wait(req->comm, req);
    req_put(req->comm, req);
    return st;
}

static const gs_req_class coll_req_class = {
    .layer = "coll",
    .test = coll_req_test,
    .wait = coll_req_wait,
};
