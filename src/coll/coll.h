/*
 * The collectives layer's internal objects and the functions its files share.
 * The layer does not know which transport runs underneath: it chooses by
 * gs_tp_caps (LOCAL_MAP, ZCOPY_SEND, USER_MEM), never by name (the name
 * appears only in logs, traces and when a sub-communicator opens the same
 * kind again).
 *
 *   comm.c      communicator: staging buffers, descriptor exchange, teardown
 *   chan.c      per-peer channels: slots, credits, completions, arrival checks
 *   prim.c      the steps every algorithm is made of (send, receive-reduce-forward, ...)
 *   engine.c    request queue, progress, waiting, the progress thread
 *   fail.c      a communicator's failure: the calls it ends, the peers told, its one sentence
 *   split.c     sub-communicators: split by color, or from a list of ranks
 *   shrink.c    the survivors' communicator after a lost rank (gs_comm_shrink)
 *   grow.c      old ranks and joiners in one communicator (gs_comm_grow)
 *   desc.c      call descriptors: checks and the mismatch messages
 *   select.c    which algorithm runs a call
 *   layout.c    cutting a call into chunk columns
 *   ring.c      pipelined ring (reduce-scatter + all-gather, chains)
 *   rd.c        recursive doubling (butterfly, any rank count)
 *   hier.c      hierarchical allreduce: inside each host, across hosts, inside again
 *   direct.c    every rank to every rank in one step (small messages)
 *   rooted.c    reduce, gather, scatter over the boxes (direct's steps for them)
 *   alltoall.c  alltoall over the boxes (direct's steps for it)
 *   pairwise.c  every newer collective over messages: per peer, a block each way
 *   blocks.c    what each newer collective sends to and receives from each peer
 *   box.c       the direct algorithm's shared-memory plane (one host, shm)
 *   box.h       the boxes' layout, shared by box.c and tiny.c
 *   box_ref.c   box posts by reference: who copies what between the callers' buffers
 *   parts.c     allreduce by parts over the boxes (large allreduces on one host)
 *   tiny.c      the tiny path: 2-rank allreduce or reduce of at most 256 B, or barrier, over the boxes
 *   zcopy.c     over tcp, large calls' send mode: copied or by reference (GS_OP_ZCOPY)
 *   api.c       the public calls: argument checks, requests, fusion
 *   p2p.c       point-to-point send/recv: envelopes, matching, rendezvous (p2p.h)
 *   p2p.h       point-to-point's objects and calls (p2p.c's interface)
 *   p2p_mail.c  point-to-point mailboxes: small messages through the boxes (p2p.h)
 *   summary.c   the init summary rank 0 prints at GS_LOG_LEVEL=info
 *   trace.c     GS_TRACE events of the collectives
 *   coll_proto.h  the wire format, all in one place
 *   coll.h      this file: the objects and functions the files share
 *
 * An algorithm is a schedule: given the call and a cursor it names the next
 * step (gs_prim); the engine runs steps in order, each one when its message
 * has arrived and its peer has a free slot, so every algorithm reads as the
 * textbook and non-blocking progress comes for free.
 */
#ifndef GS_COLL_COLL_H
#define GS_COLL_COLL_H

#include "coll/coll_proto.h"
#include "coll/p2p.h"
#include "kernel/reduce.h"
#include "gradsync.h"
#include "util/config.h"
#include "util/req.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct gs_coll_op gs_coll_op;

typedef struct gs_box gs_box;

/* ------------------------------------------------------------------------ */
/* Channels: one per peer, both directions                                  */
/* ------------------------------------------------------------------------ */

typedef struct gs_chan {
    int peer;
    /* sending: into the peer's inbox block for this rank */
    uint64_t tx_sent;    /* messages posted */
    uint64_t tx_acked;   /* messages the peer has released (credits) */
    uint64_t remote_off; /* offset of this rank's block in the peer's inbox */
    /* receiving: this rank's inbox block for the peer */
    uint8_t *slots;               /* slot 0 */
    volatile uint64_t *credit_in; /* the peer's released count of my messages, written by the peer */
    const gs_coll_abort *abort_in;
    uint64_t rx_arrived;         /* messages arrived */
    uint64_t rx_next;            /* next message to consume */
    uint64_t rx_released;        /* messages whose slot is free again */
    uint64_t rx_returned;        /* released count last sent back to the peer */
    bool rx_held[GS_COLL_SLOTS]; /* consumed but still the source of a forward */
    /* an unsignaled forward's slot: held until the peer sends a message of a
     * later step (call, unit) than the forward's (0: held by a signaled one) */
    uint64_t held_call[GS_COLL_SLOTS];
    uint32_t held_unit[GS_COLL_SLOTS];
    uint64_t *credit_src; /* outbox word the credit write is made from */
    bool credit_inflight;
    uint64_t rx_seq_max;  /* highest call number of a message that arrived from the peer */
    uint32_t rx_unit_max; /* highest step id that arrived in that call */
} gs_chan;

/* ------------------------------------------------------------------------ */
/* Steps                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum gs_prim_kind {
    GS_PRIM_PAIR,     /* send to one peer and/or receive from one peer */
    GS_PRIM_SEND_ALL, /* send to every peer */
    GS_PRIM_RECV_ALL, /* receive from every peer, then combine */
} gs_prim_kind;

typedef enum gs_prim_mode {
    GS_PRIM_COPY,   /* the result is what arrived */
    GS_PRIM_REDUCE, /* the result is what arrived op local */
    GS_PRIM_GATHER, /* RECV_ALL: peer q's payload lands at out + q * stride */
    GS_PRIM_BCAST,  /* RECV_ALL: root's payload lands at out */
} gs_prim_mode;

