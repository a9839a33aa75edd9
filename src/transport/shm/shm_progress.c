/*
 * shm progress: the notification rings (one writer, one reader, sequence
 * numbered cache-line slots), peer liveness, and poll/wait in the three
 * completion modes.
 *
 * Publishing a message costs the writer its slot stores plus one seq_cst
 * store of the head slot's seq, then one load of the reader's waiter flag;
 * it calls FUTEX_WAKE only when the reader said it sleeps. The reader polls
 * the seq word of the next slot of each ring: when nothing arrives it reads
 * lines it already holds, so an idle poll costs no cache-line transfer.
 * Every head slot carries the writer's ack of the ring the other way; a
 * writer whose peer's ack says it is close behind goes back to slot 0
 * (WRAP) past GS_SHM_RING_HOT slots, so that a ping-pong keeps cycling
 * through a few lines that stay in L1 instead of the whole ring.
 *
 * Liveness: every peer has a pidfd that becomes readable when the process
 * exits (without pidfd_open: its /proc entry disappears, turns zombie or
 * changes start time). Poll checks them every 10 ms (never on every call), wait also
 * before sleeping and after each sleep slice; a peer that exited without a
 * clean close is lost: its posted receives complete with GS_ERR_FLUSHED,
 * what it sent before dying is still delivered, and then poll and wait
 * return GS_ERR_PEER_LOST naming it whenever they have nothing else.
 */
#include "transport/shm/shm.h"

#include "util/clock.h"
#include "util/futex.h"
#include "util/log.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define RING_MASK         (GS_SHM_RING_SLOTS - 1u)
#define CHECK_EVERY_POLLS 1024u
#define CHECK_PERIOD_NS   10000000ull /* 10 ms */
#define SLEEP_SLICE_NS    20000000ull /* a sleeper wakes this often to check its peers */
#define YIELD_AFTER_NS    2000ull     /* hybrid: spin this long before yielding the core now and then */

static const char *const poll_mode_names[] = {"spin", "event", "hybrid"};

/* ---- endpoint state --------------------------------------------------------- */

gs_status gs_shm_ep_down(gs_shm_ep *ep, const char *op)
{
    if (ep->state == GS_SHM_EP_CLOSED)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_PEER_LOST,
                       "rank %d: %s to rank %d: that rank closed its transport", ep->tp->base.rank, op,
                       ep->base.peer);
    (void)op; /* a lost peer reads the same whatever was posted to it */
    return gs_fail_peer_lost(GS_SUBSYS_SHM, ep->tp->base.rank, ep->base.peer, "%s", ep->lost_why);
}

static void ep_mark_lost(gs_shm_ep *ep, const char *why)
{
    ep->state = GS_SHM_EP_LOST;
    ep->tp->lost_count++;
    snprintf(ep->lost_why, sizeof(ep->lost_why), "%s", why);
    gs_shm_flush_recvs(ep);
}

bool gs_shm_proc_stat(pid_t pid, uint64_t *start_p, bool *zombie_p)
{
    char path[48], text[512], *close_paren;
    unsigned long long start = 0;
    char state = 0;
    size_t n;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return false;
    n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    close_paren = strrchr(text, ')'); /* the command name may hold spaces and parentheses */
    if (!close_paren ||
        sscanf(close_paren + 1,
               " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &state,
               &start) != 2)
        return false;
    *start_p = start;
    *zombie_p = state == 'Z' || state == 'X';
    return true;
}

/* Whether the peer's process has exited: its pidfd, or /proc where there is none. */
static bool peer_exited(gs_shm_ep *ep, struct pollfd *pfd)
{
    uint64_t start = 0;
    bool zombie = false;
    if (ep->pidfd >= 0)
        return poll(pfd, 1, 0) > 0;
    return !gs_shm_proc_stat(ep->pid, &start, &zombie) || zombie || start != ep->start_time;
}

/* Whether the message at the head of ep's ring to us is there. */
static inline bool ring_ready(const gs_shm_ep *ep)
{
    return __atomic_load_n(&ep->rx->slots[ep->rx_head & RING_MASK].seq, __ATOMIC_ACQUIRE) == ep->rx_head + 1;
}

