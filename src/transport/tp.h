/*
 * The transport contract: one small ops table that shm, tcp and verbs
 * implement, and the base objects they extend (each backend's tp, ep and mr
 * structs start with struct gs_tp / gs_ep / gs_mr).
 *
 * The generic layer (tp.c) checks arguments that do not need the peer
 * (lengths, the local buffer inside its region, 8-byte alignment of atomics,
 * the descriptor's version and transport) before calling a backend; the
 * backend checks the remote side (key, bounds, permission) at the target, or
 * at the initiator where it maps the target's memory (shm).
 *
 * A transport knows nothing of the layers above it (collectives, parameter
 * server); they know it only through this table and its capabilities.
 * docs/transport.md is this contract for readers.
 *
 * Rules every backend keeps:
 *  - post ops (write ... send, recv) never block on the network: they queue
 *    and return; GS_ERR_AGAIN when the send queue is full.
 *  - a call that returns an error never completes later.
 *  - exactly one completion per signaled op, one per arriving WRITE_IMM and
 *    one per arriving SEND (consuming a posted recv); unsignaled ops complete
 *    silently, errors on them are reported on the next signaled completion
 *    of the endpoint and the endpoint enters error.
 *  - RC ordering per endpoint: a WRITE_IMM or SEND seen at the target implies
 *    every earlier WRITE of that endpoint is visible there.
 *  - after an endpoint error, every later op on it completes (or returns) with
 *    GS_ERR_FLUSHED; a dead peer surfaces as GS_ERR_PEER_LOST within
 *    GS_TIMEOUT_MS, never a hang.
 *  - peer loss, precisely: what the peer delivered before it died is still
 *    delivered; its endpoint's posted receives complete with GS_ERR_FLUSHED;
 *    then poll and wait return GS_ERR_PEER_LOST (gs_last_error() naming the
 *    peer rank) whenever they have no completion to return, and posts to
 *    that endpoint return GS_ERR_PEER_LOST. A peer that closed its transport
 *    cleanly is not lost: posts to it return GS_ERR_PEER_LOST, waits only
 *    time out.
 *  - a GS_WC_RECV_IMM completion carries wr_id 0 (no receive is consumed).
 *  - a gs_tp is driven by one thread at a time.
 */
#ifndef GS_TRANSPORT_TP_H
#define GS_TRANSPORT_TP_H

#include "gradsync.h"
#include "util/config.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct gs_tp_ops gs_tp_ops;

struct gs_tp {
    const gs_tp_ops *ops;
    gs_ctx *ctx;
    const gs_config *cfg;
    int rank;
    int size;
    gs_ep **eps; /* [size], NULL at rank; filled by the backend's open */
};

struct gs_ep {
    gs_tp *tp;
    int peer;
};

struct gs_mr {
    gs_tp *tp;
    void *addr;
    size_t len;
    unsigned access;
    bool owned; /* allocated by gs_mr_alloc: freed by dereg */
};

/* The common head of every serialized descriptor; the backend's own part
 * follows in tail. Fixed-width fields, little-endian host order (every
 * supported host is little-endian). */
#define GS_RMR_VERSION 1
typedef struct gs_rmr_head {
    uint8_t version;   /* GS_RMR_VERSION */
    uint8_t transport; /* GS_TRANSPORT_SHM / _TCP / _VERBS */
    uint8_t access;    /* gs_access bits */
    uint8_t pad;
    uint32_t owner; /* rank that registered it */
    uint64_t addr;  /* owner's virtual address of byte 0 */
    uint64_t len;
    uint64_t key; /* backend key (shm: region id, tcp: region id, verbs: rkey) */
    uint8_t tail[GS_RMR_BYTES - 32];
} gs_rmr_head;
_Static_assert(sizeof(gs_rmr_head) == GS_RMR_BYTES, "descriptor must fill the blob exactly");

/* Capabilities a backend may lack; the conformance suite skips (counted)
 * what is missing, and the layers above choose by them, never by name. */
enum {
    GS_TP_CAP_USER_MEM = 1u << 0,   /* gs_mr_reg of arbitrary memory */
    GS_TP_CAP_ATOMIC = 1u << 1,     /* FETCH_ADD / CMP_SWAP */
    GS_TP_CAP_LOCAL_MAP = 1u << 2,  /* every peer runs on this host and its memory is mapped here: an
                                     * operation is a memcpy, no network in between, and a peer's
                                     * allocated region can be mapped for loads and stores (map; shm) */
    GS_TP_CAP_ZCOPY_SEND = 1u << 3, /* GS_OP_ZCOPY lets a large payload leave by reference, and registering
                                     * caller memory is a table entry, not pinned pages (tcp) */
    GS_TP_CAP_SEND_COPY = 1u << 4,  /* a SEND's payload is copied before gs_ep_send returns: the source
                                     * may be reused at once, and an unsignaled SEND needs no
                                     * completion to free it (shm: into the peer's ring) */
};

