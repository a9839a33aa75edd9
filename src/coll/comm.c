/*
 * The communicator: staging buffers registered once, every rank's inbox
 * descriptor exchanged through the bootstrap store, channels to every peer.
 *
 * Inbox (remote-writable), one block per rank index (this rank's own block
 * unused), block b receiving from rank b:
 *     GS_COLL_SLOTS x slot (header + chunk) | credit word (line) | control slot
 * Outbox (local): out_nslots slots | one credit word per peer | abort notice.
 */
#include "coll/coll.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GS_COLL_REQ_POOL 8

uint8_t *gs_coll_outbox_slot(gs_comm *comm, int i)
{
    return comm->out_slots + (size_t)i * comm->slot_stride;
}

bool gs_coll_outbox_busy(gs_comm *comm, int i)
{
    uint64_t call = comm->out_call[i];
    uint32_t unit = comm->out_unit[i];
    if (comm->out_pending[i] != 0)
        return true;
    if (call == 0)
        return false;
    for (int q = 0; q < comm->size; q++) {
        const gs_chan *ch = &comm->chans[q];
        if (q != comm->rank && (ch->rx_seq_max < call || (ch->rx_seq_max == call && ch->rx_unit_max <= unit)))
            return true;
    }
    comm->out_call[i] = 0;
    return false;
}

int gs_coll_outbox_take(gs_comm *comm)
{
    int i = comm->out_next;
    if (gs_coll_outbox_busy(comm, i))
        return -1;
    comm->out_next = (i + 1) % comm->out_nslots;
    return i;
}

static void user_dereg(gs_comm *c, gs_mr *mr)
{
    if (gs_mr_dereg(mr) != GS_OK)
        gs_log_warn(COLL, "rank %d: deregistering a caller's buffer failed: %s", c->rank, gs_last_error());
}

/* A registration of [addr, addr + len) with access: a cached one, or a new
 * one put in the cache in place of the least recently used idle entry (or
 * outside it if every entry is in use). */
static gs_status user_get(gs_comm *c, void *addr, size_t len, unsigned access, gs_mr **mr_p)
{
    int victim = -1;
    for (int i = 0; i < GS_COLL_USER_MRS; i++) {
        gs_mr *mr = c->user_mrs[i].mr;
        if (mr && c->user_mrs[i].addr == addr && c->user_mrs[i].len == len &&
            c->user_mrs[i].access == access) {
            c->user_mrs[i].refs++;
            c->user_mrs[i].used = ++c->user_clock;
            *mr_p = mr;
            return GS_OK;
        }
        if (c->user_mrs[i].refs == 0 &&
            (victim < 0 || !mr || (c->user_mrs[victim].mr && c->user_mrs[i].used < c->user_mrs[victim].used)))
            victim = i;
    }
    gs_mr *mr;
    gs_status st = gs_mr_reg(c->tp, addr, len, access, &mr);
    if (st != GS_OK)
        return st;
    if (victim >= 0) {
        if (c->user_mrs[victim].mr)
            user_dereg(c, c->user_mrs[victim].mr);
        c->user_mrs[victim].mr = mr;
        c->user_mrs[victim].addr = addr;
        c->user_mrs[victim].len = len;
        c->user_mrs[victim].access = access;
        c->user_mrs[victim].refs = 1;
        c->user_mrs[victim].used = ++c->user_clock;
    }
    *mr_p = mr;
    return GS_OK;
}

static void user_put(gs_comm *c, gs_mr *mr)
{
    for (int i = 0; i < GS_COLL_USER_MRS; i++)
        if (c->user_mrs[i].mr == mr) {
            c->user_mrs[i].refs--;
            return;
        }
    user_dereg(c, mr); /* registered outside the cache */
}

/* By reference over the boxes: the buffers this rank posts from and reads
 * into. A failure fails the call (a post by reference has no slot room to
 * fall back on), with the reason. */
