/* Configuration: read once from the environment into a struct passed down.
 * One table names every GS_* variable, its type, default and meaning. */
#ifndef GS_UTIL_CONFIG_H
#define GS_UTIL_CONFIG_H

#include "gradsync.h"

#include <stdbool.h>
#include <stdint.h>

#define GS_CONFIG_STR_MAX 256

/* X(field, VARIABLE, type, default, choices, meaning)
 * types: INT (signed), SIZE (bytes, K/M/G suffixes), BOOL (0/1/yes/no/true/false/on/off),
 * STR (free text), ENUM (one of choices, stored as its index). */
#define GS_PARAM_TABLE(X)                                                                                    \
    X(transport, "GS_TRANSPORT", ENUM, "auto", "auto|shm|tcp|verbs",                                         \
      "transport between ranks: auto = shm among the ranks of a host, and between hosts verbs if built, a "  \
      "port is active and its data-path probe passes on every rank, else tcp (a transport per peer); any "   \
      "other value: that one for every peer")                                                                \
    X(timeout_ms, "GS_TIMEOUT_MS", INT, "30000", NULL,                                                       \
      "deadline of every wait in milliseconds; on expiry the error names the rank, peer and operation")      \
    X(log_level, "GS_LOG_LEVEL", ENUM, "warn", "none|error|warn|info|debug|trace", "log level")              \
    X(log_subsys, "GS_LOG_SUBSYS", STR, "all", NULL,                                                         \
      "subsystems to log, comma separated: all or util,boot,tp,shm,tcp,verbs,coll,ps,tool")                  \
    X(log_file, "GS_LOG_FILE", STR, "", NULL,                                                                \
      "log to this file instead of stderr (%h host, %p pid, %r rank)")                                       \
    X(trace, "GS_TRACE", STR, "", NULL,                                                                      \
      "write a timeline of every collective and parameter-server operation to this file (Chrome Trace "      \
      "Event "                                                                                               \
      "JSON, %r the rank); gstrace merge joins the ranks' files")                                            \
    X(poll, "GS_POLL", ENUM, "hybrid", "spin|event|hybrid",                                                  \
      "completion wait: busy poll, block on an fd/futex, or spin GS_SPIN_US then block")                     \
    X(spin_us, "GS_SPIN_US", INT, "100", NULL, "hybrid polling: microseconds to spin before blocking")       \
    X(algo, "GS_ALGO", ENUM, "auto", "auto|ring|rd|direct|hier",                                             \
      "collectives' algorithm: auto by size, ranks and hosts, pipelined ring, recursive doubling/halving, "  \
      "direct, hierarchical (allreduce, reduce_scatter, allgather: inside each host and across; several "    \
      "hosts)")                                                                                              \
    X(chunk_bytes, "GS_CHUNK_BYTES", SIZE, "256K", NULL, "pipeline chunk of the ring algorithms")            \
    X(ib_dev, "GS_IB_DEV", STR, "", NULL,                                                                    \
      "verbs devices, a comma list of dev[:port]; of several, the GS_IB_RAILS nearest the rank's NUMA node " \
      "are used (default: every device with an active port, chosen the same way)")                           \
    X(ib_port, "GS_IB_PORT", INT, "1", NULL, "verbs port number")                                            \
    X(ib_gid_index, "GS_IB_GID_INDEX", INT, "-1", NULL,                                                      \
      "RoCE GID index (-1: automatic, prefers RoCE v2 routable)")                                            \
    X(ib_addr_family, "GS_IB_ADDR_FAMILY", ENUM, "auto", "auto|AF_INET|AF_INET6",                            \
      "RoCE GID address family of the automatic choice: auto = IPv4 first, then IPv6 (NCCL's AF_INET "       \
      "default, with a fallback); AF_INET or AF_INET6: only that family")                                    \
    X(ib_addr_range, "GS_IB_ADDR_RANGE", STR, "", NULL,                                                      \
      "RoCE: the automatic GID choice takes only addresses in this prefix/len, e.g. 10.0.0.0/8 or fd00::/8 " \
      "(like NCCL_IB_ADDR_RANGE)")                                                                           \
    X(ib_timeout, "GS_IB_TIMEOUT", INT, "-1", NULL,                                                          \
      "verbs QP local ack timeout exponent, 1-31 (4.096 us * 2^n; 0, infinite on hardware, is refused); "    \
      "-1: "                                                                                                 \
      "the largest up to 17 (0.54 s a try, 3.8 s of outage ridden out with 6 retries) whose retries and "    \
      "two "                                                                                                 \
      "heartbeats fit in GS_TIMEOUT_MS")                                                                     \
    X(ib_retry_cnt, "GS_IB_RETRY_CNT", INT, "6", NULL,                                                       \
      "verbs QP retry count (0-7; Soft-RoCE retries forever at 7)")                                          \
    X(ib_rnr_retry, "GS_IB_RNR_RETRY", INT, "6", NULL,                                                       \
      "verbs QP receiver-not-ready retry count (0-6; 7 = forever, may hang)")                                \
    X(ib_rnr_timer, "GS_IB_RNR_TIMER", INT, "12", NULL,                                                      \
      "verbs QP minimum RNR NAK timer code (1-31, 12 = 0.64 ms)")                                            \
    X(ib_sl, "GS_IB_SL", INT, "0", NULL, "verbs service level, 0-15 (InfiniBand QoS; like NCCL_IB_SL)")      \
    X(ib_tc, "GS_IB_TC", INT, "0", NULL,                                                                     \
      "verbs traffic class, 0-255 (RoCE v2: DSCP << 2, e.g. 104 for DSCP 26; like NCCL_IB_TC)")              \
    X(ib_pkey, "GS_IB_PKEY", STR, "", NULL,                                                                  \
      "verbs partition key, e.g. 0x8001, found in the port's table (default: the table's entry 0)")          \
    X(ib_fork_safe, "GS_IB_FORK_SAFE", BOOL, "0", NULL, "call ibv_fork_init so the process may fork")        \
    X(ib_qps_per_peer, "GS_IB_QPS_PER_PEER", INT, "1", NULL,                                                 \
      "verbs RC queue pairs per peer, 1-16; with several, WRITEs and READs of GS_IB_STRIPE_MIN bytes or "    \
      "more "                                                                                                \
      "are striped across them (both sides must set the same)")                                              \
    X(ib_rails, "GS_IB_RAILS", INT, "1", NULL,                                                               \
      "verbs devices used at once, 1-2: the nearest of GS_IB_DEV's (or of the active ones); queue pair l "   \
      "of "                                                                                                  \
      "a peer is on rail l mod GS_IB_RAILS, so stripes spread over both (both sides must set the same)")     \
    X(ib_stripe_min, "GS_IB_STRIPE_MIN", SIZE, "256K", NULL,                                                 \
      "verbs: the smallest WRITE/WRITE_IMM/READ striped across the GS_IB_QPS_PER_PEER queue pairs (4K-1G)")  \
    X(tcp_ifname, "GS_TCP_IFNAME", STR, "", NULL,                                                            \
      "network interface for the tcp transport (default: the store's route)")                                \
    X(tcp_netns, "GS_TCP_NETNS", STR, "", NULL,                                                              \
      "network namespaces for the tcp transport's sockets: names under /run/netns, comma separated, rank r " \
      "uses entry r mod n (default: the process's own; for multi-host tests on one machine)")                \
    X(host_id, "GS_HOST_ID", STR, "", NULL,                                                                  \
      "this process's host, as the transports see it: ranks with equal ids share memory (shm), others talk " \
      "over tcp or verbs (default: the kernel's boot id and namespaces; like NCCL_HOSTID)")                  \
    X(tcp_zcopy, "GS_TCP_ZCOPY", ENUM, "auto", "auto|on|off",                                                \
      "tcp: large collective payloads leave by reference (vmsplice + splice) instead of being copied into "  \
      "the socket; auto measures both and keeps the faster per call size")                                   \
    X(cpu_affinity, "GS_CPU_AFFINITY", STR, "", NULL,                                                        \
      "pin each local rank to a core: empty = no pinning, 'auto' = local rank modulo cores, or a list "      \
      "0,1,...")                                                                                             \
    X(progress_thread, "GS_PROGRESS_THREAD", BOOL, "0", NULL,                                                \
      "run a progress thread so remote READs and non-blocking collectives advance while the caller "         \
      "computes")                                                                                            \
    X(job_token, "GS_JOB_TOKEN", STR, "", NULL,                                                              \
      "secret every connection of the job must prove (gsrun sets a fresh one)")                              \
    X(store, "GS_STORE", STR, "", NULL, "host:port of the bootstrap store (rank 0 serves it)")               \
    X(store_external, "GS_STORE_EXTERNAL", BOOL, "0", NULL,                                                  \
      "the launcher serves the store at GS_STORE (gsrun sets it): rank 0 joins it instead of serving")       \
    X(rank, "GS_RANK", INT, "-1", NULL,                                                                      \
      "this process's rank (else RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID)")                                 \
    X(world_size, "GS_WORLD_SIZE", INT, "-1", NULL,                                                          \
      "number of ranks (else WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)")                               \
    X(local_rank, "GS_LOCAL_RANK", INT, "-1", NULL, "rank among the ranks of this host (set by gsrun)")      \
    X(role, "GS_ROLE", ENUM, "auto", "auto|worker|server", "parameter-server role of this rank")             \
    X(ps_servers, "GS_PS_SERVERS", INT, "1", NULL,                                                           \
      "parameter server: number of server ranks (the last ranks, when GS_ROLE is auto)")                     \
    X(ps_shard_bytes, "GS_PS_SHARD_BYTES", SIZE, "4M", NULL, "parameter server: largest shard")              \
    X(ps_mode, "GS_PS_MODE", ENUM, "sync", "sync|async", "parameter server: BSP or ASP")                     \
    X(ps_staleness, "GS_PS_STALENESS", INT, "-1", NULL, "parameter server: SSP bound in steps (-1: none)")   \
    X(ps_agg, "GS_PS_AGG", ENUM, "write", "write|atomic",                                                    \
      "parameter server: aggregate by WRITE_IMM slots or by fixed-point FETCH_ADD")                          \
    X(ps_atomic_frac_bits, "GS_PS_ATOMIC_FRAC_BITS", INT, "32", NULL,                                        \
      "parameter server, atomic aggregation: gradients travel as int64 = round(g * 2^bits)")                 \
    X(ps_apply_threads, "GS_PS_APPLY_THREADS", INT, "2", NULL,                                               \
      "parameter server: threads that sum and apply a shard of 1 MiB or more (the serve loop + helpers)")    \
    X(ps_checkpoint, "GS_PS_CHECKPOINT", STR, "", NULL,                                                      \
      "parameter server: checkpoint file prefix (empty: none)")                                              \
    X(ps_checkpoint_every, "GS_PS_CHECKPOINT_EVERY", INT, "0", NULL,                                         \
      "parameter server: checkpoint every N steps (0: only on request)")                                     \
    X(rejoin, "GS_REJOIN", BOOL, "0", NULL,                                                                  \
      "this process replaces a rank that died (a restarted parameter server, a joiner started by gsrun "     \
      "--restarts): rejoin the running job")                                                                 \
    X(library, "GS_LIBRARY", STR, "", NULL,                                                                  \
      "Python package gradsync: the libgradsync.so its bindings load (default: the installed one; from a "   \
      "build tree, its src/; else the loader's search path)")