void gs_shm_check_peers(gs_shm_tp *tp)
{
    for (int p = 0; p < tp->base.size; p++) {
        gs_shm_ep *ep = &tp->peers[p];
        struct pollfd pfd = {.fd = ep->pidfd, .events = POLLIN};
        char why[160];
        if (p == tp->base.rank || ep->state != GS_SHM_EP_UP)
            continue;
        /* Closed cleanly (whether or not it has exited since) ... */
        if (__atomic_load_n(&gs_shm_state_of(ep->ctrl)->closed, __ATOMIC_ACQUIRE)) {
            ep->state = GS_SHM_EP_CLOSED;
            continue;
        }
        /* ... or exited without closing; closing may have raced with the check. */
        if (!peer_exited(ep, &pfd))
            continue;
        if (__atomic_load_n(&gs_shm_state_of(ep->ctrl)->closed, __ATOMIC_ACQUIRE)) {
            ep->state = GS_SHM_EP_CLOSED;
            continue;
        }
        /* what it sent before it died is taken first (a later check marks
         * it lost): its receives flushed now would drop those messages */
        if (ring_ready(ep) && !ep->stalled)
            continue;
        snprintf(why, sizeof(why), "its process %d exited without closing its transport", (int)ep->pid);
        ep_mark_lost(ep, why);
    }
    tp->next_check_ns = gs_now_ns() + CHECK_PERIOD_NS;
}

/* GS_ERR_PEER_LOST for the first lost peer, logged the first time only. */
static __attribute__((noinline)) gs_status lost_status(gs_shm_tp *tp)
{
    for (int p = 0; p < tp->base.size; p++) {
        gs_shm_ep *ep = &tp->peers[p];
        char text[320];
        if (p == tp->base.rank || ep->state != GS_SHM_EP_LOST)
            continue;
        if (!ep->lost_logged) {
            ep->lost_logged = true;
            return gs_fail_peer_lost(GS_SUBSYS_SHM, tp->base.rank, p, "%s", ep->lost_why);
        }
        gs_error_peer_lost_text(text, sizeof(text), tp->base.rank, p, ep->lost_why);
        gs_error_restore(text);
        return GS_ERR_PEER_LOST;
    }
    return GS_OK;
}

/* ---- ring: writer side -------------------------------------------------------- */

/* Whether the peer's reading of ep's ring to it, reported as pos, is news
 * after since: only forward, never past what was written (a peer's bad
 * value is ignored). */
static inline bool tx_ahead(const gs_shm_ep *ep, uint32_t since, uint32_t pos)
{
    return (int32_t)(pos - since) > 0 && (int32_t)(ep->tx_tail - pos) >= 0;
}

bool gs_shm_ring_room_reread(gs_shm_ep *ep, uint32_t nslots)
{
    uint32_t head = __atomic_load_n(&ep->tx->ctl.head, __ATOMIC_ACQUIRE);
    if (tx_ahead(ep, ep->tx_head, head))
        ep->tx_head = head;
    return ep->tx_tail + nslots - ep->tx_head <= GS_SHM_RING_SLOTS;
}

gs_status gs_shm_ring_full(const gs_shm_ep *ep)
{
    char text[200];
    snprintf(text, sizeof(text),
             "GS_ERR_AGAIN: rank %d: the notification ring to rank %d is full (%u slots); it must poll",
             ep->tp->base.rank, ep->base.peer, GS_SHM_RING_SLOTS);
    gs_error_restore(text);
    gs_log_debug(SHM, "%s", text);
    return GS_ERR_AGAIN;
}

void gs_shm_ring_wake(gs_shm_ep *ep)
{
    gs_shm_wake *w = gs_shm_wake_of(ep->ctrl);
    __atomic_fetch_add(&w->doorbell, 1, __ATOMIC_SEQ_CST);
    gs_futex(&w->doorbell, FUTEX_WAKE, INT_MAX, NULL); /* shared: no FUTEX_PRIVATE_FLAG */
}

