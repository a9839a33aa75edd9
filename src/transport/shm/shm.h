/*
 * The shm transport's internal objects and the functions its files share.
 *
 *   shm_tp.c        open/close, control segment, connecting peers through the store
 *   shm_mr.c        regions: memfd segments, caller memory, the per-peer mapping cache
 *   shm_rma.c       write, write_imm, read, atomics, send (initiator side)
 *   shm_cq.c        local completion queue, posted receives, unexpected sends
 *   shm_progress.c  notification rings, peer liveness, poll and wait (spin/event/hybrid)
 *
 * A gs_tp is driven by one thread at a time (like a verbs QP + CQ pair
 * without locks). All ops complete at post time except arriving
 * notifications, which poll/wait deliver.
 */
#ifndef GS_SHM_H
#define GS_SHM_H

#include "transport/shm/shm_proto.h"
#include "transport/tp.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

typedef struct gs_shm_tp gs_shm_tp;

/* A peer region mapped into this process, cached by key. */
typedef struct gs_shm_map {
    uint64_t key; /* 0: empty bucket */
    uint32_t slot;
    uint32_t access; /* the region's, as registered (fixed while its key lives) */
    uint64_t region_len;
    void *base;
    size_t len; /* mapped bytes (the region rounded up to pages) */
} gs_shm_map;

typedef struct gs_shm_map_cache {
    gs_shm_map *buckets; /* open addressing, power-of-two count */
    size_t cap;
    size_t count;
    gs_shm_map *last; /* the last hit, checked first */
} gs_shm_map_cache;

/* A posted receive or a buffered SEND that arrived before one was posted. */
typedef struct gs_shm_rbuf {
    void *buf;
    size_t cap;
    uint64_t wr_id;
} gs_shm_rbuf;

typedef struct gs_shm_unexp {
    uint8_t *data; /* malloc'd copy of the payload */
    uint32_t len;
} gs_shm_unexp;

#define GS_SHM_UNEXP_MAX 64 /* then the ring stalls until a receive is posted */

/* ABSENT: a rank of another host, in an instance opened for this host's
 * ranks only (gs_shm_open_host): no endpoint, its ring here stays empty. */
typedef enum gs_shm_ep_state {
    GS_SHM_EP_UP = 0,
    GS_SHM_EP_CLOSED,
    GS_SHM_EP_LOST,
    GS_SHM_EP_ABSENT
} gs_shm_ep_state;

typedef struct gs_shm_ep {
    gs_ep base;
    gs_shm_tp *tp;
    gs_shm_ep_state state;
    pid_t pid;
    int pidfd;           /* readable once the peer process has exited; -1 without pidfd_open */
    uint64_t start_time; /* without a pidfd: the process's start time (/proc/<pid>/stat) */
    void *ctrl;          /* the peer's control segment, mapped */
    size_t ctrl_len;
    gs_shm_region *regions; /* the peer's region table, in ctrl */
    gs_shm_ring *tx;        /* in the peer's segment: my notifications to it */
    gs_shm_ring *rx;        /* in my segment: its notifications to me */
    uint32_t tx_tail;       /* position of my next message in tx */
    uint32_t tx_head;       /* the peer's consumption of tx, last read or acked */
    uint32_t tx_acked;      /* the peer's consumption of tx, as its last ack said */
    uint32_t rx_head;       /* position of its next message in rx (what I consumed) */
    gs_shm_map_cache maps;
    /* posted receives and buffered sends: FIFO rings that grow */
    gs_shm_rbuf *recvs;
    size_t recv_cap, recv_first, recv_count;
    gs_shm_unexp unexp[GS_SHM_UNEXP_MAX];
    size_t unexp_first, unexp_count;
    bool stalled;     /* a SEND waits in rx for a receive (unexpected queue full) */
    bool lost_logged; /* the loss was logged once; later reports stay quiet */
    char lost_why[160];
} gs_shm_ep;

typedef struct gs_shm_mr {
    gs_mr base;
    struct gs_shm_mr *next, *prev; /* every region of the tp, freed at close */
    int kind;                      /* GS_SHM_REGION_* */
    int fd;                        /* MEMFD: the memfd; -1 otherwise */
    uint32_t slot;
    uint64_t key;
    size_t map_len;
} gs_shm_mr;

