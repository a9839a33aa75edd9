/*
 * The verbs transport's objects and internal interface.
 *
 * One gs_verbs_tp per open: a device context, protection domain, one
 * completion queue (with a completion channel for event mode) shared by
 * every queue pair, GS_IB_QPS_PER_PEER RC queue pairs per peer (gs_verbs_ep:
 * lane 0, which carries everything, and its side lanes, which carry only
 * stripes of large WRITEs and READs), a control region (credits, heartbeat,
 * close notice) and a pool of receive buffers.
 *
 * Work request ids carry where a completion belongs:
 *   bits 63..60 kind (GS_VERBS_WR_SQ or GS_VERBS_WR_RQ),
 *   bits 59..56 the lane (queue pair of the peer),
 *   bits 55..32 the peer,
 *   bits 31..0  the send-queue sequence number (low bits) or receive buffer.
 */
#ifndef GS_TRANSPORT_VERBS_VERBS_H
#define GS_TRANSPORT_VERBS_VERBS_H

#include "transport/tp.h"
#include "transport/verbs/verbs_proto.h"

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>

#define GS_VERBS_SQ_DEPTH      128 /* send work requests per queue pair */
#define GS_VERBS_RQ_DEPTH      64  /* receives kept posted per peer */
#define GS_VERBS_INLINE_WANT   220 /* inline data asked for at QP creation */
#define GS_VERBS_URECV_MAX     256 /* user receives queued per endpoint */
#define GS_VERBS_RD_ATOMIC_MAX 16
#define GS_VERBS_CQ_BATCH      16
#define GS_VERBS_OPS_MAX       512 /* user operations tracked per endpoint with several lanes */
#define GS_VERBS_DEFER_MAX     64  /* lane-0 posts waiting per endpoint (see verbs_stripe.c) */

enum { GS_VERBS_WR_SQ = 1, GS_VERBS_WR_RQ = 2 };

static inline uint64_t gs_verbs_wr_id(unsigned kind, unsigned lane, int peer, uint32_t low)
{
    return ((uint64_t)kind << 60) | ((uint64_t)(lane & 0xfu) << 56) |
           ((uint64_t)((uint32_t)peer & 0xffffffu) << 32) | low;
}

/* A GID table entry, as rdma-core >= 32 gives it (struct ibv_gid_entry), kept in our own type so that
 * the transport builds against older libibverbs too (verbs_compat.c fills it there from sysfs). */
enum {
    GS_VERBS_GID_TYPE_IB = 0, /* the values of enum ibv_gid_type, also on the wire (the blob) */
    GS_VERBS_GID_TYPE_ROCE_V1 = 1,
    GS_VERBS_GID_TYPE_ROCE_V2 = 2,
};

typedef struct gs_verbs_gid_entry {
    union ibv_gid gid;
    uint32_t gid_index;
    uint32_t port_num;
    uint32_t gid_type;     /* GS_VERBS_GID_TYPE_* */
    uint32_t ndev_ifindex; /* the netdev of a RoCE GID, 0 if none or unknown */
} gs_verbs_gid_entry;

/* The chosen device and port, and what we learned from querying them. */
typedef struct gs_verbs_dev {
    struct ibv_context *ctx;
    char name[64];
    uint8_t port;
    struct ibv_device_attr attr;
    struct ibv_port_attr port_attr;
    uint8_t link_layer; /* IBV_LINK_LAYER_* */
    uint16_t lid;
    int gid_index; /* -1 on InfiniBand without GRH */
    union ibv_gid gid;
    uint32_t gid_type;   /* GS_VERBS_GID_TYPE_* */
    uint16_t pkey_index; /* GS_IB_PKEY's entry in the port's table (0 when unset) */
    uint16_t pkey;       /* the key at that entry (both sides of a QP must be in one partition) */
    int numa_node;       /* the device's NUMA node (sysfs), -1 unknown */
    /* Soft-RoCE (rxe): its responder runs every request to the end, in order, so a fence
     * adds nothing; and a fenced work request there can stall its queue pair for good
     * (seen on Linux 6.1: READ, READ/FENCE, READ/FENCE never completed nor failed). */
    bool fence_unneeded;
} gs_verbs_dev;

