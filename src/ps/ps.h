/*
 * The parameter server's internal objects and the functions its files share.
 * It reaches the other ranks through the transport's ops and capabilities
 * only, and borrows nothing of the collectives; the reduction kernels it
 * shares with them live below both (kernel/reduce.h).
 *
 *   ps.c          parameters, roles, create/destroy, the control region
 *   register.c    collective registration of keys: regions, descriptors, init
 *   server.c      the serve loop: arrivals, sync/async aggregation, notices
 *   server_apply.c  summing slots / draining the accumulator, optimizer, seqlock
 *   server_ckpt.c checkpoints of a server: when, writing, restoring
 *   worker.c      requests and the worker's progress engine
 *   worker_push.c push by WRITE_IMM or by fixed-point FETCH_ADD
 *   worker_pull.c pull by fenced READs under the seqlock
 *   peers.c       finding which peer a GS_ERR_PEER_LOST is about
 *   recover.c     rebuilding the job's transport around a restarted server
 *
 * Formats are in ps_proto.h, the sharding plan in plan.h. Each gs_ps (and
 * its transport) is driven by one thread at a time.
 */
#ifndef GS_PS_H
#define GS_PS_H

/* Keys at least this big are pushed from and pulled into the caller's
 * buffers directly (registered for the duration of each request); smaller
 * ones go through the PS's own registered staging. */
#define GS_PS_ZCOPY_MIN (256u << 10)

/* Atomic aggregation adds this many elements per round of FETCH_ADDs. */
#define GS_PS_ATOMIC_CHUNK_ELEMS 4096

#include "gradsync.h"
#include "ps/ckpt.h"
#include "ps/fixed.h"
#include "ps/plan.h"
#include "ps/ps_proto.h"
#include "transport/tp.h"
#include "util/clock.h"
#include "util/config.h"
#include "util/req.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* wr_id of our own signaled ops: kind in the top byte, a shard or ring index below. */
enum {
    GS_PS_WR_PUSH = 1, /* worker: WRITE_IMM of a gradient shard */
    GS_PS_WR_PULL,     /* worker: the last READ of a pull */
    GS_PS_WR_ATOMIC,   /* worker: the last FETCH_ADD of a chunk */
    GS_PS_WR_ARRIVE,   /* worker: the arrival counter FETCH_ADD */
    GS_PS_WR_NOTIFY,   /* worker: WRITE_IMM telling the server a step is complete */
    GS_PS_WR_TX,       /* either: a control or notice record from the tx ring */
    GS_PS_WR_INIT,     /* worker 0: initial values */
};
static inline uint64_t gs_ps_wr(int kind, uint64_t index)
{
    return (uint64_t)kind << 56 | index;
}
static inline int gs_ps_wr_kind(uint64_t wr_id)
{
    return (int)(wr_id >> 56);
}
static inline uint64_t gs_ps_wr_index(uint64_t wr_id)
{
    return wr_id & ((1ull << 56) - 1);
}

/* A ring of 64-byte records to send from (notices, control messages): a
 * record stays untouched until its signaled WRITE_IMM completes. */
typedef struct gs_ps_tx {
    gs_mr *mr;
    uint32_t cap;
    uint32_t *free_list;
    uint32_t nfree;
    int *dest; /* [cap] the rank a record in flight goes to, -1 if free */
} gs_ps_tx;

/* ---- server ---------------------------------------------------------------- */

typedef struct gs_ps_sshard {
    uint32_t gid;    /* index in the plan */
    uint32_t kindex; /* shard index within its key (its notice record) */
    uint64_t key;
    size_t count;       /* elements */
    int init_pending;   /* registration: initial values not yet received */
    gs_mr *param;       /* head + wstate[W] + parameters (REMOTE_READ) */
    gs_mr *slots;       /* W gradient slots (REMOTE_WRITE) */
    gs_mr *acc;         /* accumulator (REMOTE_ATOMIC), atomic mode */
    float *state[2];    /* optimizer state vectors */
    uint64_t opt_steps; /* optimizer updates taken */
    uint64_t saved_version;
    uint64_t waiting_since_ns; /* sync: when the first gradient of the pending step arrived, 0: none */
    gs_rmr *notice;            /* [W] each worker's notice region of this shard's key */
    bool restored;             /* parameters came from a checkpoint */
    gs_status status;          /* error the notices report (GS_OK normally) */
    int status_about;          /* the worker it is about, -1 */
    uint8_t *dirty;            /* [W] a notice is owed to that worker */
} gs_ps_sshard;

