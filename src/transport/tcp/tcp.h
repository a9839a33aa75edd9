/*
 * The tcp transport's objects and internal interface.
 *
 * One gs_tcp_tp per open: a connected, non-blocking, TCP_NODELAY socket per
 * peer (gs_tcp_ep), a table of registered regions (gs_tcp_mr, found by key),
 * a completion queue for what arrives (WRITE_IMM, SEND, endpoint errors) and,
 * per endpoint, a ring of the initiator's outstanding operations that
 * complete in posting order.
 *
 * Threads: every entry point takes tp->lock, so the caller's thread(s) and
 * the optional progress thread (GS_PROGRESS_THREAD=1) may drive the same
 * transport. Socket descriptors stay open (shut down after an error) until
 * close, so a thread blocked in poll() never sees one reused.
 *
 * Files: tcp_tp.c (ops table, open through the store, close), tcp_ep.c (the
 * transport object and its endpoints, without the store), tcp_addr.c
 * (addresses, listening, socket options), tcp_connect.c (dialling, accepting
 * and the hello exchange), tcp_mr.c (regions), tcp_rma.c (posting
 * ops), tcp_tx.c (sending frames), tcp_progress.c (receiving frames,
 * endpoint errors, deadlines), tcp_serve.c (acting on what arrived),
 * tcp_cq.c (completions, poll and wait), tcp_thread.c (the progress thread),
 * tcp_frame.c (checks of what arrives), tcp_proto.h (the wire format).
 */
#ifndef GS_TRANSPORT_TCP_TCP_H
#define GS_TRANSPORT_TCP_TCP_H

#include "transport/tcp/tcp_proto.h"
#include "transport/tp.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Limits per endpoint. */
#define GS_TCP_SQ_DEPTH  1024 /* operations the user may have queued or outstanding */
#define GS_TCP_MAX_RD    64   /* outstanding READs and atomics (responder resources) */
#define GS_TCP_TX_CAP    (GS_TCP_SQ_DEPTH + GS_TCP_MAX_RD + 8) /* + replies and control frames */
#define GS_TCP_PEND_CAP  (GS_TCP_SQ_DEPTH + GS_TCP_MAX_RD)
#define GS_TCP_RECV_CAP  256   /* posted receives */
#define GS_TCP_UNEXP_CAP 64    /* SENDs that arrived before their receive was posted */
#define GS_TCP_RBUF      16384 /* receive prefetch: headers and the start of small payloads */
#define GS_TCP_CQ_CAP    8192  /* target-side completions waiting to be polled */

typedef struct gs_tcp_mr {
    gs_mr base;
    uint64_t key;     /* slot in the low 32 bits, random check bits above */
    uint32_t tx_refs; /* queued READ replies whose payload reads from this region */
} gs_tcp_mr;

/* One frame waiting to be written: a header and an optional payload that is
 * sent straight from the caller's (or the region's) memory. */
typedef struct gs_tcp_tx {
    gs_tcp_hdr hdr;
    const uint8_t *payload;
    uint64_t total; /* header + payload bytes */
    uint64_t done;  /* bytes already handed to the kernel */
    gs_tcp_mr *ref; /* region the payload reads from (READ reply), else NULL */
    bool user;      /* counts against GS_TCP_SQ_DEPTH */
    bool splice;    /* the payload goes by reference: vmsplice into the pipe, splice to the socket */
    uint64_t piped; /* payload bytes already in the pipe or sent */
} gs_tcp_tx;

/* An initiator operation waiting for its acknowledgement or reply. */
typedef struct gs_tcp_pend {
    uint64_t seq;
    uint64_t wr_id;
    uint64_t posted_ns;
    void *local; /* READ destination / atomic result */
    uint64_t len;
    gs_wc_opcode opcode;
    bool signaled;
    bool replied; /* READ / atomic: the reply arrived */
} gs_tcp_pend;

typedef struct gs_tcp_posted {
    void *buf;
    uint64_t cap;
    uint64_t wr_id;
} gs_tcp_posted;

typedef struct gs_tcp_unexp {
    uint8_t *buf;
    uint64_t len;
} gs_tcp_unexp;

enum { GS_TCP_RX_HDR, GS_TCP_RX_PAYLOAD };

typedef struct gs_tcp_rx {
    int state;
    gs_tcp_hdr hdr;    /* the frame being received */
    uint8_t *dst;      /* where the rest of its payload goes */
    uint64_t left;     /* payload bytes still to come */
    int unexp;         /* SEND into the unexpected slot, -1 if none */
    bool reserved;     /* holds a completion queue slot for this frame */
    bool stalled;      /* the last header waits for room (queue, completions) */
    bool drained;      /* this pass's last read came back short: the socket is empty */
    uint64_t last_len; /* payload length of the last frame */
    uint32_t rpos, rlen;
    uint8_t buf[GS_TCP_RBUF];
} gs_tcp_rx;