#define GS_CFG_TYPE_INT          int64_t
#define GS_CFG_TYPE_SIZE         uint64_t
#define GS_CFG_TYPE_BOOL         bool
#define GS_CFG_TYPE_ENUM         int
#define GS_CFG_FIELD_STR(field)  char field[GS_CONFIG_STR_MAX];
#define GS_CFG_FIELD_INT(field)  GS_CFG_TYPE_INT field;
#define GS_CFG_FIELD_SIZE(field) GS_CFG_TYPE_SIZE field;
#define GS_CFG_FIELD_BOOL(field) GS_CFG_TYPE_BOOL field;
#define GS_CFG_FIELD_ENUM(field) GS_CFG_TYPE_ENUM field;

/* gs_config (declared opaque in gradsync.h): one field per parameter. */
struct gs_config {
#define GS_X_FIELD(field, var, type, def, choices, help) GS_CFG_FIELD_##type(field)
    GS_PARAM_TABLE(GS_X_FIELD)
#undef GS_X_FIELD
};

/* Enum values, in the order of their choices strings. */
/* GS_TRANSPORT's values; MIXED is never configured: auto picks it (a
 * transport per peer) and descriptors name it. */
enum { GS_TRANSPORT_AUTO, GS_TRANSPORT_SHM, GS_TRANSPORT_TCP, GS_TRANSPORT_VERBS, GS_TRANSPORT_MIXED };
enum { GS_POLL_SPIN, GS_POLL_EVENT, GS_POLL_HYBRID };
enum { GS_ALGO_AUTO, GS_ALGO_RING, GS_ALGO_RD, GS_ALGO_DIRECT, GS_ALGO_HIER };
enum { GS_TCP_ZCOPY_AUTO, GS_TCP_ZCOPY_ON, GS_TCP_ZCOPY_OFF };
enum { GS_ROLE_AUTO, GS_ROLE_WORKER, GS_ROLE_SERVER };
enum { GS_PS_SYNC, GS_PS_ASYNC };
enum { GS_PS_AGG_WRITE, GS_PS_AGG_ATOMIC };

