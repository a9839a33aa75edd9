/*
 * Rank, world size and store address from the launcher's environment, in
 * order: GS_RANK/GS_WORLD_SIZE/GS_STORE (gsrun, or by hand); torchrun's
 * RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; Open MPI's OMPI_COMM_WORLD_*;
 * Slurm's SLURM_*; else a single process, rank 0 of 1. GS_STORE, when set,
 * is the store address under every launcher.
 */
#include "bootstrap/boot.h"

#include "bootstrap/store_proto.h"
#include "util/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ports derived for single-host Open MPI and Slurm jobs: below Linux's
 * default ephemeral range (32768-60999), so no outgoing connection holds them. */
#define DERIVED_PORT_BASE 20000
#define DERIVED_PORT_SPAN 12000

typedef struct env_reader {
    gs_getenv_fn fn;
    void *arg;
} env_reader;

static const char *env_get(const env_reader *env, const char *name)
{
    return env->fn(name, env->arg);
}

/* name's value as an integer in [min, max]; GS_ERR_CONFIG naming it otherwise. */
static gs_status env_int(const env_reader *env, const char *name, long min, long max, int *value_p)
{
    const char *text = env_get(env, name);
    char *end;
    long v;

    if (!text)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG, "%s is not set", name);
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "%s='%s' is not valid: expected an integer from %ld to %ld", name, text, min, max);
    *value_p = (int)v;
    return GS_OK;
}

/* rank_var and size_var: both set and consistent. */
static gs_status rank_and_size(const env_reader *env, const char *rank_var, const char *size_var,
                               gs_boot_info *info)
{
    gs_status status = env_int(env, size_var, 1, GS_STORE_RANKS_MAX, &info->size);
    if (status == GS_OK)
        status = env_int(env, rank_var, 0, info->size - 1, &info->rank);
    return status;
}

static uint64_t fnv1a(const char *text, uint64_t hash)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        hash = (hash ^ *p) * 0x100000001b3ull;
    return hash;
}

/* 127.0.0.1 and a port derived from the job's id: every rank of a
 * single-host job computes the same one. */
static void derived_store(gs_boot_info *info, const char *job_id)
{
    uint64_t hash = fnv1a(job_id, 0xcbf29ce484222325ull);
    snprintf(info->store_host, sizeof(info->store_host), "127.0.0.1");
    info->store_port = DERIVED_PORT_BASE + (int)(hash % DERIVED_PORT_SPAN);
    gs_log_info(BOOT, "GS_STORE not set: using 127.0.0.1:%d, derived from job id %s (%s, one host)",
                info->store_port, job_id, info->source);
}

static gs_status from_gs(const gs_config *cfg, const env_reader *env, gs_boot_info *info)
{
    info->source = "GS_*";
    if (!env_get(env, "GS_RANK") || !env_get(env, "GS_WORLD_SIZE"))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG, "%s is set but %s is not; set both (gsrun does)",
                       env_get(env, "GS_RANK") ? "GS_RANK" : "GS_WORLD_SIZE",
                       env_get(env, "GS_RANK") ? "GS_WORLD_SIZE" : "GS_RANK");
    if (cfg->world_size < 1 || cfg->world_size > GS_STORE_RANKS_MAX)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "GS_WORLD_SIZE=%" PRId64 " is not valid: expected 1 to %d", cfg->world_size,
                       GS_STORE_RANKS_MAX);
    if (cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "GS_RANK=%" PRId64 " is not valid: expected 0 to GS_WORLD_SIZE-1 = %" PRId64,
                       cfg->rank, cfg->world_size - 1);
    info->rank = (int)cfg->rank;
    info->size = (int)cfg->world_size;
    if (info->size > 1 && !cfg->store[0])
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "GS_STORE is not set: with GS_WORLD_SIZE=%d every rank needs the store's host:port",
                       info->size);
    return GS_OK;
}

static gs_status from_torchrun(const env_reader *env, gs_boot_info *info, bool have_store)
{
    const char *addr = env_get(env, "MASTER_ADDR");
    size_t len;
    int port;
    gs_status status;

    info->source = "torchrun";
    if (!env_get(env, "RANK") || !env_get(env, "WORLD_SIZE"))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG, "%s is set but %s is not; torchrun sets both",
                       env_get(env, "RANK") ? "RANK" : "WORLD_SIZE",
                       env_get(env, "RANK") ? "WORLD_SIZE" : "RANK");
    status = rank_and_size(env, "RANK", "WORLD_SIZE", info);
    if (status == GS_OK && env_get(env, "LOCAL_RANK"))
        status = env_int(env, "LOCAL_RANK", 0, GS_STORE_RANKS_MAX - 1, &info->local_rank);
    if (status == GS_OK && env_get(env, "LOCAL_WORLD_SIZE"))
        status = env_int(env, "LOCAL_WORLD_SIZE", 1, GS_STORE_RANKS_MAX, &info->local_size);
    if (status != GS_OK || have_store || (info->size == 1 && !addr))
        return status;
    /* torchrun's own TCPStore holds MASTER_PORT: gradsync's store takes the next port. */
    status = env_int(env, "MASTER_PORT", 1, 65534, &port);
    if (status != GS_OK)
        return status;
    if (!addr || !*addr)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG, "MASTER_ADDR is not set (torchrun sets it)");
    len = strlen(addr);
    if (addr[0] == '[' && addr[len - 1] == ']') { /* accept a bracketed IPv6 address */
        addr++;
        len -= 2;
    }
    if (len == 0 || len >= sizeof(info->store_host))
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "MASTER_ADDR='%s' is not valid: expected a host name or address",
                       env_get(env, "MASTER_ADDR"));
    snprintf(info->store_host, sizeof(info->store_host), "%.*s", (int)len, addr);
    info->store_port = port + 1;
    return GS_OK;
}

