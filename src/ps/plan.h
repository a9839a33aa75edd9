/*
 * The sharding plan: which server holds which part of which key. Every rank
 * builds the same plan from the same registrations in the same order, so the
 * plan itself is never sent anywhere.
 *
 * A key of n bytes is cut into ceil(n / shard_bytes) shards whose element
 * counts differ by at most one; each shard goes to the server holding the
 * fewest bytes so far (ties: the lowest server index).
 */
#ifndef GS_PS_PLAN_H
#define GS_PS_PLAN_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

typedef struct gs_ps_shard_info {
    uint64_t key;
    uint32_t index;  /* shard index within the key */
    uint32_t server; /* server index (0 .. servers-1) */
    uint32_t slot;   /* index among that server's shards, in plan order */
    size_t offset;   /* first element within the key */
    size_t count;    /* elements */
} gs_ps_shard_info;

typedef struct gs_ps_key_info {
    uint64_t key;
    size_t count;       /* elements */
    size_t first_shard; /* index into plan->shards */
    size_t nshards;
} gs_ps_key_info;

typedef struct gs_ps_plan {
    int servers;
    size_t shard_bytes; /* largest shard, a multiple of the element size */
    size_t elem_bytes;
    uint64_t *load;   /* [servers] bytes assigned */
    uint32_t *nslots; /* [servers] shards assigned */
    gs_ps_shard_info *shards;
    size_t nshards, shards_cap;
    gs_ps_key_info *keys;
    size_t nkeys, keys_cap;
} gs_ps_plan;

/* shard_bytes is rounded down to a multiple of elem_bytes; it must leave at
 * least one element. */
gs_status gs_ps_plan_init(gs_ps_plan *plan, int servers, size_t shard_bytes, size_t elem_bytes);
void gs_ps_plan_free(gs_ps_plan *plan);
/* Adds a key of count elements (count > 0; the key not yet added). */
gs_status gs_ps_plan_add(gs_ps_plan *plan, uint64_t key, size_t count);
/* The key's entry, or NULL. */
const gs_ps_key_info *gs_ps_plan_find(const gs_ps_plan *plan, uint64_t key);

#endif