typedef struct gs_prim {
    gs_prim_kind kind;
    gs_prim_mode mode;
    int send_to;          /* PAIR: -1 for none */
    int recv_from;        /* PAIR: -1 for none */
    bool send_local;      /* PAIR: send local before receiving; else forward the result */
    bool recv_first;      /* REDUCE operand order: received op local (else local op received) */
    bool finish;          /* divide the result by the rank count (GS_AVG) */
    bool from_user;       /* PAIR, 2 ranks: what it sends (send_local's data, or the forwarded result,
                           * then in out) goes straight from the caller's buffers, registered for the
                           * call (op->send_mr, op->recv_mr), instead of from a staging copy */
    int root;             /* RECV_ALL BCAST: whose payload; SEND_ALL: -1 or the only sender */
    uint32_t send_unit;   /* the unit id carried by what this step sends */
    uint32_t recv_unit;   /* the unit id expected on what it receives */
    size_t bytes;         /* payload bytes of every message of the step */
    size_t stride;        /* SEND_ALL: bytes between peers' data (0: the same to all); GATHER: out stride */
    const uint8_t *local; /* this rank's operand / data to send (NULL on RECV_ALL: the last SEND_ALL copy) */
    const uint8_t *with;  /* PAIR with no peers: out = local op with (a reduction of this rank's alone) */
    uint8_t *out;         /* where the result goes in user memory (NULL: nowhere) */
    /* the newer collectives (pairwise.c, rooted.c, alltoall.c) */
    bool split;               /* PAIR with send_local: sends send_bytes from send_data, apart from what it
                               * receives (bytes, into out or reduced with local) */
    const uint8_t *send_data; /* split: what it sends */
    size_t send_bytes;
    bool pieces;  /* RECV_ALL over the boxes: a post holds a piece of bytes per rank; this rank's is read
                   * (SEND_ALL with stride: this rank's own piece is left out of its post) */
    bool to_root; /* RECV_ALL: root's post is empty, every other one carries bytes (gather, reduce) */
    /* progress of a step that had to stop half way */
    bool sent;     /* PAIR: send_local posted */
    bool combined; /* PAIR: result computed (forward still to post) */
    int next_peer; /* SEND_ALL: peers posted so far */
    int out_slot;  /* SEND_ALL with stride 0: the outbox slot in use, -1 none */
} gs_prim;

/* ------------------------------------------------------------------------ */
/* Algorithms                                                                */
/* ------------------------------------------------------------------------ */

typedef struct gs_coll_algo {
    const char *name;
    gs_coll_algo_id id;
    /* Sets up the op's schedule (cursor, layout). */
    void (*start)(gs_coll_op *op);
    /* Fills the next step and advances the cursor; false when none is left. */
    bool (*next)(gs_coll_op *op, gs_prim *prim);
} gs_coll_algo;

extern const gs_coll_algo gs_ring_algo;
extern const gs_coll_algo gs_rd_algo;
extern const gs_coll_algo gs_direct_algo;
extern const gs_coll_algo gs_local_algo;
extern const gs_coll_algo gs_pairwise_algo;
extern const gs_coll_algo gs_hier_algo;
/* hier_blocks.c: gs_hier_algo's reduce_scatter and allgather (start and next). */
void gs_hier_blocks_start(gs_coll_op *op);
bool gs_hier_blocks_next(gs_coll_op *op, gs_prim *p);
/* hier_small.c: its small allreduces, through one rank per host (up to GS_HIER_LEADERS_BYTES). */
#define GS_HIER_LEADERS_BYTES (16u << 10)
void gs_hier_small_start(gs_coll_op *op);
bool gs_hier_small_next(gs_coll_op *op, gs_prim *p);

/* One call: its descriptor, buffers and the schedule's cursor. */
struct gs_coll_op {
    gs_comm *comm;
    /* descriptor (what every rank must agree on) */
    gs_coll_kind kind;
    gs_dtype dtype;
    gs_redop redop;
    int32_t root;
    uint64_t count;
    uint64_t seq;
    const gs_coll_algo *algo;
    /* buffers */
    const uint8_t *send;
    uint8_t *recv;
    size_t es; /* element bytes */
    /* cursor, owned by the algorithm */
    size_t col, ncols; /* chunk column */
    int step, nsteps;  /* step within a column */
    size_t col_elems;  /* elements per chunk of a segment */
    gs_prim prim;
    bool have_prim;
    bool started;      /* reached the head of the queue */
    bool box;          /* SEND_ALL / RECV_ALL go through the shared-memory boxes */
    bool nt;           /* results written with streaming stores (too large for the cache) */
    bool box_nt;       /* by parts, 2 ranks: data posts streamed (the peer is far, parts.c) */
    bool leaders;      /* hier allreduce of a small call: through one rank per host (hier_small.c) */
    bool zcopy;        /* data posts carry GS_OP_ZCOPY (zcopy.c) */
    int zc_class;      /* the size class zcopy.c times this call in, -1: none */
    size_t zc_bytes;   /* the call's bytes, as zcopy.c classes them */
    uint64_t start_ns; /* when the call reached the head of the queue (zc_class >= 0) */
    uint64_t far_ns;   /* by parts, 2 ranks: least post line delay seen this call (0: none) */
    bool box_waited;   /* the current box reception found a peer's post missing at least once */
    bool box_ref;      /* data posts go by reference: readers copy from the poster's buffer (box.c) */
    bool parts;        /* direct over the boxes, 3+ ranks: each rank reduces its part (parts.c) */
    uint64_t box_post; /* the post of the latest SEND_ALL (boxes) */
    gs_mr *send_mr;    /* the caller's buffers registered for sends from them (gs_coll_user_open), or NULL */
    gs_mr *recv_mr;
    int last_out_slot; /* outbox slot of the latest SEND_ALL */
    /* allreduce_multi */
    const gs_tensor *tensors;
    size_t ntensors;
    /* the v-variants, in elements (the caller's arrays, untouched until the call ends): alltoallv all
     * four; allgatherv rcounts and rdispls; reduce_scatter_v rcounts */
    const size_t *scounts, *sdispls, *rcounts, *rdispls;
    /* GS_TRACE (trace.c): when the call started (0: not traced), the last
     * tick, the progress count then, and the time it waited */
    uint64_t trace_ns, trace_tick_ns, trace_seen, trace_wait_ns;
};

