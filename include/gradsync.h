/*
 * gradsync: gradient synchronization for data-parallel training.
 *
 * The one public header. Every object is opaque and created/destroyed in
 * pairs; every call returns a gs_status (GS_OK = 0, errors negative) and sets
 * its outputs (the arguments ending in _p) only on success. The detail of an
 * error (which peer, which operation, the errno text) is logged by the
 * function that detected it and kept in gs_last_error().
 *
 * Layers, bottom up: context (config, rank, bootstrap store) -> transport
 * (one-sided RDMA semantics: memory regions, endpoints, WRITE, WRITE_IMM,
 * READ, atomics, SEND/RECV, completions) -> collectives and parameter server.
 */
#ifndef GRADSYNC_H
#define GRADSYNC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GS_BUILDING_LIBRARY)
#define GS_API __attribute__((visibility("default")))
#else
#define GS_API
#endif

#define GS_VERSION_MAJOR  0
#define GS_VERSION_MINOR  2
#define GS_VERSION_PATCH  0
#define GS_VERSION_STRING "0.2.0"

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* X(name, value, message): the one table that generates gs_status,
 * gs_status_name() and gs_strerror(). */
#define GS_STATUS_TABLE(X)                                                                                   \
    X(OK, 0, "success")                                                                                      \
    X(INPROGRESS, 1, "operation in progress")                                                                \
    X(ERR_INVALID, -1, "invalid argument")                                                                   \
    X(ERR_NOMEM, -2, "out of memory")                                                                        \
    X(ERR_SYSTEM, -3, "system call failed")                                                                  \
    X(ERR_CONFIG, -4, "bad configuration")                                                                   \
    X(ERR_TIMEOUT, -5, "timed out")                                                                          \
    X(ERR_PEER_LOST, -6, "peer lost")                                                                        \
    X(ERR_REMOTE_ACCESS, -7, "remote access error (bad key, out of bounds or no permission)")                \
    X(ERR_PROTOCOL, -8, "protocol error (malformed message)")                                                \
    X(ERR_AUTH, -9, "authentication failed (wrong job token)")                                               \
    X(ERR_MISMATCH, -10, "mismatched calls across ranks")                                                    \
    X(ERR_UNSUPPORTED, -11, "not supported by this transport or build")                                      \
    X(ERR_FLUSHED, -12, "flushed after an endpoint error")                                                   \
    X(ERR_OVERFLOW, -13, "numeric overflow")                                                                 \
    X(ERR_AGAIN, -14, "resource temporarily exhausted, retry")                                               \
    X(ERR_IO, -15, "input/output error")

typedef enum gs_status {
#define GS_X_ENUM(name, value, msg) GS_##name = value,
    GS_STATUS_TABLE(GS_X_ENUM)
#undef GS_X_ENUM
} gs_status;

/* "GS_ERR_TIMEOUT" for GS_ERR_TIMEOUT; "GS_UNKNOWN" for a value not in the table. */
GS_API const char *gs_status_name(gs_status status);
/* A one-line human message for the status. */
GS_API const char *gs_strerror(gs_status status);
/* The detail of the last error this thread saw ("" if none), one sentence
 * read once: the rank, the operation (a collective with its sequence
 * number), the peer and the cause, e.g. "rank 2: allreduce #14: rank 1
 * lost (connection reset by peer): did it exit or crash?". The status is
 * the call's return value (gs_status_name), not repeated in the text. */
GS_API const char *gs_last_error(void);

GS_API const char *gs_version(void);

/* The clock of gradsync's timings and GS_TRACE timelines (CLOCK_MONOTONIC,
 * nanoseconds). */
GS_API uint64_t gs_clock_ns(void);
/* With GS_TRACE set, adds the application's own span (e.g. "forward",
 * "backward", start and end from gs_clock_ns) to this process's timeline
 * (category "app"), beside gradsync's operations; nothing otherwise. */
GS_API void gs_trace_span(const char *name, uint64_t start_ns, uint64_t end_ns);

/* ------------------------------------------------------------------------ */
/* Context: configuration, rank discovery, bootstrap store                   */
/* ------------------------------------------------------------------------ */

typedef struct gs_ctx gs_ctx;

/*
 * Reads the configuration once from the environment (GS_* variables; a
 * malformed value is GS_ERR_CONFIG naming the variable), finds this process's
 * rank and the world size (GS_RANK/GS_WORLD_SIZE/GS_STORE, else torchrun's
 * RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, else Open MPI's
 * OMPI_COMM_WORLD_RANK/SIZE, else Slurm's SLURM_PROCID/SLURM_NTASKS) and
 * connects to the job's key-value store (served by rank 0 unless gsrun
 * serves it). Blocks until connected or GS_TIMEOUT_MS.
 */
GS_API gs_status gs_ctx_create(gs_ctx **ctx_p);

/*
 * A key-value store the caller brings (a framework's own, e.g. PyTorch's
 * c10d TCPStore or FileStore), so gradsync bootstraps through it and opens
 * no port of its own for that. gradsync calls it from the thread that calls
 * gradsync, one call at a time per context; keys are NUL-terminated, values
 * binary. Each returns GS_OK or an error status (GS_ERR_TIMEOUT for get).
 *   set: stores a copy of value under key, replacing an earlier one.
 *   get: waits until key exists, at most timeout_ms, then copies up to cap
 *        bytes of its value into buf and sets *len_p to its full length.
 *   add: optional (NULL if the store has none): adds delta to the integer
 *        under key (0 if absent), *value_p the result.
 * With an external store the store is the job's trust boundary: whoever can
 * write to it can join the job. gradsync's own store checks GS_JOB_TOKEN.
 */
typedef struct gs_kv_store {
    void *arg;
    gs_status (*set)(void *arg, const char *key, const void *value, size_t len);
    gs_status (*get)(void *arg, const char *key, void *buf, size_t cap, size_t *len_p, int timeout_ms);
    gs_status (*add)(void *arg, const char *key, int64_t delta, int64_t *value_p);
} gs_kv_store;

#define GS_CTX_PARAMS_VERSION 1

/*
 * What a framework knows and tells gradsync instead of the environment.
 * Versioned: `size` is sizeof(gs_ctx_params) of the caller's header and
 * `version` GS_CTX_PARAMS_VERSION, so fields can be added later. Start
 * from gs_ctx_params_init() (or GS_CTX_PARAMS_INIT in C): every field then
 * means "not given", and a field given overrides its environment variable.
 */