/* The local completion queue: a ring of gs_wc that doubles when full. */
typedef struct gs_shm_cq {
    gs_wc *wcs;
    size_t cap, first, count;
} gs_shm_cq;

struct gs_shm_tp {
    gs_tp base;
    gs_shm_ep *peers; /* [size]; peers[rank] unused */
    int ctrl_fd;
    void *ctrl;
    size_t ctrl_len;
    uint64_t key_seed;
    uint64_t key_count;
    uint32_t *free_slots; /* stack of free region-table slots */
    uint32_t free_count;
    uint32_t next_slot; /* slots never used start here */
    gs_shm_mr *mrs;
    gs_shm_cq cq;
    bool cma_ok;
    bool host_only; /* connects the ranks of this host only (gs_shm_open_host) */
    char cma_why[160];
    uint32_t poll_count;    /* liveness is checked every so many polls ... */
    uint64_t next_check_ns; /* ... once this time has passed */
    int rr;                 /* ring the next poll starts at */
    int lost_count;         /* endpoints in GS_SHM_EP_LOST */
};

/* Views into a control segment. */
static inline gs_shm_ctrl_head *gs_shm_head(void *ctrl)
{
    return (gs_shm_ctrl_head *)ctrl;
}
static inline gs_shm_wake *gs_shm_wake_of(void *ctrl)
{
    return (gs_shm_wake *)((char *)ctrl + GS_SHM_WAKE_OFF);
}
static inline gs_shm_state *gs_shm_state_of(void *ctrl)
{
    return (gs_shm_state *)((char *)ctrl + GS_SHM_STATE_OFF);
}
static inline gs_shm_ring *gs_shm_ring_of(void *ctrl, int src)
{
    return (gs_shm_ring *)((char *)ctrl + GS_SHM_RING_OFF + (size_t)src * sizeof(gs_shm_ring));
}
static inline gs_shm_region *gs_shm_regions_of(void *ctrl)
{
    return (gs_shm_region *)((char *)ctrl + gs_shm_head(ctrl)->region_off);
}
static inline gs_shm_tp *gs_shm_tp_of(gs_tp *tp)
{
    return (gs_shm_tp *)tp;
}
static inline gs_shm_ep *gs_shm_ep_of(gs_ep *ep)
{
    return (gs_shm_ep *)ep;
}
/* Bytes of a control segment for size ranks. */
size_t gs_shm_ctrl_bytes(int size);

/* ---- shm_tp.c: creation in steps, so tests can connect ranks without a store */
gs_status gs_shm_tp_create(const gs_config *cfg, int rank, int size, gs_shm_tp **tp_p);
void gs_shm_tp_addr(const gs_shm_tp *tp, const char *host_id, gs_shm_addr *addr_p);
/* Maps every peer's control segment from addrs[size]; fills ready_p either way. */
gs_status gs_shm_tp_connect(gs_shm_tp *tp, const gs_shm_addr *addrs, gs_shm_ready *ready_p);
/* Applies every rank's ready record: fails if any rank failed. */
gs_status gs_shm_tp_finish(gs_shm_tp *tp, const gs_shm_ready *readies);
/* Opens memfd number fd of process pid (rank peer) through /proc and checks
 * its inode; what names it in errors. */
gs_status gs_shm_open_peer_fd(int rank, int peer, pid_t pid, int fd, uint64_t ino, const char *what,
                              int *fd_p);

/* ---- shm_mr.c */
/* ops->map: the peer's allocated region d, mapped for the caller (its own
 * mapping, outside the endpoint's cache); ops->unmap gives it back. */
gs_status gs_shm_map_region(gs_ep *ep, const gs_rmr_head *d, void **addr_p, size_t *len_p);
void gs_shm_unmap_region(gs_tp *tp, void *addr, size_t len);
void gs_shm_maps_clear(gs_shm_map_cache *cache);

/* Where an op lands in the target: checked against the owner's table. */
typedef struct gs_shm_target {
    int kind;
    uint8_t *ptr;         /* MEMFD: byte off of the region in this process's mapping */
    uint64_t remote_addr; /* USER: the owner's address of byte off */
} gs_shm_target;