/* ------------------------------------------------------------------------ */
/* Requests and the communicator                                             */
/* ------------------------------------------------------------------------ */

/* A collective's or a send's/receive's request: the public gs_req is its
 * head (base), so gs_req_test/gs_req_wait reach coll_req_class (api.c). */
struct gs_coll_req {
    gs_req base;
    gs_comm *comm;
    gs_coll_op op;
    gs_status status;      /* GS_INPROGRESS until done */
    bool pooled;           /* from the pool (gs_req_test/wait release it) */
    gs_coll_req *next;     /* queue or free list */
    gs_coll_req *all_next; /* pooled: every request the communicator made (freed with it) */
    uint8_t *fused;        /* allreduce_multi's buffer, kept for the next call */
    size_t fused_cap;
    gs_p2p_op p2p; /* a send or receive (p2p.kind != GS_P2P_NONE), p2p.c */
};

/* gs_comm_destroy after a failure waits this long at most for the other
 * ranks (a live one may still finish a call before the failed one through
 * this rank; a dead one never comes). */
#define GS_COLL_LEAVE_FAILED_MS 3000

#define GS_COLL_USER_MRS 8 /* cached registrations of callers' buffers per communicator */

/* zcopy.c: over tcp, whether a large call's data posts go by reference
 * (GS_OP_ZCOPY: vmsplice + splice) or are copied into the socket. Which is
 * faster depends on where the two processes run (cores sharing a cache: the
 * copy; cores that do not: the references), so both are timed per kind and
 * size class, the faster is used and the other tried again now and then. */
#define GS_ZC_MIN_BYTES     (4u << 20) /* the first size class (the transport says from where it times) */
#define GS_ZC_CLASSES       8          /* size classes 4 MiB, 8 MiB, ... 512 MiB and more */
#define GS_ZC_KINDS         GS_COLL_KIND_END
#define GS_ZC_EXPLORE       8  /* the other mode is tried every 8th call, */
#define GS_ZC_SETTLE        64 /* for the first 64 calls of a class, */
#define GS_ZC_EXPLORE_LATER 32 /* then every 32nd */
#define GS_ZC_KEEP          3  /* a mode's estimate: the median of its last 3 call times */
typedef struct gs_zc_class {
    double recent[2][GS_ZC_KEEP]; /* [copy, zcopy]: the latest call times per byte (a ring) */
    uint32_t samples[2];          /* how many each mode has had */
    uint32_t calls;               /* calls of the class so far */
    bool zcopy;                   /* the mode in use */
} gs_zc_class;

