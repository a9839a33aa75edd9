/* The sharding plan: keys cut into shards and placed on the server with the
 * fewest bytes, the same on every rank from the same registrations (plan.h).
 * Computes only: it sends nothing and touches no memory region. */
#include "ps/plan.h"

#include "ps/ps_proto.h"
#include "util/alloc.h"
#include "util/log.h"

#include <stdlib.h>
#include <string.h>

gs_status gs_ps_plan_init(gs_ps_plan *plan, int servers, size_t shard_bytes, size_t elem_bytes)
{
    memset(plan, 0, sizeof(*plan));
    if (servers < 1 || elem_bytes == 0 || shard_bytes < elem_bytes)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                       "sharding plan: %d servers and %zu-byte shards of %zu-byte elements are not usable "
                       "(need at least one server and GS_PS_SHARD_BYTES of at least one element)",
                       servers, shard_bytes, elem_bytes);
    plan->servers = servers;
    plan->elem_bytes = elem_bytes;
    plan->shard_bytes = shard_bytes / elem_bytes * elem_bytes;
    plan->load = gs_calloc((size_t)servers, sizeof(*plan->load));
    plan->nslots = gs_calloc((size_t)servers, sizeof(*plan->nslots));
    if (!plan->load || !plan->nslots) {
        gs_ps_plan_free(plan);
        return GS_ERR_NOMEM;
    }
    return GS_OK;
}

void gs_ps_plan_free(gs_ps_plan *plan)
{
    free(plan->load);
    free(plan->nslots);
    free(plan->shards);
    free(plan->keys);
    memset(plan, 0, sizeof(*plan));
}

const gs_ps_key_info *gs_ps_plan_find(const gs_ps_plan *plan, uint64_t key)
{
    for (size_t i = 0; i < plan->nkeys; i++)
        if (plan->keys[i].key == key)
            return &plan->keys[i];
    return NULL;
}

static gs_status grow(void **array, size_t *cap, size_t need, size_t elem)
{
    size_t new_cap = *cap ? *cap : 16;
    void *p;
    if (need <= *cap)
        return GS_OK;
    while (new_cap < need)
        new_cap *= 2;
    p = realloc(*array, new_cap * elem);
    if (!p)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_NOMEM, "sharding plan: no memory for %zu entries", new_cap);
    *array = p;
    *cap = new_cap;
    return GS_OK;
}

/* The server with the fewest bytes (ties: the lowest index). */
static uint32_t least_loaded(const gs_ps_plan *plan)
{
    uint32_t best = 0;
    for (uint32_t s = 1; s < (uint32_t)plan->servers; s++)
        if (plan->load[s] < plan->load[best])
            best = s;
    return best;
}

static gs_status check_key(const gs_ps_plan *plan, uint64_t key, size_t count, size_t nshards)
{
    if (count == 0)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "register key %llu: a key needs at least one element",
                       (unsigned long long)key);
    if (gs_ps_plan_find(plan, key))
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID, "register key %llu: already registered",
                       (unsigned long long)key);
    if (plan->nshards + nshards > GS_PS_MAX_WORKER_SHARDS)
        return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                       "register key %llu: more than %u shards in all; raise GS_PS_SHARD_BYTES",
                       (unsigned long long)key, GS_PS_MAX_WORKER_SHARDS);
    return GS_OK;
}

/* Takes back the first n shards placed by a gs_ps_plan_add that failed. */
static void undo(gs_ps_plan *plan, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const gs_ps_shard_info *sh = &plan->shards[plan->nshards + i];
        plan->load[sh->server] -= (uint64_t)sh->count * plan->elem_bytes;
        plan->nslots[sh->server]--;
    }
}

gs_status gs_ps_plan_add(gs_ps_plan *plan, uint64_t key, size_t count)
{
    size_t per_shard = plan->shard_bytes / plan->elem_bytes;
    size_t nshards = count / per_shard + (count % per_shard != 0);
    size_t offset = 0;
    gs_status st = check_key(plan, key, count, nshards);
    if (st == GS_OK)
        st = grow((void **)&plan->keys, &plan->keys_cap, plan->nkeys + 1, sizeof(*plan->keys));
    if (st == GS_OK)
        st = grow((void **)&plan->shards, &plan->shards_cap, plan->nshards + nshards, sizeof(*plan->shards));
    if (st != GS_OK)
        return st;
    /* Step 1: element counts that differ by at most one. */
    for (size_t i = 0; i < nshards; i++) {
        size_t n = count / nshards + (i < count % nshards);
        uint32_t server = least_loaded(plan);
        if (plan->nslots[server] == GS_PS_MAX_SERVER_SHARDS) {
            undo(plan, i);
            return gs_fail(GS_SUBSYS_PS, GS_ERR_INVALID,
                           "register key %llu: server %u would hold more than %u shards; raise "
                           "GS_PS_SHARD_BYTES or add servers",
                           (unsigned long long)key, server, GS_PS_MAX_SERVER_SHARDS);
        }
        /* Step 2: to the least loaded server. */
        plan->shards[plan->nshards + i] = (gs_ps_shard_info){.key = key,
                                                             .index = (uint32_t)i,
                                                             .server = server,
                                                             .slot = plan->nslots[server],
                                                             .offset = offset,
                                                             .count = n};
        plan->load[server] += (uint64_t)n * plan->elem_bytes;
        plan->nslots[server]++;
        offset += n;
    }
    plan->keys[plan->nkeys++] =
        (gs_ps_key_info){.key = key, .count = count, .first_shard = plan->nshards, .nshards = nshards};
    plan->nshards += nshards;
    return GS_OK;
}