#define GS_VERBS_RXE_VENDOR_ID 0xffffffu /* what Soft-RoCE reports as vendor_id */

/* What a send-queue slot was posted for. */
typedef enum gs_verbs_slot_kind {
    GS_VERBS_SLOT_USER = 1, /* a user operation (or one chunk of it) */
    GS_VERBS_SLOT_CREDIT,   /* credit return to the peer */
    GS_VERBS_SLOT_HEARTBEAT,
    GS_VERBS_SLOT_CLOSE, /* close notice to the peer */
    GS_VERBS_SLOT_PROBE, /* the data-path probe of the open (a heartbeat READ, waited for) */
} gs_verbs_slot_kind;

enum { GS_VERBS_SLOT_SIGNALED = 1, GS_VERBS_SLOT_FENCED = 2 };

typedef struct gs_verbs_slot {
    uint64_t wr_id;  /* the user's */
    uint8_t kind;    /* gs_verbs_slot_kind */
    uint8_t deliver; /* the user asked for a completion of this slot */
    uint8_t opcode;  /* gs_wc_opcode */
    uint8_t flags;   /* GS_VERBS_SLOT_SIGNALED | GS_VERBS_SLOT_FENCED, as posted (timeout report) */
    uint32_t op;     /* several lanes: the user operation (index into the endpoint's op ring) */
} gs_verbs_slot;

/* Several lanes: one user operation, complete when all of its work requests are (stripes, chunks, the
 * immediate's notice); completions reach the user in the order the operations were posted. */
typedef struct gs_verbs_track {
    uint64_t wr_id;
    uint32_t remaining; /* work requests not completed yet */
    uint8_t opcode;     /* gs_wc_opcode */
    uint8_t deliver;    /* signaled by the user */
} gs_verbs_track;

/* Several lanes: one piece of a user operation for one lane (a stripe, the whole operation, or the
 * immediate's notice), posted at once or, on lane 0, held back until the side lanes completed what was
 * posted on them before it (mark[l]: side lane l's sq_posted then) and every earlier held piece went. */
typedef struct gs_verbs_piece {
    uint64_t mark[GS_VERBS_QPS_MAX];
    uint64_t laddr, raddr, compare_add, swap;
    uint64_t total; /* notice: the WRITE_IMM's whole length */
    uint32_t len, lkey, rkey, imm;
    uint32_t op;       /* its user operation (index into the op ring) */
    uint8_t opcode;    /* enum ibv_wr_opcode as it will be posted */
    uint8_t wc_opcode; /* gs_wc_opcode of its operation */
    uint8_t fence;     /* IBV_SEND_FENCE on its first work request */
    uint8_t inline_ok;
} gs_verbs_piece;

/* One operation as the caller asked for it. */
typedef struct gs_verbs_op {
    const char *name;
    enum ibv_wr_opcode opcode;
    gs_wc_opcode wc_opcode;
    uint64_t laddr;
    size_t len;
    gs_mr *lmr;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t rail_rkey; /* rail 1's (the descriptor key's high half) */
    uint32_t imm;
    uint64_t compare_add, swap;
    uint64_t wr_id;
    unsigned flags;
} gs_verbs_op;

typedef enum gs_verbs_ep_state {
    GS_VERBS_EP_INIT = 0, /* queue pair created, not connected */
    GS_VERBS_EP_READY,    /* RTS */
    GS_VERBS_EP_FAILED,   /* queue pair in error: later ops flush */
    GS_VERBS_EP_CLOSED,   /* the peer closed its transport */
} gs_verbs_ep_state;

/* A user receive waiting for a SEND, and a SEND waiting for a user receive. */
typedef struct gs_verbs_urecv {
    void *dst;
    size_t cap;
    uint64_t wr_id;
} gs_verbs_urecv;

typedef struct gs_verbs_held {
    uint32_t buf; /* receive buffer index in the pool */
    uint32_t len;
} gs_verbs_held;