struct gs_comm {
    gs_ctx *ctx;
    gs_tp *tp;
    bool own_tp;
    bool own_ctx;     /* a sub-communicator's group context, destroyed with it */
    unsigned splits;  /* gs_comm_split calls so far: name the groups */
    unsigned shrinks; /* gs_comm_shrink calls so far: name the agreements */
    unsigned grows;   /* gs_comm_grow calls so far: name the groups */
    /* made by gs_comm_shrink: how long its agreement and its rebuild took (tests and benchmarks) */
    uint64_t shrink_agree_ns, shrink_build_ns;
    uint64_t *groups; /* gs_comm_create_group: hash of each rank list made so far (names repeats) */
    size_t ngroups;
    const gs_config *cfg;
    int rank;
    int size;
    unsigned id;         /* creation number in this process: names store keys */
    bool oversubscribed; /* more ranks on this machine (hosts emulated on it too) than cores: waiting yields
                            the CPU */
    bool all_local;      /* every rank on this host */
    int hosts;           /* hosts the ranks run on */
    int *host_of;        /* [size]: each rank's host, numbered in the order of their first ranks */
    /* hier.c's places: hier_hosts hosts (0: one host, or one rank on each), the fewest ranks on
     * one (hier_local: the core indices) and the most (hier_lmax) */
    int hier_hosts, hier_local, hier_lmax;
    int hier_h, hier_l;    /* this rank's host and its index among the host's ranks */
    int hier_extras;       /* a core rank: the extras that fold into it (hier.c); 0 otherwise */
    int *hier_rank;        /* [hier_hosts * hier_lmax]: the rank at (host, index), -1 past a host's ranks */
    uint8_t *hier_scratch; /* hier_hosts chunks, a reduce_scatter's host-reduced blocks; then, on a core
                            * rank with extras, size chunks: the extras' columns folded in (hier_blocks.c) */
    size_t hier_scratch_bytes;
    int *ring;              /* [size]: the rings' order, host by host (ring.c): the rank at each position */
    int *ring_pos_of;       /* [size]: each rank's position in it */
    int ring_pos;           /* this rank's */
    uint64_t trace_t0;      /* GS_TRACE: when the call the engine resumes from the tiny path began */
    int local_ranks;        /* ranks on this host */
    bool tiny;              /* small blocking calls may take the tiny path (tiny.c) */
    uint64_t tiny_done;     /* calls the tiny path finished (tests read them) */
    uint64_t tiny_resumed;  /* calls it posted and the engine finished */
    uint64_t quick_calls;   /* blocking calls gs_engine_quick ran its way (tests read them) */
    uint64_t box_ref_calls; /* calls whose box posts went by reference (tests read them) */
    /* staging */
    size_t chunk;       /* payload bytes per slot */
    size_t box_chunk;   /* payload bytes per shared-memory box slot (GS_BOX_CHUNK_FACTOR x chunk) */
    size_t slot_stride; /* header + chunk, rounded to cache lines */
    size_t peer_block;  /* one peer's part of the inbox */
    gs_mr *inbox;
    gs_mr *outbox;
    gs_rmr *peer_inbox; /* [size]: every rank's inbox descriptor */
    gs_chan *chans;     /* [size]; chans[rank] unused */
    uint8_t *out_slots;
    int out_nslots;
    int out_next;
    uint32_t *out_pending; /* [out_nslots]: signaled writes not yet completed */
    uint64_t *out_call;    /* [out_nslots]: call that wrote from the slot unsignaled (0: none) */
    uint32_t *out_unit;    /* [out_nslots]: and the step id it wrote */
    uint8_t *abort_src;    /* outbox area the abort notice is written from */
    /* calls */
    uint64_t seq_issued;      /* numbers given to calls so far */
    uint64_t seq_done;        /* calls finished */
    gs_coll_req *head, *tail; /* started, not finished, in order */
    gs_coll_req *free_reqs;
    gs_coll_req *all_reqs;   /* every pooled request, wherever it is (queue, free list, the caller's hands) */
    gs_coll_req sync_req;    /* the blocking calls' request */
    uint64_t progress_count; /* bumped whenever anything moves */
    uint64_t progress_seen;  /* its value when progress_ns was taken */
    uint64_t progress_ns;    /* when it last changed, as far as the waiter saw (for the deadline) */
    gs_box *box;             /* shared-memory boxes of the direct algorithm, or NULL */
    size_t nt_bytes;         /* results from this size on are streamed (GS_COLL_NT_BYTES; tests lower it) */
    size_t parts_bytes;      /* over the boxes: allreduces by parts from here (2 ranks 1 MiB, more 64 KiB) */
    uint8_t *scratch;        /* one chunk: partial results that must stay in cache */
    size_t box_ref_reduce_max; /* reduces post by reference up to this size (box.c: from the L2) */
    gs_mr *ref_mr; /* a reduce by reference: three GS_BOX_REF_READ_BYTES pieces, two the peers' operands
                      are read into, one for partial results (box_ref.c; allocated at the first such
                      call), or NULL */
    uint64_t
        box_line_ns; /* 2 ranks, boxes: the peer's post line delay, least seen in the last call by parts */
    int box_stream;  /* by parts, 2 ranks: data posts streamed: GS_BOX_STREAM_* (tests force it) */
    gs_zc_class zc[GS_ZC_KINDS][GS_ZC_CLASSES];
    struct {
        gs_mr *mr; /* a caller's buffer registered by gs_coll_user_open, or NULL */
        const void *addr;
        size_t len;
        unsigned access;
        unsigned refs; /* calls using it now */
        uint64_t used; /* user_clock when last taken (the least recent unused one is replaced) */
    } user_mrs[GS_COLL_USER_MRS];
    uint64_t user_clock;
    gs_status failed;                     /* GS_OK, or the error every later call returns */
    uint64_t failed_seq;                  /* the first call the failure concerns */
    char failed_text[GS_COLL_CTRL_BYTES]; /* the sentence every later call returns (fail.c) */
    char failed_raw[GS_COLL_CTRL_BYTES];  /* the text it was made of */
    int failed_teller;                    /* the rank that reported it, -1: found here */
    bool failed_named;                    /* the sentence names the call's kind */
    /* progress thread (GS_PROGRESS_THREAD) */
    bool threaded;
    bool stop;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a request finished, or work was queued */
    gs_wc wcs[32];
    gs_p2p *p2p; /* point-to-point plane (p2p.c) */
};

/* ---- split.c */
/* A communicator over the group context ctx (taken: freed with it, or here
 * on failure) with a transport of kind tp_name opened on it. */
gs_status gs_coll_group_build(gs_ctx *ctx, const char *tp_name, gs_comm **comm_p);

/* ---- api.c */
/* A request from the communicator's pool (released by gs_req_test/wait). */
gs_coll_req *gs_coll_req_get(gs_comm *comm);
/* The coll request a public gs_req heads. */
static inline gs_coll_req *gs_coll_req_of(gs_req *req)
{
    return (gs_coll_req *)req;
}

/* ---- comm.c */
uint8_t *gs_coll_outbox_slot(gs_comm *comm, int i);
/* The next free outbox slot, or -1 if the next one is still being written. */
int gs_coll_outbox_take(gs_comm *comm);
/* Whether outbox slot i may still be read by a write in flight. A slot
 * written from unsignaled by step u of call s is free once every peer has
 * sent a message of a later call (a rank starts call s+1 only after
 * finishing s, having consumed everything sent to it for s, so it fully
 * arrived), or of a later step of s (direct: a rank sends column k+1 only
 * after it received column k from everyone). */
bool gs_coll_outbox_busy(gs_comm *comm, int i);
/* Whether op's writes go unsignaled (freed by the proof above, with no
 * acknowledgement on the wire): calls of 2 ranks by direct or ring whose
 * every column goes both ways (a broadcast's later columns go from the
 * root only). The ring's steps alternate: a rank sends step j+1 of a column
 * (or the next column's step 0) only after it received the peer's step j,
 * so a message of a later step proves the earlier ones arrived, forwards
 * included. With 2 ranks every later column and call, whatever its
 * algorithm, brings a message from the peer (with more, a ring call after
 * a direct one hears only from its left neighbour and could wait forever
 * for the proof). */
static inline bool gs_coll_unsignaled(const gs_coll_op *op)
{
    if (op->comm->size != 2)
        return false;
    if (op->algo == &gs_direct_algo)
        return op->ncols == 1 || op->kind != GS_COLL_BROADCAST;
    return op->algo == &gs_ring_algo && op->kind != GS_COLL_BROADCAST;
}
/* Registers the caller's buffers of op for the call, so that its ring sends
 * go straight from them (gs_prim.from_user): 2 ranks over tcp, allreduce of
 * at least GS_COLL_USER_BYTES (tcp registration is a table entry; verbs
 * would pin pages). Registrations are kept in a small per-communicator
 * cache keyed by address, length and access (training loops reduce the same
 * buckets every step), so a repeated call registers nothing. Leaves both
 * NULL when it does not apply or registration fails (the sends then go
 * through the staging slots). Over the boxes by reference (op->box_ref) it
 * registers what the posts name and the reads land in (gs_box_ref_extents),
 * and a failure is the call's (GS_OK otherwise). */
