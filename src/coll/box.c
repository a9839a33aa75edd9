/*
 * The shared-memory plane of the direct algorithm ("boxes"), used when every
 * rank of the communicator runs on one host over a transport that maps
 * peers' memory (GS_TP_CAP_LOCAL_MAP: shm). It knows no file descriptors:
 * the segments are the transport's regions, mapped through it.
 *
 * Each rank owns one segment that every peer maps (layout: box.h): a
 * wake line, an abort notice and GS_BOX_SLOTS slots of post number | call
 * header | payload.
 *
 * A post (the direct algorithm's send-to-all step) copies this rank's data
 * into its next slot, the call's descriptor beside it, and last (release)
 * the post number. Readers (the receive-from-all step) wait until
 * every peer's slot shows the expected post number, check the descriptor
 * like a message header (a mismatch is caught by every rank at once) and
 * read the data in place: no message, no copy into the peer. Up to 8 payload
 * bytes share the cache line of the post number, so a small allreduce costs
 * about one cache-line transfer per peer.
 *
 * Large pieces post by reference instead (box_ref.c): the post names the
 * poster's buffers and the ranks copy between the callers' buffers.
 *
 * Two slots suffice: a rank posts number p only after it has seen every
 * peer's post p-1, and a peer posts p-1 only after it finished reading
 * everyone's post p-2, the previous user of the slot.
 *
 * Waiting: spin on the post words (polling the transport now and then for
 * aborts and lost peers; yielding the CPU at every turn when the host has
 * more ranks than cores, now and then after 20 us otherwise), and after
 * GS_SPIN_US sleep on the futex doorbell, which a poster rings when it sees
 * the waiting flag.
 */
#include "coll/box.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/futex.h"
#include "util/log.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* What a rank tells the others so they can map its segment. */
typedef struct box_addr {
    gs_rmr seg;     /* the segment, a region of the transport */
    int32_t ok;     /* first round: this rank has a segment; second: it mapped every peer's */
    int32_t l2_kib; /* this rank's L2 cache, as its core reports it (0: unknown) */
} box_addr;

/* The largest reduce posted by reference (box_ref.c): its operand, the
 * peer's and the result take 3 times that in the reader's cache, which
 * should leave room in the smallest L2 among the ranks (every rank decides
 * the same). Measured on a 2 MiB L2: 384 KiB faster than the box, 512 KiB
 * level, 768 KiB slower. */
static size_t ref_reduce_max(int l2_kib)
{
    size_t max = l2_kib > 0 ? (size_t)l2_kib * 1024 * 3 / 16 : GS_BOX_REF_REDUCE_MAX;
    return max < GS_BOX_REF_BYTES            ? GS_BOX_REF_BYTES
           : max > 4 * GS_BOX_REF_REDUCE_MAX ? 4 * GS_BOX_REF_REDUCE_MAX
                                             : max;
}

static int32_t l2_kib(void)
{
#ifdef _SC_LEVEL2_CACHE_SIZE
    long b = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return b > 0 && b / 1024 <= INT32_MAX ? (int32_t)(b / 1024) : 0;
#else
    return 0;
#endif
}

/* ---- setup and teardown ----------------------------------------------------- */

/* The segment is a region of the shm transport (gs_mr_alloc), which peers
 * map through it (gs_tp_map: the owner's record checked, its process known
 * to be the one that announced it). */
static gs_status create_segment(gs_comm *comm, gs_box *box)
{
    box->slot_stride = gs_round_up(GS_BOX_HEAD_BYTES + comm->box_chunk, GS_COLL_LINE);
    box->mail_off = gs_round_up(GS_BOX_SLOTS_OFF + GS_BOX_SLOTS * box->slot_stride, GS_COLL_LINE);
    box->len = gs_round_up(box->mail_off + gs_mail_area_bytes(comm->size), gs_page_size());
    gs_status st = gs_mr_alloc(
        comm->tp, box->len, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_WRITE, &box->mr);
    if (st != GS_OK)
        return st;
    gs_pages_touch(gs_mr_addr(box->mr), box->len);
    box->seg[comm->rank] = gs_mr_addr(box->mr);
    return GS_OK;
}