typedef const char *(*gs_getenv_fn)(const char *name, void *arg);

/* Parses every parameter through getenv_fn (defaults where unset). A bad
 * value is GS_ERR_CONFIG with gs_last_error() naming the variable and the
 * accepted forms. */
gs_status gs_config_parse(gs_config *cfg, gs_getenv_fn getenv_fn, void *arg);
/* Warns about each GS_* variable in envp that no parameter has, with the
 * closest known name. Returns how many it warned about. */
int gs_config_warn_unknown(char *const *envp);
/* Checks the configuration in envp as gs_config_parse and
 * gs_config_warn_unknown do, reporting every problem (a malformed value: the
 * variable, the value, the accepted forms; an unknown GS_* name: the closest
 * known one) instead of stopping at the first. cfg gets the configuration,
 * the default in place of each malformed value. Returns how many problems. */
int gs_config_check(char *const *envp, gs_config *cfg, gs_config_report_fn report, void *arg);
/* The process configuration, parsed from the environment on first use. */
gs_status gs_config_get(const gs_config **cfg_p);
/* The current value of parameter i (gs_param_at's index), formatted. */
void gs_param_format(const gs_config *cfg, int i, char *buf, size_t cap);
/* The closest parameter name to name (edit distance), or NULL if none is close. */
const char *gs_param_closest(const char *name);
/* gs_config_value and gs_ctx_param: parameter name's value in cfg, as the
 * header says; caller names the public call in the error text. */
gs_status gs_config_param_value(const gs_config *cfg, const char *caller, const char *name, char *buf,
                                size_t cap);

#endif