gs_status gs_coll_user_open(gs_coll_op *op);
/* Gives them back at the end of the call, when every write from them has
 * arrived (a 2-rank ring call ends after its last receive, which the peer
 * sent after it received all of this rank's writes but the last forward,
 * and that one goes from the staging slot): to the cache, or deregistered
 * if the cache was full of registrations in use. */
void gs_coll_user_close(gs_coll_op *op);
/* Deregisters every cached registration (at gs_comm_destroy). */
void gs_coll_user_drop(gs_comm *comm);
#define GS_COLL_USER_BYTES (64u << 10)

/* A payload's header (payload - GS_COLL_HDR_BYTES). */
static inline gs_coll_hdr *gs_coll_hdr_of(uint8_t *slot)
{
    return (gs_coll_hdr *)slot;
}
static inline uint8_t *gs_coll_payload(uint8_t *slot)
{
    return slot + GS_COLL_HDR_BYTES;
}

/* A box column is this many slot chunks: a post costs a synchronization,
 * not a message, so fewer and larger columns pay off. */
#define GS_BOX_CHUNK_FACTOR 2

/* 2 ranks through the network (tcp, verbs): a slot, and so a column, is
 * this many GS_CHUNK_BYTES. Each message costs both ends system calls and
 * a turn of the wait loop; over tcp on loopback 512K columns measured
 * faster than 256K from 1 to 64 MiB, 1M ones slower from 4 MiB (the
 * figures: docs/collectives.md). */
#define GS_PAIR_CHUNK_FACTOR 2

/* 2 ranks over the boxes: allreduces this large run by parts (halves). */
#define GS_BOX_HALVES_BYTES (1u << 20)

/* 3 or more ranks over the boxes: allreduces this large run by parts. */
#define GS_BOX_PARTS_BYTES (64u << 10)

/* By parts, 2 ranks: data posts are written with streaming stores when the
 * peer's post line took at least this long to arrive in the last such call.
 * Where the two cores share a cache (a line moves fast) the peer reads the
 * post from it; between cores that do not (a line takes several times as
 * long), reading lines dirty in the other core's cache is slower than
 * reading them from memory (the placements: docs/figures.md). */
#define GS_BOX_FAR_NS 120
enum { GS_BOX_STREAM_AUTO, GS_BOX_STREAM_ALWAYS, GS_BOX_STREAM_NEVER };

/* Over the boxes, broadcast, allgather, gather, scatter, alltoall (not in
 * place) and reduce (to GS_BOX_REF_REDUCE_MAX) with at least this many
 * bytes per rank's piece post by reference when cross-memory attach works
 * (the shm transport's caller-memory registrations): one copy, a
 * process_vm_readv from the poster's buffer or a process_vm_writev into
 * the peer's result (box_ref.c says who copies what), instead of two
 * through the box, in one column and a last empty one that keeps each
 * buffer until every rank is done (measured beside the box at 64 KiB:
 * docs/collectives.md). */
#define GS_BOX_REF_BYTES (32u << 10)

/* A reduce's operands post by reference from GS_BOX_REF_BYTES up to this
 * size where the ranks' L2 size is unknown (else 3/16 of the smallest L2,
 * box.c): they are read in GS_BOX_REF_READ_BYTES pieces into a buffer that
 * stays in the reader's cache and reduced from there (box_ref.c; the
 * peer's lines are read clean from its buffer, not dirty from its box:
 * faster where the two cores share no cache). Larger reduces go through the
 * box, where the other ranks' copies overlap the root's reduction (measured:
 * by reference wins to 384 KiB and loses from 768 KiB, where the operands
 * and the result no longer fit a 2 MiB L2 together). */
#define GS_BOX_REF_REDUCE_MAX (384u << 10)
#define GS_BOX_REF_READ_BYTES (64u << 10)

/* Results of calls this large are written with non-temporal stores. */
#define GS_COLL_NT_BYTES (8u << 20)

/* Writing into the caller's result buffer. */
static inline void gs_coll_copy_out(const gs_coll_op *op, void *dst, const void *src, size_t bytes)
{
    if (op->nt)
        gs_red_copy_nt(dst, src, bytes);
    else if (bytes)
        memcpy(dst, src, bytes);
}

static inline void gs_coll_reduce_out(const gs_coll_op *op, void *dst, const void *a, const void *b,
                                      size_t count)
{
    if (op->nt)
        gs_red_apply_nt(op->dtype, op->redop, dst, a, b, count);
    else
        gs_red_apply(op->dtype, op->redop, dst, a, b, count);
}

/* ---- chan.c */
/* wr_id of the writes a communicator posts. */
enum {
    GS_WR_OUTBOX = 1,
    GS_WR_FORWARD,
    GS_WR_CREDIT,
    GS_WR_ABORT,
    GS_WR_P2P_SEND,
    GS_WR_P2P_RECV,
    GS_WR_P2P_READ
};
#define GS_WR_ID(type, a, b)                                                                                 \
    (((uint64_t)(type) << 56) | ((uint64_t)(uint32_t)(a) << 16) | (uint64_t)(uint16_t)(b))

static inline bool gs_chan_has_msg(const gs_chan *ch)
{
    return ch->rx_next < ch->rx_arrived;
}
static inline bool gs_chan_has_credit(const gs_chan *ch)
{
    return ch->tx_sent - ch->tx_acked < GS_COLL_SLOTS;
}
/* The slot of the next message to consume. */
uint8_t *gs_chan_head(gs_comm *comm, gs_chan *ch);
/* Consumes the head message; hold keeps its slot until gs_chan_release
 * (it is being forwarded from). */