static gs_status map_peer(gs_comm *comm, gs_box *box, int peer, const box_addr *a)
{
    void *p = NULL;
    size_t len = 0;
    gs_status st = gs_tp_map(gs_tp_ep(comm->tp, peer), &a->seg,
                             GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_WRITE, &p, &len);
    if (st != GS_OK)
        return st;
    if (len < box->len) {
        gs_tp_unmap(comm->tp, p, len);
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                       "rank %d: the box of rank %d has %zu bytes, %zu expected", comm->rank, peer, len,
                       box->len);
    }
    box->seg[peer] = p;
    box->map_len[peer] = len;
    return GS_OK;
}

void gs_box_close(gs_comm *comm)
{
    gs_box *box = comm->box;
    if (!box)
        return;
    for (int p = 0; box->seg && p < comm->size; p++)
        if (p != comm->rank && box->seg[p])
            gs_tp_unmap(comm->tp, box->seg[p], box->map_len[p]);
    if (box->mr && gs_mr_dereg(box->mr) != GS_OK)
        gs_log_warn(COLL, "rank %d: deregistering the shared-memory box failed: %s", comm->rank,
                    gs_last_error());
    free(box->seg);
    free(box->map_len);
    free(box);
    comm->box = NULL;
}

/* Creates and maps the boxes; every rank ends with boxes or none (a rank
 * that could not map them tells the others, and all use the transport). */
gs_status gs_box_open(gs_comm *comm)
{
    char tag[64];
    box_addr mine = {.ok = 0, .l2_kib = l2_kib()}, *all;
    gs_status st;
    gs_box *box = gs_calloc(1, sizeof(*box));
    all = gs_calloc((size_t)comm->size, sizeof(*all));
    if (!box || !all || !(box->seg = gs_calloc((size_t)comm->size, sizeof(uint8_t *))) ||
        !(box->map_len = gs_calloc((size_t)comm->size, sizeof(size_t)))) {
        free(all);
        if (box)
            free(box->seg);
        free(box);
        return GS_ERR_NOMEM;
    }
    comm->box = box;
    if (create_segment(comm, box) == GS_OK) {
        gs_mr_pack(box->mr, &mine.seg);
        mine.ok = 1;
    }
    snprintf(tag, sizeof(tag), "coll/%u/box", comm->id);
    st = gs_store_allgather(comm->ctx, tag, &mine, sizeof(mine), all);
    int32_t l2 = mine.l2_kib;
    for (int p = 0; st == GS_OK && p < comm->size; p++)
        l2 = all[p].l2_kib < l2 ? all[p].l2_kib : l2; /* unknown anywhere: the default */
    comm->box_ref_reduce_max = ref_reduce_max(l2);
    for (int p = 0; st == GS_OK && mine.ok && p < comm->size; p++) {
        if (p == comm->rank || !all[p].ok)
            continue;
        if (map_peer(comm, box, p, &all[p]) != GS_OK)
            mine.ok = 0;
    }
    snprintf(tag, sizeof(tag), "coll/%u/box-ok", comm->id);
    if (st == GS_OK)
        st = gs_store_allgather(comm->ctx, tag, &mine, sizeof(mine), all);
    bool usable = st == GS_OK;
    for (int p = 0; usable && p < comm->size; p++)
        usable = all[p].ok;
    free(all);
    if (!usable) {
        gs_log_info(COLL,
                    "rank %d: shared-memory boxes unavailable (%s): the direct algorithm uses the transport",
                    comm->rank, gs_last_error());
        gs_box_close(comm);
    } else if (comm->size == 2) {
        gs_box_pair_init(box, comm->rank);
    }
    return st; /* only a failing store is an error */
}

/* ---- failures ------------------------------------------------------------------ */

/* Wakes the peers that sleep on their doorbell. */
void gs_box_ring(gs_comm *comm)
{
    for (int p = 0; p < comm->size; p++) {
        gs_box_wake *w = gs_box_wake_of(comm->box->seg[p]);
        if (p != comm->rank && __atomic_load_n(&w->waiting, __ATOMIC_RELAXED)) {
            __atomic_fetch_add(&w->doorbell, 1, __ATOMIC_SEQ_CST);
            gs_futex(&w->doorbell, FUTEX_WAKE, 1, NULL);
        }
    }
}

