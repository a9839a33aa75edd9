/*
 * Sub-communicators. A new communicator is a group of its parent's ranks:
 * a group context (the parent's store, keys under the group's prefix,
 * bootstrap/ctx.c), a transport of the parent's kind opened on it (its own
 * connections and completion queue, so the calls of the two never meet),
 * and a communicator made on that, as any other. The group's name, and so
 * its prefix, must be the same on every member and differ from every other
 * group of the parent: for a split, the split's number and the color; for
 * a list of ranks, a hash of the list and how many groups of that list the
 * parent made before (members make them in the same order; other ranks do
 * not take part).
 */
#include "coll/coll.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>

/* What a rank brings to a split. */
typedef struct split_vote {
    int32_t color;
    int32_t key;
} split_vote;

gs_status gs_coll_group_build(gs_ctx *ctx, const char *tp_name, gs_comm **comm_p)
{
    gs_tp *tp = NULL;
    gs_comm *comm = NULL;
    gs_status st = gs_tp_open(ctx, tp_name, &tp);
    if (st == GS_OK)
        st = gs_comm_create(ctx, tp, &comm);
    if (st != GS_OK) {
        if (tp)
            gs_tp_close(tp);
        gs_ctx_destroy(ctx);
        return st;
    }
    comm->own_tp = true;
    comm->own_ctx = true;
    *comm_p = comm;
    return GS_OK;
}

/* A communicator of parent's ranks members[0..n) named tag. */
static gs_status make_group(gs_comm *parent, const char *tag, const int *members, int n, gs_comm **comm_p)
{
    gs_ctx *ctx = NULL;
    gs_status st = gs_boot_ctx_group(parent->ctx, tag, members, n, &ctx);
    if (st == GS_OK)
        st = gs_coll_group_build(ctx, gs_tp_name(parent->tp), comm_p);
    if (st == GS_OK)
        gs_log_debug(COLL, "rank %d: sub-communicator %s: rank %d of %d", parent->rank, tag, (*comm_p)->rank,
                     (*comm_p)->size);
    return st;
}

/* The members of color in split order (key, then parent rank); their count. */
static int members_of(const split_vote *votes, int size, int32_t color, int *members)
{
    int n = 0;
    for (int r = 0; r < size; r++) {
        int at;
        if (votes[r].color != color)
            continue;
        /* insertion by key, after the equal keys: they keep rank order */
        for (at = n++; at > 0 && votes[members[at - 1]].key > votes[r].key; at--)
            members[at] = members[at - 1];
        members[at] = r;
    }
    return n;
}

gs_status gs_comm_split(gs_comm *comm, int color, int key, gs_comm **newcomm_p)
{
    split_vote mine = {.color = color, .key = key}, *votes;
    char tag[64];
    int *members, n;
    unsigned serial;
    gs_status st;
    if (!comm || !newcomm_p)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID, "gs_comm_split: comm and newcomm_p must not be NULL");
    if (color < GS_COMM_NO_COLOR)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID,
                       "rank %d: gs_comm_split: color %d: use a color >= 0 or GS_COMM_NO_COLOR", comm->rank,
                       color);
    serial = comm->splits++;
    votes = gs_calloc((size_t)comm->size, sizeof(*votes));
    members = gs_calloc((size_t)comm->size, sizeof(*members));
    if (!votes || !members) {
        free(votes);
        free(members);
        return GS_ERR_NOMEM;
    }
    snprintf(tag, sizeof(tag), "coll/%u/split/%u", comm->id, serial);
    st = gs_store_allgather(comm->ctx, tag, &mine, sizeof(mine), votes);
    *newcomm_p = NULL;
    if (st == GS_OK && color != GS_COMM_NO_COLOR) {
        n = members_of(votes, comm->size, color, members);
        snprintf(tag, sizeof(tag), "c%u.s%u.%d", comm->id, serial, color);
        st = make_group(comm, tag, members, n, newcomm_p);
    }
    free(votes);
    free(members);
    return st;
}

static uint64_t list_hash(const int *ranks, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)ranks[i]) * 1099511628211ull;
    return h ^ (uint64_t)n;
}

gs_status gs_comm_create_group(gs_comm *comm, const int *ranks, int n, gs_comm **newcomm_p)
{
    char tag[64];
    uint64_t h, *grown;
    unsigned before = 0;
    if (!comm || !ranks || n < 1 || !newcomm_p)
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_INVALID,
                       "gs_comm_create_group: comm, ranks (n >= 1) and newcomm_p must be given");
    h = list_hash(ranks, n);
    for (size_t i = 0; i < comm->ngroups; i++)
        before += comm->groups[i] == h;
    grown = realloc(comm->groups, (comm->ngroups + 1) * sizeof(*grown));
    if (!grown)
        return GS_ERR_NOMEM;
    comm->groups = grown;
    comm->groups[comm->ngroups++] = h;
    snprintf(tag, sizeof(tag), "c%u.r%016llx.%u", comm->id, (unsigned long long)h, before);
    return make_group(comm, tag, ranks, n, newcomm_p);
}