/* How far a peer is, in classes an ops table states (the layers above
 * choose algorithms and chunk sizes by them, never by the transport's name):
 * what one small message costs, and what bounds a large one. */
typedef enum gs_tp_latency {
    GS_TP_LAT_MEMORY, /* loads and stores on this host: a notification is a cache-line transfer (< 1 us) */
    GS_TP_LAT_RDMA,   /* a NIC, the kernel off the data path: a few us */
    GS_TP_LAT_KERNEL, /* sockets through the kernel's network stack: tens of us, a system call each side */
} gs_tp_latency;
typedef enum gs_tp_bandwidth {
    GS_TP_BW_MEMORY,  /* copies between this host's processes: memory bandwidth */
    GS_TP_BW_NETWORK, /* a network link's: several times less, per host */
} gs_tp_bandwidth;
typedef struct gs_tp_reach {
    gs_tp_latency latency;
    gs_tp_bandwidth bandwidth;
} gs_tp_reach;

/* How a large payload posted with GS_OP_ZCOPY leaves (ops->zcopy_mode). */
typedef enum gs_tp_zcopy_mode {
    GS_TP_ZCOPY_NEVER,  /* copied, whatever the flag says: the flag is not worth setting */
    GS_TP_ZCOPY_ALWAYS, /* the caller asked for references (e.g. GS_TCP_ZCOPY=on): set the flag */
    GS_TP_ZCOPY_TIMED,  /* either may be faster, depending on where the processes run: the caller
                         * times both and keeps the faster (coll/zcopy.c) */
} gs_tp_zcopy_mode;

/* The data-path ops, the same eleven in every backend and named by it:
 * <prefix>_buf_alloc, _mr_reg, _mr_dereg, _mr_pack, _write, _write_imm,
 * _read, _fetch_add, _cmp_swap, _send, _recv. GS_TP_DATA_OPS_DECLARE(prefix)
 * in the backend's header declares them with the table's signatures (one
 * place for the signatures); GS_TP_DATA_OPS(prefix) in its ops table fills
 * those fields. */
typedef gs_status gs_tp_buf_alloc_fn(gs_tp *tp, size_t len, unsigned access, gs_mr **mr_p);
typedef gs_status gs_tp_mr_reg_fn(gs_tp *tp, void *addr, size_t len, unsigned access, gs_mr **mr_p);
typedef gs_status gs_tp_mr_dereg_fn(gs_mr *mr);
typedef void gs_tp_mr_pack_fn(const gs_mr *mr, gs_rmr_head *head);
typedef gs_status gs_tp_write_fn(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                                 uint64_t off, uint64_t wr_id, unsigned flags);
typedef gs_status gs_tp_write_imm_fn(gs_ep *ep, const void *src, gs_mr *lmr, size_t len,
                                     const gs_rmr_head *dst, uint64_t off, uint32_t imm, uint64_t wr_id,
                                     unsigned flags);
typedef gs_status gs_tp_read_fn(gs_ep *ep, void *dst, gs_mr *lmr, size_t len, const gs_rmr_head *src,
                                uint64_t off, uint64_t wr_id, unsigned flags);
typedef gs_status gs_tp_fetch_add_fn(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst,
                                     uint64_t off, uint64_t add, uint64_t wr_id, unsigned flags);
typedef gs_status gs_tp_cmp_swap_fn(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst,
                                    uint64_t off, uint64_t compare, uint64_t swap, uint64_t wr_id,
                                    unsigned flags);
typedef gs_status gs_tp_send_fn(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id,
                                unsigned flags);
typedef gs_status gs_tp_recv_fn(gs_ep *ep, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id);

#define GS_TP_DATA_OPS_DECLARE(prefix)                                                                       \
    gs_tp_buf_alloc_fn prefix##_buf_alloc;                                                                   \
    gs_tp_mr_reg_fn prefix##_mr_reg;                                                                         \
    gs_tp_mr_dereg_fn prefix##_mr_dereg;                                                                     \
    gs_tp_mr_pack_fn prefix##_mr_pack;                                                                       \
    gs_tp_write_fn prefix##_write;                                                                           \
    gs_tp_write_imm_fn prefix##_write_imm;                                                                   \
    gs_tp_read_fn prefix##_read;                                                                             \
    gs_tp_fetch_add_fn prefix##_fetch_add;                                                                   \
    gs_tp_cmp_swap_fn prefix##_cmp_swap;                                                                     \
    gs_tp_send_fn prefix##_send;                                                                             \
    gs_tp_recv_fn prefix##_recv