/* gs_shm_target_get's full check (any region, mapped or not, and every
 * failure); the inline function below takes the last region used. */
gs_status gs_shm_target_lookup(gs_shm_ep *ep, const gs_rmr_head *d, uint64_t off, uint64_t len, unsigned need,
                               const char *op, gs_shm_target *t_p);

/* Checks descriptor d against the owner's region table (key, bounds,
 * need = GS_ACCESS_* bits) and maps it on first use. GS_ERR_REMOTE_ACCESS
 * touches nothing; a post on an endpoint that is not up is
 * GS_ERR_PEER_LOST. op names the operation in the error.
 * Inline fast path: the region this endpoint used last (the cache's last
 * hit), still registered under this key (one load of the owner's record),
 * with the bounds and permission it was mapped with. */
static inline gs_status gs_shm_target_get(gs_shm_ep *ep, const gs_rmr_head *d, uint64_t off, uint64_t len,
                                          unsigned need, const char *op, gs_shm_target *t_p)
{
    const gs_shm_map *m = ep->maps.last;
    uint32_t slot;

    memcpy(&slot, d->tail + offsetof(gs_shm_rmr_tail, slot), sizeof(slot));
    if (__builtin_expect(ep->state == GS_SHM_EP_UP && m && m->key == d->key && m->slot == slot &&
                             __atomic_load_n(&ep->regions[m->slot].key, __ATOMIC_ACQUIRE) == d->key &&
                             gs_tp_in_bounds(off, len, m->region_len) && (m->access & need) == need,
                         1)) {
        *t_p = (gs_shm_target){.kind = GS_SHM_REGION_MEMFD, .ptr = (uint8_t *)m->base + off};
        return GS_OK;
    }
    return gs_shm_target_lookup(ep, d, off, len, need, op, t_p);
}

/* ---- the data-path ops: gs_shm_buf_alloc, _mr_reg, _mr_dereg, _mr_pack
 * (shm_mr.c), gs_shm_write ... gs_shm_send (shm_rma.c), gs_shm_recv (shm_cq.c) */
GS_TP_DATA_OPS_DECLARE(gs_shm);
/* ---- the control ops: gs_shm_caps, _close, _ep_error, _describe (shm_tp.c),
 * gs_shm_poll, _wait (shm_progress.c) */
GS_TP_CONTROL_OPS_DECLARE(gs_shm);

/* ---- shm_cq.c */
/* Makes room for one more local completion (so pushing it cannot fail). */
gs_status gs_shm_cq_reserve(gs_shm_tp *tp);
/* Queues a completion; gs_shm_cq_reserve must have made room. */
void gs_shm_cq_push(gs_shm_tp *tp, const gs_wc *wc);
int gs_shm_cq_take(gs_shm_tp *tp, gs_wc *wcs, int max);
void gs_shm_cq_free(gs_shm_cq *cq);
/* The oldest posted receive (NULL if none), and taking it off the queue. */
gs_shm_rbuf *gs_shm_recv_front(gs_shm_ep *ep);
void gs_shm_recv_pop(gs_shm_ep *ep);
/* Keeps a SEND that arrived before a receive was posted (data: malloc'd,
 * owned by the queue from now on). false when GS_SHM_UNEXP_MAX are held. */
bool gs_shm_unexp_push(gs_shm_ep *ep, uint8_t *data, uint32_t len);
/* Completes posted receives of a lost endpoint with GS_ERR_FLUSHED. */
void gs_shm_flush_recvs(gs_shm_ep *ep);
void gs_shm_ep_queues_free(gs_shm_ep *ep);

/* ---- shm_progress.c */
/* Appends a message to ep's ring in the peer's segment and wakes the peer
 * if it sleeps. GS_ERR_AGAIN if the ring has no room. */
gs_status gs_shm_ring_post(gs_shm_ep *ep, uint8_t type, uint32_t imm, uint32_t len, const void *payload);
/* gs_shm_ring_room when the ring looks full: re-reads the reader's head. */
bool gs_shm_ring_room_reread(gs_shm_ep *ep, uint32_t nslots);
/* Bumps the peer's doorbell and calls FUTEX_WAKE (it said it sleeps). */
void gs_shm_ring_wake(gs_shm_ep *ep);