typedef struct gs_ctx_params {
    size_t size;              /* sizeof(gs_ctx_params) */
    unsigned version;         /* GS_CTX_PARAMS_VERSION */
    int rank;                 /* -1: from the environment (GS_RANK, RANK, ...) */
    int world_size;           /* -1: from the environment; with rank */
    int local_rank;           /* rank among the ranks of this host; -1: unknown or GS_LOCAL_RANK */
    int local_size;           /* ranks on this host; -1: unknown */
    const char *store_addr;   /* "host:port" of gradsync's own store (rank 0 serves it); NULL: GS_STORE */
    const gs_kv_store *store; /* an external store (copied); NULL: gradsync's own */
    const char *route_hint;   /* "host" or "host:port" the other hosts reach (e.g. the framework's
                               * master): tcp listens on the interface routing there; NULL: the
                               * store's address, or loopback with an external store */
    int timeout_ms;           /* deadline of every wait; -1: GS_TIMEOUT_MS */
    const char *job_token;    /* NULL: GS_JOB_TOKEN; "": none (with an external store rank 0 draws one) */
} gs_ctx_params;

#define GS_CTX_PARAMS_INIT                                                                                   \
    {                                                                                                        \
        sizeof(gs_ctx_params), GS_CTX_PARAMS_VERSION, -1, -1, -1, -1, NULL, NULL, NULL, -1, NULL             \
    }

GS_API void gs_ctx_params_init(gs_ctx_params *params);
/* gs_ctx_create with what params gives overriding the environment. With an
 * external store no store is served or joined: rank, world_size and store
 * are needed, and the transports' connections are protected by a token
 * rank 0 draws and publishes through the store (unless job_token is given). */
GS_API gs_status gs_ctx_create_with(const gs_ctx_params *params, gs_ctx **ctx_p);
/* Closes the store connection (rank 0 waits, within the deadline, until
 * every rank has closed before it stops serving). */
GS_API gs_status gs_ctx_destroy(gs_ctx *ctx);
GS_API int gs_ctx_rank(const gs_ctx *ctx);
GS_API int gs_ctx_size(const gs_ctx *ctx);
/* Rank among the ranks on this host and how many there are (-1: unknown). */
GS_API int gs_ctx_local_rank(const gs_ctx *ctx);
GS_API int gs_ctx_local_size(const gs_ctx *ctx);
/* This host's id: equal exactly for ranks that can share memory. */
GS_API const char *gs_ctx_host(const gs_ctx *ctx);
/* The value in force of configuration parameter name ("GS_ALGO",
 * "GS_CHUNK_BYTES", ...: gsinfo --params lists them) for this context, as
 * gsinfo prints it (sizes in bytes, switches 0/1, choices by name; the job
 * token only as "(set)"). GS_ERR_INVALID for a name that is no parameter. */