static gs_status user_open_ref(gs_coll_op *op)
{
    gs_comm *c = op->comm;
    size_t send, recv;
    unsigned recv_access;
    gs_status st = GS_OK;
    gs_box_ref_extents(op, &send, &recv, &recv_access);
    if (send && op->send)
        st = user_get(c, (void *)op->send, send, GS_ACCESS_REMOTE_READ, &op->send_mr);
    if (st == GS_OK && recv && op->recv)
        st = user_get(c, op->recv, recv, recv_access, &op->recv_mr);
    if (st == GS_OK && op->kind == GS_COLL_REDUCE && !c->ref_mr)
        st = gs_mr_alloc(c->tp, 3 * GS_BOX_REF_READ_BYTES, GS_ACCESS_LOCAL_WRITE, &c->ref_mr);
    if (st != GS_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", gs_last_error());
        gs_coll_user_close(op);
        return gs_fail(GS_SUBSYS_COLL, st,
                       "rank %d: registering the caller's buffers for reads by reference failed: %s", c->rank,
                       why);
    }
    return GS_OK;
}

gs_status gs_coll_user_open(gs_coll_op *op)
{
    gs_comm *c = op->comm;
    size_t bytes = (size_t)op->count * op->es;
    if (op->box_ref)
        return user_open_ref(op);
    if (c->size != 2 || op->algo != &gs_ring_algo || op->kind != GS_COLL_ALLREDUCE ||
        bytes < GS_COLL_USER_BYTES || !(gs_tp_caps(c->tp) & GS_TP_CAP_ZCOPY_SEND))
        return GS_OK;
    if (user_get(c, (void *)op->send, bytes, 0, &op->send_mr) != GS_OK) {
        gs_log_debug(COLL, "rank %d: sending from the caller's buffer is not possible (%s): copying", c->rank,
                     gs_last_error());
        op->send_mr = NULL;
        return GS_OK;
    }
    if (op->recv == op->send)
        op->recv_mr = op->send_mr;
    else if (user_get(c, op->recv, bytes, GS_ACCESS_LOCAL_WRITE, &op->recv_mr) != GS_OK) {
        op->recv_mr = NULL;
        gs_coll_user_close(op);
    }
    return GS_OK;
}

void gs_coll_user_close(gs_coll_op *op)
{
    gs_comm *c = op->comm;
    if (op->recv_mr && op->recv_mr != op->send_mr)
        user_put(c, op->recv_mr);
    if (op->send_mr)
        user_put(c, op->send_mr);
    op->send_mr = op->recv_mr = NULL;
}

void gs_coll_user_drop(gs_comm *comm)
{
    for (int i = 0; i < GS_COLL_USER_MRS; i++) {
        if (comm->user_mrs[i].mr)
            user_dereg(comm, comm->user_mrs[i].mr);
        comm->user_mrs[i].mr = NULL;
    }
}

/* Sizes of slots and blocks from GS_CHUNK_BYTES. */
static gs_status layout(gs_comm *comm)
{
    uint64_t chunk = comm->cfg->chunk_bytes;
    if (chunk < 4096 || chunk > (1u << 30))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_CONFIG,
                       "GS_CHUNK_BYTES=%llu is out of range: use 4K to 1G (default 256K)",
                       (unsigned long long)chunk);
    comm->chunk = (size_t)chunk / GS_COLL_LINE * GS_COLL_LINE;
    /* 2 ranks across a network link: larger chunks, fewer messages (each costs its latency) */
    if (comm->size == 2 && gs_tp_reach_of(comm->tp, 1 - comm->rank).bandwidth == GS_TP_BW_NETWORK)
        comm->chunk *= GS_PAIR_CHUNK_FACTOR;
    comm->box_chunk = GS_BOX_CHUNK_FACTOR * comm->chunk;
    comm->slot_stride = gs_round_up(GS_COLL_HDR_BYTES + comm->chunk, GS_COLL_LINE);
    comm->peer_block = GS_COLL_SLOTS * comm->slot_stride + GS_COLL_LINE + GS_COLL_CTRL_BYTES;
    comm->out_nslots = comm->size > 3 ? 2 * (comm->size - 1) : 4;
    return GS_OK;
}