void gs_box_tell(gs_comm *comm, gs_status status, uint64_t seq, const char *text)
{
    gs_box_abort *a = gs_box_abort_of(comm->box->seg[comm->rank]);
    size_t len = strlen(text);
    if (__atomic_load_n(&a->seq, __ATOMIC_RELAXED))
        return; /* told once */
    if (len >= sizeof(a->text))
        len = sizeof(a->text) - 1;
    memcpy(a->text, text, len);
    a->text[len] = '\0';
    a->len = (uint32_t)len;
    a->status = (int32_t)status;
    __atomic_store_n(&a->seq, seq ? seq : 1, __ATOMIC_RELEASE);
    gs_box_ring(comm);
}

/* A peer announced a failure that concerns op: fail it (and the
 * communicator) with the peer's words. */
static gs_status peer_failed(gs_coll_op *op)
{
    gs_comm *c = op->comm;
    for (int q = 0; q < c->size; q++) {
        gs_box_abort *a = gs_box_abort_of(c->box->seg[q]);
        uint64_t seq = q == c->rank ? 0 : __atomic_load_n(&a->seq, __ATOMIC_ACQUIRE);
        if (seq && seq <= op->seq) {
            char text[sizeof(a->text)];
            size_t len = a->len < sizeof(text) ? a->len : sizeof(text) - 1;
            memcpy(text, a->text, len);
            text[len] = '\0';
            gs_status st = a->status < 0 ? (gs_status)a->status : GS_ERR_PROTOCOL;
            gs_engine_fail_told(c, st, seq, q, text);
            gs_error_restore(c->failed_text);
            return c->failed;
        }
    }
    return GS_OK;
}

/* ---- posting and reading ----------------------------------------------------- */

static void publish(gs_coll_op *op, uint32_t unit, size_t bytes, uint8_t flags);

gs_status gs_box_post(gs_coll_op *op, gs_prim *p)
{
    gs_comm *c = op->comm;
    uint8_t *dst = gs_box_next_payload(c);
    uint8_t flags = op->box_ref ? gs_box_ref_fill(op, p, dst) : 0;
    if (flags) {
        publish(op, p->send_unit, p->bytes, flags);
        if (p->out && p->local && p->out != p->local && p->bytes && !p->stride)
            gs_coll_copy_out(op, p->out, p->local, p->bytes);
        return GS_OK;
    }
    if (p->stride) { /* a piece for every rank, mine included unless I read it from my input (pieces) */
        for (int q = 0; q < c->size && p->bytes; q++)
            if (!p->pieces || q != c->rank)
                memcpy(dst + (size_t)q * p->bytes, p->local + (size_t)q * p->stride, p->bytes);
    } else if (p->bytes) {
        memcpy(dst, p->local, p->bytes);
    }
    gs_box_publish(op, p->send_unit, p->bytes);
    if (p->out && p->local && p->out != p->local && p->bytes && !p->stride)
        gs_coll_copy_out(op, p->out, p->local, p->bytes);
    return GS_OK;
}

uint8_t *gs_box_next_payload(gs_comm *comm)
{
    return gs_box_payload(gs_box_slot(comm->box, comm->rank, comm->box->posts + 1));
}

/* The next post, its header flags set before the post number. */
static void publish(gs_coll_op *op, uint32_t unit, size_t bytes, uint8_t flags)
{
    gs_comm *c = op->comm;
    gs_box *box = c->box;
    uint64_t post = box->posts + 1;
    gs_box_head *head = gs_box_slot(box, c->rank, post);
    gs_desc_fill(op, &head->hdr, unit, bytes);
    head->hdr.flags = flags;
    if (op->parts && c->size == 2) /* when it was posted: the peer learns how far this rank is */
        head->hdr.reserved = gs_now_ns();
    /* a plain release store: a locked instruction would wait for the line
     * to come back from the readers. A sleeper whose flag this rank misses
     * (store and flag load crossing) wakes at its 1 ms timeout and sees it. */
    __atomic_store_n(&head->post, post, __ATOMIC_RELEASE);
    box->posts = post;
    op->box_post = post;
    gs_box_ring(c);
    c->progress_count++;
}

void gs_box_publish(gs_coll_op *op, uint32_t unit, size_t bytes)
{
    publish(op, unit, bytes, 0);
}

uint64_t gs_box_posts(const gs_comm *comm)
{
    return comm->box->posts;
}

/* Whether every peer has made the post op is waiting for. */
bool gs_box_ready(const gs_coll_op *op)
{
    const gs_comm *c = op->comm;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank &&
            __atomic_load_n(&gs_box_slot(c->box, q, op->box_post)->post, __ATOMIC_ACQUIRE) != op->box_post)
            return false;
    return true;
}