typedef struct gs_verbs_ep {
    gs_ep base;
    struct ibv_qp *qp;
    uint8_t lane;                     /* 0: the endpoint itself; else a side lane of parent */
    uint8_t rail;                     /* the device it is on: lane mod GS_IB_RAILS */
    struct gs_verbs_ep *parent;       /* side lanes: the endpoint (lane 0); lane 0: itself */
    uint32_t lanes;                   /* lane 0: queue pairs to the peer (GS_IB_QPS_PER_PEER) */
    struct gs_verbs_ep **side;        /* lane 0: [lanes - 1] side lanes */
    gs_verbs_track *ops;              /* lane 0 with side lanes: ring [GS_VERBS_OPS_MAX] */
    uint64_t op_head, op_tail;        /* ops [op_head, op_tail) not yet delivered */
    gs_verbs_piece *defer;            /* lane 0 with side lanes: ring [GS_VERBS_DEFER_MAX] */
    uint32_t defer_head, defer_count; /* held lane-0 posts, oldest first */
    gs_verbs_ep_state state;
    gs_status err;     /* the first error, once FAILED or CLOSED */
    bool err_reported; /* err reached the user (a completion or a return) */
    bool err_logged;   /* the failure was logged: later reports of it go to gs_last_error() only */
    char why[448];     /* the first error in one sentence (a lost peer's as gs_error_peer_lost_text) */
    uint32_t psn;

    /* Send queue accounting: slots [sq_done, sq_posted) are outstanding. */
    gs_verbs_slot *slots; /* [sq_depth] */
    uint64_t sq_posted, sq_done;
    uint32_t unsignaled_run;

    /* Flow control of WRITE_IMM/SEND: the peer re-posts and tells us. */
    uint32_t peer_rq_depth;
    uint64_t imm_sent;         /* WRITE_IMM + SEND posted to the peer */
    uint64_t reposted;         /* receives re-posted for the peer */
    uint64_t credits_returned; /* value of the last credit WRITE to the peer */
    uint64_t credits_seen;     /* the peer's credit total when last checked (it only grows) */
    uint64_t rctrl_addr;       /* the peer's control slot for us */
    uint32_t rctrl_rkey;
    gs_verbs_ctrl *lctrl; /* our control slot for the peer */

    /* Receives: the pool's buffers [rbuf_first, rbuf_first + rq_depth). */
    uint32_t rbuf_first;
    uint32_t *repost; /* buffers to re-post at the end of this progress pass */
    uint32_t repost_count;
    bool dirty;          /* on the tp's dirty list */
    gs_verbs_held *held; /* ring [rq_depth]: SENDs waiting for a user receive */
    uint32_t held_head, held_count;
    gs_verbs_urecv *urecv; /* ring [GS_VERBS_URECV_MAX] */
    uint32_t urecv_head, urecv_count;

    /* Liveness. */
    uint64_t last_alive_ns;
    bool hb_outstanding;
    bool probe_outstanding;
    /* An affiliated asynchronous error of the queue pair (IBV_EVENT_QP_*), applied after the CQ is polled
     * once more (a completion's own error, more precise, wins); 0: none. */
    int qp_event;
} gs_verbs_ep;

/* One ibv_mr, shared by every handle that registered the same memory. */
typedef struct gs_verbs_reg {
    struct gs_verbs_reg *next;
    struct ibv_mr *mr;
    struct ibv_mr *rail_mr[GS_VERBS_RAILS_MAX - 1]; /* the same memory on rails 1 .. */
    void *addr;
    size_t len;
    unsigned access; /* gs_access asked for */
    int ibv_access;  /* what the HCA was given */
    unsigned refs;
    bool cached; /* in the user-memory cache (else private to one handle) */
} gs_verbs_reg;

typedef struct gs_verbs_mr {
    gs_mr base;
    gs_verbs_reg *reg;
    size_t alloc_len;                /* gs_mr_alloc: the pages to free */
    struct gs_verbs_mr *prev, *next; /* the tp's live handles */
} gs_verbs_mr;

/* A device beyond the first (GS_IB_RAILS = 2): its own context, protection domain and completion queue;
 * it carries side lanes only (stripes), so no control or receive regions. */
typedef struct gs_verbs_rail {
    gs_verbs_dev dev;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    bool cq_armed;
    unsigned cq_events_unacked;
} gs_verbs_rail;

