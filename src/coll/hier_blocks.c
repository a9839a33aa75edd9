/*
 * Hierarchical reduce_scatter and allgather (hier.c's places: H hosts, the
 * fewest ranks on one L, a rank (h, l) its host and index). Any placement,
 * uneven hosts included.
 *
 * Slots: the ranks of index l + xL (x = 0 .. X, X = (most ranks on a host
 * - 1) / L) of every host form class l's slot x; slot 0 is the core (index
 * l < L), the others its extras (absent on hosts with fewer ranks: their
 * blocks are empty). Super-block (l, x) is the H blocks of slot x of class
 * l. Even hosts have slot 0 alone.
 *
 * reduce_scatter, per chunk column:
 *   1. an extra (h, l + xL) sends its column of every block to its core
 *      partner (h, l), which reduces them into its fold area, extras in the
 *      order of x (hosts with extras only);
 *   2. for x = 0 .. X: a reduce-scatter of the super-blocks (., x) on the
 *      ring of the host's core ranks (each ends host-reduced at its class,
 *      in comm->hier_scratch), then a reduce-scatter of super-block (l, x)'s
 *      blocks among class l across hosts, each ending at (h, l): in recv
 *      for x = 0, in the fold area for an extra's block;
 *   3. the core rank sends each extra its final block.
 * allgather, the other way round:
 *   1. an extra sends its block to its partner (into the partner's recv);
 *   2. for x = 0 .. X: an allgather of super-block (l, x)'s blocks among
 *      class l across hosts, then of the super-blocks (., x) on the host's
 *      core ring, all in recv;
 *   3. the core rank sends each extra every block.
 * The network carries what it carries for L ranks per host plus the
 * extras' blocks once; the extras' columns cross the host's shared memory
 * once more. Every block's result is computed at one rank and copied.
 *
 * Message ids (units) are the column's, the same on every rank: the folds
 * (extra slot x, block q), the core's slots one after the other, the
 * unfolds; each rank runs only its own steps, in that order.
 */
#include "coll/coll.h"

/* The rank at (host h, index l), -1 where that host has no such rank. */
static int at(const gs_comm *c, int h, int l)
{
    return l < c->hier_lmax ? c->hier_rank[h * c->hier_lmax + l] : -1;
}

static int xmax(const gs_comm *c)
{
    return (c->hier_lmax - 1) / c->hier_local;
}

/* Steps of one core slot: L*H on the host's ring, H across hosts. */
static int slot_units(const gs_comm *c)
{
    return (c->hier_local + 1) * c->hier_hosts;
}

/* Units per column: folds, core slots, unfolds. */
static int column_units(const gs_comm *c)
{
    return xmax(c) * (c->size + 1) + (xmax(c) + 1) * slot_units(c);
}

/* Host-ring steps a core rank runs per slot (none when alone in its host's core). */
static int host_steps(const gs_comm *c)
{
    return c->hier_local > 1 ? c->hier_local * c->hier_hosts : 0;
}

/* The steps this rank runs per column. reduce_scatter: an extra sends size
 * folds and receives one block; allgather: it sends one and receives size. */
static int own_steps(const gs_comm *c)
{
    int S = c->size, e = c->hier_extras;
    if (c->hier_l >= c->hier_local)
        return S + 1;
    return e * (S + 1) + (xmax(c) + 1) * (host_steps(c) + c->hier_hosts);
}

static bool is_rs(const gs_coll_op *op)
{
    return op->kind == GS_COLL_REDUCE_SCATTER;
}

/* Where rank q's block's chunk of this column is in a buffer of blocks, and its bytes (0 for no rank). */
static size_t block_off(const gs_coll_op *op, int q, size_t *bytes_p)
{
    size_t first, cnt;
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    *bytes_p = q >= 0 ? cnt * op->es : 0;
    return q >= 0 ? ((size_t)q * op->count + first) * op->es : 0;
}

/* This rank's chunk of this column in its own count-element buffer. */
static size_t own_off(const gs_coll_op *op)
{
    size_t first, cnt;
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    return first * op->es;
}

/* The fold area's chunk for rank q's block (a core rank with extras). */
static uint8_t *fold_at(const gs_coll_op *op, int q)
{
    const gs_comm *c = op->comm;
    return c->hier_scratch + (size_t)(c->hier_hosts + (q >= 0 ? q : 0)) * c->chunk;
}

/* A reduce_scatter core rank's operand for rank q's block: its own data, or with the extras folded in. */
static const uint8_t *rs_src(const gs_coll_op *op, int q)
{
    size_t bytes, off = block_off(op, q, &bytes);
    return op->comm->hier_extras > 0 ? fold_at(op, q) : op->send + off;
}