/* Peer q's data for this rank in the current post. */
static const uint8_t *operand(const gs_coll_op *op, const gs_prim *p, int q)
{
    const gs_comm *c = op->comm;
    gs_box_head *head = gs_box_slot(c->box, q, op->box_post);
    /* reduce_scatter posts a piece per rank (stride set on its reduce step),
     * so do scatter's root and alltoall (pieces); a gather's stride spaces
     * its output instead */
    size_t piece = (p->mode == GS_PRIM_REDUCE && p->stride) || p->pieces ? (size_t)c->rank * p->bytes : 0;
    if (q == c->rank && p->local)
        return p->local;
    return gs_box_payload(head) + piece;
}

/* out = x_0 op x_1 op ... op x_{n-1}, in rank order. No operand aliases out
 * (mine is the copy in my box unless local was given, and then out is not
 * local, but for a reduce in place at its root), so partial results may go
 * straight to out, except when they must stay in cache (streamed results,
 * avg's division) or out is an operand: then in the scratch. */
static void reduce_all(gs_coll_op *op, const gs_prim *p, size_t n)
{
    gs_comm *c = op->comm;
    int last = c->size - 1;
    bool staged = p->finish || (op->nt && c->size > 2) || (c->size > 2 && p->local && p->local == p->out);
    uint8_t *acc = staged ? c->scratch : p->out;
    if (c->size == 2 && !staged) {
        gs_coll_reduce_out(op, p->out, operand(op, p, 0), operand(op, p, 1), n);
        return;
    }
    gs_red_apply(op->dtype, op->redop, acc, operand(op, p, 0), operand(op, p, 1), n);
    for (int q = 2; q < (staged && !p->finish ? last : c->size); q++)
        gs_red_apply(op->dtype, op->redop, acc, acc, operand(op, p, q), n);
    if (p->finish) {
        gs_red_avg_finish(op->dtype, acc, n, c->size);
        gs_coll_copy_out(op, p->out, acc, p->bytes);
    } else if (staged) {
        gs_coll_reduce_out(op, p->out, acc, operand(op, p, last), n);
    }
}

gs_status gs_box_gather(gs_coll_op *op, gs_prim *p)
{
    gs_comm *c = op->comm;
    gs_status st;
    size_t n = p->bytes / op->es;
    bool ready = gs_box_ready(op);
    /* checked after the posts: a peer that failed before posting said so
     * first, and then this call must fail too */
    if ((st = peer_failed(op)) != GS_OK)
        return st;
    if (!ready)
        return GS_INPROGRESS;
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank)
            continue;
        st = gs_desc_check(c, op, &gs_box_slot(c->box, q, op->box_post)->hdr, q, p->recv_unit,
                           gs_prim_peer_bytes(p, q));
        if (st != GS_OK)
            return st;
    }
    if (op->box_ref && (st = gs_box_ref_push(op, p)) != GS_OK) /* what this rank writes into peers */
        return st;
    if (p->mode == GS_PRIM_REDUCE && op->box_ref && p->bytes && p->out) { /* ref_mr: gs_coll_user_open */
        st = gs_box_ref_reduce(op, p);
    } else if (p->mode == GS_PRIM_REDUCE) {
        reduce_all(op, p, n);
    } else if (p->mode == GS_PRIM_GATHER && p->out && p->bytes) {
        for (int q = 0; q < c->size && st == GS_OK; q++) {
            uint8_t *dst = p->out + (size_t)q * p->stride;
            const uint8_t *src = operand(op, p, q);
            if (gs_box_by_ref(op, q))
                st = gs_box_ref_take(op, p, q, dst);
            else if (dst != src)
                gs_coll_copy_out(op, dst, src, p->bytes);
        }
    } else if (p->mode == GS_PRIM_BCAST && p->out && p->bytes) {
        const uint8_t *src = operand(op, p, p->root);
        if (gs_box_by_ref(op, p->root))
            st = gs_box_ref_take(op, p, p->root, p->out);
        else if (src != p->out)
            gs_coll_copy_out(op, p->out, src, p->bytes);
    }
    if (st != GS_OK)
        return st;
    c->progress_count++;
    return GS_OK;
}

