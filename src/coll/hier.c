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
 *
 * Uneven hosts (3 + 2): L is the fewest ranks any host has; the ranks of
 * index l < L form the core. A rank of index l >= L (an extra) first sends
 * its column to the core rank of index l mod L on its host, which reduces
 * it into its own before step 1 (its partner: extras fold in the order of
 * their indices), and receives the final column from it after step 3. The
 * network carries what it carries for L ranks per host; the host's shared
 * memory carries the extras' columns twice more.
 *
 * Message ids (units) are the same on every rank: per column, the folds of
 * extra slot x (x = l / L - 1) part i, then the core's steps, then the
 * unfolds of slot x part i; each rank runs only its own of them, in order.
 *
 * Small allreduces (up to GS_HIER_LEADERS_BYTES) go through one rank per
 * host instead: hier_small.c. reduce_scatter and allgather: hier_blocks.c.
 */
#include "coll/coll.h"

/* Part i of count elements cut into n: offset and length (as the ring's segments). */
static void part_of(size_t count, size_t n, size_t i, size_t *off_p, size_t *len_p)
{
    size_t q = count / n, rem = count % n;
    *off_p = i * q + (i < rem ? i : rem);
    *len_p = q + (i < rem ? 1 : 0);
}

/* The rank at (host h, index l), -1 past the host's ranks. */
static int at(const gs_comm *c, int h, int l)
{
    return l < c->hier_lmax ? c->hier_rank[h * c->hier_lmax + l] : -1;
}

/* Parts per column: L blocks of H parts. */
static int nparts(const gs_comm *c)
{
    return c->hier_local * c->hier_hosts;
}

/* The most extras one core rank has: unit slots for folds and unfolds. */
static int xmax(const gs_comm *c)
{
    return (c->hier_lmax - 1) / c->hier_local;
}

/* The core's steps: L*H of step 1, 2H-1 of step 2, L*H of step 3. */
static int core_units(const gs_comm *c)
{
    return 2 * nparts(c) + 2 * c->hier_hosts - 1;
}

/* Extras folding into this core rank (0 for an extra). */
static int extras_of_me(const gs_comm *c)
{
    return c->hier_extras;
}

/* The steps this rank runs per column: an extra sends its parts and
 * receives them back; a core rank runs step 1 (unless alone on its host's
 * core ring), 2, 3, and a fold and an unfold per extra. */
static int own_steps(const gs_comm *c)
{
    int P = nparts(c), H = c->hier_hosts;
    if (c->hier_l >= c->hier_local)
        return 2 * P;
    return 2 * extras_of_me(c) * P + (c->hier_local > 1 ? core_units(c) : 2 * H - 1);
}

static bool blocks_kind(const gs_coll_op *op)
{
    return op->kind == GS_COLL_REDUCE_SCATTER || op->kind == GS_COLL_ALLGATHER;
}

static void hier_start(gs_coll_op *op)
{
    const gs_comm *c = op->comm;
    size_t parts = (size_t)nparts(c);
    op->leaders = (op->kind == GS_COLL_ALLREDUCE || op->kind == GS_COLL_ALLREDUCE_MULTI) &&
                  op->count * op->es <= GS_HIER_LEADERS_BYTES && c->hier_scratch;
    if (op->leaders) {
        gs_hier_small_start(op);
        return;
    }
    if (blocks_kind(op)) {
        gs_hier_blocks_start(op);
        return;
    }
    gs_coll_layout(op, (op->count + parts - 1) / parts);
    op->nsteps = 2 * xmax(c) * nparts(c) + core_units(c);
}

/* This column's chunk of part i: where it starts in the buffers, and its bytes. */
static size_t part_chunk(const gs_coll_op *op, int i, size_t *bytes_p)
{
    size_t off, len, first, cnt;
    part_of(op->count, (size_t)nparts(op->comm), (size_t)i, &off, &len);
    gs_coll_chunk(op, len, op->col, &first, &cnt);
    *bytes_p = cnt * op->es;
    return (off + first) * op->es;
}

