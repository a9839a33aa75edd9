/* The context and the bootstrap layer's internal interface. */
#ifndef GS_BOOTSTRAP_BOOT_H
#define GS_BOOTSTRAP_BOOT_H

#include "gradsync.h"
#include "util/config.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct gs_store_client gs_store_client;
/* gs_store_server: declared in gradsync.h (a launcher may serve the store). */

#define GS_BOOT_HOST_MAX 256

/* Where rank, size and store address came from. */
typedef struct gs_boot_info {
    int rank;
    int size;
    int local_rank;                    /* -1 if unknown */
    int local_size;                    /* -1 if unknown */
    char store_host[GS_BOOT_HOST_MAX]; /* host name or address of the store */
    int store_port;                    /* 0: no store address (a single process serves its own) */
    bool store_external;               /* the launcher serves the store: rank 0 only connects */
    const char *source;                /* "GS_*", "torchrun", "Open MPI", "Slurm", "single process" */
} gs_boot_info;

struct gs_ctx {
    gs_config cfg; /* copy of the process configuration */
    gs_boot_info boot;
    int rank;
    int size;
    char host_id[128]; /* identical exactly for ranks that can share memory */
    gs_store_client *store;
    gs_store_server *server; /* rank 0 when it serves the store, else NULL */
    /* The store, seen three ways (store_kv.c):
     *  - gradsync's own (store set, ext NULL, parent NULL): allgather and
     *    barrier are requests the server answers;
     *  - an external one (ext): set/get callbacks, allgather and barrier
     *    built from them here;
     *  - a group of a parent context's ranks (parent): the parent's store,
     *    every key under prefix, allgather and barrier built from put/get. */
    bool has_ext;
    gs_kv_store ext;
    pthread_mutex_t ext_lock; /* one call of ext at a time (groups' communicators may run in threads) */
    gs_ctx *parent;
    char prefix[96]; /* "" but in a group */
    int *world;      /* a group: [size] the world rank of each of its ranks, else NULL */
    unsigned kv_seq; /* allgathers and barriers built from put/get so far: names their keys */
    /* Transport opens through this context: gs_tp_open sets tp_open to
     * tp_next++ and the backends name their store exchanges with it. Every
     * rank opens in the same order; a process that replaces a lost rank
     * restarts the count at the value the others agreed on
     * (gs_boot_tp_count_set, called by gs_ps recovery); nothing else writes it. */
    unsigned tp_next;
    unsigned tp_open;
    unsigned comm_next; /* communicators created on it so far: names their store keys */
    bool traced;        /* this context opened the GS_TRACE file (closed with it) */
};

/* ---- discovery (discover.c, host_id.c) ---------------------------------- */

/* Fills info from the launcher's environment (see gs_ctx_create and
 * docs/bootstrap.md). A malformed or inconsistent value is GS_ERR_CONFIG
 * naming the variable. */
gs_status gs_boot_discover(const gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_boot_info *info_p);
/* "<hostname>:<16 hex digits>": the digits hash the kernel boot id and the
 * network, IPC and PID namespace inodes, so two processes get the same id
 * exactly when they run on one kernel in the same namespaces (and so can
 * share memory and see each other's pids). */
void gs_boot_host_id(char *buf, size_t cap);
/* A hash of the running kernel's boot id: equal for processes that share a
 * machine's CPUs, whatever their namespaces (emulated hosts included); 0
 * where it cannot be read. */
uint64_t gs_boot_machine_id(void);
/* The next transport open through ctx is number next (its store exchanges
 * are named by it): for a job whose ranks agreed on a fresh numbering after
 * a recovery, so a replacement process and the survivors open alike. */
void gs_boot_tp_count_set(gs_ctx *ctx, unsigned next);

/* Creates a context from an already parsed configuration and an environment
 * (gs_ctx_create passes the process's; tests pass their own). */
gs_status gs_boot_ctx_create(const gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_ctx **ctx_p);

/* A context for a group of parent's ranks: members[i] is the parent rank
 * of group rank i (in that order, without repeats), and this rank must be
 * one of them. It uses the parent's store with every key under a prefix
 * made from tag (unique among the parent's groups and the same on every
 * member) and opens no connection; transports opened through it connect
 * the members only. gs_ctx_destroy frees it; the parent must outlive it. */
gs_status gs_boot_ctx_group(gs_ctx *parent, const char *tag, const int *members, int n, gs_ctx **ctx_p);
/* gs_store_get waiting at most timeout_ms instead of GS_TIMEOUT_MS. */
gs_status gs_boot_store_get_ms(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p,
                               int timeout_ms);
/* The rank of ctx's rank r in the world (the root context): for groups. */
int gs_boot_world_rank(const gs_ctx *ctx, int r);

/* ---- the survivors' agreement (survivors.c) ------------------------------ */