gs_status gs_shm_ring_post(gs_shm_ep *ep, uint8_t type, uint32_t imm, uint32_t len, const void *payload)
{
    uint32_t nslots = type == GS_SHM_MSG_SEND ? GS_SHM_MSG_SLOTS(len) : 1u;
    uint32_t pos = ep->tx_tail, copied;
    gs_shm_slot *head = &ep->tx->slots[pos & RING_MASK];

    if (!gs_shm_ring_room(ep, nslots))
        return gs_shm_ring_full(ep);
    /* Continuation slots first, then the head slot, its seq last. */
    copied = type == GS_SHM_MSG_SEND && len > GS_SHM_HEAD_INLINE ? GS_SHM_HEAD_INLINE : 0;
    for (uint32_t i = 1; i < nslots; i++) {
        gs_shm_cont *c = (gs_shm_cont *)&ep->tx->slots[(pos + i) & RING_MASK];
        uint32_t chunk = len - copied < GS_SHM_CONT_INLINE ? len - copied : GS_SHM_CONT_INLINE;
        c->seq = pos + i + 1;
        memcpy(c->data, (const uint8_t *)payload + copied, chunk);
        copied += chunk;
    }
    head->type = type;
    head->nslots = (uint16_t)nslots;
    head->imm = imm;
    head->len = len;
    if (type == GS_SHM_MSG_SEND && len > 0)
        memcpy(head->data, payload, len < GS_SHM_HEAD_INLINE ? len : GS_SHM_HEAD_INLINE);
    gs_shm_ring_publish(ep, head, nslots);
    return GS_OK;
}

/* ---- ring: reader side ------------------------------------------------------ */

/* Copies a SEND's payload (head inline bytes, then continuation slots) out of the ring. */
static void ring_gather(const gs_shm_ep *ep, const gs_shm_slot *head, uint8_t *out)
{
    uint32_t len = head->len, copied = len < GS_SHM_HEAD_INLINE ? len : GS_SHM_HEAD_INLINE;
    if (len == 0)
        return; /* out may be NULL */
    memcpy(out, head->data, copied);
    for (uint32_t i = 1; copied < len; i++) {
        const gs_shm_cont *c = (const gs_shm_cont *)&ep->rx->slots[(ep->rx_head + i) & RING_MASK];
        uint32_t chunk = len - copied < GS_SHM_CONT_INLINE ? len - copied : GS_SHM_CONT_INLINE;
        memcpy(out + copied, c->data, chunk);
        copied += chunk;
    }
}

/* A SEND at the ring head: into a posted receive (1, *wc filled), buffered
 * (0), or left in the ring because nothing can take it yet (-1). */
static int take_send(gs_shm_ep *ep, const gs_shm_slot *head, gs_wc *wc)
{
    gs_shm_rbuf *r = gs_shm_recv_front(ep);
    uint8_t *copy;

    if (r) {
        *wc = (gs_wc){.wr_id = r->wr_id,
                      .status = GS_OK,
                      .opcode = GS_WC_RECV,
                      .len = head->len,
                      .peer = ep->base.peer};
        if (head->len > r->cap)
            wc->status = gs_fail(GS_SUBSYS_SHM, GS_ERR_OVERFLOW,
                                 "rank %d: a %u-byte SEND from rank %d does not fit the %zu-byte receive",
                                 ep->tp->base.rank, head->len, ep->base.peer, r->cap);
        else
            ring_gather(ep, head, r->buf);
        gs_shm_recv_pop(ep);
        return 1;
    }
    if (ep->unexp_count == GS_SHM_UNEXP_MAX || !(copy = malloc(head->len ? head->len : 1))) {
        ep->stalled = true;
        return -1;
    }
    ring_gather(ep, head, copy);
    gs_shm_unexp_push(ep, copy, head->len);
    return 0;
}

/* A WRITE_IMM: one slot, no flag but WRAP (the common case, tested inline). */
static inline bool slot_is_imm(const gs_shm_slot *s)
{
    return s->type == GS_SHM_MSG_WRITE_IMM && s->nslots == 1 && (s->flags & ~GS_SHM_SLOT_WRAP) == 0;
}

static bool slot_valid(const gs_shm_slot *s)
{
    return slot_is_imm(s) || (s->type == GS_SHM_MSG_SEND && (s->flags & ~GS_SHM_SLOT_WRAP) == 0 &&
                              s->len <= GS_SEND_MAX && s->nslots == GS_SHM_MSG_SLOTS(s->len));
}

/* The message at the ring head when it is not a plain WRITE_IMM: a SEND
 * (as take_send), or a malformed slot, which drops the endpoint (-1). */
static __attribute__((noinline)) int take_other(gs_shm_ep *ep, const gs_shm_slot *s, gs_wc *wc)
{
    if (slot_valid(s))
        return take_send(ep, s, wc);
    gs_log_error(SHM,
                 "rank %d: malformed notification from rank %d (type %u, %u slots, %u bytes); "
                 "dropping the endpoint",
                 ep->tp->base.rank, ep->base.peer, s->type, s->nslots, s->len);
    ep_mark_lost(ep, "it sent a malformed notification");
    ep->stalled = true; /* read nothing more from this ring */
    return -1;
}

