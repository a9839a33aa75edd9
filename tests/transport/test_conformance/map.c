/* Conformance: mapping a peer's region (gs_tp_map), on transports that map peers' memory
 * (GS_TP_CAP_LOCAL_MAP); elsewhere it is refused as unsupported. */
#include "ct.h"

#define MAP_BYTES (8 * KIB)

enum { MAP_BAD_KEY, MAP_FORGED_LENGTH, MAP_NO_WRITE, MAP_USER_MEMORY, MAP_REFUSALS };

static const char *const map_refusal_names[] = {"bad key", "forged length", "no remote write",
                                                "registered caller memory"};

/* Rank 1 owns the regions; rank 0 maps them, reads what rank 1 wrote, writes
 * back, keeps its mapping past rank 1's deregistration, and is refused the
 * forged and unmappable ones with nothing mapped. */
static void map_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    bool maps = (ct_caps(tp) & GS_TP_CAP_LOCAL_MAP) != 0;
    gs_mr *mr = NULL, *ro = NULL, *user_mr = NULL;
    uint8_t *user = calloc(1, MAP_BYTES);
    GS_ASSERT(user != NULL);
    GS_ASSERT_OK(gs_mr_alloc(tp, MAP_BYTES, GS_ACCESS_ALL, &mr));
    GS_ASSERT_OK(gs_mr_alloc(tp, MAP_BYTES, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_READ, &ro));
    bool have_user =
        (ct_caps(tp) & GS_TP_CAP_USER_MEM) &&
        gs_mr_reg(tp, user, MAP_BYTES, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_WRITE,
                  &user_mr) == GS_OK;
    ct_fill(gs_mr_addr(mr), MAP_BYTES, (uint32_t)(rank + 40));
    gs_rmr *all = ct_exchange(ctx, "ct.map.rmr", mr);
    gs_rmr *all_ro = ct_exchange(ctx, "ct.map.ro", ro);
    gs_rmr *all_user = have_user ? ct_exchange(ctx, "ct.map.user", user_mr) : NULL;
    void *p = NULL;
    size_t len = 0;
    if (rank == 0) {
        gs_ep *ep = gs_tp_ep(tp, 1);
        gs_status st = gs_tp_map(ep, &all[1], GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_WRITE, &p, &len);
        if (!maps) {
            GS_ASSERT_STATUS(st, GS_ERR_UNSUPPORTED);
        } else {
            GS_ASSERT_OK(st);
            GS_ASSERT(len >= MAP_BYTES);
            GS_ASSERT_EQ(ct_check(p, MAP_BYTES, 41), MAP_BYTES); /* what rank 1 wrote */
            ct_fill(p, MAP_BYTES, 7);                            /* seen by rank 1 */
            for (int v = 0; v < MAP_REFUSALS; v++) {
                gs_rmr bad = v == MAP_NO_WRITE      ? all_ro[1]
                             : v == MAP_USER_MEMORY ? (have_user ? all_user[1] : all[1])
                                                    : all[1];
                gs_rmr_head head;
                void *q = NULL;
                size_t qlen = 0;
                if (v == MAP_USER_MEMORY && !have_user)
                    continue;
                memcpy(&head, bad.bytes, sizeof(head));
                if (v == MAP_BAD_KEY)
                    head.key ^= 0x5a5a0001ull;
                if (v == MAP_FORGED_LENGTH)
                    head.len = 2 * MAP_BYTES;
                if (v == MAP_NO_WRITE)
                    head.access |= GS_ACCESS_REMOTE_WRITE; /* forged: the owner's record says read only */
                memcpy(bad.bytes, &head, sizeof(head));
                st = gs_tp_map(ep, &bad, GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_WRITE, &q, &qlen);
                if (st != GS_ERR_REMOTE_ACCESS || q != NULL)
                    gs_test_fail_here(__FILE__, __LINE__,
                                      "map of a region with %s: %s (%s), want GS_ERR_REMOTE_ACCESS",
                                      map_refusal_names[v], gs_status_name(st), gs_last_error());
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.map.written"));
    if (rank == 1 && maps)
        GS_ASSERT_EQ(ct_check(gs_mr_addr(mr), MAP_BYTES, 7), MAP_BYTES);
    if (rank == 1) { /* the owner lets go; the mapping stays the caller's */
        GS_ASSERT_OK(gs_mr_dereg(mr));
        mr = NULL;
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.map.dropped"));
    if (rank == 0 && p) {
        GS_ASSERT_EQ(ct_check(p, MAP_BYTES, 7), MAP_BYTES);
        gs_tp_unmap(tp, p, len);
    }
    free(all_user);
    free(all_ro);
    if (user_mr)
        GS_ASSERT_OK(gs_mr_dereg(user_mr));
    free(user);
    if (mr)
        GS_ASSERT_OK(gs_mr_dereg(mr));
    ct_finish(ctx, "ct.map.done", tp, ro, all);
}

GS_TEST_TP(a_peers_allocated_region_maps_where_the_transport_maps_memory)
{
    ct_run(2, map_body, transport, 0, NULL);
}