/* A ring step: position k of steps, sending from local (the first step
 * sends it, as the rank's own), receiving into out (the last only stores). */
static void ring_pass(gs_prim *p, int k, int steps, int left, int right, gs_prim_mode mode,
                      const uint8_t *local, uint8_t *out, size_t bytes)
{
    if (k == 0) {
        *p = gs_prim_pair(right, -1, GS_PRIM_COPY, local, out, bytes);
        p->send_local = true;
    } else if (k < steps - 1) {
        *p = gs_prim_pair(right, left, mode, local, mode == GS_PRIM_COPY ? out : NULL, bytes);
    } else {
        *p = gs_prim_pair(-1, left, mode, local, out, bytes);
    }
    p->recv_first = true;
}

/* reduce_scatter, core slot x, its step j (units as on every rank). */
static void rs_core_step(gs_coll_op *op, gs_prim *p, int x, int j)
{
    const gs_comm *c = op->comm;
    int L = c->hier_local, H = c->hier_hosts, l = c->hier_l, h = c->hier_h;
    size_t bytes;
    if (j < L * H) { /* super-block (blk, x)'s block of host g on the host's ring */
        int s = j % L, g = j / L, q = at(c, g, gs_coll_mod(l - 1 - s, L) + x * L);
        block_off(op, q, &bytes);
        ring_pass(p, s, L, at(c, h, gs_coll_mod(l - 1, L)), at(c, h, gs_coll_mod(l + 1, L)), GS_PRIM_REDUCE,
                  rs_src(op, q), s == L - 1 ? c->hier_scratch + (size_t)g * c->chunk : NULL, bytes);
        return;
    }
    /* class l across hosts: the block of host g's slot x, ending at (h, l) */
    int k = j - L * H, g = gs_coll_mod(h - 1 - k, H), q = at(c, g, l + x * L);
    block_off(op, q, &bytes);
    const uint8_t *in = L > 1 ? c->hier_scratch + (size_t)g * c->chunk : rs_src(op, q);
    uint8_t *out = NULL;
    if (k == H - 1) /* my block in recv; an extra's in the fold area, for step 3 */
        out = x == 0 ? op->recv + own_off(op) : fold_at(op, q);
    ring_pass(p, k, H, at(c, gs_coll_mod(h - 1, H), l), at(c, gs_coll_mod(h + 1, H), l), GS_PRIM_REDUCE, in,
              out, bytes);
    p->finish = k == H - 1 && op->redop == GS_AVG;
}

/* allgather, core slot x, its step j: across hosts, then the host's ring, all in recv. */
static void ag_core_step(gs_coll_op *op, gs_prim *p, int x, int j)
{
    const gs_comm *c = op->comm;
    int L = c->hier_local, H = c->hier_hosts, l = c->hier_l, h = c->hier_h;
    size_t bytes;
    if (j < H) { /* class l across hosts: the block of host h-j's slot x */
        int q = at(c, gs_coll_mod(h - j, H), l + x * L);
        uint8_t *out = op->recv + block_off(op, q, &bytes);
        const uint8_t *local = NULL;
        if (j == 0) /* mine from send; an extra's where its fold left it (then nothing to store) */
            local = x == 0 ? op->send + own_off(op) : out;
        ring_pass(p, j, H, at(c, gs_coll_mod(h - 1, H), l), at(c, gs_coll_mod(h + 1, H), l), GS_PRIM_COPY,
                  local, j == 0 && x > 0 ? NULL : out, bytes);
        return;
    }
    int s = (j - H) % L, g = (j - H) / L, q = at(c, g, gs_coll_mod(l - s, L) + x * L);
    uint8_t *at_b = op->recv + block_off(op, q, &bytes);
    ring_pass(p, s, L, at(c, h, gs_coll_mod(l - 1, L)), at(c, h, gs_coll_mod(l + 1, L)), GS_PRIM_COPY,
              s == 0 ? at_b : NULL, s == 0 ? NULL : at_b, bytes);
}

/* Step 1 (fold) or 3 (unfold) between an extra and its core partner: block
 * q (or, where one block goes, the extra's own: q is the extra), seen from
 * this rank. first: the partner's first reduce_scatter fold (its own data
 * from send). */