typedef struct gs_tcp_ep {
    gs_ep base;
    int fd;             /* the connection (the one the lower rank dialled) */
    int side_fd;        /* the second one (the higher rank's), or fd */
    int rx_fd;          /* where the peer's frames arrive now */
    int tx_fd;          /* where this rank's frames leave now */
    bool switcher;      /* this rank (the higher) moves its frames between the two */
    bool tx_side;       /* frames posted now go on side_fd (a SWITCH is queued before) */
    bool tx_last_small; /* the last posted frame was small */
    bool dead;          /* no more traffic: error or orderly close */
    bool lost;          /* the peer died, hung or was dropped (not an orderly close, not a refusal of ours) */
    bool bye_rcvd;      /* the peer closed in order */
    bool err_reported;  /* a completion or return value has carried err */
    bool err_logged;    /* later reports of the dead endpoint go to gs_last_error() only */
    gs_status err;      /* why the endpoint died */
    char why[256];

    /* sending */
    gs_tcp_tx *tx; /* ring [GS_TCP_TX_CAP] */
    uint32_t tx_head, tx_count, tx_user;
    bool tx_blocked;         /* the last write hit a full socket buffer */
    uint64_t tx_stuck_since; /* when the queue last moved (for the timeout) */
    uint64_t next_seq;       /* number of our next request */
    bool ack_owed;           /* the peer asked for an ack we have not sent */
    uint64_t ack_sent;       /* highest ack put on the wire */
    int pipe[2];             /* zero-copy sends: user pages travel through it, -1 until needed */
    uint32_t pipe_cap;       /* its capacity in bytes */
    uint64_t pipe_bytes;     /* bytes in it, all of the head frame's payload */
    bool zcopy_off;          /* a pipe could not be made or fed: copy from now on */

    /* our outstanding operations */
    gs_tcp_pend *pend; /* ring [GS_TCP_PEND_CAP] */
    uint32_t pend_head, pend_count;
    uint32_t rd_out; /* READs and atomics awaiting a reply */
    uint64_t acked;  /* the peer has served our requests < acked */

    /* receiving */
    gs_tcp_rx rx;
    uint64_t rx_seq; /* number of the peer's next request */
    gs_tcp_posted recvs[GS_TCP_RECV_CAP];
    uint32_t recv_head, recv_count;
    gs_tcp_unexp unexp[GS_TCP_UNEXP_CAP];
    uint32_t unexp_head, unexp_count;
} gs_tcp_ep;

typedef struct gs_tcp_tp {
    gs_tp base;
    pthread_mutex_t lock;
    uint32_t instance;
    int wake_fd;             /* eventfd: wakes a blocked waiter or the progress thread */
    int waiters;             /* threads blocked in poll() waiting for completions */
    struct pollfd *wait_fds; /* [size + 1], for the (one) caller thread's waits */
    uint64_t user_ns;        /* when the caller last polled (the progress thread stays out of its way) */

    /* regions */
    gs_tcp_mr **regions;
    uint32_t region_cap;

    /* target-side completions (RECV_IMM, RECV, endpoint errors) */
    gs_wc *cq;
    uint32_t cq_head, cq_count;
    uint32_t cq_reserved; /* slots promised to frames still arriving */
    uint32_t ep_cursor;   /* where the next harvest starts (fairness) */
    bool progressed;      /* something became ready to poll since the last wake */
    bool rx_bytes;        /* the current pass read bytes from the current endpoint */
    uint64_t rx_reads;    /* reads that brought bytes, ever (hybrid waits spin on after activity) */

    /* the progress thread */
    int thread_wake_fd; /* eventfd: wakes the progress thread */
    bool thread_on;
    bool thread_stop;
    pthread_t thread;
} gs_tcp_tp;

static inline gs_tcp_tp *gs_tcp_tp_of(gs_tp *tp)
{
    return (gs_tcp_tp *)tp;
}

static inline gs_tcp_ep *gs_tcp_ep_at(gs_tcp_tp *tp, int peer)
{
    return (gs_tcp_ep *)tp->base.eps[peer];
}

/* tcp_ep.c: the transport object without the store. */
gs_status gs_tcp_tp_create(const gs_config *cfg, int rank, int size, gs_tcp_tp **tp_p);
/* Takes over fd, a connected and authenticated stream socket to peer. */
gs_status gs_tcp_ep_attach(gs_tcp_tp *tp, int peer, int fd);
/* The same with two connections to peer: fd the one the lower rank dialled,
 * side_fd the higher rank's (see "Two connections" in tcp_tx.c). */
