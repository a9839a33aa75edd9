/*
 * The init summary: at GS_LOG_LEVEL=info rank 0 prints, once per process,
 * when its first communicator over the whole job is up, what a person
 * tuning the job wants to see (as NCCL_DEBUG=INFO does): version, ranks and
 * hosts, the transport with its device, the algorithms auto picks and the
 * thresholds in force, the CPU affinity, and every variable that differs
 * from its default.
 */
#include "coll/coll.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/log.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

/* "1K", "16M": a power of two, short. */
static void size_text(size_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "K", "M", "G"};
    int u = 0;
    while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, cap, "%zu%s", bytes, units[u]);
}

/* Which algorithm auto runs kind at each power-of-two size, as ranges:
 * "direct <= 16M, ring above". */
static void algo_ranges(const gs_comm *comm, gs_coll_kind kind, char *buf, size_t cap)
{
    size_t n = 0, es = 4;
    const gs_coll_algo *prev = gs_coll_select(comm, kind, es);
    buf[0] = '\0';
    for (int k = 3; k <= 31 && n < cap; k++) {
        size_t bytes = (size_t)1 << k;
        const gs_coll_algo *a = k < 31 ? gs_coll_select(comm, kind, bytes) : NULL;
        if (a == prev)
            continue;
        char upto[16];
        size_text(bytes / 2, upto, sizeof(upto));
        n += (size_t)snprintf(buf + n, cap - n, "%s%s%s%s", n ? ", " : "", prev->name, a ? " <= " : "",
                              a ? upto : (n ? " above" : " at every size"));
        prev = a;
    }
}

/* "host 0: 0,2,4; host 1: 1,3" */
static void host_map(const gs_comm *comm, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int h = 0; h < comm->hosts && n < cap; h++) {
        n += (size_t)snprintf(buf + n, cap - n, "%shost %d:", h ? "; " : "", h);
        for (int r = 0, first = 1; r < comm->size && n < cap; r++)
            if (comm->host_of[r] == h) {
                n += (size_t)snprintf(buf + n, cap - n, "%s%d", first ? " " : ",", r);
                first = 0;
            }
    }
}

static void cpu_list(char *buf, size_t cap)
{
    cpu_set_t set;
    size_t n = 0;
    buf[0] = '\0';
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        snprintf(buf, cap, "unknown");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++) {
        if (!CPU_ISSET(c, &set))
            continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
            last++;
        n += (size_t)(last > c ? snprintf(buf + n, cap - n, "%s%d-%d", n ? "," : "", c, last)
                               : snprintf(buf + n, cap - n, "%s%d", n ? "," : "", c));
        c = last;
    }
}

static const char *no_env(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    return NULL;
}

/* Every parameter whose value differs from its default, "GS_X=v, ...". */
static void changed_params(const gs_config *cfg, char *buf, size_t cap)
{
    gs_config defaults;
    size_t n = 0;
    buf[0] = '\0';
    if (gs_config_parse(&defaults, no_env, NULL) != GS_OK)
        return;
    for (int i = 0; i < gs_param_count() && n < cap; i++) {
        char now[GS_CONFIG_STR_MAX], def[GS_CONFIG_STR_MAX];
        const char *var = gs_param_at(i)->name;
        gs_param_format(cfg, i, now, sizeof(now));
        gs_param_format(&defaults, i, def, sizeof(def));
        if (strcmp(now, def) != 0)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s=%s", n ? ", " : "", var,
                                  strcmp(var, "GS_JOB_TOKEN") == 0 ? "(set)" : now);
    }
}

void gs_coll_summary(const gs_comm *comm)
{
    static bool printed;
    char line[1024], a[256], b[256], c[256], d[256], e[256];
    const gs_ctx *ctx = comm->ctx;
    if (printed || comm->rank != 0 || ctx->parent || !gs_log_enabled(GS_LOG_INFO, GS_SUBSYS_COLL))
        return;
    printed = true;
    gs_log_info(COLL, "gradsync %s: %d ranks on %d host%s (%d on this one), ranks from %s", GS_VERSION_STRING,
                comm->size, comm->hosts, comm->hosts == 1 ? "" : "s", comm->local_ranks, ctx->boot.source);
    if (comm->hosts > 1) {
        host_map(comm, line, sizeof(line));
        gs_log_info(COLL, "ranks by host: %s", line);
    }
    gs_tp_describe(comm->tp, line, sizeof(line));
    gs_log_info(COLL, "transport %s: %s", comm->tp->ops->peer_reach ? "per peer" : "for every peer", line);
    algo_ranges(comm, GS_COLL_ALLREDUCE, a, sizeof(a));
    algo_ranges(comm, GS_COLL_BROADCAST, b, sizeof(b));
    algo_ranges(comm, GS_COLL_REDUCE, c, sizeof(c));
    algo_ranges(comm, GS_COLL_REDUCE_SCATTER, d, sizeof(d));
    algo_ranges(comm, GS_COLL_ALLGATHER, e, sizeof(e));
    gs_log_info(COLL,
                "algorithms (GS_ALGO=%s): allreduce %s%s; reduce_scatter %s; allgather %s; broadcast %s; "
                "reduce, gather, scatter, alltoall %s",
                comm->cfg->algo == GS_ALGO_AUTO ? "auto, by size" : "forced", a,
                comm->tiny ? " (2 ranks, <= 8 B: the tiny path)" : "", d, e, b, c);
    size_text(comm->chunk, a, sizeof(a));
    size_text(comm->nt_bytes, b, sizeof(b));
    c[0] = '\0';
    if (comm->box)
        size_text(comm->box_chunk, c, sizeof(c));
    gs_log_info(
        COLL,
        "thresholds: chunk %s (GS_CHUNK_BYTES)%s%s, results streamed from %s, p2p eager up to 4056 B; "
        "timeout %lld ms",
        a, c[0] ? ", shared-memory column " : "", c, b, (long long)comm->cfg->timeout_ms);
    cpu_list(a, sizeof(a));
    gs_log_info(COLL, "cpu affinity of rank 0: %s (GS_CPU_AFFINITY=%s)%s", a,
                comm->cfg->cpu_affinity[0] ? comm->cfg->cpu_affinity : "unset",
                comm->oversubscribed ? "; more ranks than cores here: waits yield" : "");
    changed_params(comm->cfg, line, sizeof(line));
    gs_log_info(COLL, "set apart from the defaults: %s", line[0] ? line : "nothing");
}