GS_API gs_status gs_ctx_param(const gs_ctx *ctx, const char *name, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Configuration: the GS_* parameters, without a context                     */
/* ------------------------------------------------------------------------ */

/*
 * For tools and launchers (gsinfo prints these; gs_ctx_param gives a
 * context's value): the table of every GS_* parameter the library reads,
 * and a configuration read from an environment without joining a job.
 */

/* One parameter, as the library declares it. Owned by the library, valid
 * for the life of the process. Fields may be added at the end. */
typedef struct gs_param_info {
    const char *name;          /* the variable: "GS_TIMEOUT_MS" */
    const char *type;          /* "INT", "SIZE" (bytes; K, M, G suffixes), "BOOL", "STR" or "ENUM" */
    const char *default_value; /* as the variable would be written; "" for empty */
    const char *choices;       /* ENUM: the values, "auto|shm|tcp|verbs"; NULL otherwise */
    const char *help;          /* what it means, one sentence */
} gs_param_info;

/* How many parameters there are; gs_param_at(0 .. count-1) lists them. */
GS_API int gs_param_count(void);
/* Parameter i, NULL outside 0 .. gs_param_count()-1. */
GS_API const gs_param_info *gs_param_at(int i);

/* A configuration: every parameter's value, read from an environment. */
typedef struct gs_config gs_config;

/* One problem of a configuration, as a sentence ("GS_CHUNK_BYTES=12Q: ...
 * expected a size such as 4096, 64K, 1M"): param is the index of the
 * parameter (gs_param_at), or -1 for a GS_* variable no parameter has (the
 * sentence then names the closest one). */
typedef void (*gs_config_report_fn)(int param, const char *problem, void *arg);

/*
 * Reads every parameter from envp ("NAME=value" strings ending in NULL;
 * NULL: the process's environment) as gs_ctx_create would, but reports
 * every problem to report (may be NULL) instead of stopping at the first:
 * each malformed value (the variable, the value, the accepted forms) and
 * each unknown GS_* variable. The default stands in for a malformed value.
 * *problems_p (may be NULL) is how many there were. Returns GS_OK with
 * *cfg_p set, problems or not (GS_ERR_NOMEM or GS_ERR_INVALID otherwise).
 */
GS_API gs_status gs_config_create(char *const *envp, gs_config_report_fn report, void *arg, int *problems_p,
                                  gs_config **cfg_p);
GS_API void gs_config_destroy(gs_config *cfg);
/* The value of parameter name in cfg, formatted as gs_ctx_param gives it
 * (sizes in bytes, switches 0/1, choices by name; the job token only as
 * "(set)" or ""), truncated to cap - 1 bytes. GS_ERR_INVALID for a name that
 * is no parameter (gs_last_error suggests the closest) or cap 0. */
GS_API gs_status gs_config_value(const gs_config *cfg, const char *name, char *buf, size_t cap);
/* Parses a size as the GS_* size parameters take it: "4096", "64K", "1M",
 * "2G" (binary multiples). GS_ERR_CONFIG for anything else. */
GS_API gs_status gs_size_parse(const char *text, uint64_t *value_p);

/* This machine's own host id (what GS_HOST_ID overrides; gs_ctx_host gives
 * the one in force): equal exactly for processes that can share memory. */
GS_API void gs_host_id(char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Bootstrap store: small blobs between the ranks of one job                 */
/* ------------------------------------------------------------------------ */

#define GS_STORE_KEY_MAX   255
#define GS_STORE_VALUE_MAX (1u << 20)

/* Sets key to a copy of value (replacing an earlier value). Blocks for one
 * round trip to the store. */
GS_API gs_status gs_store_put(gs_ctx *ctx, const char *key, const void *value, size_t len);
/* Waits until key exists (or GS_TIMEOUT_MS), then copies up to cap bytes of
 * its value into buf; *len_p is the full length of the value. */
GS_API gs_status gs_store_get(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p);
/* Every rank contributes len bytes; out (size * len bytes) receives them in
 * rank order. All ranks must call with the same tag and len. */
GS_API gs_status gs_store_allgather(gs_ctx *ctx, const char *tag, const void *blob, size_t len, void *out);
/* Returns when every rank has entered the barrier with this tag; on the
 * deadline the error names the ranks that never arrived. */
GS_API gs_status gs_store_barrier(gs_ctx *ctx, const char *tag);

/* ------------------------------------------------------------------------ */
/* Store server: a launcher serves the job's store                           */
/* ------------------------------------------------------------------------ */

/*
 * gradsync's store, served by the program that starts the ranks (as gsrun
 * does) instead of by rank 0, so that it outlives every rank: survivors can
 * shrink past rank 0's death (gs_comm_shrink). Give every rank GS_STORE=
 * host:port (gs_store_server_port), GS_STORE_EXTERNAL=1, GS_JOB_TOKEN (the
 * token, gs_store_server_token), GS_RANK and GS_WORLD_SIZE. Each rank's
 * connection must prove the token; whoever knows it can join the job.
 */
typedef struct gs_store_server gs_store_server;

#define GS_STORE_SERVER_PARAMS_VERSION 1

/* Versioned as gs_ctx_params: start from gs_store_server_params_init() (or
 * GS_STORE_SERVER_PARAMS_INIT), then set world_size and what else you need. */
typedef struct gs_store_server_params {
    size_t size;           /* sizeof(gs_store_server_params) */
    unsigned version;      /* GS_STORE_SERVER_PARAMS_VERSION */
    const char *host;      /* address to listen on; NULL: "127.0.0.1" (a job on this host) */
    int port;              /* 0: an ephemeral port */
    int world_size;        /* ranks of the job, each announcing this size (required, >= 1) */
    const char *job_token; /* the token every connection proves; NULL: a fresh random one; "": none */
    int timeout_ms;        /* a connection that has not said who it is this long is dropped, and a
                            * rank's wait ends at its own deadline; -1: GS_TIMEOUT_MS */
} gs_store_server_params;

#define GS_STORE_SERVER_PARAMS_INIT                                                                          \
    {                                                                                                        \
        sizeof(gs_store_server_params), GS_STORE_SERVER_PARAMS_VERSION, NULL, 0, 0, NULL, -1                 \
    }

GS_API void gs_store_server_params_init(gs_store_server_params *params);
/* Listens on host:port and returns: no thread runs yet, so the caller may
 * fork its ranks now and start serving afterwards (a forked child has no
 * copy of the server's thread). An address that cannot be served (in use,
 * an unknown host) is an error naming it; with timeout_ms -1 a malformed
 * GS_TIMEOUT_MS is GS_ERR_CONFIG. */
GS_API gs_status gs_store_server_create(const gs_store_server_params *params, gs_store_server **server_p);
/* The port it listens on (the ephemeral one chosen, with port 0). */
GS_API int gs_store_server_port(const gs_store_server *server);
/* The job token the ranks must prove (the one given, or the one drawn). */
GS_API const char *gs_store_server_token(const gs_store_server *server);
/* Serves from a thread of its own until destroyed. */
GS_API gs_status gs_store_server_start(gs_store_server *server);
/* Waits up to drain_ms (0: not at all) for every rank to have joined and
 * left (a warning names those that did not), stops serving, closes every
 * connection and frees the server. NULL is ignored. */
GS_API void gs_store_server_destroy(gs_store_server *server, int drain_ms);

/* ------------------------------------------------------------------------ */
/* Transport: one-sided RDMA semantics over shm, tcp or verbs                */
/* ------------------------------------------------------------------------ */

typedef struct gs_tp gs_tp; /* one transport instance: its endpoints and completion queue */
typedef struct gs_mr gs_mr; /* a registered memory region */
typedef struct gs_ep gs_ep; /* a connection to one peer */

typedef enum gs_access {
    GS_ACCESS_LOCAL_WRITE = 1u << 0,
    GS_ACCESS_REMOTE_WRITE = 1u << 1,
    GS_ACCESS_REMOTE_READ = 1u << 2,
    GS_ACCESS_REMOTE_ATOMIC = 1u << 3,
    GS_ACCESS_ALL = 0xf,
} gs_access;

/* The serialized remote descriptor of a memory region: everything a peer
 * needs to target it (address, length, key; for shm, how to map it).
 * Fixed size, carried through the bootstrap store or any message. */
#define GS_RMR_BYTES 64
typedef struct gs_rmr {
    uint8_t bytes[GS_RMR_BYTES];
} gs_rmr;

/* Operation flags (or-ed together). */
typedef enum gs_op_flags {
    GS_OP_SIGNALED = 1u << 0, /* a completion is delivered locally when done */
    GS_OP_FENCE = 1u << 1,    /* start only after earlier READs/atomics on the ep completed */
    GS_OP_STREAM = 1u << 2,   /* hint: part of a stream too large for the cache; the destination may be
                                 written with streaming (non-temporal) stores (shm does; others ignore it) */
    GS_OP_ZCOPY = 1u << 3,    /* hint: a large payload may be sent by reference (tcp: vmsplice + splice),
                                 so its bytes are read when the peer takes them: the source must stay
                                 unchanged until the op completes or the peer answered a later message
                                 (the rule verbs needs anyway); shm and verbs ignore it */
} gs_op_flags;

typedef enum gs_wc_opcode {
    GS_WC_WRITE = 1,
    GS_WC_WRITE_IMM,
    GS_WC_READ,
    GS_WC_FETCH_ADD,
    GS_WC_CMP_SWAP,
    GS_WC_SEND,
    GS_WC_RECV,     /* target side: a SEND arrived into a posted receive */
    GS_WC_RECV_IMM, /* target side: a WRITE_IMM arrived; imm is valid */
} gs_wc_opcode;

typedef struct gs_wc {
    uint64_t wr_id;   /* as given by the caller (posted receive's id for RECV) */
    gs_status status; /* GS_OK or the error of this operation */
    gs_wc_opcode opcode;
    uint32_t imm; /* GS_WC_RECV_IMM only */
    uint32_t len; /* bytes received (RECV, RECV_IMM) */
    int peer;     /* rank of the other side */
} gs_wc;

/* Largest SEND payload (control messages). */
#define GS_SEND_MAX 4096

/*
 * Opens a transport by name ("shm", "tcp", "verbs"; NULL or "auto" follows
 * GS_TRANSPORT) and connects one endpoint to every other rank through the
 * bootstrap store. Collective over the job: every rank must call it.
 * Blocks until all endpoints are up or GS_TIMEOUT_MS.
 */
GS_API gs_status gs_tp_open(gs_ctx *ctx, const char *name, gs_tp **tp_p);
/* Destroys the endpoints, completion queue and any region still registered. */
GS_API gs_status gs_tp_close(gs_tp *tp);
/* The name of the i-th transport built into this library ("shm", "verbs",
 * "tcp", in the order auto prefers them); NULL past the last. */
GS_API const char *gs_tp_builtin_name(int i);
/* 1 if the built transport name can be used on this machine under cfg
 * (verbs: a device with an active port, GS_IB_DEV's if set), else 0 (also
 * for a name not built). */
GS_API int gs_tp_usable(const gs_config *cfg, const char *name);
/* 1 with buf set to one line on the devices transport name would use here under cfg and why (verbs: the
 * rails chosen by NUMA locality, the CPU's node, every usable device:port and its node); 0 for a name not
 * built or a transport without devices. Opens the devices briefly; no peer is involved. */
GS_API int gs_tp_devices(const gs_config *cfg, const char *name, char *buf, size_t cap);

GS_API const char *gs_tp_name(const gs_tp *tp);
/* The endpoint to peer (NULL for the caller's own rank). Non-blocking. */
GS_API gs_ep *gs_tp_ep(gs_tp *tp, int peer);

/* Allocates len bytes, page-aligned, pre-touched and registered with access
 * (gs_access bits or-ed): the seed's GradientBuffer (zero-copy for peers on
 * shm). gs_mr_dereg frees it. */
GS_API gs_status gs_mr_alloc(gs_tp *tp, size_t len, gs_access access, gs_mr **mr_p);
/* Registers caller memory (shm: cross-memory attach where the kernel
 * permits it, else GS_ERR_UNSUPPORTED). Deregister before freeing it. */
GS_API gs_status gs_mr_reg(gs_tp *tp, void *addr, size_t len, gs_access access, gs_mr **mr_p);
/* Deregisters (and frees, for gs_mr_alloc memory). */
GS_API gs_status gs_mr_dereg(gs_mr *mr);
GS_API void *gs_mr_addr(const gs_mr *mr);
GS_API size_t gs_mr_len(const gs_mr *mr);
/* Serializes the remote descriptor. Non-blocking. */
GS_API void gs_mr_pack(const gs_mr *mr, gs_rmr *rmr_p);

/*
 * One-sided and two-sided operations. None of them waits for the network:
 * each posts and returns. The local buffer (src/dst) must lie inside the
 * registered region lmr and must not be touched until the operation's
 * completion (or, for unsignaled ops, a later signaled op on the same
 * endpoint) has been seen. Remote memory is named by a peer's descriptor
 * and a byte offset into it. A call that returns an error never completes
 * later. GS_ERR_AGAIN: the send queue is full; poll and retry.
 */
GS_API gs_status gs_ep_write(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr *dst,
                             uint64_t dst_off, uint64_t wr_id, gs_op_flags flags);
/* WRITE, then a GS_WC_RECV_IMM completion carrying imm at the target; when
 * the target sees it, every earlier WRITE on this endpoint is visible. */
GS_API gs_status gs_ep_write_imm(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr *dst,
                                 uint64_t dst_off, uint32_t imm, uint64_t wr_id, gs_op_flags flags);
GS_API gs_status gs_ep_read(gs_ep *ep, void *dst, gs_mr *lmr, size_t len, const gs_rmr *src, uint64_t src_off,
                            uint64_t wr_id, gs_op_flags flags);
/* 64-bit atomics on an 8-byte aligned remote word; the old value is stored
 * at result (8 bytes inside lmr) before the completion. */
GS_API gs_status gs_ep_fetch_add(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr *dst, uint64_t dst_off,
                                 uint64_t add, uint64_t wr_id, gs_op_flags flags);
GS_API gs_status gs_ep_cmp_swap(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr *dst, uint64_t dst_off,
                                uint64_t compare, uint64_t swap, uint64_t wr_id, gs_op_flags flags);
/* Two-sided: len <= GS_SEND_MAX; consumes one receive posted by the peer. */
GS_API gs_status gs_ep_send(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id,
                            gs_op_flags flags);
/* Posts a receive buffer for the next SEND from this endpoint's peer. */
GS_API gs_status gs_ep_recv(gs_ep *ep, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id);

/* Takes up to max completions without blocking; *n_p is how many. Also
 * drives the transport's progress. */
GS_API gs_status gs_tp_poll(gs_tp *tp, gs_wc *wcs, int max, int *n_p);
/* Waits for at least one completion (GS_POLL: spin, event or hybrid) up to
 * timeout_ms (-1: GS_TIMEOUT_MS); GS_ERR_TIMEOUT if none came. */
GS_API gs_status gs_tp_wait(gs_tp *tp, gs_wc *wcs, int max, int *n_p, int timeout_ms);

/* ------------------------------------------------------------------------ */
/* Data types and reduction operators                                        */
/* ------------------------------------------------------------------------ */

typedef enum gs_dtype {
    GS_F32 = 0,
    GS_F64,
    GS_F16,
    GS_BF16, /* accumulated in f32 */
    GS_I32,
    GS_I64,
    GS_U8, /* PyTorch's byte-like types: uint8, int8, int16 */
    GS_I8,
    GS_I16,
    GS_BOOL, /* one byte, 0 false, anything else true (reductions give 0 or 1) */
    GS_DTYPE_COUNT
} gs_dtype;

/*
 * Integer sums and products wrap; min and max compare u8 unsigned, the other
 * integers signed. GS_BAND, GS_BOR, GS_BXOR: bitwise and, or, xor of the
 * integer types; on bool logical and, or, xor. On bool, as in PyTorch, sum
 * and max are or, prod and min are and (avg is not defined). A bitwise
 * operator on a floating type, or avg on bool, is GS_ERR_INVALID.
 */
typedef enum gs_redop {
    GS_SUM = 0,
    GS_AVG,
    GS_MIN,
    GS_MAX,
    GS_PROD,
    GS_BAND,
    GS_BOR,
    GS_BXOR,
    GS_REDOP_COUNT
} gs_redop;

GS_API size_t gs_dtype_size(gs_dtype dtype);
GS_API const char *gs_dtype_name(gs_dtype dtype);
GS_API const char *gs_redop_name(gs_redop op);

/* dst[i] = dst[i] op src[i] for i < count, with the kernels the collectives
 * use (the semantics above; f16 and bf16 in f32, rounded to nearest even).
 * dst == src is allowed, other overlap is not. GS_AVG has no local form
 * (sum, then divide by the count of operands): GS_ERR_INVALID, as is an
 * operator the type does not have. Non-blocking, allocates nothing. */
GS_API gs_status gs_reduce_local(void *dst, const void *src, size_t count, gs_dtype dtype, gs_redop op);
/* The half-precision conversions of the kernels: from f32 rounded to
 * nearest, ties to even (overflow to infinity, NaN stays NaN), and back
 * (exact). */
GS_API uint16_t gs_f16_from_f32(float value);
GS_API float gs_f16_to_f32(uint16_t bits);
GS_API uint16_t gs_bf16_from_f32(float value);
GS_API float gs_bf16_to_f32(uint16_t bits);

/* ------------------------------------------------------------------------ */
/* Requests: one model for every non-blocking call                           */
/* ------------------------------------------------------------------------ */

/*
 * A non-blocking call (a collective gs_i<name>, gs_isend/gs_irecv, a
 * parameter-server gs_ps_i<name>) starts the operation and hands out a
 * request. A start that returns an error hands out nothing and has no
 * effect later. A request handed out is released by exactly one of:
 * gs_req_test returning anything but GS_INPROGRESS, or gs_req_wait. After
 * that it must not be used again. Buffers stay untouched (send buffers
 * unchanged) until then. Progress happens inside test and wait (and any
 * blocking call of the same object), or all the time with
 * GS_PROGRESS_THREAD=1 for communicators.
 */
typedef struct gs_req gs_req;

/* Non-blocking: GS_INPROGRESS while the request runs, else its final status
 * (the request released). */
GS_API gs_status gs_req_test(gs_req *req);
/* Waits (GS_TIMEOUT_MS at most) for the request; returns its final status
 * and releases it. */
GS_API gs_status gs_req_wait(gs_req *req);

/* ------------------------------------------------------------------------ */
/* Collectives (src/coll)                                                    */
/* ------------------------------------------------------------------------ */

/*
 * A communicator runs collectives over every rank of a context. Calls on one
 * communicator must be made in the same order on every rank, with the same
 * count, type, operator and root; a rank that differs gets GS_ERR_MISMATCH,
 * and so does every other rank, with a message naming what each side called
 * (the communicator is unusable afterwards: destroy it). Results are bitwise
 * identical on every rank and from run to run for a fixed rank count and
 * algorithm (GS_ALGO; auto picks by size and rank count, the same on every
 * rank). Every wait has the GS_TIMEOUT_MS deadline.
 *
 * Buffers: recvbuf == sendbuf is in place. Counts are elements. Any count
 * works, 0 and counts below the rank count included. Floating types f16 and
 * bf16 are reduced in f32 per step and rounded to nearest even; GS_AVG is the
 * sum divided once, at the end, by the rank count; integer sums wrap.
 *
 * The communicator's buffers (registered staging slots of GS_CHUNK_BYTES)
 * are allocated at creation; a call allocates nothing.
 *
 * Threads: a communicator is used by one thread at a time (its calls, test
 * and wait of its requests); different communicators may be used from
 * different threads at the same time, each its own transport and sequence
 * numbers (gs_comm_split, gs_comm_create_group). Creating and destroying
 * communicators of one context, and the context's store calls, are made from
 * one thread at a time, in the same order on every rank. With
 * GS_PROGRESS_THREAD the communicator's own thread runs alongside: still
 * one caller thread. gs_last_error() is per thread.
 */
typedef struct gs_comm gs_comm;

/* Collective over the context's ranks. tp: a transport opened on ctx, or
 * NULL to open the default one (GS_TRANSPORT), closed with the communicator. */
GS_API gs_status gs_comm_create(gs_ctx *ctx, gs_tp *tp, gs_comm **comm_p);
/* Collective: waits (GS_TIMEOUT_MS at most) until every rank has called it,
 * then releases it (requests still in flight are abandoned). After a failed
 * call it does not wait (a peer may be gone). */
GS_API gs_status gs_comm_destroy(gs_comm *comm);
/* Not collective: returns at once (within 250 ms) and frees the
 * communicator and everything it owns; its requests are gone (do not test
 * or wait them). Every other rank in a call with this one, or calling
 * later, fails with GS_ERR_PEER_LOST naming this rank, within about a
 * second (it is told; if that fails, the transport finds the rank gone).
 * For a framework that must stop a job after an error without waiting out
 * GS_TIMEOUT_MS. */
GS_API gs_status gs_comm_abort(gs_comm *comm);
GS_API int gs_comm_rank(const gs_comm *comm);
GS_API int gs_comm_size(const gs_comm *comm);
/* The transport the communicator runs on. */
GS_API gs_tp *gs_comm_tp(gs_comm *comm);

/* gs_comm_split's color of a rank that joins no new communicator. */
#define GS_COMM_NO_COLOR (-1)
/*
 * Collective over comm (every rank calls it, in the same order as its other
 * calls): the ranks of each color >= 0 form a new communicator, ordered by
 * key, then by their rank in comm (MPI_Comm_split, ncclCommSplit). A rank
 * with color GS_COMM_NO_COLOR gets *newcomm_p = NULL. The new communicator
 * has its own transport instance of comm's kind (its own connections among
 * its ranks), sequence numbers and mismatch detection; it outlives nothing:
 * destroy it before comm's context.
 */
GS_API gs_status gs_comm_split(gs_comm *comm, int color, int key, gs_comm **newcomm_p);
/*
 * A communicator of ranks[0..n) of comm (in that order: rank i of the new
 * one is comm's rank ranks[i]), called by those ranks only, with the same
 * list (MPI_Comm_create_group; what PyTorch's new_group needs). Groups with
 * the same list are told apart by how many were made before on comm.
 */
GS_API gs_status gs_comm_create_group(gs_comm *comm, const int *ranks, int n, gs_comm **newcomm_p);
/*
 * After a peer is lost (a call returned GS_ERR_PEER_LOST, or a rank aborted
 * comm), every surviving rank calls it: the survivors agree through the
 * store on who is alive, and *newcomm_p is a communicator of those ranks,
 * numbered densely in comm's rank order (gs_comm_rank of the new one), with
 * its own sequence numbers and mismatch detection, as after a split. On a
 * comm that lost nothing it gives the same ranks. comm itself stays failed:
 * gs_comm_abort it (or destroy it) once the new one is made; the new one
 * outlives it, not comm's context.
 *
 * The agreement: gradsync's store server decides, once, which of comm's
 * ranks asked while their store connection was open. A rank that dies
 * during the agreement is out the moment its connection closes (not waited
 * for); a rank alive but not calling is out after GS_TIMEOUT_MS; one that
 * calls after the decision gets GS_ERR_PEER_LOST (it is out). If the store
 * itself is gone (rank 0 served it and died), GS_ERR_PEER_LOST at once,
 * saying so: a job that must survive rank 0 runs under gsrun (which serves
 * the store). With an external store (gs_ctx_params.store; it needs add)
 * the first asker decides: a member is out when a survivor's transport saw
 * it lost, else when it has not asked by the deadline; a decider lost
 * before deciding fails the others at their deadline. Today the new communicator opens a transport of comm's
 * kind with fresh connections among the survivors (like gs_comm_create_group); a rank lost during that
 * rebuild makes it fail within GS_TIMEOUT_MS on the others (shrink comm again). See docs/elastic.md.
 */
GS_API gs_status gs_comm_shrink(gs_comm *comm, gs_comm **newcomm_p);
/* For a communicator made by gs_comm_shrink: how long the survivors' agreement
 * and the rebuild of the communicator took, in ns (both 0 for any other
 * communicator); either pointer may be NULL. For progress reports. */
GS_API void gs_comm_shrink_times(const gs_comm *comm, uint64_t *agree_ns, uint64_t *rebuild_ns);
/*
 * Joining a running job. Every rank of comm calls gs_comm_grow(NULL, comm,
 * &newcomm) at a point they choose (the same on each, e.g. an epoch
 * boundary: it is collective over comm); a process that joins calls
 * gs_comm_grow(ctx, NULL, &newcomm) with its context. A joiner is a process
 * of the job whose rank is not among comm's: under gsrun a restarted rank,
 * whose context (GS_REJOIN=1) takes the place of the lost rank in the store,
 * which checks its job token. It announces itself in the store and waits
 * (GS_TIMEOUT_MS) until comm's rank 0 admits it at a grow point. Then the
 * old ranks and the joiners agree through the store on who is alive (as in
 * gs_comm_shrink: one lost meanwhile is out, not waited for), and
 * *newcomm_p is a communicator of them: comm's ranks first, in their order,
 * then the joiners in job-rank order, over a transport of comm's kind.
 * When nobody is waiting the old ranks get *newcomm_p = NULL (keep comm):
 * one small broadcast over comm (nothing at all while comm holds every
 * rank of the job). comm stays usable; destroy it once the new one is made.
 * The job never has more ranks than it started with (the store's world).
 */
GS_API gs_status gs_comm_grow(gs_ctx *ctx, gs_comm *comm, gs_comm **newcomm_p);

/* recvbuf[i] = sendbuf[i] reduced over the ranks, count elements. */
GS_API gs_status gs_allreduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                              gs_redop op);
/* sendbuf holds size * recvcount elements; rank r receives block r of the
 * reduction. In place: recvbuf == sendbuf + r * recvcount elements. */
GS_API gs_status gs_reduce_scatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                                   gs_dtype dtype, gs_redop op);
/* recvbuf (size * sendcount elements) receives every rank's sendbuf in rank
 * order. In place: sendbuf == recvbuf + r * sendcount elements. */