gs_status gs_tcp_ep_attach2(gs_tcp_tp *tp, int peer, int fd, int side_fd);
/* attach2 with the two sockets of gs_tcp_connect_all: the one accepted from
 * peer and the one this rank dialled. */
gs_status gs_tcp_ep_attach_both(gs_tcp_tp *tp, int peer, int accepted, int dialled);
/* The poll entries of a live ep with work (reading unless stalled, writing
 * while frames wait): 0 to 2 written to pfds. */
int gs_tcp_ep_pollfds(const gs_tcp_ep *ep, struct pollfd *pfds);
/* Stops the progress thread, says goodbye to every live peer, frees everything. */
void gs_tcp_tp_destroy(gs_tcp_tp *tp);

/* tcp_addr.c (addresses, listening, socket options) and tcp_connect.c (dialling and accepting every peer, the
 * hello exchange). */
typedef struct gs_tcp_addr {
    struct sockaddr_storage sa;
    socklen_t len;
} gs_tcp_addr;
/* The address to listen on: GS_TCP_IFNAME's, else the one routing to the
 * store host (store_host may be empty: loopback). */
gs_status gs_tcp_addr_choose(const gs_config *cfg, const char *store_host, int store_port, int rank,
                             gs_tcp_addr *addr_p);
void gs_tcp_addr_format(const gs_tcp_addr *addr, char *buf, size_t cap);
gs_status gs_tcp_listen(const gs_tcp_addr *addr, int backlog, int rank, int *fd_p, gs_tcp_addr *bound_p);
void gs_tcp_blob_pack(const gs_tcp_addr *addr, const uint8_t nonce[GS_TCP_NONCE_BYTES],
                      gs_tcp_addr_blob *blob);
gs_status gs_tcp_blob_unpack(const gs_tcp_addr_blob *blob, int peer, gs_tcp_addr *addr_p);
/* Enters the network namespace GS_TCP_NETNS names for rank (the thread's
 * sockets are made there until leave); *saved_p is -1 if there is none. */
gs_status gs_tcp_netns_enter(const gs_config *cfg, int rank, int *saved_p);
void gs_tcp_netns_leave(int saved, int rank);
/* Socket options of a data connection: non-blocking, TCP_NODELAY, user timeout. */
gs_status gs_tcp_sock_tune(int fd, const gs_config *cfg, int rank, int peer);
/* What both ends of setup need to know. */
typedef struct gs_tcp_setup {
    const gs_config *cfg;
    int rank, size;
    uint32_t instance;
    const gs_tcp_addr_blob *blobs; /* [size], this rank's own included */
    uint64_t deadline_ns;
} gs_tcp_setup;
/* Dials every peer and accepts every peer on lfd, proving and checking the
 * job token both ways: fds[peer] gets the accepted socket, tx_fds[peer] the
 * dialled one (gs_tcp_ep_attach2 takes the lower rank's dialled one as the
 * shared connection). Strangers are dropped with a logged reason. Blocks
 * until done or the deadline. */
gs_status gs_tcp_connect_all(const gs_tcp_setup *setup, int lfd, int *fds, int *tx_fds);

/* tcp_mr.c */
/* The region key names, or NULL. */
gs_tcp_mr *gs_tcp_mr_find(gs_tcp_tp *tp, uint64_t key);
/* GS_OK if [off, off+len) lies in mr and it grants access; else
 * GS_ERR_REMOTE_ACCESS with *why_p a static reason. */
gs_status gs_tcp_mr_check(const gs_tcp_mr *mr, uint64_t off, uint64_t len, unsigned access,
                          const char **why_p);

/* The data-path ops: gs_tcp_buf_alloc, _mr_reg, _mr_dereg, _mr_pack
 * (tcp_mr.c), gs_tcp_write ... gs_tcp_recv (tcp_rma.c). */
GS_TP_DATA_OPS_DECLARE(gs_tcp);
/* The control ops: gs_tcp_caps, _close, _ep_error, _describe (tcp_tp.c),
 * gs_tcp_poll, _wait (tcp_cq.c). */
GS_TP_CONTROL_OPS_DECLARE(gs_tcp);

/* tcp_tx.c (callers hold tp->lock). */
/* Writes as much of ep's queue as the socket takes. */
void gs_tcp_tx_flush(gs_tcp_ep *ep);
/* Queues a frame (payload sent from its own memory); NULL if the ring is full. */
gs_tcp_tx *gs_tcp_tx_push(gs_tcp_ep *ep, const gs_tcp_hdr *hdr, const void *payload, bool user);
/* Payloads of GS_OP_ZCOPY operations from this size on go by reference. */
#define GS_TCP_ZCOPY_MIN (32u << 10)
/* Calls of at least this many bytes are worth sending by reference at all
 * (tcp_zcopy_mode; smaller ones: the page references cost more, measured,
 * docs/collectives.md "Two data planes"). */