/* Consumes the message s at the head of ep's ring: its ack says how far
 * the peer read our ring to it; then publishes how far we read. */
static inline void ring_consume(gs_shm_ep *ep, const gs_shm_slot *s)
{
    uint32_t head = ep->rx_head + s->nslots, ack = s->ack;
    if (tx_ahead(ep, ep->tx_acked, ack)) {
        ep->tx_acked = ack;
        if (tx_ahead(ep, ep->tx_head, ack))
            ep->tx_head = ack;
    }
    ep->rx_head = s->flags & GS_SHM_SLOT_WRAP ? GS_SHM_NEXT_LAP(head) : head;
    __atomic_store_n(&ep->rx->ctl.head, ep->rx_head, __ATOMIC_RELEASE);
}

/* Takes up to max completions from the rings, each drained in turn,
 * starting at a rotating one (fairness). */
static inline int rings_drain(gs_shm_tp *tp, gs_wc *wcs, int max)
{
    int n = 0, size = tp->base.size, rank = tp->base.rank, p = tp->rr, left = size;

    tp->rr = p + 1 < size ? p + 1 : 0;
    while (n < max && left > 0) {
        gs_shm_ep *ep = &tp->peers[p];
        const gs_shm_slot *s;
        int took = 1;
        if (p == rank || !ring_ready(ep) || ep->stalled) {
            p = p + 1 < size ? p + 1 : 0; /* this ring is done */
            left--;
            continue;
        }
        s = &ep->rx->slots[ep->rx_head & RING_MASK];
        if (__builtin_expect(slot_is_imm(s), 1))
            wcs[n] = (gs_wc){.status = GS_OK,
                             .opcode = GS_WC_RECV_IMM,
                             .imm = s->imm,
                             .len = s->len,
                             .peer = ep->base.peer};
        else
            took = take_other(ep, s, &wcs[n]);
        if (took >= 0) {
            n += took;
            ring_consume(ep, s);
        }
    }
    return n;
}

/* Whether a poll would return something: a local completion, a lost peer
 * to report, or a notification in a ring that is not stalled. */
static inline bool anything_ready(gs_shm_tp *tp)
{
    gs_shm_ep *peers = tp->peers;
    int size = tp->base.size, rank = tp->base.rank;

    if (tp->cq.count > 0 || tp->lost_count > 0)
        return true;
    for (int p = 0; p < size; p++)
        if (p != rank && ring_ready(&peers[p]) && !peers[p].stalled)
            return true;
    return false;
}

/* ---- poll and wait ------------------------------------------------------------- */

/* Every CHECK_EVERY_POLLS polls: the peers' liveness, once CHECK_PERIOD_NS passed. */
static __attribute__((noinline)) void poll_check_peers(gs_shm_tp *tp)
{
    if (gs_now_ns() >= tp->next_check_ns)
        gs_shm_check_peers(tp);
}

/* Takes what anything_ready said is there: local completions first, then
 * the rings; a lost peer's report when there is nothing to return. */
static gs_status poll_take(gs_shm_tp *tp, gs_wc *wcs, int max, int *n_p)
{
    int n = 0;

    if (tp->cq.count > 0)
        n = gs_shm_cq_take(tp, wcs, max);
    n += rings_drain(tp, wcs + n, max - n);
    if (__builtin_expect(n == 0 && tp->lost_count > 0, 0)) {
        gs_status st = lost_status(tp);
        if (st != GS_OK)
            return st;
    }
    *n_p = n;
    return GS_OK;
}

/* Every CHECK_EVERY_POLLS polls (and waits): the peers' liveness, at most
 * every CHECK_PERIOD_NS; before taking, so flushed receives come out now. */
static inline void poll_count_check(gs_shm_tp *tp)
{
    if (__builtin_expect(++tp->poll_count % CHECK_EVERY_POLLS == 0, 0))
        poll_check_peers(tp);
}

gs_status gs_shm_poll(gs_tp *base, gs_wc *wcs, int max, int *n_p)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);

    poll_count_check(tp);
    if (!anything_ready(tp)) { /* the idle poll: a few loads */
        *n_p = 0;
        return GS_OK;
    }
    return poll_take(tp, wcs, max, n_p);
}