GS_API gs_status gs_allgather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                              gs_dtype dtype);
/* recvbuf on every rank receives root's sendbuf (read on root only). */
GS_API gs_status gs_broadcast(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                              int root);
/* Returns once every rank has entered it. */
GS_API gs_status gs_barrier(gs_comm *comm);

/* One tensor of a fused allreduce. */
typedef struct gs_tensor {
    const void *sendbuf;
    void *recvbuf; /* == sendbuf: in place */
    size_t count;
} gs_tensor;

/* Allreduces n tensors of one type through one fused buffer (one collective,
 * like a DDP bucket). Every rank passes the same list of counts. */
GS_API gs_status gs_allreduce_multi(gs_comm *comm, const gs_tensor *tensors, size_t n, gs_dtype dtype,
                                    gs_redop op);

/*
 * Rooted, all-to-all and uneven collectives. Buffers a rank does not use
 * may be NULL (recvbuf of reduce and gather, sendbuf of scatter, except on
 * the root). Count and displacement arrays are in elements and hold one
 * entry per rank; they are read during the call (non-blocking: until it
 * completes, like the buffers). Every rank passes the same root and the
 * same per-rank counts (alltoallv: what rank a sends b is what b expects
 * from a); a rank that differs gets GS_ERR_MISMATCH, and so does every
 * rank it exchanges with (the communicator fails on all).
 */