static gs_status from_open_mpi(const env_reader *env, gs_boot_info *info, bool have_store)
{
    const char *job = env_get(env, "OMPI_MCA_ess_base_jobid");
    int local_size = 0;
    gs_status status;

    info->source = "Open MPI";
    status = rank_and_size(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", info);
    if (status == GS_OK && env_get(env, "OMPI_COMM_WORLD_LOCAL_RANK"))
        status = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, GS_STORE_RANKS_MAX - 1, &info->local_rank);
    if (status == GS_OK && env_get(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
        status = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, GS_STORE_RANKS_MAX, &info->local_size);
    if (status == GS_OK && env_get(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
        status = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, GS_STORE_RANKS_MAX, &local_size);
    if (status != GS_OK || have_store || info->size == 1)
        return status;
    if (!job)
        job = env_get(env, "PMIX_NAMESPACE");
    if (local_size != info->size || !job)
        return gs_fail(
            GS_SUBSYS_BOOT, GS_ERR_CONFIG,
            "GS_STORE is not set: under mpirun across hosts, set GS_STORE=host:port to a free port on "
            "rank 0's host and pass it to every rank (mpirun -x GS_STORE ...)");
    derived_store(info, job);
    return GS_OK;
}

static gs_status from_slurm(const env_reader *env, gs_boot_info *info, bool have_store)
{
    const char *job = env_get(env, "SLURM_JOB_ID"), *step = env_get(env, "SLURM_STEP_ID");
    const char *nodes = env_get(env, "SLURM_STEP_NUM_NODES") ? env_get(env, "SLURM_STEP_NUM_NODES")
                                                             : env_get(env, "SLURM_NNODES");
    char job_step[160];
    gs_status status;

    info->source = "Slurm";
    status = rank_and_size(env, "SLURM_PROCID", "SLURM_NTASKS", info);
    if (status == GS_OK && env_get(env, "SLURM_LOCALID"))
        status = env_int(env, "SLURM_LOCALID", 0, GS_STORE_RANKS_MAX - 1, &info->local_rank);
    if (status != GS_OK || have_store || info->size == 1)
        return status;
    if (!job || !nodes || strcmp(nodes, "1") != 0)
        return gs_fail(
            GS_SUBSYS_BOOT, GS_ERR_CONFIG,
            "GS_STORE is not set: under srun across nodes, set GS_STORE=host:port to a free port on the "
            "first node of the job (export it before srun)");
    snprintf(job_step, sizeof(job_step), "%s.%s", job, step ? step : "0");
    derived_store(info, job_step);
    return GS_OK;
}

static gs_status parse_store(const gs_config *cfg, gs_boot_info *info)
{
    if (gs_boot_parse_hostport(cfg->store, info->store_host, sizeof(info->store_host), &info->store_port) !=
        GS_OK)
        return gs_fail(
            GS_SUBSYS_BOOT, GS_ERR_CONFIG,
            "GS_STORE='%s' is not valid: expected host:port or [ipv6-address]:port, port 1 to 65535",
            cfg->store);
    return GS_OK;
}

gs_status gs_boot_discover(const gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_boot_info *info_p)
{
    env_reader env = {getenv_fn, arg};
    gs_boot_info info = {
        .rank = 0, .size = 1, .local_rank = -1, .local_size = -1, .source = "single process"};
    bool have_store = cfg->store[0] != '\0';
    gs_status status = have_store ? parse_store(cfg, &info) : GS_OK;

    if (status != GS_OK)
        return status;
    if (env_get(&env, "GS_RANK") || env_get(&env, "GS_WORLD_SIZE"))
        status = from_gs(cfg, &env, &info);
    else if (env_get(&env, "RANK") || env_get(&env, "WORLD_SIZE"))
        status = from_torchrun(&env, &info, have_store);
    else if (env_get(&env, "OMPI_COMM_WORLD_RANK"))
        status = from_open_mpi(&env, &info, have_store);
    else if (env_get(&env, "SLURM_PROCID"))
        status = from_slurm(&env, &info, have_store);
    if (status != GS_OK)
        return status;
    if (cfg->local_rank >= 0)
        info.local_rank = (int)cfg->local_rank;
    else if (info.local_rank < 0 && info.size == 1)
        info.local_rank = 0;
    if (info.size == 1)
        info.local_size = 1;
    info.store_external = cfg->store_external;
    if (info.store_external && info.store_port == 0)
        return gs_fail(GS_SUBSYS_BOOT, GS_ERR_CONFIG,
                       "GS_STORE_EXTERNAL=1 says a launcher serves the store, but GS_STORE is not set");
    *info_p = info;
    return GS_OK;
}