typedef struct gs_ps_server {
    gs_ps_sshard *shards; /* this server's shards, in slot order */
    uint32_t nshards, shards_cap;
    uint32_t epoch;      /* incarnation: 1 at first start, +1 per restart */
    bool *lost;          /* [W] */
    bool *bye;           /* [W] */
    int finished;        /* workers that said BYE or were lost */
    gs_ps_ckpt *restore; /* the checkpoint to restore keys from, or NULL */
    float *scratch;      /* atomic: decoded gradient */
    size_t scratch_count;
    gs_ps_tx tx;
    uint64_t *dirty_list; /* shard slot << 32 | worker, for notices owed */
    size_t ndirty, dirty_cap;
    uint64_t next_probe_ns; /* peer-loss probes are rate limited */
    uint32_t *outbox;       /* control replies owed: worker << 8 | cmd, then arg */
    size_t noutbox, outbox_cap;
    gs_status verdict;           /* what gs_ps_serve returns once finished */
    bool recheck;                /* elastic: a worker was lost, rounds waiting for it may be complete */
    uint64_t next_join_probe_ns; /* elastic: when to look for rejoining workers again */
    bool recover_asked;          /* a worker asked for recovery */
    uint32_t recover_arg;
    struct gs_ps_pool *pool; /* apply threads while serving (GS_PS_APPLY_THREADS > 1), else NULL */
} gs_ps_server;

/* ---- worker ---------------------------------------------------------------- */

typedef enum gs_ps_phase {
    GS_PS_IDLE = 0,
    GS_PS_PUSH_WAIT,     /* until the slot, the staleness bound and the log allow step `pushed` */
    GS_PS_PUSH_POSTED,   /* WRITE_IMM in flight */
    GS_PS_ATOMIC_CHUNK,  /* FETCH_ADDs of the chunk [chunk_start, chunk_end) being posted or in flight */
    GS_PS_ATOMIC_ARRIVE, /* arrival counter in flight */
    GS_PS_ATOMIC_NOTIFY, /* last arriver's WRITE_IMM in flight */
    GS_PS_PULL_WAIT,     /* until the server has applied every push of ours */
    GS_PS_PULL_POSTED,   /* READs in flight */
    GS_PS_DONE,
} gs_ps_phase;

typedef struct gs_ps_wshard {
    uint32_t gid;    /* index in the plan */
    uint32_t keyi;   /* index of its key in worker->keys */
    uint32_t kindex; /* shard index within the key */
    int server;      /* server index */
    int server_rank;
    size_t offset, count;     /* elements within the key */
    uint32_t slot;            /* index among the server's shards */
    gs_rmr param, slots, acc; /* the server's regions of this shard */
    uint64_t pushed;          /* pushes sent (the next push's step) */
    gs_ps_notice seen;        /* what the server told us, fields merged by max */
    gs_ps_phase phase;
    bool restored;                 /* registration found it in a checkpoint */
    size_t next;                   /* atomic: next element to add */
    size_t chunk_start, chunk_end; /* atomic: the chunk being added */
    bool posted;                   /* atomic arrive/notify: posted, waiting for its completion */
    gs_status error;               /* reported by the server, for the next request on this shard */
    uint64_t error_version;        /* 1 + the shard version of the last error recorded (or reported by us) */
    uint32_t pull_tries;
    uint64_t retry_at_ns; /* pull: torn read, try again after this */
    uint32_t counted;     /* sync: the pushes the round of the last pull counted (its head's) */
} gs_ps_wshard;

typedef struct gs_ps_req gs_ps_req; /* a push or pull in flight (below) */