/* root's recvbuf[i] = sendbuf[i] reduced over the ranks (count elements).
 * In place on root: recvbuf == sendbuf. */
GS_API gs_status gs_reduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                           gs_redop op, int root);
/* root's recvbuf (size * sendcount elements) receives every rank's sendbuf
 * in rank order. In place on root: sendbuf == recvbuf + root * sendcount. */
GS_API gs_status gs_gather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                           gs_dtype dtype, int root);
/* Rank r's recvbuf receives block r (recvcount elements) of root's sendbuf
 * (size * recvcount). In place on root: recvbuf == sendbuf + root * recvcount. */
GS_API gs_status gs_scatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                            gs_dtype dtype, int root);
/* Block q (count elements) of rank r's sendbuf goes to block r of rank q's
 * recvbuf (both size * count elements). In place: recvbuf == sendbuf. */
GS_API gs_status gs_alltoall(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype);
/* sendcounts[q] elements from sendbuf + sdispls[q] go to rank q, which puts
 * them at its recvbuf + rdispls[r] (recvcounts[r] elements: must match).
 * No in-place form: the buffers must not overlap. */
GS_API gs_status gs_alltoallv(gs_comm *comm, const void *sendbuf, const size_t *sendcounts,
                              const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                              const size_t *rdispls, gs_dtype dtype);