/* Registers inbox and outbox and points every channel at its part. */
static gs_status alloc_staging(gs_comm *comm)
{
    size_t in_len = (size_t)comm->size * comm->peer_block;
    size_t words = gs_round_up((size_t)comm->size * sizeof(uint64_t), GS_COLL_LINE);
    size_t out_len = (size_t)comm->out_nslots * comm->slot_stride + words + GS_COLL_CTRL_BYTES;
    gs_status st =
        gs_mr_alloc(comm->tp, in_len, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE, &comm->inbox);
    if (st == GS_OK)
        st = gs_mr_alloc(comm->tp, out_len, GS_ACCESS_LOCAL_WRITE, &comm->outbox);
    if (st != GS_OK)
        return st;
    comm->out_slots = gs_mr_addr(comm->outbox);
    comm->abort_src = comm->out_slots + (size_t)comm->out_nslots * comm->slot_stride + words;
    comm->out_pending = gs_calloc((size_t)comm->out_nslots, sizeof(uint32_t));
    comm->out_call = gs_calloc((size_t)comm->out_nslots, sizeof(uint64_t));
    comm->out_unit = gs_calloc((size_t)comm->out_nslots, sizeof(uint32_t));
    comm->chans = gs_calloc((size_t)comm->size, sizeof(gs_chan));
    comm->peer_inbox = gs_calloc((size_t)comm->size, sizeof(gs_rmr));
    comm->host_of = gs_calloc((size_t)comm->size, sizeof(int));
    comm->ring = gs_calloc((size_t)comm->size, sizeof(int));
    comm->ring_pos_of = gs_calloc((size_t)comm->size, sizeof(int));
    if (!comm->out_pending || !comm->out_call || !comm->out_unit || !comm->chans || !comm->peer_inbox ||
        !comm->host_of || !comm->ring || !comm->ring_pos_of)
        return GS_ERR_NOMEM;
    gs_status st2 = gs_pages_alloc(comm->box_chunk, (void **)&comm->scratch); /* the larger of the two */
    if (st2 != GS_OK)
        return st2;
    uint8_t *in = gs_mr_addr(comm->inbox);
    uint64_t *credit_words = (uint64_t *)(comm->out_slots + (size_t)comm->out_nslots * comm->slot_stride);
    for (int p = 0; p < comm->size; p++) {
        gs_chan *ch = &comm->chans[p];
        uint8_t *block = in + (size_t)p * comm->peer_block;
        ch->peer = p;
        ch->slots = block;
        ch->credit_in = (volatile uint64_t *)(block + GS_COLL_SLOTS * comm->slot_stride);
        ch->abort_in = (const gs_coll_abort *)(block + GS_COLL_SLOTS * comm->slot_stride + GS_COLL_LINE);
        ch->remote_off = (uint64_t)comm->rank * comm->peer_block;
        ch->credit_src = &credit_words[p];
    }
    return GS_OK;
}

/* What each rank tells the others at creation. */
typedef struct comm_hello {
    gs_rmr inbox;     /* where to write to it */
    uint64_t host;    /* hash of its host id: ranks sharing memory */
    uint64_t machine; /* its kernel's (gs_boot_machine_id, else host): ranks sharing CPUs */
    uint32_t cores;   /* CPUs it may run on */
    uint32_t pad;
} comm_hello;

static uint64_t host_hash(const char *id)
{
    uint64_t h = 1469598103934665603ull;
    for (; *id; id++)
        h = (h ^ (uint8_t)*id) * 1099511628211ull;
    return h;
}

/* Each rank's place for the hierarchical algorithms (hier.c): its host and
 * its index among that host's ranks, in rank order. They run on two or more
 * hosts when some host has more than one rank; hosts may hold different
 * counts (the first hier_local indices of every host form the core, the
 * others fold into it). Leaves hier_hosts 0 when they do not apply or
 * memory is short (the rings serve then). */