typedef struct gs_verbs_tp {
    gs_tp base;
    gs_verbs_dev dev; /* rail 0 */
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    bool cq_armed;
    unsigned cq_events_unacked;

    uint32_t sq_depth, rq_depth, credit_batch;
    uint32_t lanes;                              /* queue pairs per peer (GS_IB_QPS_PER_PEER) */
    uint32_t rails;                              /* devices (GS_IB_RAILS) */
    gs_verbs_rail extra[GS_VERBS_RAILS_MAX - 1]; /* rails 1 .. */
    uint32_t max_inline;
    uint32_t max_msg;
    uint8_t rd_atomic;      /* READ/atomic requests we accept in flight (responder) */
    uint8_t init_rd_atomic; /* READ/atomic requests we may have in flight (initiator) */
    uint64_t hb_interval_ns, next_hb_ns;
    struct rlimit memlock;
    bool up; /* the open completed on every rank: close notifies the peers */

    /* Device faults (IBV_EVENT_PORT_ERR): since when our port is down (0: it is up), and how long an
     * outage is ridden out before every endpoint fails with GS_ERR_IO (the QP's retry budget). */
    uint64_t port_down_ns;
    uint64_t port_grace_ns;
    bool qp_events; /* some endpoint has a qp_event to apply */

    /* Control slots, one per rank (ours unused): ctrl_mr registers them all for local access (the lkey
     * of our own control operations); ctrl_peer_mr[p] registers slot p alone for remote write and read,
     * and only peer p learns its rkey, so a peer's HCA cannot reach another peer's slot (credits). */
    gs_verbs_ctrl *ctrl;
    size_t ctrl_len;
    struct ibv_mr *ctrl_mr;
    struct ibv_mr **ctrl_peer_mr; /* [size]; NULL at our own rank */
    /* Receive buffers: rq_depth per peer, GS_SEND_MAX bytes each. */
    uint8_t *rbuf;
    size_t rbuf_len;
    struct ibv_mr *rbuf_mr;

    /* Completions ready for the user. */
    gs_wc *outq;
    size_t out_head, out_count, out_cap;

    gs_verbs_ep **dirty; /* [size]: endpoints with receives to re-post */
    uint32_t dirty_count;

    gs_verbs_reg *regs; /* cached user registrations */
    gs_verbs_mr *mrs;   /* live handles, deregistered by close if the user did not */
} gs_verbs_tp;

static inline gs_verbs_tp *gs_verbs_tp_of(gs_tp *tp)
{
    return (gs_verbs_tp *)tp;
}

static inline gs_verbs_ep *gs_verbs_ep_at(gs_verbs_tp *vt, int peer)
{
    return (gs_verbs_ep *)vt->base.eps[peer];
}

/* The peer wrote its close notice: a later failure of the endpoint is expected, not news. */
static inline bool gs_verbs_peer_closed(const gs_verbs_ep *ep)
{
    return __atomic_load_n(&ep->lctrl->closed, __ATOMIC_ACQUIRE) == GS_VERBS_CLOSED_MAGIC;
}

/* The device a lane is on. */
static inline const gs_verbs_dev *gs_verbs_ep_dev(const gs_verbs_tp *vt, const gs_verbs_ep *ep)
{
    return ep->rail ? &vt->extra[ep->rail - 1].dev : &vt->dev;
}

static inline uint8_t *gs_verbs_rbuf_addr(const gs_verbs_tp *vt, uint32_t buf)
{
    return vt->rbuf + (size_t)buf * GS_SEND_MAX;
}

/* verbs_compat.c: libibverbs calls newer than some clusters' rdma-core, with fallbacks (sysfs) where
 * the configure step did not find them (GS_IB_HAVE_*; -DGS_IB_COMPAT=ON forces the fallbacks). */
/* One GID entry of device dev_name port port: 0 or an errno (an empty or unreadable entry). */
int gs_verbs_query_gid(struct ibv_context *ctx, const char *dev_name, uint8_t port, uint8_t link_layer,
                       uint32_t index, gs_verbs_gid_entry *e);