void gs_chan_consume(gs_comm *comm, gs_chan *ch, bool hold);
void gs_chan_release(gs_chan *ch, unsigned slot);
/* Writes slot (header + bytes of payload, in lmr) into the peer's next slot
 * with op's descriptor and unit in the header; signaled: wr_id completes
 * when the write is done. GS_ERR_AGAIN: nothing posted. */
gs_status gs_chan_post(gs_comm *comm, gs_chan *ch, uint8_t *slot, gs_mr *lmr, size_t bytes,
                       const gs_coll_op *op, uint32_t unit, uint64_t wr_id, bool signaled);
/* The same with the payload apart, straight from (registered) user memory:
 * a WRITE of it into the slot's payload, then a WRITE_IMM of the header
 * (built in hdr_slot, which stays untouched until the write is done). */
gs_status gs_chan_post_apart(gs_comm *comm, gs_chan *ch, uint8_t *hdr_slot, gs_mr *hdr_mr,
                             const void *payload, gs_mr *payload_mr, size_t bytes, const gs_coll_op *op,
                             uint32_t unit, uint64_t wr_id, bool signaled);
/* Sends a credit if enough slots were released since the last one. */
gs_status gs_chan_credit(gs_comm *comm, gs_chan *ch);
/* Sends the credits still owed once a progress pass has posted what it
 * could (a data message going the other way carries them for free). */
void gs_chan_flush_credits(gs_comm *comm);
/* Holds the head slot of rx (being consumed) until the peer proves that
 * the unsignaled forward from it, step unit of call seq, arrived. */
void gs_chan_hold_until_proof(gs_chan *rx, uint64_t seq, uint32_t unit);
/* Handles one completion of the communicator's transport. */
gs_status gs_chan_complete(gs_comm *comm, const gs_wc *wc);
/* Checks every message already queued for op (it just started). */
gs_status gs_chan_check_queued(gs_comm *comm, const gs_coll_op *op);

/* ---- desc.c */
/* Writes op's descriptor into a header. */
void gs_desc_fill(const gs_coll_op *op, gs_coll_hdr *hdr, uint32_t unit, size_t bytes);
/* The part of a message's descriptor that depends on its receiver (alltoallv:
 * the count is what this rank sends peer). */
void gs_desc_fill_peer(const gs_coll_op *op, gs_coll_hdr *hdr, int peer);
/* Whether hdr describes the same call as op. */
bool gs_desc_same(const gs_coll_op *op, const gs_coll_hdr *hdr);
/* "allreduce #3 (count 10, f32, sum) [ring]" */
void gs_desc_format_op(const gs_coll_op *op, char *buf, size_t cap);
void gs_desc_format_hdr(const gs_coll_hdr *hdr, char *buf, size_t cap);
const char *gs_coll_kind_name(gs_coll_kind kind);
/* GS_ERR_MISMATCH naming both calls (the engine fails the communicator). */
gs_status gs_desc_mismatch(gs_comm *comm, const gs_coll_op *op, const gs_coll_hdr *hdr, const char *what);
/* Checks a message about to be consumed by a step of op. */
gs_status gs_desc_check(gs_comm *comm, const gs_coll_op *op, const gs_coll_hdr *hdr, int peer, uint32_t unit,
                        size_t bytes);

/* The payload bytes a RECV_ALL step expects in peer q's message or post. */
static inline size_t gs_prim_peer_bytes(const gs_prim *p, int q)
{
    if (p->mode == GS_PRIM_BCAST)
        return q == p->root ? p->bytes : 0;
    if (p->to_root)
        return q == p->root ? 0 : p->bytes;
    return p->bytes;
}

/* ---- blocks.c */
/* The newer collectives (reduce, gather, scatter, alltoall(v), allgatherv,
 * reduce_scatter_v) as blocks: what this rank sends to peer q (from
 * op->send), receives from q (into op->recv, reduced there for the
 * reductions) and, for q == rank, copies from its input to its result; in
 * elements. A block of length 0 still travels as one empty message. */
void gs_block_peer(const gs_coll_op *op, int q, size_t *send_off_p, size_t *send_len_p, size_t *recv_off_p,
                   size_t *recv_len_p);
void gs_block_self(const gs_coll_op *op, size_t *from_p, size_t *to_p, size_t *len_p);
/* Whether the kind's received blocks are reduced into the result. */
bool gs_block_reduces(gs_coll_kind kind);
/* Whether the kind is one of the newer collectives. */
static inline bool gs_block_kind(gs_coll_kind kind)
{
    return kind >= GS_COLL_REDUCE && kind < GS_COLL_KIND_END;
}

/* ---- rooted.c, alltoall.c: direct's steps over the boxes */
void gs_rooted_fill(gs_coll_op *op, int step, size_t first, size_t bytes, gs_prim *p);
void gs_alltoall_fill(gs_coll_op *op, int step, size_t first, size_t bytes, gs_prim *p);

/* ---- trace.c: GS_TRACE events (callers check gs_trace_enabled() first) */
void gs_coll_trace_start(gs_coll_op *op);
/* A progress pass of comm: the head call's time since the last one was
 * waiting if nothing moved. */
void gs_coll_trace_tick(gs_comm *comm);
/* The call's event (nothing if it was not traced). */
void gs_coll_trace_end(gs_coll_op *op, gs_status status);
/* One event from its parts (the tiny path, which has no op). */
void gs_coll_trace_event(const gs_comm *comm, const char *kind, const char *algo, uint64_t seq, size_t count,
                         size_t bytes, gs_dtype dtype, gs_redop redop, int root, uint64_t start_ns,
                         uint64_t wait_ns, gs_status status);