static void hier_places(gs_comm *comm)
{
    int hosts = comm->hosts, lmin = comm->size, lmax = 0;
    int *count = gs_calloc((size_t)(hosts > 0 ? hosts : 1), sizeof(int));
    comm->hier_hosts = comm->hier_local = comm->hier_lmax = 0;
    if (!count || hosts < 2 || comm->size == hosts) {
        free(count);
        return;
    }
    for (int r = 0; r < comm->size; r++)
        count[comm->host_of[r]]++;
    for (int h = 0; h < hosts; h++) {
        lmin = count[h] < lmin ? count[h] : lmin;
        lmax = count[h] > lmax ? count[h] : lmax;
    }
    comm->hier_rank = gs_calloc((size_t)hosts * (size_t)lmax, sizeof(int));
    if (!comm->hier_rank) {
        free(count);
        return;
    }
    for (int i = 0; i < hosts * lmax; i++)
        comm->hier_rank[i] = -1;
    memset(count, 0, (size_t)hosts * sizeof(int));
    for (int r = 0; r < comm->size; r++) {
        int h = comm->host_of[r];
        if (r == comm->rank) {
            comm->hier_h = h;
            comm->hier_l = count[h];
        }
        comm->hier_rank[h * lmax + count[h]++] = r;
    }
    free(count);
    comm->hier_extras = 0;
    if (comm->hier_l < lmin)
        for (int l = comm->hier_l + lmin; l < lmax && comm->hier_rank[comm->hier_h * lmax + l] >= 0;
             l += lmin)
            comm->hier_extras++;
    /* a reduce_scatter's blocks reduced on the host wait here for the hosts' ring; a core rank
     * with extras also folds their columns of every block here (hier_blocks.c) */
    comm->hier_scratch_bytes = (size_t)(hosts + (comm->hier_extras > 0 ? comm->size : 0)) * comm->chunk;
    if (gs_pages_alloc(comm->hier_scratch_bytes, (void **)&comm->hier_scratch) != GS_OK)
        comm->hier_scratch = NULL;
    comm->hier_hosts = hosts;
    comm->hier_local = lmin;
    comm->hier_lmax = lmax;
}

/* The rings' order: host by host, rank order inside each. */
static void ring_order(gs_comm *comm)
{
    int pos = 0;
    for (int h = 0; h < comm->hosts; h++)
        for (int r = 0; r < comm->size; r++)
            if (comm->host_of[r] == h) {
                comm->ring_pos_of[r] = pos;
                comm->ring[pos++] = r;
            }
    comm->ring_pos = comm->ring_pos_of[comm->rank];
}

/* More ranks on this machine than CPUs to run them: waiting ranks must
 * yield. The machine, not the host: emulated hosts (network namespaces)
 * share the CPUs of one kernel. */
static void note_oversubscription(gs_comm *comm, const comm_hello *all)
{
    const comm_hello *me = &all[comm->rank];
    int local = 0, sharing = 0;
    for (int p = 0; p < comm->size; p++) {
        local += all[p].host == me->host;
        sharing += all[p].machine == me->machine;
    }
    comm->oversubscribed = sharing > (int)me->cores;
    comm->all_local = local == comm->size;
    comm->local_ranks = local;
    comm->hosts = 0;
    for (int p = 0; p < comm->size; p++) { /* a host counts at its first rank */
        int q = 0;
        while (all[q].host != all[p].host)
            q++;
        comm->host_of[p] = q == p ? comm->hosts++ : comm->host_of[q];
    }
    hier_places(comm);
    ring_order(comm);
}

static uint32_t usable_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return (uint32_t)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)n : 1;
}

/* Every rank's inbox descriptor and host, through the store. */
static gs_status exchange_descriptors(gs_comm *comm)
{
    char tag[64];
    comm_hello mine = {
        .host = host_hash(comm->ctx->host_id), .machine = gs_boot_machine_id(), .cores = usable_cores()};
    if (!mine.machine)
        mine.machine = mine.host;
    comm_hello *all = gs_calloc((size_t)comm->size, sizeof(*all));
    gs_status st;
    if (!all)
        return GS_ERR_NOMEM;
    gs_mr_pack(comm->inbox, &mine.inbox);
    snprintf(tag, sizeof(tag), "coll/%u/hello", comm->id);
    /* each rank registered before contributing: when this returns, every
     * inbox can be written into */
    st = gs_store_allgather(comm->ctx, tag, &mine, sizeof(mine), all);
    if (st == GS_OK) {
        for (int p = 0; p < comm->size; p++)
            comm->peer_inbox[p] = all[p].inbox;
        note_oversubscription(comm, all);
    }
    free(all);
    return st;
}

static gs_status alloc_requests(gs_comm *comm)
{
    for (int i = 0; i < GS_COLL_REQ_POOL; i++) {
        gs_coll_req *req = gs_calloc(1, sizeof(*req));
        if (!req)
            return GS_ERR_NOMEM;
        req->pooled = true;
        req->comm = comm;
        req->next = comm->free_reqs;
        comm->free_reqs = req;
        req->all_next = comm->all_reqs;
        comm->all_reqs = req;
    }
    comm->sync_req.comm = comm;
    return GS_OK;
}