/* The same from ibv_query_gid and sysfs gid_attrs (types/N, ndevs/N) whatever libibverbs offers;
 * sysfs_root is "/sys/class/infiniband" but for tests. */
int gs_verbs_query_gid_sysfs(struct ibv_context *ctx, const char *sysfs_root, const char *dev_name,
                             uint8_t port, uint8_t link_layer, uint32_t index, gs_verbs_gid_entry *e);
/* The valid GID entries of the port (at most cap), in index order. */
int gs_verbs_read_gids(struct ibv_context *ctx, const char *dev_name, uint8_t port, uint8_t link_layer,
                       int table_len, gs_verbs_gid_entry *out, int cap);
/* Whether the port requires a GRH on every packet (IBV_QPF_GRH_REQUIRED; false where unknown). */
bool gs_verbs_port_grh_required(const struct ibv_port_attr *attr);
/* One phrase on fork safety after ibv_fork_init. */
const char *gs_verbs_fork_state(void);
/* Which libibverbs calls this build uses: "native" or "compat (...)". */
const char *gs_verbs_compat_summary(void);

/* verbs_dev.c: device, port and GID. */
gs_status gs_verbs_config_check(const gs_config *cfg);
/* GS_IB_TIMEOUT=-1 picks at most this exponent (0.54 s a try). */
#define GS_VERBS_ACK_TIMEOUT_MAX 17
/* The heartbeat interval: GS_TIMEOUT_MS / 4, within 50 ms .. 1 s. */
int64_t gs_verbs_heartbeat_ms(const gs_config *cfg);
/* The QP's ack timeout exponent: GS_IB_TIMEOUT, or for -1 the largest up to
 * GS_VERBS_ACK_TIMEOUT_MAX whose (GS_IB_RETRY_CNT + 1) tries and two
 * heartbeats fit in GS_TIMEOUT_MS (at least 1). */
int gs_verbs_ack_timeout(const gs_config *cfg);
/* GS_IB_PKEY's text as a partition key (pkey_p may be NULL: only checked). */
gs_status gs_verbs_pkey_parse(const char *text, uint16_t *pkey_p);
/* dev->pkey_index for GS_IB_PKEY: its entry in the port's table, or GS_ERR_CONFIG naming what the table
 * holds. */
gs_status gs_verbs_pkey_index(const gs_config *cfg, int rank, gs_verbs_dev *dev);
/* Why a device of this ibv_transport_type whose port has this link layer cannot carry the verbs
 * transport (one phrase: "an iWARP device: ..."), or NULL: InfiniBand transport type, InfiniBand or
 * Ethernet (RoCE) link layer. */
const char *gs_verbs_kind_refusal(int transport_type, uint8_t link_layer);
bool gs_verbs_available(const gs_config *cfg);
/* One entry of GS_IB_DEV's list. */
#define GS_VERBS_DEVS_MAX 16
typedef struct gs_verbs_dev_want {
    char name[64];
    uint8_t port; /* 0: GS_IB_PORT */
} gs_verbs_dev_want;
/* GS_IB_DEV's comma list of dev[:port] into out[cap] (*n_p entries; "" gives 0), or GS_ERR_CONFIG naming
 * the variable and the bad entry (empty, port outside 1-255, name too long, listed twice, too many). */
gs_status gs_verbs_dev_list_parse(const char *text, gs_verbs_dev_want *out, int cap, int *n_p);
/* The NUMA node sysfs gives device name under sysfs_root ("/sys/class/infiniband" but for tests): its
 * device/numa_node, or -1 where unknown. */
int gs_verbs_dev_numa_node(const char *sysfs_root, const char *name);
/* The NUMA node of the CPU this thread runs on (sysfs /sys/devices/system/cpu/cpuN/nodeM), or -1; cpu_p
 * (may be NULL) gets the CPU. sysfs_cpu_root is "/sys/devices/system/cpu" but for tests. */
int gs_verbs_cpu_numa_node(const char *sysfs_cpu_root, int *cpu_p);
/* Of n devices on NUMA nodes nodes[], the index to use from a CPU on node cpu_node: one on the same node,
 * else one whose node is unknown (-1), else any; ties go to the first listed. */