#define GS_TCP_ZCOPY_TIMED_MIN (4u << 20)
/* Lets t's payload go by reference if it is large enough (GS_TCP_ZCOPY_MIN). */
void gs_tcp_tx_zcopy(gs_tcp_ep *ep, gs_tcp_tx *t);
/* Closes ep's pipe, if it has one. */
void gs_tcp_tx_pipe_close(gs_tcp_ep *ep);
/* Posted frames of this size and more go on the higher rank's own connection. */
#define GS_TCP_SIDE_MIN (64u << 10)
/* Before a posted frame of len bytes: moves the higher rank's frames to the
 * other connection when that pays (queues a SWITCH). */
void gs_tcp_tx_route(gs_tcp_ep *ep, uint64_t len);
/* Drops every queued frame that has not started (all of them if all). */
void gs_tcp_tx_drop(gs_tcp_ep *ep, bool all);
/* Sends the acknowledgement ep owes, alone unless a queued frame will carry it. */
void gs_tcp_ack_send(gs_tcp_ep *ep);
/* Sends any acknowledgement a peer asked for and is still owed. */
void gs_tcp_ack_flush(gs_tcp_tp *tp);

/* tcp_serve.c (callers hold tp->lock). */
/* Acts on a checked header: 1 taken, 0 stall (retry later: no room), -1 the
 * endpoint failed. */
int gs_tcp_frame_start(gs_tcp_tp *tp, gs_tcp_ep *ep, const gs_tcp_hdr *hdr);
/* The frame's whole payload has landed. */
void gs_tcp_frame_finish(gs_tcp_tp *tp, gs_tcp_ep *ep);
/* The peer broke the protocol or asked for memory it may not touch: tells it
 * why (a NAK, best effort, when no frame of ours is half written) and drops it. */
void gs_tcp_refuse(gs_tcp_ep *ep, const gs_tcp_hdr *hdr, gs_status status, const char *why);

/* tcp_progress.c (callers hold tp->lock). */
/* One pass over every endpoint: reads and serves what arrived, writes what
 * is queued, checks deadlines. */
void gs_tcp_progress(gs_tcp_tp *tp);
/* Puts ep in error (idempotent): logs why, shuts the socket down, drops its
 * queue, and marks the peer lost; the outstanding operations complete with
 * status when polled. */
void gs_tcp_ep_fail(gs_tcp_ep *ep, gs_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* gs_tcp_ep_fail with GS_ERR_PEER_LOST and the one sentence of a lost peer
 * ("rank R: rank P lost (CAUSE): did it exit or crash?"). */
void gs_tcp_ep_lost(gs_tcp_ep *ep, const char *cause_fmt, ...) __attribute__((format(printf, 2, 3)));
/* Returns status for the dead ep with gs_last_error() set to the message;
 * logs it only the first time (polls and posts repeat it). */
#define gs_tcp_ep_report(ep, status, ...)                                                                    \
    gs_fail_once(&(ep)->err_logged, GS_SUBSYS_TCP, (status), __VA_ARGS__)
/* Drops an orderly closed endpoint without an error to report. */
void gs_tcp_ep_close_quiet(gs_tcp_ep *ep, const char *why);
/* Whether an outstanding operation is answered (acknowledged or replied). */
bool gs_tcp_pend_done(const gs_tcp_ep *ep, const gs_tcp_pend *e);
/* Pairs posted receives with SENDs that came before them (completion queue room permitting). */
void gs_tcp_ep_match_unexp(gs_tcp_tp *tp, gs_tcp_ep *ep);

/* tcp_cq.c (callers of gs_tcp_cq_push hold tp->lock). */
bool gs_tcp_cq_full(const gs_tcp_tp *tp);
void gs_tcp_cq_push(gs_tcp_tp *tp, const gs_wc *wc);
/* Delivers what arrived after the last receive-side check; wakes waiters. */
void gs_tcp_wake(gs_tcp_tp *tp);

/* tcp_thread.c: the progress thread. It takes over the progress engine
 * whenever the caller has not polled for GS_TCP_TAKEOVER_NS (computing, or
 * waiting in the store), so peers' READs, atomics and acknowledgements are
 * served without the caller; with GS_PROGRESS_THREAD=1 it serves at once,
 * all the time. */
#define GS_TCP_TAKEOVER_NS 5000000ull
gs_status gs_tcp_thread_start(gs_tcp_tp *tp);
void gs_tcp_thread_stop(gs_tcp_tp *tp);
/* Makes a progress thread blocked in poll() look again (new data to write). */
void gs_tcp_wake_thread(gs_tcp_tp *tp);

#endif