/* Where a core rank's steps read its own data: recv once extras folded into it. */
static const uint8_t *core_src(const gs_coll_op *op)
{
    return extras_of_me(op->comm) > 0 ? op->recv : op->send;
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
    const uint8_t *in = gs_coll_at(core_src(op), (off + first) * op->es);
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
    /* one core rank per host: its own data (folded); else block l as step 1 left it */
    const uint8_t *in = gs_coll_at(L > 1 ? op->recv : core_src(op), (off + first) * op->es);
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

/* A fold (an extra's part i to its partner, reduced there) or an unfold
 * (the final part back), as seen from this rank. */
static void fold_step(gs_coll_op *op, gs_prim *p, int peer, int i, bool fold, bool first_fold)
{
    size_t bytes, at_b = part_chunk(op, i, &bytes);
    bool extra = op->comm->hier_l >= op->comm->hier_local;
    if (fold && extra) {
        *p = gs_prim_pair(peer, -1, GS_PRIM_COPY, gs_coll_at(op->send, at_b), NULL, bytes);
        p->send_local = true;
    } else if (fold) {
        *p = gs_prim_pair(-1, peer, GS_PRIM_REDUCE, gs_coll_at(first_fold ? op->send : op->recv, at_b),
                          gs_coll_at(op->recv, at_b), bytes);
        p->recv_first = true;
    } else if (extra) {
        *p = gs_prim_pair(-1, peer, GS_PRIM_COPY, NULL, gs_coll_at(op->recv, at_b), bytes);
    } else {
        *p = gs_prim_pair(peer, -1, GS_PRIM_COPY, gs_coll_at(op->recv, at_b), NULL, bytes);
        p->send_local = true;
    }
}

/* Step jc of the core's column (units as on every rank): 1, 2, 3. */
static void core_step(gs_coll_op *op, gs_prim *p, int jc)
{
    const gs_comm *c = op->comm;
    int LH = nparts(c), H = c->hier_hosts;
    if (jc < LH)
        local_step(op, p, jc, false);
    else if (jc < LH + 2 * H - 1)
        cross_step(op, p, jc - LH);
    else
        local_step(op, p, jc - LH - (2 * H - 1), true);
}

/* The cursor runs over this rank's own steps of a column (own_steps); the
 * units it sends and expects are the column's shared ones. */
static bool hier_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    if (blocks_kind(op))
        return gs_hier_blocks_next(op, p);
    if (op->leaders)
        return gs_hier_small_next(op, p);
    int L = c->hier_local, h = c->hier_h, l = c->hier_l, P = nparts(c), X = xmax(c), j = op->step;
    int fold_units = X * P, unfold0 = fold_units + core_units(c);
    if (op->col == op->ncols)
        return false;
    if (l >= L) { /* an extra: its column to its partner and back */
        int x = l / L - 1, partner = at(c, h, l % L);
        fold_step(op, p, partner, j % P, j < P, false);
        p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, (j < P ? x * P : unfold0 + x * P) + j % P);
    } else {
        int e = extras_of_me(c), core_n = L > 1 ? core_units(c) : 2 * c->hier_hosts - 1;
        if (j < e * P) {
            fold_step(op, p, at(c, h, l + (j / P + 1) * L), j % P, true, j < P);
            p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, j);
        } else if (j < e * P + core_n) {
            int jc = j - e * P + (L > 1 ? 0 : P); /* one core rank per host: step 2 only */
            core_step(op, p, jc);
            p->send_unit = gs_coll_unit(op, op->col, fold_units + jc);
            p->recv_unit = gs_coll_unit(op, op->col, fold_units + jc - 1);
        } else {
            int k = j - e * P - core_n;
            fold_step(op, p, at(c, h, l + (k / P + 1) * L), k % P, false, false);
            p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, unfold0 + k);
        }
    }
    if (++op->step == own_steps(c)) {
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
