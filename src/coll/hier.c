/*
 * Hierarchical allreduce, for ranks on H hosts with L ranks each (any
 * placement: a rank's place is its host h and its index l among the ranks
 * of that host, in rank order). The data is cut into L blocks, each into H
 * parts: part (a, g). Column by column, rank (h, l):
 *
 *   1. reduce-scatter of the blocks on the ring of its host's ranks
 *      (over shm): it ends with block l reduced over the host, in recv;
 *   2. allreduce of block l's parts on the ring of the ranks with index l,
 *      one per host (over the network), as the ring allreduce does: part g
 *      is final at one rank and copied to the others;
 *   3. allgather of the blocks on the host's ring again.
 *
 * Every rank sends 2(L-1)/L of the data to its host's peers and 2(H-1)/(HL)
 * across hosts: one host's ranks together put 2(H-1)/H of it on the
 * network, the least an allreduce can (the flat ring crosses hosts at
 * every host boundary of its ring, as often as the placement makes it).
 * Each part's final value is computed once and copied, so every rank ends
 * with the same bits. Steps 1 and 3 pass the H parts of the blocks around
 * the host's ring one after the other, in the same order on every rank.
 */
#include "coll/coll.h"

/* Part i of count elements cut into n: offset and length (as the ring's segments). */
static void part_of(size_t count, size_t n, size_t i, size_t *off_p, size_t *len_p)
{
    size_t q = count / n, rem = count % n;
    *off_p = i * q + (i < rem ? i : rem);
    *len_p = q + (i < rem ? 1 : 0);
}

static void hier_start(gs_coll_op *op)
{
    const gs_comm *c = op->comm;
    size_t parts = (size_t)c->hier_hosts * (size_t)c->hier_local;
    gs_coll_layout(op, (op->count + parts - 1) / parts);
    op->nsteps = 2 * c->hier_local * c->hier_hosts + 2 * c->hier_hosts - 1;
}

/* The rank at (host h, index l). */
static int at(const gs_comm *c, int h, int l)
{
    return c->hier_rank[h * c->hier_local + l];
}

/* Steps 1 and 3: part g after part g-1, each a whole ring pass (step s of
 * L) of its column, so a rank sends one message before it receives, as on
 * the ring: never more than the slots a peer has. */
static void local_step(gs_coll_op *op, gs_prim *p, int j, bool gather)
{
    const gs_comm *c = op->comm;
    int L = c->hier_local, H = c->hier_hosts, l = c->hier_l, h = c->hier_h;
    int s = j % L, g = j / L, left = at(c, h, gs_coll_mod(l - 1, L)), right = at(c, h, gs_coll_mod(l + 1, L));
    int blk = gather ? gs_coll_mod(l - s, L) : gs_coll_mod(l - 1 - s, L);
    size_t off, len, first, cnt;
    part_of(op->count, (size_t)(L * H), (size_t)(blk * H + g), &off, &len);
    gs_coll_chunk(op, len, op->col, &first, &cnt);
    const uint8_t *in = gs_coll_at(op->send, (off + first) * op->es);
    uint8_t *out = gs_coll_at(op->recv, (off + first) * op->es);
    size_t bytes = cnt * op->es;
    if (!gather) { /* reduce-scatter: block l, reduced over the host, ends in recv */
        if (s == 0) {
            *p = gs_prim_pair(right, -1, GS_PRIM_COPY, in, NULL, bytes);
            p->send_local = true;
        } else if (s < L - 1) {
            *p = gs_prim_pair(right, left, GS_PRIM_REDUCE, in, NULL, bytes);
        } else {
            *p = gs_prim_pair(-1, left, GS_PRIM_REDUCE, in, out, bytes);
        }
    } else { /* allgather of the final blocks, in recv */
        if (s == 0) {
            *p = gs_prim_pair(right, -1, GS_PRIM_COPY, out, NULL, bytes);
            p->send_local = true;
        } else if (s < L - 1) {
            *p = gs_prim_pair(right, left, GS_PRIM_COPY, NULL, out, bytes);
        } else {
            *p = gs_prim_pair(-1, left, GS_PRIM_COPY, NULL, out, bytes);
        }
    }
    p->recv_first = true;
}

/* Step 2: ring allreduce step k of block l's parts among the ranks of index l. */
static void cross_step(gs_coll_op *op, gs_prim *p, int k)
{
    const gs_comm *c = op->comm;
    int L = c->hier_local, H = c->hier_hosts, l = c->hier_l, h = c->hier_h;
    int left = at(c, gs_coll_mod(h - 1, H), l), right = at(c, gs_coll_mod(h + 1, H), l);
    int g = k == 0 ? h : k <= H - 1 ? gs_coll_mod(h - k, H) : gs_coll_mod(h + 1 - (k - (H - 1)), H);
    size_t off, len, first, cnt;
    part_of(op->count, (size_t)(L * H), (size_t)(l * H + g), &off, &len);
    gs_coll_chunk(op, len, op->col, &first, &cnt);
    /* one rank per host: its own data; else block l as step 1 left it */
    const uint8_t *in = gs_coll_at(L > 1 ? op->recv : op->send, (off + first) * op->es);
    uint8_t *out = gs_coll_at(op->recv, (off + first) * op->es);
    size_t bytes = cnt * op->es;
    if (k == 0) {
        *p = gs_prim_pair(right, -1, GS_PRIM_COPY, in, NULL, bytes);
        p->send_local = true;
    } else if (k < H - 1) {
        *p = gs_prim_pair(right, left, GS_PRIM_REDUCE, in, NULL, bytes);
    } else if (k == H - 1) {
        *p = gs_prim_pair(right, left, GS_PRIM_REDUCE, in, out, bytes);
        p->finish = op->redop == GS_AVG;
    } else if (k < 2 * H - 2) {
        *p = gs_prim_pair(right, left, GS_PRIM_COPY, NULL, out, bytes);
    } else {
        *p = gs_prim_pair(-1, left, GS_PRIM_COPY, NULL, out, bytes);
    }
    p->recv_first = true;
}

/* The cursor runs 0 .. nsteps-1 per column: L*H steps of 1 (none with one
 * rank per host: they are then skipped), 2H-1 of 2, L*H of 3. */
static bool hier_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    int L = c->hier_local, H = c->hier_hosts, j;
    if (op->col == op->ncols)
        return false;
    if (L == 1 && op->step == 0)
        op->step = L * H; /* nothing to do on the host */
    j = op->step;
    if (j < L * H)
        local_step(op, p, j, false);
    else if (j < L * H + 2 * H - 1)
        cross_step(op, p, j - L * H);
    else
        local_step(op, p, j - L * H - (2 * H - 1), true);
    p->send_unit = gs_coll_unit(op, op->col, j);
    p->recv_unit = gs_coll_unit(op, op->col, j - 1);
    if (++op->step == op->nsteps || (L == 1 && op->step == L * H + 2 * H - 1)) {
        op->step = 0;
        op->col++;
    }
    return true;
}

const gs_coll_algo gs_hier_algo = {
    .name = "hier",
    .id = GS_COLL_ALGO_HIER,
    .start = hier_start,
    .next = hier_next,
};