/* Rank q's sendbuf (recvcounts[q] elements) lands at recvbuf + displs[q] on
 * every rank. In place: sendbuf == recvbuf + displs[r]. */
GS_API gs_status gs_allgatherv(gs_comm *comm, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                               const size_t *displs, gs_dtype dtype);
/* sendbuf holds recvcounts[0] + ... + recvcounts[size-1] elements, block q
 * after the blocks before it; rank r receives block r of the reduction
 * (recvcounts[r] elements). In place: recvbuf == sendbuf + the elements of
 * the blocks before r. */
GS_API gs_status gs_reduce_scatter_v(gs_comm *comm, const void *sendbuf, void *recvbuf,
                                     const size_t *recvcounts, gs_dtype dtype, gs_redop op);

/*
 * Non-blocking forms (gs_req: see Requests above): start the collective and
 * return a request at once. Buffers, the tensor list and the count arrays
 * must stay untouched until it completes. A communicator's collectives
 * complete in the order they were started.
 */
GS_API gs_status gs_iallreduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                               gs_dtype dtype, gs_redop op, gs_req **req_p);
GS_API gs_status gs_ireduce_scatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                                    gs_dtype dtype, gs_redop op, gs_req **req_p);
GS_API gs_status gs_iallgather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                               gs_dtype dtype, gs_req **req_p);
GS_API gs_status gs_ibroadcast(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                               gs_dtype dtype, int root, gs_req **req_p);
GS_API gs_status gs_ibarrier(gs_comm *comm, gs_req **req_p);
GS_API gs_status gs_iallreduce_multi(gs_comm *comm, const gs_tensor *tensors, size_t n, gs_dtype dtype,
                                     gs_redop op, gs_req **req_p);