static void fold_step(gs_coll_op *op, gs_prim *p, int peer, int q, bool fold, bool first)
{
    bool extra = op->comm->hier_l >= op->comm->hier_local, rs = is_rs(op);
    bool sends = extra == fold;
    size_t bytes, off = block_off(op, q, &bytes);
    if (rs && fold) { /* the extra's column of block q, reduced into the fold area */
        if (sends)
            *p = gs_prim_pair(peer, -1, GS_PRIM_COPY, op->send + off, NULL, bytes);
        else
            *p = gs_prim_pair(-1, peer, GS_PRIM_REDUCE, first ? op->send + off : fold_at(op, q),
                              fold_at(op, q), bytes);
    } else if (rs) { /* the extra's final block */
        *p = sends ? gs_prim_pair(peer, -1, GS_PRIM_COPY, fold_at(op, q), NULL, bytes)
                   : gs_prim_pair(-1, peer, GS_PRIM_COPY, NULL, op->recv + own_off(op), bytes);
    } else if (fold) { /* allgather: the extra's block, into the partner's recv */
        *p = sends ? gs_prim_pair(peer, -1, GS_PRIM_COPY, op->send + own_off(op), NULL, bytes)
                   : gs_prim_pair(-1, peer, GS_PRIM_COPY, NULL, op->recv + off, bytes);
    } else { /* allgather: every block to the extra */
        *p = sends ? gs_prim_pair(peer, -1, GS_PRIM_COPY, op->recv + off, NULL, bytes)
                   : gs_prim_pair(-1, peer, GS_PRIM_COPY, NULL, op->recv + off, bytes);
    }
    p->send_local = sends;
    p->recv_first = true;
}

/* The unit of fold or unfold i (block or single) of extra slot x (1..X). */
static int fold_unit(const gs_coll_op *op, int x, int i, bool fold)
{
    const gs_comm *c = op->comm;
    int X = xmax(c), S = c->size, per = is_rs(op) == fold ? S : 1; /* blocks per extra */
    int folds = X * (is_rs(op) ? S : 1);
    return fold ? (x - 1) * per + i : folds + (X + 1) * slot_units(c) + (x - 1) * per + i;
}

/* An extra's step j: its folds, then its unfolds (x: its slot). */
static void extra_step(gs_coll_op *op, gs_prim *p, int j)
{
    const gs_comm *c = op->comm;
    int S = c->size, x = c->hier_l / c->hier_local, partner = at(c, c->hier_h, c->hier_l % c->hier_local);
    int nfold = is_rs(op) ? S : 1, i = j < nfold ? j : j - nfold;
    bool fold = j < nfold;
    fold_step(op, p, partner, nfold == 1 && fold ? c->rank : (!fold && is_rs(op) ? c->rank : i), fold, false);
    p->send_unit = p->recv_unit = (uint32_t)gs_coll_unit(op, op->col, fold_unit(op, x, i, fold));
}

/* A core rank's step j: folds from its extras, its slots, unfolds to them. */
static void core_step(gs_coll_op *op, gs_prim *p, int j)
{
    const gs_comm *c = op->comm;
    int L = c->hier_local, h = c->hier_h, l = c->hier_l, e = c->hier_extras, S = c->size;
    int nfold = is_rs(op) ? S : 1, nunfold = is_rs(op) ? 1 : S, per_slot = host_steps(c) + c->hier_hosts;
    int folds = e * nfold, core = (xmax(c) + 1) * per_slot;
    if (j < folds || j >= folds + core) { /* with extra slot x */
        bool fold = j < folds;
        int k = fold ? j : j - folds - core, per = fold ? nfold : nunfold, x = k / per + 1, i = k % per;
        int extra = at(c, h, l + x * L), q = per == 1 ? extra : i;
        fold_step(op, p, extra, q, fold, fold && x == 1);
        p->send_unit = p->recv_unit = (uint32_t)gs_coll_unit(op, op->col, fold_unit(op, x, i, fold));
        return;
    }
    int k = j - folds, x = k / per_slot, js = k % per_slot;
    /* alone in the host's core: reduce_scatter skips the host's ring (before), allgather too (after) */
    if (L == 1 && is_rs(op))
        js += L * c->hier_hosts;
    int base = xmax(c) * nfold + x * slot_units(c);
    if (is_rs(op))
        rs_core_step(op, p, x, js);
    else
        ag_core_step(op, p, x, js);
    p->send_unit = (uint32_t)gs_coll_unit(op, op->col, base + js);
    p->recv_unit = (uint32_t)gs_coll_unit(op, op->col, base + js - 1);
}

void gs_hier_blocks_start(gs_coll_op *op)
{
    gs_coll_layout(op, op->count);
    op->nsteps = column_units(op->comm);
}

bool gs_hier_blocks_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    if (op->col == op->ncols)
        return false;
    if (c->hier_l >= c->hier_local)
        extra_step(op, p, op->step);
    else
        core_step(op, p, op->step);
    if (++op->step == own_steps(c)) {
        op->step = 0;
        op->col++;
    }
    return true;
}