/* By parts, 2 ranks: the peer's post arrived while this rank was waiting for
 * it, so the time since the peer stamped it is about one cache line's way
 * from its core to this one. The least seen in a call decides the next
 * one's data posts (gs_comm.box_line_ns). */
static void line_delay_seen(gs_coll_op *op)
{
    const gs_box_head *head = gs_box_slot(op->comm->box, 1 - op->comm->rank, op->box_post);
    int64_t d = (int64_t)(gs_now_ns() - head->hdr.reserved);
    if (d > 0 && (op->far_ns == 0 || (uint64_t)d < op->far_ns)) {
        op->far_ns = (uint64_t)d;
        op->comm->box_line_ns = op->far_ns;
    }
}

gs_status gs_box_arrived(gs_coll_op *op, uint32_t unit, size_t (*bytes_of)(const gs_coll_op *op, int peer))
{
    gs_comm *c = op->comm;
    gs_status st;
    bool ready = gs_box_ready(op);
    if ((st = peer_failed(op)) != GS_OK) /* after the posts, as in gs_box_gather */
        return st;
    if (!ready) {
        op->box_waited = true;
        return GS_INPROGRESS;
    }
    if (op->box_waited && c->size == 2)
        line_delay_seen(op);
    op->box_waited = false;
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank)
            continue;
        st = gs_desc_check(c, op, &gs_box_slot(c->box, q, op->box_post)->hdr, q, unit, bytes_of(op, q));
        if (st != GS_OK)
            return st;
    }
    return GS_OK;
}

const uint8_t *gs_box_peer_payload(const gs_coll_op *op, int q)
{
    return gs_box_payload(gs_box_slot(op->comm->box, q, op->box_post));
}

/* ---- waiting ----------------------------------------------------------------- */

/* Whether some peer announced a failure (without acting on it). */
static uint64_t peer_failed_quiet(const gs_coll_op *op)
{
    const gs_comm *c = op->comm;
    for (int q = 0; q < c->size; q++)
        if (q != c->rank && __atomic_load_n(&gs_box_abort_of(c->box->seg[q])->seq, __ATOMIC_ACQUIRE))
            return 1;
    return 0;
}

void gs_box_idle(gs_comm *comm, const gs_coll_op *op, uint64_t idle_ns, unsigned turn)
{
    gs_box_wake *w = gs_box_wake_of(comm->box->seg[comm->rank]);
    uint64_t spin = comm->cfg->poll == GS_POLL_SPIN ? UINT64_MAX
                    : comm->cfg->poll == GS_POLL_EVENT
                        ? 0
                        : (uint64_t)(comm->cfg->spin_us > 0 ? comm->cfg->spin_us : 0) * 1000u;
    if (idle_ns < spin) {
        /* more ranks than cores: the rank we wait for may need this CPU.
         * Otherwise spin, and only after 20 us (far beyond a small call)
         * yield now and then, in case the peer was put on this CPU. */
        if (comm->oversubscribed || (idle_ns >= 20000 && (turn & 15) == 0))
            sched_yield();
        else if (idle_ns >= 20000)
            gs_cpu_relax();
        return; /* no pause at first: in a VM a pause loop ends in an exit to the host */
    }
    /* long wait: sleep until a poster rings (or 1 ms, to poll the transport) */
    struct timespec ts = {0, 1000000};
    __atomic_store_n(&w->waiting, 1, __ATOMIC_SEQ_CST);
    uint32_t bell = __atomic_load_n(&w->doorbell, __ATOMIC_SEQ_CST);
    if (!gs_box_ready(op) && peer_failed_quiet(op) == 0)
        gs_futex(&w->doorbell, FUTEX_WAIT, bell, &ts);
    __atomic_store_n(&w->waiting, 0, __ATOMIC_RELAXED);
}

void gs_box_describe_wait(const gs_coll_op *op, char *buf, size_t cap)
{
    const gs_comm *c = op->comm;
    size_t used = (size_t)snprintf(buf, cap, "waiting in shared memory for post %llu of ranks",
                                   (unsigned long long)op->box_post);
    for (int q = 0; q < c->size && used + 8 < cap; q++)
        if (q != c->rank &&
            __atomic_load_n(&gs_box_slot(c->box, q, op->box_post)->post, __ATOMIC_ACQUIRE) != op->box_post)
            used += (size_t)snprintf(buf + used, cap - used, " %d", q);
}