typedef struct gs_ps_wkey {
    uint64_t key;
    size_t count;
    size_t first; /* gid of the first shard: shards are worker->shards[first ..] */
    size_t nshards;
    uint64_t next_step; /* step of the next push request (pushes started, less failed ones) */
    gs_mr *log;         /* depth entries of the key's gradient: push staging + replay log */
    uint32_t depth;
    size_t entry_bytes;
    gs_mr *pull;            /* per shard: head, region copy, head */
    size_t *pull_off;       /* [nshards] */
    gs_mr *notice;          /* [nshards] gs_ps_notice, written by the servers */
    gs_mr *atomic;          /* atomic: per shard q[chunk], old[chunk], 8 result words */
    gs_ps_req *head, *tail; /* requests, oldest first; only the head progresses */
} gs_ps_wkey;

typedef struct gs_ps_worker {
    gs_ps_wkey *keys;
    size_t nkeys, keys_cap;
    gs_ps_wshard *shards; /* [plan.nshards] */
    size_t shards_cap;
    gs_ps_tx tx;
    int init_pending;     /* registration: initial-value writes in flight */
    bool *server_lost;    /* [S] */
    gs_status fatal;      /* sticky: set when the job can no longer go on without recovery */
    char fatal_why[512];  /* its gs_last_error() text */
    uint32_t ckpt_serial; /* checkpoint requests sent */
    int ckpt_pending;     /* servers yet to answer the current one */
    gs_status ckpt_status;
    uint64_t pull_retries;   /* torn or stale copies read again (statistics) */
    uint64_t next_probe_ns;  /* peer-loss probes are rate limited */
    gs_status replay_status; /* the first error of a replayed push */
    uint64_t finished;       /* requests finished, ever (a progress pass that finished one does not block) */
    bool again;              /* a post met a full send queue: poll and retry, do not block */
    bool no_zcopy;           /* the transport refused to register caller memory: always stage */
} gs_ps_worker;

/* A push, pull or push-pull in flight: the public gs_req is its head (base),
 * so gs_req_test/gs_req_wait reach worker.c's class. */
struct gs_ps_req {
    gs_req base;
    gs_ps *ps;
    gs_ps_wkey *key;
    bool push, pull;
    bool replay;   /* internal: re-send step `step` from the log after a recovery (freed when done) */
    uint64_t step; /* push: the key's step this request pushes */
    const float *grad;
    float *out;
    gs_mr *grad_mr, *out_mr; /* zero copy: grad and out registered while the request runs */
    size_t left;             /* shards not yet done */
    bool active;             /* at the head of its key, shards set up */
    bool done;
    gs_status status;
    uint64_t trace_ns; /* GS_TRACE: when it started (0: not traced) */
    gs_ps_req *next;
};

/* ---- the object ---------------------------------------------------------------- */

struct gs_ps {
    gs_ctx *ctx;
    const gs_config *cfg;
    gs_ps_params params;
    char transport[32];
    char checkpoint[GS_CONFIG_STR_MAX];
    gs_tp *tp;
    int rank, size;
    bool is_server;
    int index; /* among the servers or the workers */
    int nservers, nworkers;
    int *server_ranks; /* [nservers] */
    int *worker_ranks; /* [nworkers] */
    int *role_index;   /* [size] index of each rank among its role */
    gs_mr *ctrl;       /* 64 bytes, target of zero-length control writes */
    gs_rmr *ctrl_rmrs; /* [size] */
    unsigned ns;       /* which gs_ps of the job (creation order): store keys carry it */
    bool restarted;    /* this process replaced a lost server (GS_REJOIN=1) */
    gs_ps_plan plan;
    gs_ps_fixed fixed;
    uint32_t gen;          /* transport generation: 0, +1 per recovery */
    uint32_t *incarnation; /* [nservers] as last known */
    uint32_t log_depth;
    int64_t timeout_ms;
    gs_ps_server srv;
    gs_ps_worker wrk;
    pthread_t thread;
    bool thread_started;
    gs_status thread_status;
};

