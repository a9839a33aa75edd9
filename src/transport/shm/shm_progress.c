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
    return gs_fail(GS_SUBSYS_SHM, GS_ERR_PEER_LOST, "rank %d: %s to rank %d: %s", ep->tp->base.rank, op,
                   ep->base.peer, ep->lost_why);
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
        snprintf(why, sizeof(why), "peer rank %d (pid %d) exited without closing its transport", p,
                 (int)ep->pid);
        ep_mark_lost(ep, why);
    }
    tp->next_check_ns = gs_now_ns() + CHECK_PERIOD_NS;
}

/* GS_ERR_PEER_LOST for the first lost peer, logged the first time only. */
static gs_status lost_status(gs_shm_tp *tp)
{
    for (int p = 0; p < tp->base.size; p++) {
        gs_shm_ep *ep = &tp->peers[p];
        char text[320];
        if (p == tp->base.rank || ep->state != GS_SHM_EP_LOST)
            continue;
        if (!ep->lost_logged) {
            ep->lost_logged = true;
            return gs_fail(GS_SUBSYS_SHM, GS_ERR_PEER_LOST, "rank %d: %s", tp->base.rank, ep->lost_why);
        }
        snprintf(text, sizeof(text), "GS_ERR_PEER_LOST: rank %d: %s", tp->base.rank, ep->lost_why);
        gs_error_restore(text);
        return GS_ERR_PEER_LOST;
    }
    return GS_OK;
}

/* ---- ring: writer side -------------------------------------------------------- */

bool gs_shm_ring_room(gs_shm_ep *ep, uint32_t nslots)
{
    if (ep->tx_tail + nslots - ep->tx_head <= GS_SHM_RING_SLOTS)
        return true;
    ep->tx_head = __atomic_load_n(&ep->tx->ctl.head, __ATOMIC_ACQUIRE);
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

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, word, op, val, ts, NULL, 0); /* shared: no FUTEX_PRIVATE_FLAG */
}

/* Wakes the peer if it said it sleeps (store of seq before this load: seq_cst). */
static void wake_peer(gs_shm_ep *ep)
{
    gs_shm_wake *w = gs_shm_wake_of(ep->ctrl);
    if (__atomic_load_n(&w->waiting, __ATOMIC_SEQ_CST)) {
        __atomic_fetch_add(&w->doorbell, 1, __ATOMIC_SEQ_CST);
        futex(&w->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    }
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
    __atomic_store_n(&head->seq, pos + 1, __ATOMIC_SEQ_CST);
    ep->tx_tail = pos + nslots;
    wake_peer(ep);
    return GS_OK;
}

/* ---- ring: reader side ------------------------------------------------------ */

static inline bool ring_ready(const gs_shm_ep *ep)
{
    return __atomic_load_n(&ep->rx->slots[ep->rx_head & RING_MASK].seq, __ATOMIC_ACQUIRE) == ep->rx_head + 1;
}

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

static bool slot_valid(const gs_shm_slot *s)
{
    return (s->type == GS_SHM_MSG_WRITE_IMM && s->nslots == 1) ||
           (s->type == GS_SHM_MSG_SEND && s->len <= GS_SEND_MAX && s->nslots == GS_SHM_MSG_SLOTS(s->len));
}

/* Takes up to max completions from ep's ring. */
static int ring_drain(gs_shm_ep *ep, gs_wc *wcs, int max)
{
    int n = 0;
    while (n < max && !ep->stalled && ring_ready(ep)) {
        const gs_shm_slot *s = &ep->rx->slots[ep->rx_head & RING_MASK];
        int took = 1;
        if (!slot_valid(s)) {
            gs_log_error(SHM,
                         "rank %d: malformed notification from rank %d (type %u, %u slots, %u bytes); "
                         "dropping the endpoint",
                         ep->tp->base.rank, ep->base.peer, s->type, s->nslots, s->len);
            ep_mark_lost(ep, "it sent a malformed notification");
            ep->stalled = true; /* read nothing more from this ring */
            break;
        }
        if (s->type == GS_SHM_MSG_WRITE_IMM)
            wcs[n] = (gs_wc){.status = GS_OK,
                             .opcode = GS_WC_RECV_IMM,
                             .imm = s->imm,
                             .len = s->len,
                             .peer = ep->base.peer};
        else
            took = take_send(ep, s, &wcs[n]);
        if (took < 0)
            break;
        n += took;
        ep->rx_head += s->nslots;
    }
    if (ep->rx_head != ep->rx_published) {
        __atomic_store_n(&ep->rx->ctl.head, ep->rx_head, __ATOMIC_RELEASE);
        ep->rx_published = ep->rx_head;
    }
    return n;
}

/* Whether a poll would find something (for the sleeper's last look). */
static bool anything_ready(gs_shm_tp *tp)
{
    if (tp->cq.count > 0)
        return true;
    for (int p = 0; p < tp->base.size; p++) {
        gs_shm_ep *ep = &tp->peers[p];
        if (p != tp->base.rank && !ep->stalled && ring_ready(ep))
            return true;
    }
    return false;
}

/* ---- poll and wait ------------------------------------------------------------- */

gs_status gs_shm_poll(gs_tp *base, gs_wc *wcs, int max, int *n_p)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);
    int n, size = base->size;

    if ((++tp->poll_count % CHECK_EVERY_POLLS) == 0 && gs_now_ns() >= tp->next_check_ns)
        gs_shm_check_peers(tp); /* before taking: flushed receives come out now */
    n = tp->cq.count ? gs_shm_cq_take(tp, wcs, max) : 0;
    for (int i = 0, p = tp->rr; i < size && n < max; i++) { /* start at a rotating ring: fairness */
        if (p != base->rank)
            n += ring_drain(&tp->peers[p], wcs + n, max - n);
        if (++p == size)
            p = 0;
    }
    if (++tp->rr == size)
        tp->rr = 0;
    if (n == 0 && tp->lost_count) {
        gs_status st = lost_status(tp);
        if (st != GS_OK)
            return st;
    }
    *n_p = n;
    return GS_OK;
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
        futex(&w->doorbell, FUTEX_WAIT, bell, &ts);
    __atomic_store_n(&w->waiting, 0, __ATOMIC_RELAXED);
    gs_shm_check_peers(tp);
}