int gs_verbs_numa_pick(const int *nodes, int n, int cpu_node);
gs_status gs_verbs_dev_open(const gs_config *cfg, int rank, gs_verbs_dev *dev);
/* The n (1..GS_VERBS_RAILS_MAX) usable devices nearest this CPU's NUMA node, nearest first (the first as
 * gs_verbs_dev_open gives it). */
gs_status gs_verbs_devs_open(const gs_config *cfg, int rank, gs_verbs_dev *devs, int n);
/* What the open would choose under cfg, for gsinfo: "rail 0 rxe0:1 (NUMA node -1); this process on CPU 1,
 * NUMA node 0; usable: ...", or why none. */
void gs_verbs_devices_text(const gs_config *cfg, char *buf, size_t cap);
void gs_verbs_dev_close(gs_verbs_dev *dev);
/* What the automatic GID choice may take: GS_IB_ADDR_FAMILY and GS_IB_ADDR_RANGE. */
typedef struct gs_verbs_gid_filter {
    int family;         /* AF_INET or AF_INET6: only that family; 0: any, IPv4 first */
    int prefix_bits;    /* -1: no range; else the GID must share this many leading bits with prefix */
    uint8_t prefix[16]; /* as a GID: IPv4 ranges as ::ffff:a.b.c.d */
} gs_verbs_gid_filter;
/* The filter of cfg, or GS_ERR_CONFIG naming the variable. */
gs_status gs_verbs_gid_filter_parse(const gs_config *cfg, gs_verbs_gid_filter *f);
/* AF_INET for an IPv4-mapped GID (::ffff:a.b.c.d), else AF_INET6. */
int gs_verbs_gid_family(const union ibv_gid *gid);
/* The best entry among n GID entries that pass the filter (NULL: all do), or -1 if none: routable
 * beats link-local, then RoCE v2 beats v1, then IPv4 beats IPv6, then the lowest index. */
int gs_verbs_gid_pick(const gs_verbs_gid_entry *entries, int n, const gs_verbs_gid_filter *f);
bool gs_verbs_gid_is_link_local(const union ibv_gid *gid);
void gs_verbs_gid_format(const union ibv_gid *gid, char *buf, size_t cap);
const char *gs_verbs_gid_type_name(uint32_t type);
int gs_verbs_mtu_bytes(enum ibv_mtu mtu);
enum ibv_mtu gs_verbs_mtu_min(enum ibv_mtu a, enum ibv_mtu b);

/* verbs_ep.c: queue pairs and their connection. */
gs_status gs_verbs_ep_create(gs_verbs_tp *vt, int peer, gs_verbs_ep **ep_p);
void gs_verbs_ep_fill_blob(const gs_verbs_tp *vt, const gs_verbs_ep *ep, gs_verbs_conn_blob *blob);
gs_status gs_verbs_ep_check_blob(const gs_verbs_tp *vt, int peer, const gs_verbs_conn_blob *blob);
gs_status gs_verbs_ep_connect(gs_verbs_tp *vt, gs_verbs_ep *ep, const gs_verbs_conn_blob *remote);
void gs_verbs_ep_destroy(gs_verbs_ep *ep);
/* GS_OK when ops may be posted, else the status a post returns (and logs). */
gs_status gs_verbs_ep_usable(gs_verbs_ep *ep, const char *op);
/* Returns status for the failed or closed ep with gs_last_error() set to the
 * message; logs it only the first time (a lost peer is reported by every
 * poll, wait and post after it, and a caller may loop on them). */
#define gs_verbs_ep_report(ep, status, ...)                                                                  \
    gs_fail_once(&(ep)->err_logged, GS_SUBSYS_VERBS, (status), __VA_ARGS__)

/* verbs_mr.c: registration. */
int gs_verbs_access_flags(unsigned access);
gs_status gs_verbs_reg_raw(gs_verbs_tp *vt, void *addr, size_t len, int ibv_access, const char *what,
                           struct ibv_mr **mr_p);
void gs_verbs_mr_release_all(gs_verbs_tp *vt);
void gs_verbs_memlock_describe(const struct rlimit *lim, char *buf, size_t cap);