/* Waits shorter than this are polls instead: the transports time waits
 * with the coarse clock (a tick, up to 4 ms, early), and log every wait that
 * times out. */
#define GS_PS_MIN_WAIT_MS 8

/* Milliseconds to block for something due by deadline_ns; 0 (poll) when
 * that is too close for a timed wait. Waits are as long as the awaited
 * completion may take. */
static inline int gs_ps_wait_ms(uint64_t deadline_ns)
{
    int left = gs_deadline_left_ms(deadline_ns);
    return left < GS_PS_MIN_WAIT_MS ? 0 : left;
}

/* ---- ps.c ---------------------------------------------------------------------- */
const char *gs_ps_role_name(const gs_ps *ps);
/* Roles from one byte per rank (1: server). */
gs_status gs_ps_take_roles(gs_ps *ps, const uint8_t *all);
/* A store key of this gs_ps and generation: "gs.ps.<ns>.g<gen>." + what. */
void gs_ps_tag(const gs_ps *ps, char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sets up the control region and the tx ring on ps->tp and exchanges the
 * control descriptors (tag includes the generation). Collective. */
gs_status gs_ps_connect(gs_ps *ps);
/* Once the roles are known: the fixed-point format, the shard plan, the
 * servers' incarnations and the server's or worker's own state (create, and
 * a restarted server's recovery). */
gs_status gs_ps_state_init(gs_ps *ps);
/* Frees what gs_ps_connect and registration put on ps->tp. */
void gs_ps_disconnect(gs_ps *ps);

/* ---- tx ring (ps.c) ------------------------------------------------------------- */
gs_status gs_ps_tx_init(gs_ps *ps, gs_ps_tx *tx, uint32_t cap);
void gs_ps_tx_free(gs_ps_tx *tx);
/* Sends a 64-byte record (or none: rec NULL) with imm to rank's region at
 * off; GS_ERR_AGAIN when no record or send slot is free (poll, retry). */
gs_status gs_ps_tx_send(gs_ps *ps, gs_ps_tx *tx, int rank, const void *rec, const gs_rmr *dst, uint64_t off,
                        uint32_t imm);
void gs_ps_tx_complete(gs_ps_tx *tx, uint64_t wr_id);
/* Records in flight to peers not known lost: what a loop that lets the
 * records leave waits for (a lost peer's may complete late or never). */
uint32_t gs_ps_tx_live(const gs_ps *ps, const gs_ps_tx *tx);
/* Whether rank, a peer of this role (a server of a worker, a worker of a server), is known lost. */
bool gs_ps_peer_lost(const gs_ps *ps, int rank);
/* A zero-length control message (CTRL imm) to rank's control region. */
gs_status gs_ps_ctrl_send(gs_ps *ps, int rank, uint32_t cmd, uint32_t arg);

/* ---- peers.c ------------------------------------------------------------------------ */
/* After poll/wait said GS_ERR_PEER_LOST: which of the given ranks are
 * gone (lost_p[i] set for ranks[i]); skip[i] ranks are not probed. */
void gs_ps_find_lost(gs_ps *ps, const int *ranks, int n, const bool *skip, bool *lost_p);

/* ---- register.c ------------------------------------------------------------------------ */
gs_status gs_ps_server_add_key(gs_ps *ps, const gs_ps_key_info *key);
gs_status gs_ps_worker_add_key(gs_ps *ps, const gs_ps_key_info *key);
/* Exchanges descriptors and state of the ki-th key (collective), then worker 0 sends init. */
gs_status gs_ps_exchange_key(gs_ps *ps, size_t ki, const float *init);
void gs_ps_server_free_keys(gs_ps *ps);
void gs_ps_worker_free_keys(gs_ps *ps);

/* ---- server.c / server_apply.c -------------------------------------------------------- */
gs_status gs_ps_server_init(gs_ps *ps);
void gs_ps_server_fini(gs_ps *ps);
/* Seqlock writer: make seq odd before rewriting the region, even after. */
void gs_ps_seq_begin(gs_ps_head *head);
void gs_ps_seq_end(gs_ps_head *head);
static inline gs_ps_head *gs_ps_head_of(const gs_ps_sshard *sh)
{
    return (gs_ps_head *)gs_mr_addr(sh->param);
}
static inline gs_ps_wstate *gs_ps_wstate_of(const gs_ps_sshard *sh)
{
    return (gs_ps_wstate *)((char *)gs_mr_addr(sh->param) + sizeof(gs_ps_head));
}
static inline float *gs_ps_params_of(const gs_ps_sshard *sh)
{
    return (float *)((char *)gs_mr_addr(sh->param) + gs_ps_head_of(sh)->data_off);
}
/* Sync: all live workers' gradients of the pending step are in: apply. */
gs_status gs_ps_apply_sync(gs_ps *ps, gs_ps_sshard *sh);
/* Async: apply worker w's gradient now. */
gs_status gs_ps_apply_async(gs_ps *ps, gs_ps_sshard *sh, int w);
/* Atomic: the accumulator holds every worker's step: drain and apply. */
gs_status gs_ps_apply_atomic(gs_ps *ps, gs_ps_sshard *sh);
/* Smallest `applied` among live workers. */
uint64_t gs_ps_min_step(const gs_ps *ps, const gs_ps_sshard *sh);
/* Owes worker w (every live worker) a notice of the shard's state; sent by gs_ps_flush_notices. */
void gs_ps_notify(gs_ps *ps, gs_ps_sshard *sh, int w);
void gs_ps_notify_all(gs_ps *ps, gs_ps_sshard *sh);
/* Sends the notices owed, as far as the tx ring allows. */
gs_status gs_ps_flush_notices(gs_ps *ps);
/* Owes worker w a control message. */
void gs_ps_server_reply(gs_ps *ps, int w, uint32_t cmd, uint32_t arg);
/* Worker w is gone (why: for the log): marks it and tells the others. */
void gs_ps_server_worker_lost(gs_ps *ps, int w, gs_status st, const char *why);
/* Progress the server's transport once, dispatching what came in; waits up
 * to wait_ms for something (0: poll). */
gs_status gs_ps_server_progress(gs_ps *ps, int wait_ms);

/* ---- server_ckpt.c ------------------------------------------------------------------- */
gs_status gs_ps_server_load_checkpoint(gs_ps *ps);
/* Restores shard sh from the loaded checkpoint if it holds it. */
gs_status gs_ps_server_restore_shard(gs_ps *ps, gs_ps_sshard *sh);
gs_status gs_ps_server_checkpoint(gs_ps *ps);
/* Checkpoint if some shard moved checkpoint_every versions since the last. */
gs_status gs_ps_server_maybe_checkpoint(gs_ps *ps);

/* ---- worker.c ----------------------------------------------------------------------- */
gs_status gs_ps_worker_init(gs_ps *ps);
void gs_ps_worker_fini(gs_ps *ps);
/* Polls the transport once (waiting up to wait_ms when nothing is ready,
 * less if a pull retry is due sooner), dispatches completions and advances
 * every active request. */
gs_status gs_ps_worker_progress(gs_ps *ps, int wait_ms);
/* Fails every request with st (they complete with it). */
void gs_ps_worker_fail_all(gs_ps *ps, gs_status st);
/* Makes st (detail: gs_last_error()) sticky and fails every request. */
void gs_ps_worker_set_fatal(gs_ps *ps, gs_status st);
/* The status a worker call returns for st once the job is fatal: the job's
 * error with its detail as gs_last_error() (polls after it overwrite that
 * with the transport's report of the lost peer) for st GS_OK excepted. */
gs_status gs_ps_worker_fatal_status(gs_ps *ps, gs_status st);
/* Shard ws of its key's oldest request is done (from a completion). */
void gs_ps_worker_shard_done(gs_ps *ps, gs_ps_wshard *ws);
/* The error a server reported on the shard, as the request's status (logged). */
gs_status gs_ps_worker_take_error(gs_ps *ps, gs_ps_wshard *ws, const char *during);
/* GS_ERR_AGAIN from a post: not an error; the next progress polls instead of blocking
 * (the queue frees silently, no completion need come). Other statuses pass through. */
static inline gs_status gs_ps_again(gs_ps *ps, gs_status st)
{
    if (st != GS_ERR_AGAIN)
        return st;
    ps->wrk.again = true;
    return GS_OK;
}
/* Keys of this size and more are pushed and pulled with GS_OP_STREAM: one
 * step moves several times the key through memory (every worker's slot, the
 * parameters, every worker's copy), more than a last-level cache holds, so
 * streaming stores win; a smaller key's shards stay in the cache for their
 * reader. The crossover was measured (docs/ps.md, "Large keys stream"). */
#define GS_PS_STREAM_BYTES (8u << 20)
static inline unsigned gs_ps_stream_flag(const gs_ps_wkey *wk)
{
    return wk->count * sizeof(float) >= GS_PS_STREAM_BYTES ? GS_OP_STREAM : 0;
}
/* A control message to server s, progressing while no record or send slot
 * is free, until deadline (GS_ERR_TIMEOUT); gives up at once when server s
 * is known lost (its records may never come back). */
gs_status gs_ps_worker_ctrl_send(gs_ps *ps, int s, uint32_t cmd, uint32_t arg, uint64_t deadline);
/* Merges a notice into the shard's view. */
void gs_ps_worker_merge_notice(gs_ps_wshard *ws, const gs_ps_notice *n);

/* ---- worker_push.c / worker_pull.c ----------------------------------------------------- */
/* Advances shard i of the head request of wk; returns GS_OK also when it
 * must wait; an error fails the request. */
gs_status gs_ps_push_advance(gs_ps *ps, gs_ps_req *req, size_t i);
gs_status gs_ps_pull_advance(gs_ps *ps, gs_ps_req *req, size_t i);
/* A completion of ours for shard ws. */
/* Atomic: posts the arrival or the last arriver's notification again after a full send queue. */
gs_status gs_ps_push_retry(gs_ps *ps, gs_ps_wshard *ws);
gs_status gs_ps_push_completed(gs_ps *ps, gs_ps_wshard *ws, int kind, const gs_wc *wc);
gs_status gs_ps_pull_completed(gs_ps *ps, gs_ps_wkey *wk, size_t i, const gs_wc *wc);
/* Atomic mode: every element of grad within the fixed-point bound, else
 * GS_ERR_OVERFLOW naming the first that is not (nothing is sent). */
gs_status gs_ps_atomic_check(gs_ps *ps, const gs_ps_wkey *wk, const float *grad);
/* Posts the three fenced READs of shard i into the pull staging. */
gs_status gs_ps_pull_post(gs_ps *ps, gs_ps_wkey *wk, size_t i, unsigned last_flags, uint64_t wr_id);
/* Whether shard i's pull read a consistent copy (the same even seq before and after). */
bool gs_ps_pull_consistent(const gs_ps_wkey *wk, size_t i);
/* Bytes of a shard's pull staging: head and wstate, parameters, head again. */
static inline size_t gs_ps_pull_stage_bytes(uint32_t workers, uint64_t count)
{
    return gs_ps_param_region_bytes(workers, count) + GS_PS_ALIGN;
}

/* ---- recover.c ---------------------------------------------------------------------- */
/* Server, elastic: when every lost worker has a process waiting to rejoin in
 * its place (probed in the store every 50 ms), asks for a recovery that
 * readmits them. */
void gs_ps_server_check_joiners(gs_ps *ps);
/* Worker: a key goes on from the step its servers hold (the lowest, if
 * shards differ: those ahead skip the steps they have). register.c. */
void gs_ps_worker_start_at_servers(gs_ps *ps, gs_ps_wkey *wk);
/* Server: a worker asked for recovery: rebuild the transport with the others. */
gs_status gs_ps_recover_server(gs_ps *ps);
/* gs_ps_create of a process started with GS_REJOIN=1 in a lost server's place. */
gs_status gs_ps_restart(gs_ps *ps);

#endif