/* Whether the ring to ep's peer has room for a message of nslots; the
 * reader's head is re-read only when the ring looks full. */
static inline bool gs_shm_ring_room(gs_shm_ep *ep, uint32_t nslots)
{
    return __builtin_expect(ep->tx_tail + nslots - ep->tx_head <= GS_SHM_RING_SLOTS, 1) ||
           gs_shm_ring_room_reread(ep, nslots);
}

/* Past this many slots of a lap the writer goes back to slot 0 (WRAP)
 * when the peer's last ack says it is at most a quarter of them behind
 * (a ping-pong, not a stream), so that a ping-pong cycles through a few
 * lines: once the lines a process cycles through outgrow L1, each message
 * costs up to one more cache-line transfer. */
#define GS_SHM_RING_HOT 32u
/* One lap in this many (the last of each run) is written through, without
 * WRAP, so that every slot's seq is rewritten long before positions, counted
 * mod 2^32, could come back to a value a skipped slot still holds (after
 * 2^21 laps of 2048 slots); the lap ending at 2^32 is one of them. */
#define GS_SHM_FULL_LAP_EVERY 65536u

/* Publishes the head slot at the ring's tail, whose other fields (and
 * continuation slots) are written: flags and ack, then seq last, seq_cst
 * so that it is ordered before the load of the peer's waiter flag (which
 * pairs with the sleeper's store of that flag before its last look). */
static inline void gs_shm_ring_publish(gs_shm_ep *ep, gs_shm_slot *head, uint32_t nslots)
{
    uint32_t pos = ep->tx_tail, next = pos + nslots;
    bool wrap = (next & (GS_SHM_RING_SLOTS - 1u)) >= GS_SHM_RING_HOT &&
                next - ep->tx_acked <= GS_SHM_RING_HOT / 4 &&
                next / GS_SHM_RING_SLOTS % GS_SHM_FULL_LAP_EVERY != GS_SHM_FULL_LAP_EVERY - 1;

    head->flags = wrap ? GS_SHM_SLOT_WRAP : 0;
    head->ack = ep->rx_head;
    __atomic_store_n(&head->seq, pos + 1, __ATOMIC_SEQ_CST);
    ep->tx_tail = wrap ? GS_SHM_NEXT_LAP(next) : next;
    if (__builtin_expect(__atomic_load_n(&gs_shm_wake_of(ep->ctrl)->waiting, __ATOMIC_SEQ_CST) != 0, 0))
        gs_shm_ring_wake(ep);
}

/* Posts a WRITE_IMM notification: one slot. gs_shm_ring_room must have said yes. */
static inline void gs_shm_ring_post_imm(gs_shm_ep *ep, uint32_t imm, uint32_t len)
{
    gs_shm_slot *s = &ep->tx->slots[ep->tx_tail & (GS_SHM_RING_SLOTS - 1u)];
    s->type = GS_SHM_MSG_WRITE_IMM;
    s->nslots = 1;
    s->imm = imm;
    s->len = len;
    gs_shm_ring_publish(ep, s, 1);
}

/* GS_ERR_AGAIN with gs_last_error() saying which ring is full (not logged: flow control). */
gs_status gs_shm_ring_full(const gs_shm_ep *ep);
/* GS_ERR_PEER_LOST for a post on an endpoint that is not up, naming the peer. */
gs_status gs_shm_ep_down(gs_shm_ep *ep, const char *op);
/* The endpoint's state for a post (inline: on every op's path). */
static inline gs_status gs_shm_ep_check(gs_shm_ep *ep, const char *op)
{
    return __builtin_expect(ep->state == GS_SHM_EP_UP, 1) ? GS_OK : gs_shm_ep_down(ep, op);
}
/* Checks every peer's process now; marks the lost and closed ones. */
void gs_shm_check_peers(gs_shm_tp *tp);
/* The start time of process pid (field 22 of /proc/<pid>/stat) and whether
 * it is a zombie; false if it is gone. */
bool gs_shm_proc_stat(pid_t pid, uint64_t *start_p, bool *zombie_p);

#endif
