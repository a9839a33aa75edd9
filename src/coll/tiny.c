/*
 * The tiny path: a blocking allreduce of at most GS_TINY_MAX_BYTES (256),
 * or a barrier, between 2 ranks over the shared-memory boxes with nothing
 * else in flight.
 *
 * It makes exactly the post the direct algorithm makes (box.c: the call's
 * header and the payload, whose first 8 bytes share the post word's cache
 * line, then the post number with one release store) and waits for the peer's post of the same number,
 * so a peer on the engine's path meets it as any other post. What it leaves
 * out is the engine's bookkeeping: no request, no schedule, no clock. The
 * hit path is
 *
 *   1. header (six words built in registers) and payload into my slot's
 *      line, the post number last;
 *   2. spin on the peer's post word (GS_TINY_SPIN turns at most);
 *   3. the peer announced no failure, and its header is mine but for the
 *      sender (six word compares);
 *   4. out = x0 op x1 in rank order, my operand read from my buffer
 *      (reading my own line again would wait for the peer's read of it):
 *      sums of at most 8 bytes inline where that gives the kernels' bits,
 *      the rest through the direct algorithm's kernels.
 *
 * Anything else (a late peer, a different header, an announced failure)
 * returns GS_INPROGRESS with the post made and counted: the caller prepares
 * the call as usual and gs_engine_resume runs its receive step in the
 * engine, which reports the mismatch naming both calls, the deadline or the
 * lost peer as on any other path.
 */
#include "coll/box.h"
#include "util/dtype.h"

#include <stddef.h>

/* Turns of the spin on the peer's post before the engine takes over (each
 * a read of a line the peer is about to write: a few microseconds). */
#define GS_TINY_SPIN 4096

_Static_assert(GS_TINY_MAX_BYTES <= GS_COLL_LINE * 8, "tiny payloads: a few lines (the box chunk is >= 4K)");
/* The header as six little-endian words (what gs_desc_fill writes). */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "header words are packed little-endian");
_Static_assert(offsetof(gs_coll_hdr, kind) == 1 && offsetof(gs_coll_hdr, dtype) == 2 &&
                   offsetof(gs_coll_hdr, op) == 3 && offsetof(gs_coll_hdr, algo) == 4 &&
                   offsetof(gs_coll_hdr, root) == 8 && offsetof(gs_coll_hdr, sender) == 12 &&
                   offsetof(gs_coll_hdr, seq) == 16 && offsetof(gs_coll_hdr, count) == 24 &&
                   offsetof(gs_coll_hdr, unit) == 32 && offsetof(gs_coll_hdr, bytes) == 36 &&
                   offsetof(gs_coll_hdr, reserved) == 40 && offsetof(gs_box_head, hdr) == 8,
               "header words");

enum { W_DESC, W_ROOT_SENDER, W_SEQ, W_COUNT, W_UNIT_BYTES, W_RESERVED };

bool gs_tiny_allowed(const gs_comm *comm)
{
    return comm->box && comm->size == 2 && !comm->threaded;
}

static uint64_t load64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static void store64(void *p, uint64_t v)
{
    memcpy(p, &v, sizeof(v));
}

/* Words 0 (version, kind, dtype, op, algo) and 1 (root -1, sender). */
static uint64_t desc_word(gs_coll_kind kind, gs_dtype dtype, gs_redop op)
{
    return (uint64_t)GS_COLL_PROTO_VERSION | (uint64_t)kind << 8 | (uint64_t)dtype << 16 |
           (uint64_t)op << 24 | (uint64_t)GS_COLL_ALGO_DIRECT << 32;
}

static uint64_t root_sender_word(int root, int sender)
{
    return (uint64_t)(uint32_t)root | (uint64_t)(uint32_t)sender << 32;
}

/* bytes (at most GS_TINY_MAX_BYTES) from src to dst. */
static void tiny_copy(uint8_t *dst, const uint8_t *src, size_t bytes)
{
    if (bytes == 8) {
        memcpy(dst, src, 8);
    } else if (bytes > 8) {
        memcpy(dst, src, bytes);
    } else {
        if (bytes & 4)
            memcpy(dst, src, 4);
        if (bytes & 2)
            memcpy(dst + (bytes & 4), src + (bytes & 4), 2);
        if (bytes & 1) /* the byte-like types */
            dst[bytes - 1] = src[bytes - 1];
    }
}

/* Step 1 for a call described by desc, count and bytes: the post, counted
 * as the engine counts posts and calls. */