/* ---- prim.c */
/* Runs one step as far as it can: GS_OK done, GS_INPROGRESS waiting (call
 * again after progress), else an error. */
gs_status gs_prim_run(gs_coll_op *op, gs_prim *prim);
/* What the step waits for, for the timeout message. */
void gs_prim_describe_wait(const gs_coll_op *op, const gs_prim *prim, char *buf, size_t cap);
/* Step constructors used by the algorithms. */
gs_prim gs_prim_pair(int send_to, int recv_from, gs_prim_mode mode, const void *local, void *out,
                     size_t bytes);
/* Post bytes from local to every peer (stride: bytes between peers' pieces, 0: the same). */
gs_prim gs_prim_send_all(const void *local, size_t bytes, size_t stride);
/* Take what every peer posted (root: only the root's, -1: every peer's). */
gs_prim gs_prim_recv_all(gs_prim_mode mode, const void *local, void *out, size_t bytes, int root);

/* ---- engine.c */
/* The communicator's lock, taken only when a progress thread shares it. */
static inline void gs_engine_lock(gs_comm *comm)
{
    if (comm->threaded)
        pthread_mutex_lock(&comm->lock);
}
static inline void gs_engine_unlock(gs_comm *comm)
{
    if (comm->threaded)
        pthread_mutex_unlock(&comm->lock);
}
/* Queues a started request and runs what it can without waiting. */
gs_status gs_engine_submit(gs_comm *comm, gs_coll_req *req);
/* Waits for req to finish (deadline: GS_TIMEOUT_MS without progress). */
gs_status gs_engine_wait(gs_comm *comm, gs_coll_req *req);
/* Progress without waiting; req's status (GS_INPROGRESS while it runs). */
gs_status gs_engine_test(gs_comm *comm, gs_coll_req *req);
/* Polls once and runs the queue; never blocks. Caller holds the lock. */
gs_status gs_engine_progress(gs_comm *comm);
/* Fails the communicator from call seq on: queued requests from seq on end
 * with status (earlier ones still finish), later calls return it; with
 * tell_peers every peer is told (not when the news came from a peer). */
void gs_engine_fail(gs_comm *comm, gs_status status, uint64_t seq, const char *text, bool tell_peers);
/* The same for a failure rank teller reported (text: its sentence); the
 * communicator's sentence names teller (fail.c). */
void gs_engine_fail_told(gs_comm *comm, gs_status status, uint64_t seq, int teller, const char *text);
/* A failure found between calls names the next call ("call #8" until
 * then): the call of kind that learns of it at its start names it. */
void gs_engine_fail_name(gs_comm *comm, gs_coll_kind kind);
/* The call a failure now concerns: the head request's, else the next one. */
uint64_t gs_engine_current_seq(const gs_comm *comm);
/* Whether a blocking call may take the quick path now: shared-memory
 * boxes between 2 ranks, nothing queued or failed, no progress thread. */
static inline bool gs_engine_quick_fits(const gs_comm *comm)
{
    return comm->box && comm->size == 2 && !comm->head && !comm->threaded && comm->failed == GS_OK;
}
/* Runs a prepared blocking call whose op fits one box post (allreduce,
 * reduce, gather, scatter, allgather, alltoall by direct in one column; else
 * the engine's way): posts, spins on the peer's post word, reads, done;
 * anything unusual (a slow peer, a mismatch, a failure) continues in
 * gs_engine_wait from where it stands. */
gs_status gs_engine_quick(gs_comm *comm, gs_coll_req *req);
/* Continues a prepared blocking call whose only box post the tiny path
 * already made (call number comm->seq_issued, the box's latest post): runs
 * its receive step in the engine (a late peer, a mismatch, a failure). */
gs_status gs_engine_resume(gs_comm *comm, gs_coll_req *req);
/* Blocks in the transport up to timeout_ms for completions and handles
 * them (p2p.c's waits). */
gs_status gs_engine_block(gs_comm *comm, int timeout_ms);
gs_status gs_engine_thread_start(gs_comm *comm);
void gs_engine_thread_stop(gs_comm *comm);

/* ---- box.c, box_ref.c */
/* Maps every rank's box when all ranks share this host and the transport
 * is shm; all ranks end with boxes or none. */
gs_status gs_box_open(gs_comm *comm);
void gs_box_close(gs_comm *comm);
/* SEND_ALL and RECV_ALL through the boxes. */
gs_status gs_box_post(gs_coll_op *op, gs_prim *prim);
gs_status gs_box_gather(gs_coll_op *op, gs_prim *prim);
/* Whether calls with pieces of this size could post by reference (boxes,
 * cross-memory attach, GS_BOX_REF_BYTES). */
bool gs_box_ref_possible(const gs_comm *comm, size_t piece);
/* Whether op posts by reference, the same on every rank. */
bool gs_box_ref_wanted(const gs_coll_op *op);
/* By reference: the bytes of op->send this rank posts from and of op->recv
 * it reads into (0: none), and the access op->recv needs (peers may write
 * into it). */
void gs_box_ref_extents(const gs_coll_op *op, size_t *send_p, size_t *recv_p, unsigned *recv_access_p);
/* By reference: the first bytes of a broadcast's result that the root
 * writes into each non-root (the rest the non-root reads). */
size_t gs_box_ref_share(const gs_coll_op *op);
/* The number of this rank's latest post. */
uint64_t gs_box_posts(const gs_comm *comm);
/* Whether every peer made the post op waits for. */
bool gs_box_ready(const gs_coll_op *op);
/* One turn of waiting for it, idle_ns after the last progress: spin, yield
 * or sleep on the doorbell. */