/* Sleeps on the doorbell until a writer rings it, the slice ends or the deadline. */
static void sleep_until_rung(gs_shm_tp *tp, uint64_t deadline_ns)
{
    gs_shm_wake *w = gs_shm_wake_of(tp->ctrl);
    uint64_t now = gs_now_ns(), left = deadline_ns > now ? deadline_ns - now : 0;
    struct timespec ts;
    uint32_t bell;

    if (left > SLEEP_SLICE_NS)
        left = SLEEP_SLICE_NS;
    ts.tv_sec = (time_t)(left / 1000000000ull);
    ts.tv_nsec = (long)(left % 1000000000ull);
    __atomic_store_n(&w->waiting, 1, __ATOMIC_SEQ_CST);
    bell = __atomic_load_n(&w->doorbell, __ATOMIC_SEQ_CST);
    if (!anything_ready(tp) && left > 0)
        gs_futex(&w->doorbell, FUTEX_WAIT, bell, &ts);
    __atomic_store_n(&w->waiting, 0, __ATOMIC_RELAXED);
    gs_shm_check_peers(tp);
}

static gs_status wait_timeout(gs_shm_tp *tp, uint64_t started_ns)
{
    int up = 0;
    for (int p = 0; p < tp->base.size; p++)
        up += p != tp->base.rank && tp->peers[p].state == GS_SHM_EP_UP;
    return gs_fail_quiet(
        GS_SUBSYS_SHM, GS_ERR_TIMEOUT,
        "rank %d: no completion arrived within %llu ms (shm wait, GS_POLL=%s, %d of %d peers up); "
        "a peer may be stuck or waiting for this rank",
        tp->base.rank, (unsigned long long)((gs_now_ns() - started_ns) / 1000000ull),
        poll_mode_names[tp->base.cfg->poll], up, tp->base.size - 1);
}

/* How long a wait spins before it sleeps (GS_POLL, GS_SPIN_US). */
static uint64_t spin_budget_ns(const gs_config *cfg)
{
    if (cfg->poll == GS_POLL_SPIN)
        return UINT64_MAX;
    if (cfg->poll == GS_POLL_EVENT)
        return 0;
    return (uint64_t)(cfg->spin_us > 0 ? cfg->spin_us : 0) * 1000u;
}

/* Returns once a poll would find something (at once if it would now):
 * spinning on the rings' next seq words (a tight loop notices an arrival
 * sooner), looking at the clock every 64 turns for the deadline, the
 * peers' liveness, and when to yield or sleep (GS_POLL). */
static gs_status wait_for_news(gs_shm_tp *tp, uint64_t deadline_ns, uint64_t *start_p)
{
    int mode = tp->base.cfg->poll;

    for (uint32_t iter = 1; !anything_ready(tp); iter++) {
        uint64_t now;
        gs_cpu_relax();
        if ((iter & 63u) != 0 && mode != GS_POLL_EVENT)
            continue;
        now = gs_now_ns();
        if (!*start_p)
            *start_p = now; /* read lazily: a clock read costs as much as a cache-line transfer */
        if (now >= deadline_ns)
            return wait_timeout(tp, *start_p);
        if (now >= tp->next_check_ns)
            gs_shm_check_peers(tp); /* a loss or flushed receives end the loop */
        if (now - *start_p >= spin_budget_ns(tp->base.cfg)) {
            sleep_until_rung(tp, deadline_ns);
            return GS_OK;
        }
        /* Hybrid, past the first microseconds: let a rank that shares
         * this core run (with more ranks than cores, the one we wait
         * for may be it); returns at once when nobody else is ready. */
        if (mode == GS_POLL_HYBRID && now - *start_p >= YIELD_AFTER_NS)
            sched_yield();
    }
    return GS_OK;
}

gs_status gs_shm_wait(gs_tp *base, gs_wc *wcs, int max, int *n_p, uint64_t deadline_ns)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);
    uint64_t start = 0;

    for (;;) {
        int n = 0;
        gs_status st = wait_for_news(tp, deadline_ns, &start);
        if (st == GS_OK) {
            poll_count_check(tp);
            st = poll_take(tp, wcs, max, &n);
        }
        if (st != GS_OK)
            return st;
        if (n > 0) {
            *n_p = n;
            return GS_OK;
        }
    }
}
