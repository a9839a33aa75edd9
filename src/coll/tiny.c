/*
 * The tiny path: a blocking allreduce of at most 8 bytes, or a barrier,
 * between 2 ranks over the shared-memory boxes with nothing else in flight.
 *
 * It makes exactly the post the direct algorithm makes (box.c: the call's
 * header, the payload in the post word's cache line, then the post number
 * with one release store) and waits for the peer's post of the same number,
 * so a peer on the engine's path meets it as any other post. What it leaves
 * out is the engine's bookkeeping: no request, no schedule, no clock. The
 * hit path is
 *
 *   1. header and payload into my slot's line, the post number last;
 *   2. spin on the peer's post word (GS_TINY_SPIN turns at most);
 *   3. the peer announced no failure, and its header is mine but for the
 *      sender (one compare of the line);
 *   4. out = x0 op x1 in rank order through the direct algorithm's
 *      kernels (my operand read from my buffer: reading my own line again
 *      would wait for the peer's read of it to finish).
 *
 * Anything else (a late peer, a different header, an announced failure)
 * returns GS_INPROGRESS with the post made and counted: the caller prepares
 * the call as usual and gs_engine_resume runs its receive step in the
 * engine, which reports the mismatch naming both calls, the deadline or the
 * lost peer as on any other path.
 */
#include "coll/box.h"

/* Turns of the spin on the peer's post before the engine takes over (each
 * a read of a line the peer is about to write: a few microseconds). */
#define GS_TINY_SPIN 4096

_Static_assert(GS_TINY_MAX_BYTES == GS_BOX_LINE_BYTES, "the tiny payload shares the post word's line");

bool gs_tiny_allowed(const gs_comm *comm)
{
    return comm->box && comm->size == 2 && !comm->threaded;
}

/* The payload bytes of t when it is a valid call the tiny path carries,
 * else -1 (too large, or an argument the usual checks report). */
static int tiny_bytes(const gs_tiny_call *t)
{
    size_t es;
    if (t->kind == GS_COLL_BARRIER)
        return 0;
    if (t->kind != GS_COLL_ALLREDUCE || (unsigned)t->redop >= GS_REDOP_COUNT || t->count > GS_TINY_MAX_BYTES)
        return -1;
    es = gs_dtype_size(t->dtype); /* 0: unknown */
    if (!es || t->count * es > GS_TINY_MAX_BYTES)
        return -1;
    if (t->count && (!t->send || !t->recv)) /* NULL buffers */
        return -1;
    uintptr_t s = (uintptr_t)t->send, r = (uintptr_t)t->recv, bytes = t->count * es;
    if (s != r && s < r + bytes && r < s + bytes) /* overlap, not in place */
        return -1;
    return (int)bytes;
}

/* Whether two headers are equal (compared as words: no padding in them). */
static bool tiny_same(const gs_coll_hdr *a, const gs_coll_hdr *b)
{
    uint64_t x[6], y[6], d = 0;
    memcpy(x, a, sizeof(x));
    memcpy(y, b, sizeof(y));
    for (int i = 0; i < 6; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

/* The header the direct algorithm's post carries (desc.c's gs_desc_fill). */
static gs_coll_hdr tiny_hdr(const gs_comm *comm, const gs_tiny_call *t, uint64_t seq, size_t bytes)
{
    bool barrier = t->kind == GS_COLL_BARRIER;
    return (gs_coll_hdr){
        .version = GS_COLL_PROTO_VERSION,
        .kind = (uint8_t)t->kind,
        .dtype = (uint8_t)(barrier ? GS_F32 : t->dtype),
        .op = (uint8_t)(barrier ? GS_SUM : t->redop),
        .algo = GS_COLL_ALGO_DIRECT,
        .root = -1,
        .sender = (uint32_t)comm->rank,
        .seq = seq,
        .count = barrier ? 0 : t->count,
        .unit = 0,
        .bytes = (uint32_t)bytes,
    };
}

/* bytes (0, 2, 4, 6 or 8) from src into the line. */
static void tiny_copy(uint8_t *dst, const uint8_t *src, size_t bytes)
{
    if (bytes == 8) {
        memcpy(dst, src, 8);
        return;
    }
    if (bytes & 4)
        memcpy(dst, src, 4);
    if (bytes & 2)
        memcpy(dst + (bytes & 4), src + (bytes & 4), 2);
}

/* out = x0 op x1 (avg: then halved) through the kernels the direct
 * algorithm uses: the same bits, NaN payloads included. */
static void tiny_reduce(const gs_tiny_call *t, const uint8_t *x0, const uint8_t *x1, size_t bytes)
{
    uint8_t acc[GS_TINY_MAX_BYTES];
    gs_red_apply(t->dtype, t->redop, acc, x0, x1, t->count);
    if (t->redop == GS_AVG)
        gs_red_avg_finish(t->dtype, acc, t->count, 2);
    tiny_copy(t->recv, acc, bytes);
}

gs_status gs_tiny_run(gs_comm *comm, const gs_tiny_call *t)
{
    gs_box *box = comm->box;
    int me = comm->rank, peer = 1 - me;
    uint64_t post = box->posts + 1, seq = comm->seq_issued + 1;
    int bytes = tiny_bytes(t);
    if (bytes < 0)
        return GS_ERR_AGAIN;
    gs_box_head *mine = gs_box_slot(box, me, post), *theirs = gs_box_slot(box, peer, post);
    gs_coll_hdr hdr = tiny_hdr(comm, t, seq, (size_t)bytes);
    /* 1. post, counted as the engine counts posts and calls */
    tiny_copy(gs_box_payload(mine), t->send, (size_t)bytes);
    mine->hdr = hdr;
    __atomic_store_n(&mine->post, post, __ATOMIC_RELEASE);
    box->posts = post;
    comm->seq_issued = seq;
    comm->progress_count++;
    if (__atomic_load_n(&gs_box_wake_of(box->seg[peer])->waiting, __ATOMIC_RELAXED))
        gs_box_ring(comm);
    /* 2. the peer's post */
    for (unsigned i = 0; __atomic_load_n(&theirs->post, __ATOMIC_ACQUIRE) != post; i++)
        if (i == GS_TINY_SPIN || comm->oversubscribed)
            return GS_INPROGRESS;
    /* 3. no failure announced, the same call */
    hdr.sender = (uint32_t)peer;
    if (__atomic_load_n(&gs_box_abort_of(box->seg[peer])->seq, __ATOMIC_ACQUIRE) ||
        !tiny_same(&theirs->hdr, &hdr))
        return GS_INPROGRESS;
    /* 4. the result, in rank order */
    if (bytes) {
        const uint8_t *x[2];
        x[me] = t->send;
        x[peer] = gs_box_payload(theirs);
        tiny_reduce(t, x[0], x[1], (size_t)bytes);
    }
    comm->seq_done = seq;
    comm->progress_count++;
    comm->tiny_done++;
    return GS_OK;
}