static inline __attribute__((always_inline)) void tiny_post(gs_comm *comm, uint64_t desc, int root,
                                                            uint64_t count, size_t bytes, const void *send)
{
    gs_box *box = comm->box;
    uint64_t post = box->posts + 1;
    uint8_t *mine = box->pair.mine[post % GS_BOX_SLOTS];
    tiny_copy(mine + GS_BOX_HEAD_BYTES, send, bytes);
    store64(mine + 8 + 8 * W_DESC, desc);
    store64(mine + 8 + 8 * W_ROOT_SENDER, root_sender_word(root, comm->rank));
    store64(mine + 8 + 8 * W_SEQ, comm->seq_issued + 1);
    store64(mine + 8 + 8 * W_COUNT, count);
    store64(mine + 8 + 8 * W_UNIT_BYTES, (uint64_t)bytes << 32); /* unit 0 */
    store64(mine + 8 + 8 * W_RESERVED, 0);
    __atomic_store_n((uint64_t *)mine, post, __ATOMIC_RELEASE);
    box->posts = post;
    comm->seq_issued++;
    comm->progress_count++;
}

/* Steps 2 and 3: the peer's post of the same call, of bytes (its payload),
 * or NULL (the engine finishes the call). */
static inline __attribute__((always_inline)) const uint8_t *tiny_wait(gs_comm *comm, uint64_t desc, int root,
                                                                      uint64_t count, size_t bytes)
{
    const gs_box_pair *pair = &comm->box->pair;
    uint64_t post = comm->box->posts, seq = comm->seq_issued;
    const uint8_t *theirs = pair->theirs[post % GS_BOX_SLOTS], *th = theirs + 8;
    if (__atomic_load_n(pair->peer_waiting, __ATOMIC_RELAXED))
        gs_box_ring(comm);
    for (unsigned i = 0; __atomic_load_n((const uint64_t *)theirs, __ATOMIC_ACQUIRE) != post; i++)
        if (i == GS_TINY_SPIN || comm->oversubscribed)
            return NULL;
    uint64_t diff = (load64(th + 8 * W_DESC) ^ desc) |
                    (load64(th + 8 * W_ROOT_SENDER) ^ root_sender_word(root, comm->rank ^ 1)) |
                    (load64(th + 8 * W_SEQ) ^ seq) | (load64(th + 8 * W_COUNT) ^ count) |
                    (load64(th + 8 * W_UNIT_BYTES) ^ (uint64_t)bytes << 32) | load64(th + 8 * W_RESERVED);
    if (diff || __atomic_load_n(pair->peer_abort, __ATOMIC_ACQUIRE))
        return NULL;
    comm->seq_done = seq;
    comm->progress_count++;
    comm->tiny_done++;
    return theirs + GS_BOX_HEAD_BYTES;
}