GS_API gs_status gs_ireduce(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                            gs_redop op, int root, gs_req **req_p);
GS_API gs_status gs_igather(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t sendcount,
                            gs_dtype dtype, int root, gs_req **req_p);
GS_API gs_status gs_iscatter(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t recvcount,
                             gs_dtype dtype, int root, gs_req **req_p);
GS_API gs_status gs_ialltoall(gs_comm *comm, const void *sendbuf, void *recvbuf, size_t count, gs_dtype dtype,
                              gs_req **req_p);
GS_API gs_status gs_ialltoallv(gs_comm *comm, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, gs_dtype dtype, gs_req **req_p);
GS_API gs_status gs_iallgatherv(gs_comm *comm, const void *sendbuf, void *recvbuf, const size_t *recvcounts,
                                const size_t *displs, gs_dtype dtype, gs_req **req_p);
GS_API gs_status gs_ireduce_scatter_v(gs_comm *comm, const void *sendbuf, void *recvbuf,
                                      const size_t *recvcounts, gs_dtype dtype, gs_redop op, gs_req **req_p);

/* ------------------------------------------------------------------------ */
/* Point-to-point (src/coll/p2p.c)                                           */
/* ------------------------------------------------------------------------ */

/*
 * Tagged sends and receives between two ranks of a communicator, beside its
 * collectives (their own messages: neither ever waits behind the other).
 * Not collective: only the two ranks take part, and they do not count as
 * calls for the collectives' sequence numbers.
 *
 * Matching: a receive takes the earliest message from peer with its tag
 * (tag >= 0); messages of one sender and tag are received in the order they
 * were sent (MPI's non-overtaking rule). With GS_ANY_SOURCE it takes the
 * earliest arrived message with the tag from any rank. Receives of one tag
 * are matched in the order they were posted. The types of both sides must
 * agree (else GS_ERR_MISMATCH on the receiving side); a message longer than
 * the receive buffer is GS_ERR_MISMATCH naming both sizes, for the receive
 * and, above the eager size, for the send (nothing is written past the
 * buffer; the message is consumed). A rank may send to itself (the payload
 * is copied). Send/recv needs the communicator's own transport (tp NULL at
 * gs_comm_create, or one opened for it alone).
 *
 * Blocking: gs_send returns when buf may be reused. Messages of at most
 * 4056 bytes (GS_SEND_MAX less the envelope) are copied out at once
 * (eager); larger ones wait until the receiver has taken them (its READ
 * from buf), so two ranks that both gs_send a large message to each other
 * before receiving wait out their deadline (post gs_irecv first). gs_recv
 * returns with the message in buf.
 *
 * Every wait has the GS_TIMEOUT_MS deadline: a receive that no message
 * matches within it fails with GS_ERR_TIMEOUT ("rank 1: recv from rank 0
 * (tag 7) ..."); a lost peer is GS_ERR_PEER_LOST naming it; a failed
 * communicator fails every send and receive. Same thread rule as the
 * collectives: one thread at a time per communicator.
 */
#define GS_ANY_SOURCE (-1)

/* What a receive got: the sender, its tag and the element count. */
typedef struct gs_p2p_status {
    int source;
    int tag;
    size_t count;
} gs_p2p_status;

GS_API gs_status gs_send(gs_comm *comm, const void *buf, size_t count, gs_dtype dtype, int peer, int tag);
/* peer: a rank or GS_ANY_SOURCE; status may be NULL. */
GS_API gs_status gs_recv(gs_comm *comm, void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                         gs_p2p_status *status);
/* Non-blocking forms: buf stays untouched (isend: unchanged) until the
 * request completes (gs_req_test / gs_req_wait); *status is filled when the
 * receive completes. Point-to-point requests complete in any order, apart
 * from the collectives' ones. */
GS_API gs_status gs_isend(gs_comm *comm, const void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                          gs_req **req_p);
GS_API gs_status gs_irecv(gs_comm *comm, void *buf, size_t count, gs_dtype dtype, int peer, int tag,
                          gs_p2p_status *status, gs_req **req_p);

/* ------------------------------------------------------------------------ */
/* Parameter server (src/ps)                                                 */
/* ------------------------------------------------------------------------ */

/*
 * S servers and W workers in one job. Tensors (f32) are registered by key and
 * split into shards of at most GS_PS_SHARD_BYTES, spread over the servers
 * balanced by bytes. Workers push gradients (WRITE_IMM into their own slot
 * on the shard's server, or fixed-point FETCH_ADD into an accumulator) and
 * pull parameters (RDMA READ, consistent by a seqlock: the server's CPU takes
 * no part in a pull). Servers aggregate, apply the optimizer and publish.
 *
 * Modes: sync (BSP: a shard is updated once all W gradients of a step have
 * arrived, with their mean), async (ASP: every push is applied on arrival,
 * scaled by 1/W) and, in async, bounded staleness (SSP: a worker's push of
 * step t waits until every live worker's step t - s - 1 is applied).
 *
 * A pull returns parameters that include every push this worker completed
 * for the key (read-your-writes). A call that returns an error had no effect
 * that a repeat of the same call after the error is handled would duplicate:
 * after GS_ERR_PEER_LOST (a server died), call gs_ps_recover, then repeat the
 * failed call with the same arguments. See docs/ps.md.
 */
typedef struct gs_ps gs_ps;

typedef enum gs_ps_role { GS_PS_ROLE_AUTO = 0, GS_PS_ROLE_WORKER, GS_PS_ROLE_SERVER } gs_ps_role;
typedef enum gs_ps_mode { GS_PS_MODE_SYNC = 0, GS_PS_MODE_ASYNC } gs_ps_mode;
typedef enum gs_ps_agg { GS_PS_AGG_WRITE_SLOTS = 0, GS_PS_AGG_FETCH_ADD } gs_ps_agg;
typedef enum gs_ps_optimizer {
    GS_PS_SGD = 0,
    GS_PS_MOMENTUM,
    GS_PS_ADAM,
    GS_PS_OPTIMIZER_COUNT
} gs_ps_optimizer;