/* The data-path ops: gs_verbs_buf_alloc, _mr_reg, _mr_dereg, _mr_pack
 * (verbs_mr.c), gs_verbs_write ... gs_verbs_recv (verbs_rma.c). */
GS_TP_DATA_OPS_DECLARE(gs_verbs);
/* The control ops: gs_verbs_caps, _close, _ep_error, _describe (verbs_tp.c),
 * gs_verbs_poll, _wait (verbs_cq.c). */
GS_TP_CONTROL_OPS_DECLARE(gs_verbs);
/* Internal control operations (credit return, heartbeat, close notice). */
gs_status gs_verbs_post_ctrl(gs_verbs_ep *ep, gs_verbs_slot_kind kind);
/* Queues a consumed receive buffer for re-posting at the end of this progress pass. */
void gs_verbs_queue_repost(gs_verbs_tp *vt, gs_verbs_ep *ep, uint32_t buf);
/* Pairs arrived SENDs with posted user receives. */
void gs_verbs_match_recvs(gs_verbs_tp *vt, gs_verbs_ep *ep);
/* Posts the receives queued for re-posting and returns credits. */
void gs_verbs_flush_reposts(gs_verbs_tp *vt);
gs_status gs_verbs_post_recv_bufs(gs_verbs_ep *ep, const uint32_t *bufs, uint32_t count);

/* verbs_rma.c: posts one piece on one lane (every work request signaled, counted on its op); GS_ERR_AGAIN
 * when that lane's send queue lacks room (nothing posted). */
gs_status gs_verbs_piece_post(gs_verbs_ep *lane_ep, const gs_verbs_piece *piece);
/* Work requests a piece takes (chunks of the port's message size). */
uint32_t gs_verbs_piece_wrs(const gs_verbs_tp *vt, const gs_verbs_piece *piece);

/* verbs_stripe.c: several queue pairs per peer (GS_IB_QPS_PER_PEER > 1). */
/* Posts op (checked and credited by the caller) as pieces on the lanes of ep. */
gs_status gs_verbs_lanes_post(gs_verbs_ep *ep, const gs_verbs_op *op);
/* Posts the held lane-0 pieces whose side-lane work completed, in order. */
void gs_verbs_lanes_flush(gs_verbs_ep *ep);
/* A work request of op completed (ok) or will never (the endpoint failed); delivers, in post order, the
 * operations now complete. */
void gs_verbs_lanes_done(gs_verbs_ep *ep, uint32_t op);
/* The endpoint failed with status: side lanes to ERR, held pieces dropped, every undelivered operation
 * completed (those fully done with GS_OK, the first other with status, the rest flushed). */
void gs_verbs_lanes_fail(gs_verbs_ep *ep, gs_status status);

/* verbs_cq.c: completions (gs_verbs_poll and _wait are control ops, above). */
/* Drains the CQ and runs the housekeeping (re-posts, credits, heartbeats). */
gs_status gs_verbs_progress(gs_verbs_tp *vt);
gs_status gs_verbs_outq_push(gs_verbs_tp *vt, const gs_wc *wc);
/* Sleeps on the completion channel (and the async fd) until an event, the deadline or the next heartbeat;
 * an unarmed CQ is armed instead, and the call returns at once (the caller polls once more first). */
gs_status gs_verbs_block_once(gs_verbs_tp *vt, uint64_t deadline_ns);
/* Puts ep in error with status (first error wins) and completes what it had outstanding. */
void gs_verbs_ep_fail(gs_verbs_ep *ep, gs_status status, uint64_t failed_seq);
/* Acts on one asynchronous event of the device: DEVICE_FATAL and CQ_ERR fail every endpoint with
 * GS_ERR_IO, PORT_ERR of our port does so unless the port is ACTIVE again within port_grace_ns, a QP's
 * fatal event fails its endpoint. The progress path reads the events (never blocking) and passes each
 * here; a test may pass one it made up. Does not ack the event. */
void gs_verbs_async_event(gs_verbs_tp *vt, const struct ibv_async_event *ev);
/* The gradsync status of a work completion status, and a hint for the log. */
gs_status gs_verbs_wc_status_map(enum ibv_wc_status status, const char **hint_p);

#endif