static float ldf(const uint8_t *p)
{
    float v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static double ldd(const uint8_t *p)
{
    double v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* out = x0 + x1 (avg: halved) for the common types, computed inline when
 * that gives the kernels' bits for sure: integers always (wrapping sums,
 * C division), floats unless an operand is NaN (which NaN comes out is
 * the compiler's choice of operand order: the kernels decide it). The
 * result is stored after both operands were read (out may be x0 or x1).
 * False, nothing written: use the kernels. */
static bool tiny_sum_inline(gs_dtype dtype, bool avg, uint8_t *out, const uint8_t *x0, const uint8_t *x1,
                            size_t count)
{
    bool two = count == 2; /* else 1: at most 8 bytes of 4 or 8-byte elements */
    switch (dtype) {
    case GS_F32: {
        float a0 = ldf(x0), b0 = ldf(x1), a1 = two ? ldf(x0 + 4) : 0.0f, b1 = two ? ldf(x1 + 4) : 0.0f;
        if (a0 != a0 || b0 != b0 || a1 != a1 || b1 != b1)
            return false;
        float r0 = avg ? (a0 + b0) / 2.0f : a0 + b0, r1 = avg ? (a1 + b1) / 2.0f : a1 + b1;
        memcpy(out, &r0, 4);
        if (two)
            memcpy(out + 4, &r1, 4);
        return true;
    }
    case GS_F64: {
        double a = ldd(x0), b = ldd(x1);
        if (a != a || b != b)
            return false;
        double r = avg ? (a + b) / 2.0 : a + b;
        memcpy(out, &r, 8);
        return true;
    }
    case GS_I32: {
        int32_t r0 = (int32_t)(ld32(x0) + ld32(x1)), r1 = two ? (int32_t)(ld32(x0 + 4) + ld32(x1 + 4)) : 0;
        r0 = avg ? r0 / 2 : r0;
        r1 = avg ? r1 / 2 : r1;
        memcpy(out, &r0, 4);
        if (two)
            memcpy(out + 4, &r1, 4);
        return true;
    }
    case GS_I64: {
        int64_t r = (int64_t)(load64(x0) + load64(x1));
        r = avg ? r / 2 : r;
        memcpy(out, &r, 8);
        return true;
    }
    default: return false;
    }
}

/* Step 4: out = x0 op x1 in rank order, my operand from my buffer mine
 * (reading my own line again would wait for the peer's read of it). */
static void tiny_combine(int rank, gs_red_fn fn, gs_dtype dtype, gs_redop op, void *out, const void *mine,
                         const uint8_t *theirs, size_t count, size_t bytes)
{
    const uint8_t *x0 = rank ? theirs : mine, *x1 = rank ? mine : theirs;
    bool sum = op == GS_SUM || op == GS_AVG;
    if (bytes && !(sum && bytes <= 8 && tiny_sum_inline(dtype, op == GS_AVG, out, x0, x1, count))) {
        uint8_t acc[GS_TINY_MAX_BYTES];
        fn(acc, x0, x1, count);
        if (op == GS_AVG)
            gs_red_avg_finish(dtype, acc, count, 2);
        tiny_copy(out, acc, bytes);
    }
}

gs_status gs_tiny_allreduce(gs_comm *comm, const void *send, void *recv, size_t count, gs_dtype dtype,
                            gs_redop op)
{
    size_t es = gs_dtype_bytes(dtype), bytes = count * es; /* 0: unknown */
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    uint64_t desc = desc_word(GS_COLL_ALLREDUCE, dtype, op);
    /* too large, or an argument the usual checks report */
    if (!es || count > GS_TINY_MAX_BYTES || bytes > GS_TINY_MAX_BYTES || !gs_red_valid(dtype, op) ||
        (count && (!send || !recv)) || (s != r && s < r + bytes && r < s + bytes))
        return GS_ERR_AGAIN;
    tiny_post(comm, desc, -1, count, bytes, send);
    /* while the peer's post travels: the kernel (before the wait, so that
     * a rank that finds the post there already does not pay it after) */
    gs_red_fn fn = gs_red_kernel(dtype, op);
    const uint8_t *payload = tiny_wait(comm, desc, -1, count, bytes);
    if (!payload)
        return GS_INPROGRESS;
    tiny_combine(comm->rank, fn, dtype, op, recv, send, payload, count, bytes);
    return GS_OK;
}

gs_status gs_tiny_reduce(gs_comm *comm, const void *send, void *recv, size_t count, gs_dtype dtype,
                         gs_redop op, int root)
{
    size_t es = gs_dtype_bytes(dtype), bytes = count * es; /* 0: unknown */
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    bool at_root = comm->rank == root;
    uint64_t desc = desc_word(GS_COLL_REDUCE, dtype, op);
    /* too large, or an argument the usual checks report (the result only at the root) */
    if (!es || count > GS_TINY_MAX_BYTES || bytes > GS_TINY_MAX_BYTES || !gs_red_valid(dtype, op) ||
        (root != 0 && root != 1) || (count && !send) || (at_root && count && !recv) ||
        (at_root && s != r && s < r + bytes && r < s + bytes))
        return GS_ERR_AGAIN;
    /* 1. the others post their operand, the root an empty post (rooted.c) */
    tiny_post(comm, desc, root, count, at_root ? 0 : bytes, send);
    gs_red_fn fn = gs_red_kernel(dtype, op);
    const uint8_t *payload = tiny_wait(comm, desc, root, count, at_root ? bytes : 0);
    if (!payload)
        return GS_INPROGRESS;
    if (at_root)
        tiny_combine(comm->rank, fn, dtype, op, recv, send, payload, count, bytes);
    return GS_OK;
}

gs_status gs_tiny_barrier(gs_comm *comm)
{
    /* a barrier's descriptor: f32, sum, count 0 (as api.c's prepare sets it) */
    uint64_t desc = desc_word(GS_COLL_BARRIER, GS_F32, GS_SUM);
    tiny_post(comm, desc, -1, 0, 0, NULL);
    return tiny_wait(comm, desc, -1, 0, 0) ? GS_OK : GS_INPROGRESS;
}