/* Server-side optimizer: grad' = grad + weight_decay * w, then
 *   SGD:      w -= lr * grad'
 *   momentum: b = momentum * b + grad';  w -= lr * b
 *   Adam:     m = beta1 m + (1-beta1) grad';  v = beta2 v + (1-beta2) grad'^2;
 *             w -= lr * (m / (1-beta1^t)) / (sqrt(v / (1-beta2^t)) + eps)
 * (PyTorch's SGD and Adam with L2 weight decay; state kept per shard). */
typedef struct gs_ps_optim {
    gs_ps_optimizer kind;
    float lr;
    float momentum;
    float beta1, beta2, eps;
    float weight_decay;
} gs_ps_optim;

/* Fill with gs_ps_params_init, then change what you need: fields may be added
 * at the end in later versions. */
typedef struct gs_ps_params {
    gs_ps_role role;        /* AUTO: GS_ROLE, else the last `servers` ranks serve */
    int servers;            /* number of servers when roles are automatic (GS_PS_SERVERS) */
    const char *transport;  /* NULL: GS_TRANSPORT */
    gs_ps_mode mode;        /* GS_PS_MODE */
    int staleness;          /* async only: SSP bound in steps, -1 none (GS_PS_STALENESS) */
    gs_ps_agg agg;          /* GS_PS_AGG: write (slots) or atomic (FETCH_ADD; sync only) */
    int atomic_frac_bits;   /* atomic: gradients scaled by 2^bits into int64 (GS_PS_ATOMIC_FRAC_BITS) */
    size_t shard_bytes;     /* GS_PS_SHARD_BYTES */
    gs_ps_optim optim;      /* default: SGD, lr 0.01 */
    int average;            /* 1: the update uses the mean over workers (default), 0: the sum */
    const char *checkpoint; /* file prefix, NULL/"": none (GS_PS_CHECKPOINT) */
    int checkpoint_every;   /* server steps between checkpoints, 0: only on request */
    int elastic;            /* sync, write aggregation: 1: a lost worker leaves the job, the rounds go on
                               with the live workers (GS_PS_ELASTIC; docs/ps.md) */
} gs_ps_params;

/* Defaults from the context's configuration (the GS_PS_* variables). */
GS_API void gs_ps_params_init(const gs_ctx *ctx, gs_ps_params *params);

/* Collective over every rank of ctx: assigns roles, opens the transport and
 * connects servers and workers. A rank started with GS_REJOIN=1 replaces a
 * server that died: it restores its shards from the checkpoint and joins the
 * recovery the other ranks run in gs_ps_recover. Blocks up to GS_TIMEOUT_MS. */
GS_API gs_status gs_ps_create(gs_ctx *ctx, const gs_ps_params *params, gs_ps **ps_p);
/* Workers say goodbye to every server; servers stop serving once every
 * worker has (writing a last checkpoint when one is configured). Collective. */
GS_API gs_status gs_ps_destroy(gs_ps *ps);
GS_API int gs_ps_is_server(const gs_ps *ps);
/* This rank's index among the workers (or servers), and the counts. */
GS_API int gs_ps_index(const gs_ps *ps);
GS_API int gs_ps_num_workers(const gs_ps *ps);
GS_API int gs_ps_num_servers(const gs_ps *ps);

/* Collective: every rank registers the same keys in the same order. count
 * f32 elements; init (taken from the first worker; others may pass NULL;
 * NULL there too: zeros) gives the starting parameters, unless a checkpoint
 * of the key is restored. */
GS_API gs_status gs_ps_register(gs_ps *ps, uint64_t key, size_t count, const float *init);

/* Worker calls. grad and out hold the key's count elements; grad may be
 * reused as soon as the call (or the request) completes. */
GS_API gs_status gs_ps_push(gs_ps *ps, uint64_t key, const float *grad);
GS_API gs_status gs_ps_pull(gs_ps *ps, uint64_t key, float *out);
GS_API gs_status gs_ps_push_pull(gs_ps *ps, uint64_t key, const float *grad, float *out);
/* Non-blocking forms: start, then gs_req_test / gs_req_wait (see Requests;
 * a test progresses every request of ps). Requests of one key complete in
 * the order they were started. Each worker drives its gs_ps from one thread
 * at a time. */
GS_API gs_status gs_ps_ipush(gs_ps *ps, uint64_t key, const float *grad, gs_req **req_p);
GS_API gs_status gs_ps_ipull(gs_ps *ps, uint64_t key, float *out, gs_req **req_p);
GS_API gs_status gs_ps_ipush_pull(gs_ps *ps, uint64_t key, const float *grad, float *out, gs_req **req_p);
/* Worker, sync mode: how many workers' pushes the round of this worker's
 * last completed pull of key counted (the fewest over the key's shards):
 * the number of workers until one is lost in elastic mode, fewer after
 * (every worker that pulls the same round gets the same answer); -1 for an
 * unknown key or no pull yet. */
GS_API int gs_ps_key_workers(gs_ps *ps, uint64_t key);
/* Worker: the round (the key's step, 0-based) the next push of key goes to;
 * for a worker that rejoined (GS_REJOIN=1, elastic), the round the servers
 * readmitted it at, which the other workers may have passed: the
 * application skips its steps before it. -1 for an unknown key. */
GS_API int64_t gs_ps_key_round(gs_ps *ps, uint64_t key);

/* Server: serves until every worker has called gs_ps_destroy (GS_OK) or a
 * worker is lost in sync mode (GS_ERR_PEER_LOST, reported to the other
 * workers too). gs_ps_serve_start runs the same loop in a thread that
 * gs_ps_destroy joins; the caller must not use ps meanwhile. */
GS_API gs_status gs_ps_serve(gs_ps *ps);
GS_API gs_status gs_ps_serve_start(gs_ps *ps);
/* Writes a checkpoint of every server now: on a server, its own file; on a
 * worker, asks every server and waits until all have written. */
GS_API gs_status gs_ps_checkpoint(gs_ps *ps);
/* Worker, after GS_ERR_PEER_LOST: waits (up to GS_TIMEOUT_MS) for the lost
 * server to be restarted, reconnects the job, and re-pushes every step that
 * server restored from its checkpoint has not applied. Then repeat the call
 * that failed. */
GS_API gs_status gs_ps_recover(gs_ps *ps);

#ifdef __cplusplus
}
#endif

#endif /* GRADSYNC_H */