/* Every request made, wherever it is now: queued, free, or in the
 * caller's hands after a failure or an abort (gs_comm_abort frees those). */
static void free_requests(gs_comm *comm)
{
    for (gs_coll_req *req = comm->all_reqs, *next; req; req = next) {
        next = req->all_next;
        gs_coll_user_close(&req->op);
        gs_pages_free(req->fused, req->fused_cap);
        free(req);
    }
    comm->all_reqs = comm->free_reqs = comm->head = comm->tail = NULL;
}

static void release(gs_comm *comm)
{
    if (comm->threaded)
        gs_engine_thread_stop(comm);
    gs_box_close(comm);
    gs_p2p_close(comm);
    gs_pages_free(comm->scratch, comm->box_chunk);
    if (comm->ref_mr && gs_mr_dereg(comm->ref_mr) != GS_OK)
        gs_log_warn(COLL, "rank %d: freeing the reduce's read buffer failed: %s", comm->rank,
                    gs_last_error());
    gs_coll_user_close(&comm->sync_req.op); /* nothing if it holds no registration */
    free_requests(comm);
    gs_pages_free(comm->sync_req.fused, comm->sync_req.fused_cap);
    gs_coll_user_drop(comm);
    if (comm->inbox && gs_mr_dereg(comm->inbox) != GS_OK)
        gs_log_warn(COLL, "rank %d: deregistering the collectives' inbox failed: %s", comm->rank,
                    gs_last_error());
    if (comm->outbox && gs_mr_dereg(comm->outbox) != GS_OK)
        gs_log_warn(COLL, "rank %d: deregistering the collectives' outbox failed: %s", comm->rank,
                    gs_last_error());
    if (comm->own_tp && comm->tp && gs_tp_close(comm->tp) != GS_OK)
        gs_log_warn(COLL, "rank %d: closing the communicator's transport failed: %s", comm->rank,
                    gs_last_error());
    if (comm->own_ctx)
        gs_ctx_destroy(comm->ctx);
    free(comm->groups);
    free(comm->out_pending);
    free(comm->out_call);
    free(comm->out_unit);
    free(comm->chans);
    free(comm->peer_inbox);
    free(comm->host_of);
    free(comm->hier_rank);
    if (comm->hier_scratch)
        gs_pages_free(comm->hier_scratch, comm->hier_scratch_bytes);
    free(comm->ring);
    free(comm->ring_pos_of);
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->cond);
    free(comm);
}

gs_status gs_comm_create(gs_ctx *ctx, gs_tp *tp, gs_comm **comm_p)
{
    gs_status st;
    gs_comm *comm;
    if (!ctx || !comm_p)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "gs_comm_create: ctx and comm_p must not be NULL");
    comm = gs_calloc(1, sizeof(*comm));
    if (!comm)
        return GS_ERR_NOMEM;
    pthread_mutex_init(&comm->lock, NULL);
    pthread_cond_init(&comm->cond, NULL);
    comm->ctx = ctx;
    comm->cfg = &ctx->cfg;
    comm->rank = ctx->rank;
    comm->size = ctx->size;
    comm->id = ctx->comm_next++; /* the same on every rank of ctx: they create in the same order */
    comm->nt_bytes = GS_COLL_NT_BYTES;
    comm->parts_bytes = comm->size == 2 ? GS_BOX_HALVES_BYTES : GS_BOX_PARTS_BYTES;
    comm->tp = tp;
    if (!tp) {
        st = gs_tp_open(ctx, NULL, &comm->tp);
        if (st != GS_OK)
            goto err_release;
        comm->own_tp = true;
    }
    st = layout(comm);
    if (st == GS_OK)
        st = alloc_staging(comm);
    if (st == GS_OK)
        st = alloc_requests(comm);
    if (st == GS_OK)
        st = gs_p2p_open(comm); /* receives posted before any peer can send */
    if (st == GS_OK)
        st = exchange_descriptors(comm);
    if (st == GS_OK && comm->size > 1 && comm->all_local && (gs_tp_caps(comm->tp) & GS_TP_CAP_LOCAL_MAP))
        st = gs_box_open(comm);
    if (st == GS_OK && comm->cfg->progress_thread)
        st = gs_engine_thread_start(comm);
    if (st != GS_OK)
        goto err_release;
    comm->tiny = gs_tiny_allowed(comm);
    gs_coll_summary(comm);
    gs_log_debug(COLL, "rank %d: communicator %u up over %s, %d ranks, chunk %zu bytes%s", comm->rank,
                 comm->id, gs_tp_name(comm->tp), comm->size, comm->chunk,
                 comm->oversubscribed ? ", more local ranks than cores: waits yield" : "");
    *comm_p = comm;
    return GS_OK;