#define GS_TP_DATA_OPS(prefix)                                                                               \
    .buf_alloc = prefix##_buf_alloc, .mr_reg = prefix##_mr_reg, .mr_dereg = prefix##_mr_dereg,               \
    .mr_pack = prefix##_mr_pack, .write = prefix##_write, .write_imm = prefix##_write_imm,                   \
    .read = prefix##_read, .fetch_add = prefix##_fetch_add, .cmp_swap = prefix##_cmp_swap,                   \
    .send = prefix##_send, .recv = prefix##_recv

/* The control ops, the same six in every backend and named by it the same
 * way: <prefix>_caps, _close, _poll, _wait, _ep_error, _describe.
 * GS_TP_CONTROL_OPS_DECLARE(prefix) and GS_TP_CONTROL_OPS(prefix) as for the
 * data path. */
typedef unsigned gs_tp_caps_fn(const gs_tp *tp);
typedef gs_status gs_tp_close_fn(gs_tp *tp);
typedef gs_status gs_tp_poll_fn(gs_tp *tp, gs_wc *wcs, int max, int *n_p);
typedef gs_status gs_tp_wait_fn(gs_tp *tp, gs_wc *wcs, int max, int *n_p, uint64_t deadline_ns);
typedef gs_status gs_tp_ep_error_fn(gs_ep *ep, char *buf, size_t cap);
typedef void gs_tp_describe_fn(const gs_tp *tp, char *buf, size_t cap);

#define GS_TP_CONTROL_OPS_DECLARE(prefix)                                                                    \
    gs_tp_caps_fn prefix##_caps;                                                                             \
    gs_tp_close_fn prefix##_close;                                                                           \
    gs_tp_poll_fn prefix##_poll;                                                                             \
    gs_tp_wait_fn prefix##_wait;                                                                             \
    gs_tp_ep_error_fn prefix##_ep_error;                                                                     \
    gs_tp_describe_fn prefix##_describe

#define GS_TP_CONTROL_OPS(prefix)                                                                            \
    .caps = prefix##_caps, .close = prefix##_close, .poll = prefix##_poll, .wait = prefix##_wait,            \
    .ep_error = prefix##_ep_error, .describe = prefix##_describe

struct gs_tp_ops {
    const char *name;
    int id; /* GS_TRANSPORT_* */

    /* Optional (NULL: yes): whether GS_TRANSPORT=auto may pick this backend
     * on this host (e.g. verbs: an active port). Non-blocking, no side effects. */
    bool (*available)(const gs_config *cfg);
    /* The devices open would use here under cfg and why, one line (gsinfo); NULL: the transport has none. */
    void (*devices)(const gs_config *cfg, char *buf, size_t cap);
    /* Capabilities of this instance (after open; GS_TP_CONTROL_OPS). Non-blocking. */
    gs_tp_caps_fn *caps;
    /* How far every peer of this backend is (latency and bandwidth class). */
    gs_tp_reach reach;
    /* Optional (NULL: reach for every peer): peer by peer, for a backend
     * whose peers differ (mixed). Non-blocking. */
    gs_tp_reach (*peer_reach)(const gs_tp *tp, int peer);
    /* Optional (NULL: GS_TP_ZCOPY_NEVER), with GS_TP_CAP_ZCOPY_SEND: what
     * GS_OP_ZCOPY would do for a payload of bytes, as this backend's own
     * settings and measurements say (tcp: GS_TCP_ZCOPY, from 4 MiB).
     * Non-blocking. */
    gs_tp_zcopy_mode (*zcopy_mode)(const gs_tp *tp, size_t bytes);
    /* Creates the backend and connects an endpoint to every peer through the
     * bootstrap store. Collective, blocking up to GS_TIMEOUT_MS. NULL for
     * the mixed backend (gs_mixed_open). */
    gs_status (*open)(gs_ctx *ctx, const gs_config *cfg, gs_tp **tp_p);
    /* open's GS_ERR_UNSUPPORTED is a verdict the ranks agreed on through the
     * store: every rank's open returns it (recorded in gs_last_error(), not
     * logged), so GS_TRANSPORT=auto may fall back to the next backend. */
    bool open_agrees;
    /* Tears down everything, continuing past failures (GS_TP_CONTROL_OPS). */
    gs_tp_close_fn *close;

    /* Memory (GS_TP_DATA_OPS). Non-blocking apart from the system calls
     * involved. mr_pack's head arrives zeroed with version, transport,
     * access, owner, addr and len filled by tp.c; the backend fills key and
     * tail. */
    gs_tp_buf_alloc_fn *buf_alloc;
    gs_tp_mr_reg_fn *mr_reg;
    gs_tp_mr_dereg_fn *mr_dereg;
    gs_tp_mr_pack_fn *mr_pack;