/* gs_comm_shrink's agreement among ctx's ranks on who is alive: every rank
 * that calls it with the same tag gets the same in[0..ctx->size) (1: in),
 * with itself in, or GS_ERR_PEER_LOST when the decision left it out. With
 * gradsync's own store the server decides (store_agree.c); a rank whose
 * connection closes is out at once; a rank that never asks is out after
 * timeout_ms. With an external store (it needs add) the first asker
 * decides: a member is out when it has not asked by its deadline, or at
 * once when an asker's seen_lost (NULL: none) marks it, what that rank's
 * transport found lost. A store connection that fails is GS_ERR_PEER_LOST
 * saying the store is gone and who served it. grow: gs_comm_grow's
 * agreement, whose members include replacements waiting to join (without
 * it a replacement that rejoined the store counts as gone: the member lost
 * was the process before it). */
gs_status gs_boot_survivors(gs_ctx *ctx, const char *tag, int timeout_ms, const uint8_t *seen_lost, bool grow,
                            uint8_t *in);

/* ---- store built from put/get (store_kv.c) --------------------------------- */

/* Whether ctx's allgather and barrier are built from put/get here. */
static inline bool gs_boot_kv_built(const gs_ctx *ctx)
{
    return ctx->has_ext || ctx->parent;
}
/* put and get of a full key on the root store (external or gradsync's own). */
gs_status gs_boot_kv_put(gs_ctx *ctx, const char *key, const void *value, size_t len);
gs_status gs_boot_kv_get(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p, int timeout_ms);
/* Whether a full key is in the root store now (GS_OK, its value's first cap
 * bytes in buf) or not (GS_ERR_TIMEOUT, not logged: for polling). */
gs_status gs_boot_kv_probe(gs_ctx *ctx, const char *key, void *buf, size_t cap, size_t *len_p);
/* allgather and barrier over put/get: every rank puts its part under a key
 * named by ctx->kv_seq, the tag and its rank, then waits for the others';
 * the deadline names the ranks that never came. */
gs_status gs_boot_kv_allgather(gs_ctx *ctx, const char *tag, const void *blob, size_t len, void *out);
gs_status gs_boot_kv_barrier(gs_ctx *ctx, const char *tag);

/* ---- sockets (sock.c): status only, the caller reports with context ---- */

/* Splits "host:port" or "[v6addr]:port"; GS_ERR_CONFIG if malformed. */
gs_status gs_boot_parse_hostport(const char *text, char *host, size_t host_cap, int *port_p);
/* A listening TCP socket for the store at host:port (port 0: ephemeral).
 * A loopback host binds loopback only, any other host binds every address
 * of its family. *port_p is the bound port. */
gs_status gs_boot_sock_listen(const char *host, int port, int *fd_p, int *port_p);
/* Connects to host:port, retrying refused connections until the deadline. */
gs_status gs_boot_sock_connect(const char *host, int port, uint64_t deadline_ns, int *fd_p);
/* Sends/receives exactly len bytes before the deadline (GS_ERR_TIMEOUT);
 * GS_ERR_PEER_LOST when the other side closed. */
gs_status gs_boot_sock_send(int fd, const void *buf, size_t len, uint64_t deadline_ns);
gs_status gs_boot_sock_recv(int fd, void *buf, size_t len, uint64_t deadline_ns);
/* "a.b.c.d:port" or "[v6]:port" of the other side, for logs. */
void gs_boot_sock_peer_name(int fd, char *buf, size_t cap);

/* ---- job token (token.c) ------------------------------------------------ */

/* Compares in time independent of where the texts differ. */
bool gs_boot_token_equal(const char *a, const char *b);
/* A fresh random token: 64 hex digits from getrandom(). cap >= 65. */
gs_status gs_boot_token_generate(char *buf, size_t cap);

/* ---- store server (store_server.c, store_table.c; store_launch.c the public calls) */

typedef struct gs_boot_server_params {
    const char *host;     /* address to listen on ("127.0.0.1" for a local job) */
    int port;             /* 0: ephemeral */
    int size;             /* world size every rank must announce */
    const char *token;    /* job token every connection must prove ("" accepts "") */
    int hello_timeout_ms; /* a connection silent this long before HELLO is dropped */
} gs_boot_server_params;

/* Creates the listening socket (no thread yet: safe to fork afterwards). */
gs_status gs_boot_server_listen(const gs_boot_server_params *params, gs_store_server **server_p);
int gs_boot_server_port(const gs_store_server *server);
/* Starts serving in a background thread. */
gs_status gs_boot_server_start(gs_store_server *server);
/* Waits up to drain_ms for every rank to have joined and left, then stops
 * the thread, closes every connection and frees the server. */
void gs_boot_server_stop(gs_store_server *server, int drain_ms);

/* ---- store client (store_client.c) -------------------------------------- */

/* Connects to the store and proves the token; retries until timeout_ms. */
gs_status gs_boot_client_connect(const char *host, int port, int rank, int size, const char *token,
                                 int timeout_ms, gs_store_client **client_p);
/* The same with GS_STORE_HELLO_* flags: GS_STORE_HELLO_REJOIN takes the
 * place of this rank after it was lost (a restarted process, GS_REJOIN=1). */
gs_status gs_boot_client_join(const char *host, int port, int rank, int size, const char *token,
                              int timeout_ms, int flags, gs_store_client **client_p);
/* Says BYE and closes. */
void gs_boot_client_close(gs_store_client *client);

#endif