err_release:
    release(comm);
    return st;
}

/* The ranks' meeting before a communicator goes: each says it leaves
 * ("coll/<id>/gone.<rank>"), then waits for every other rank's word, at most
 * timeout_ms in all (-1: no deadline); an aborting rank only says it. */
static gs_status leave(gs_comm *comm, int64_t timeout_ms)
{
    char key[64];
    uint64_t deadline = gs_deadline_after_ms(timeout_ms);
    gs_status st;
    snprintf(key, sizeof(key), "coll/%u/gone.%d", comm->id, comm->rank);
    st = gs_store_put(comm->ctx, key, "", 0);
    for (int r = 0; r < comm->size && st == GS_OK && timeout_ms != 0; r++) {
        if (r == comm->rank)
            continue;
        snprintf(key, sizeof(key), "coll/%u/gone.%d", comm->id, r);
        st = gs_boot_store_get_ms(comm->ctx, key, NULL, 0, NULL, gs_deadline_left_ms(deadline));
    }
    return st;
}

gs_status gs_comm_destroy(gs_comm *comm)
{
    gs_status st = GS_OK;
    if (!comm)
        return GS_OK;
    if (comm->head && comm->failed == GS_OK)
        gs_log_warn(COLL, "rank %d: destroying a communicator with requests in flight (call #%llu on)",
                    comm->rank, (unsigned long long)comm->head->op.seq);
    /* no peer may still be writing into our inbox, or finishing a call
     * before a failed one through our endpoint, when it goes: wait for
     * every rank. After a failure only briefly (a peer may be gone; a rank
     * that aborted has said it left). */
    if (comm->size > 1) {
        st = leave(comm, comm->failed == GS_OK ? comm->cfg->timeout_ms : GS_COLL_LEAVE_FAILED_MS);
        if (st != GS_OK && comm->failed == GS_OK)
            gs_log_warn(COLL, "rank %d: the other ranks did not all reach gs_comm_destroy: %s", comm->rank,
                        gs_last_error());
        if (comm->failed != GS_OK)
            st = GS_OK;
    }
    release(comm);
    return st;
}

/* The abort notices leave before the transport goes: completions are
 * polled (and dropped) until every peer's notice completed or 250 ms. */
static void flush_notices(gs_comm *comm)
{
    uint64_t deadline = gs_deadline_after_ms(250);
    int left = comm->size - 1, n = 0;
    while (left > 0 && !gs_deadline_passed(deadline) && gs_tp_poll(comm->tp, comm->wcs, 32, &n) == GS_OK)
        for (int i = 0; i < n; i++)
            left -= comm->wcs[i].opcode == GS_WC_WRITE_IMM && (comm->wcs[i].wr_id >> 56) == GS_WR_ABORT;
}

gs_status gs_comm_abort(gs_comm *comm)
{
    char text[96];
    if (!comm)
        return GS_OK;
    if (comm->threaded)
        gs_engine_thread_stop(comm);
    if (comm->failed == GS_OK && comm->size > 1) {
        snprintf(text, sizeof(text), "rank %d aborted the communicator (gs_comm_abort)", comm->rank);
        gs_engine_fail(comm, GS_ERR_PEER_LOST, gs_engine_current_seq(comm), text, true);
        flush_notices(comm);
    }
    if (comm->size > 1 && leave(comm, 0) != GS_OK) /* the others' destroy need not wait for it */
        gs_log_debug(COLL, "rank %d: could not say it left: %s", comm->rank, gs_last_error());
    gs_log_info(COLL, "rank %d: communicator %u aborted", comm->rank, comm->id);
    release(comm);
    return GS_OK;
}

int gs_comm_rank(const gs_comm *comm)
{
    return comm ? comm->rank : -1;
}

int gs_comm_size(const gs_comm *comm)
{
    return comm ? comm->size : 0;
}

gs_tp *gs_comm_tp(gs_comm *comm)
{
    return comm ? comm->tp : NULL;
}