    /* Posts (GS_TP_DATA_OPS); never block. dst/src is the peer's descriptor
     * (already checked for version and transport), off a byte offset into it. */
    gs_tp_write_fn *write;
    gs_tp_write_imm_fn *write_imm;
    gs_tp_read_fn *read;
    gs_tp_fetch_add_fn *fetch_add;
    gs_tp_cmp_swap_fn *cmp_swap;
    gs_tp_send_fn *send;
    gs_tp_recv_fn *recv;

    /* Completions (GS_TP_CONTROL_OPS). poll never blocks; wait blocks (spin,
     * event or hybrid per cfg->poll) until at least one completion or
     * deadline_ns (then GS_ERR_TIMEOUT). Both drive the backend's progress. */
    gs_tp_poll_fn *poll;
    gs_tp_wait_fn *wait;

    /* Optional, with GS_TP_CAP_LOCAL_MAP: maps the whole of the peer's
     * region rmr (one the peer allocated with buf_alloc; checked against its
     * owner's record like any access) into this process for direct loads
     * and stores: *addr_p, *len_p bytes (page-rounded). The mapping is the
     * caller's: it stays valid whatever the owner does until given to unmap
     * (the owner's later writes stay visible while both keep it). */
    gs_status (*map)(gs_ep *ep, const gs_rmr_head *rmr, void **addr_p, size_t *len_p);
    void (*unmap)(gs_tp *tp, void *addr, size_t len);

    /* Why ep failed (GS_TP_CONTROL_OPS): the status of its first error
     * (GS_ERR_PEER_LOST for a lost or closed peer; GS_OK while ep works) and
     * that error's sentence into buf (a lost peer's as
     * gs_error_peer_lost_text). A completion with an error status says what;
     * this says why. Non-blocking. */
    gs_tp_ep_error_fn *ep_error;
    /* Optional (NULL: the name alone; GS_TP_CONTROL_OPS): one line on what
     * this instance runs over, for the init summary (verbs: device, port,
     * GID, MTU). Non-blocking. */
    gs_tp_describe_fn *describe;
};

/* The backends built in, in preference order for GS_TRANSPORT=auto. */
extern const gs_tp_ops gs_shm_ops;
extern const gs_tp_ops gs_tcp_ops;
#ifdef GS_TP_BUILT_VERBS
extern const gs_tp_ops gs_verbs_ops;
#endif

/* The mixed backend (transport/mixed/): shm to the ranks of this host,
 * far to the others. Opened by gs_tp_open when GS_TRANSPORT=auto finds
 * ranks on several hosts and several ranks on one; collective. */
extern const gs_tp_ops gs_mixed_ops;
gs_status gs_mixed_open(gs_ctx *ctx, const gs_tp_ops *far, gs_tp **tp_p);
/* shm connected to the ranks of this host only (same host id); the others
 * have no endpoint (eps[p] NULL). Collective over ctx. */
gs_status gs_shm_open_host(gs_ctx *ctx, const gs_config *cfg, gs_tp **tp_p);

/* ops->caps of tp (GS_TP_CAP_*). Non-blocking. */
unsigned gs_tp_caps(const gs_tp *tp);
/* How far peer is over tp (ops->peer_reach, else ops->reach). Non-blocking. */
gs_tp_reach gs_tp_reach_of(const gs_tp *tp, int peer);
/* ops->zcopy_mode of tp for a payload of bytes (GS_TP_ZCOPY_NEVER without one). Non-blocking. */
gs_tp_zcopy_mode gs_tp_zcopy_mode_of(const gs_tp *tp, size_t bytes);
/* ops->map of ep's transport after the descriptor checks every access
 * gets (need: GS_ACCESS_REMOTE_* bits); GS_ERR_UNSUPPORTED where the
 * transport has no map. gs_tp_unmap gives the mapping back. */
gs_status gs_tp_map(gs_ep *ep, const gs_rmr *rmr, unsigned need, void **addr_p, size_t *len_p);
void gs_tp_unmap(gs_tp *tp, void *addr, size_t len);
/* ops->describe of tp, or its name. */
void gs_tp_describe(const gs_tp *tp, char *buf, size_t cap);
/* ops->ep_error of ep's transport (GS_OK for a NULL ep). */
gs_status gs_tp_ep_error(gs_ep *ep, char *buf, size_t cap);

/* Builtin backend i (NULL past the end). */
const gs_tp_ops *gs_tp_builtin(int i);
/* Whether remote access [off, off+len) of a region of region_len bytes is in bounds. */
static inline bool gs_tp_in_bounds(uint64_t off, uint64_t len, uint64_t region_len)
{
    return off <= region_len && len <= region_len - off;
}

#endif