void gs_box_idle(gs_comm *comm, const gs_coll_op *op, uint64_t idle_ns, unsigned turn);
void gs_box_describe_wait(const gs_coll_op *op, char *buf, size_t cap);
/* Announces a failure in this rank's box (peers waiting on boxes see it). */
void gs_box_tell(gs_comm *comm, gs_status status, uint64_t seq, const char *text);
/* For steps with their own payload layout (parts.c): this rank's payload
 * of its next post (free to fill: every peer has read what it held),
 * publishing it (descriptor with unit and bytes, then the post number),
 * whether every peer's post op waits for came (GS_INPROGRESS if not; a
 * peer's announced failure; each header checked against unit and
 * bytes_of(op, peer)), and peer q's payload of that post. */
uint8_t *gs_box_next_payload(gs_comm *comm);
void gs_box_publish(gs_coll_op *op, uint32_t unit, size_t bytes);
gs_status gs_box_arrived(gs_coll_op *op, uint32_t unit, size_t (*bytes_of)(const gs_coll_op *op, int peer));
const uint8_t *gs_box_peer_payload(const gs_coll_op *op, int q);

/* ---- parts.c */
/* Allreduce by parts over the boxes (direct.c runs it for op->parts):
 * layout, the schedule's step, and running its posts and receptions. */
void gs_parts_start(gs_coll_op *op);
void gs_parts_fill(gs_coll_op *op, int step, gs_prim *p);
gs_status gs_parts_post(gs_coll_op *op, gs_prim *p);
gs_status gs_parts_gather(gs_coll_op *op, gs_prim *p);

/* ---- tiny.c */
/* The largest payload the tiny path carries (the first 8 bytes share the
 * post word's cache line, the rest follows in the next lines). */
#define GS_TINY_MAX_BYTES 256

/* Whether the communicator allows the tiny path: 2 ranks over the boxes,
 * no progress thread (set at creation). */
bool gs_tiny_allowed(const gs_comm *comm);
/* Whether a blocking call may try it now: nothing in flight or failed,
 * GS_ALGO auto or direct (tests change it between calls). */
static inline bool gs_tiny_ready(const gs_comm *comm)
{
    return comm->tiny && !comm->head && comm->failed == GS_OK &&
           (comm->cfg->algo == GS_ALGO_AUTO || comm->cfg->algo == GS_ALGO_DIRECT);
}
/* A blocking allreduce, when it is a valid one of at most
 * GS_TINY_MAX_BYTES, or a barrier: GS_OK done; GS_INPROGRESS posted (call
 * comm->seq_issued) but not finished: prepare the call in comm->sync_req
 * and gs_engine_resume it; GS_ERR_AGAIN (allreduce) not taken, nothing
 * done: the usual path checks and runs it. */
gs_status gs_tiny_allreduce(gs_comm *comm, const void *send, void *recv, size_t count, gs_dtype dtype,
                            gs_redop op);
/* A blocking reduce the same way (the root's post empty, as rooted.c's). */
gs_status gs_tiny_reduce(gs_comm *comm, const void *send, void *recv, size_t count, gs_dtype dtype,
                         gs_redop op, int root);
gs_status gs_tiny_barrier(gs_comm *comm);

/* ---- summary.c: the init summary (GS_LOG_LEVEL=info, rank 0, once per process) */
void gs_coll_summary(const gs_comm *comm);

/* ---- select.c */
const gs_coll_algo *gs_coll_select(const gs_comm *comm, gs_coll_kind kind, size_t bytes);

/* ---- layout.c */
/* Sets ncols and col_elems for segments of at most max_seg elements and
 * puts the cursor at the start. */
void gs_coll_layout(gs_coll_op *op, size_t max_seg);
/* The same when `pieces` segment chunks travel in one slot. */
void gs_coll_layout_pieces(gs_coll_op *op, size_t max_seg, size_t pieces);
/* The same with columns of at most chunk bytes (at most the slot's). */
void gs_coll_layout_cap(gs_coll_op *op, size_t max_seg, size_t pieces, size_t chunk);
/* Over the boxes, reduce, gather, scatter, alltoall (and 2-rank broadcast
 * and allgather) cut a call into about this many columns (at least
 * GS_BOX_PIPE_MIN_BYTES per rank's piece, at most a slot), so that a
 * sender's copy into its box overlaps the reader's work on the column
 * before; smaller pieces cost more in posts than they gain (measured at
 * 64 KiB and 1 MiB, docs/collectives.md). */
#define GS_BOX_PIPE_COLUMNS   16
#define GS_BOX_PIPE_MIN_BYTES (16u << 10)
/* The schedule cursor past its step: the column's next step or, past the
 * column's last, the next column's first. */
void gs_coll_cursor_advance(gs_coll_op *op);
/* For schedules in which a rank sits some steps out: fill(op, step, p, arg)
 * describes the cursor's step, true when this rank has a part in it.
 * gs_coll_next_mine moves the cursor past each step and gives the first one
 * of this rank's; false when the call has no more. */
typedef bool (*gs_coll_fill_fn)(gs_coll_op *op, int step, gs_prim *p, const void *arg);
bool gs_coll_next_mine(gs_coll_op *op, gs_prim *p, gs_coll_fill_fn fill, const void *arg);
/* [first, first + n) elements of chunk col of a segment of seg elements. */
void gs_coll_chunk(const gs_coll_op *op, size_t seg, size_t col, size_t *first_p, size_t *n_p);
/* base + off, or NULL when base is NULL (barrier and count 0 have no buffers). */
static inline uint8_t *gs_coll_at(const void *base, size_t off)
{
    return base ? (uint8_t *)base + off : NULL;
}
/* The step id carried by messages: column and step. */
static inline uint32_t gs_coll_unit(const gs_coll_op *op, size_t col, int step)
{
    return (uint32_t)(col * (size_t)op->nsteps + (size_t)step);
}
static inline int gs_coll_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* zcopy.c: chooses op->zcopy as the call starts, and records the time of a
 * finished one (both under the engine's lock). */
void gs_coll_zc_choose(gs_coll_op *op);
void gs_coll_zc_record(gs_coll_op *op, uint64_t now_ns);

#endif