static gs_status wait_timeout(gs_shm_tp *tp, uint64_t started_ns)
{
    int up = 0;
    for (int p = 0; p < tp->base.size; p++)
        up += p != tp->base.rank && tp->peers[p].state == GS_SHM_EP_UP;
    return gs_fail(GS_SUBSYS_SHM, GS_ERR_TIMEOUT,
                   "rank %d: no completion arrived within %llu ms (shm wait, GS_POLL=%s, %d of %d peers up); "
                   "a peer may be stuck or waiting for this rank",
                   tp->base.rank, (unsigned long long)((gs_now_ns() - started_ns) / 1000000ull),
                   poll_mode_names[tp->base.cfg->poll], up, tp->base.size - 1);
}

gs_status gs_shm_wait(gs_tp *base, gs_wc *wcs, int max, int *n_p, uint64_t deadline_ns)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);
    int mode = base->cfg->poll;
    uint64_t start = 0; /* read lazily: a clock read costs as much as a cache-line transfer */
    uint64_t spin_ns = mode == GS_POLL_SPIN ? UINT64_MAX
                       : mode == GS_POLL_EVENT
                           ? 0
                           : (uint64_t)(base->cfg->spin_us > 0 ? base->cfg->spin_us : 0) * 1000u;

    for (;;) {
        int n = 0;
        gs_status st = gs_shm_poll(base, wcs, max, &n);
        if (st != GS_OK)
            return st;
        if (n > 0) {
            *n_p = n;
            return GS_OK;
        }
        /* Spin on the rings' next seq words only (a tight loop notices an
         * arrival sooner), looking at the clock every 64 turns. */
        for (uint32_t iter = 1; !anything_ready(tp); iter++) {
            gs_cpu_relax();
            if ((iter & 63u) != 0 && mode != GS_POLL_EVENT)
                continue;
            uint64_t now = gs_now_ns();
            if (!start)
                start = now;
            if (now >= deadline_ns)
                return wait_timeout(tp, start);
            if (now >= tp->next_check_ns) {
                gs_shm_check_peers(tp);
                if (tp->lost_count || tp->cq.count)
                    break; /* let poll report the loss or the flushed receives */
            }
            if (now - start >= spin_ns) {
                sleep_until_rung(tp, deadline_ns);
                break;
            }
            /* Hybrid, past the first microseconds: let a rank that shares
             * this core run (with more ranks than cores, the one we wait
             * for may be it); returns at once when nobody else is ready. */
            if (mode == GS_POLL_HYBRID && now - start >= YIELD_AFTER_NS)
                sched_yield();
        }
    }
}
