/*
 * Hierarchical allreduce of a small call (up to GS_HIER_LEADERS_BYTES),
 * through one rank per host, its leader (index 0), per chunk column:
 *
 *   1. every other rank of host h sends its data to the leader, which
 *      reduces them in index order into P_h (comm->hier_scratch);
 *   2. every leader sends P_h to every other leader;
 *   3. every leader computes P_0 op P_1 op ... op P_(H-1), in host order
 *      (its own in its place), so all of them get the same bits;
 *   4. the leader sends the result to the other ranks of its host.
 *
 * One message latency across hosts and H(H-1) messages on the network for
 * the whole job, where direct sends n(n-1) and recursive doubling crosses
 * hosts at every round: small calls are latency, and each message across
 * a host costs its kernel work on both sides.
 *
 * Units per column: 0 .. lmax-2 the folds of index l (l-1), lmax-1+g
 * leader g's P_g, lmax-1+H the result inside each host.
 */
#include "coll/coll.h"

static int at(const gs_comm *c, int h, int l)
{
    return l < c->hier_lmax ? c->hier_rank[h * c->hier_lmax + l] : -1;
}

/* The ranks on this rank's host. */
static int here(const gs_comm *c)
{
    int n = 0;
    while (n < c->hier_lmax && at(c, c->hier_h, n) >= 0)
        n++;
    return n;
}

/* A leader's steps: its folds (or one copy when alone), H-1 sends, H combines, the result to the others. */
static int own_steps(const gs_comm *c)
{
    int n = here(c), H = c->hier_hosts;
    if (c->hier_l > 0)
        return 2;
    return (n > 1 ? n - 1 : 1) + (H - 1) + H + (n - 1);
}

void gs_hier_small_start(gs_coll_op *op)
{
    gs_coll_layout(op, op->count);
    op->nsteps = op->comm->hier_lmax + op->comm->hier_hosts;
}

/* Step 1: the fold of index l (1 ..), or the copy of a leader alone on its host. */
static void fold(gs_coll_op *op, gs_prim *p, int l, const uint8_t *mine, uint8_t *part, size_t bytes)
{
    const gs_comm *c = op->comm;
    if (l == 0) { /* alone: P_h is my data (kept apart: in place, out is overwritten in step 3) */
        *p = gs_prim_pair(-1, -1, GS_PRIM_COPY, mine, part, bytes);
        return;
    }
    *p = gs_prim_pair(-1, at(c, c->hier_h, l), GS_PRIM_REDUCE, l == 1 ? mine : part, part, bytes);
    p->recv_unit = p->send_unit = (uint32_t)gs_coll_unit(op, op->col, l - 1);
}

/* Step 3, host g's part: the first stored, the later ones reduced in, mine from P_h. */
static void combine(gs_coll_op *op, gs_prim *p, int g, const uint8_t *part, uint8_t *out, size_t bytes)
{
    const gs_comm *c = op->comm;
    int H = c->hier_hosts;
    if (g == c->hier_h) {
        *p = gs_prim_pair(-1, -1, g == 0 ? GS_PRIM_COPY : GS_PRIM_REDUCE, g == 0 ? part : out, out, bytes);
        p->with = g == 0 ? NULL : part;
    } else {
        *p = gs_prim_pair(-1, at(c, g, 0), g == 0 ? GS_PRIM_COPY : GS_PRIM_REDUCE, g == 0 ? NULL : out, out,
                          bytes);
        p->recv_unit = (uint32_t)gs_coll_unit(op, op->col, c->hier_lmax - 1 + g);
    }
    p->finish = g == H - 1 && op->redop == GS_AVG;
}

static void leader_step(gs_coll_op *op, gs_prim *p, int j, const uint8_t *mine, uint8_t *out, size_t bytes)
{
    const gs_comm *c = op->comm;
    int n = here(c), H = c->hier_hosts, h = c->hier_h, folds = n > 1 ? n - 1 : 1;
    uint8_t *part = c->hier_scratch;
    if (j < folds) {
        fold(op, p, n > 1 ? j + 1 : 0, mine, part, bytes);
    } else if (j < folds + H - 1) { /* step 2: to the leaders after mine first */
        int g = gs_coll_mod(h + 1 + (j - folds), H);
        *p = gs_prim_pair(at(c, g, 0), -1, GS_PRIM_COPY, part, NULL, bytes);
        p->send_local = true;
        p->send_unit = (uint32_t)gs_coll_unit(op, op->col, c->hier_lmax - 1 + h);
    } else if (j < folds + 2 * H - 1) {
        combine(op, p, j - folds - (H - 1), part, out, bytes);
    } else { /* step 4 */
        *p = gs_prim_pair(at(c, h, j - folds - (2 * H - 1) + 1), -1, GS_PRIM_COPY, out, NULL, bytes);
        p->send_local = true;
        p->send_unit = (uint32_t)gs_coll_unit(op, op->col, c->hier_lmax - 1 + H);
    }
}

bool gs_hier_small_next(gs_coll_op *op, gs_prim *p)
{
    const gs_comm *c = op->comm;
    size_t first, cnt;
    if (op->col == op->ncols)
        return false;
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    const uint8_t *mine = gs_coll_at(op->send, first * op->es);
    uint8_t *out = gs_coll_at(op->recv, first * op->es);
    size_t bytes = cnt * op->es;
    if (c->hier_l > 0) { /* my data to the leader, the result back */
        int leader = at(c, c->hier_h, 0);
        if (op->step == 0) {
            *p = gs_prim_pair(leader, -1, GS_PRIM_COPY, mine, NULL, bytes);
            p->send_local = true;
            p->send_unit = (uint32_t)gs_coll_unit(op, op->col, c->hier_l - 1);
        } else {
            *p = gs_prim_pair(-1, leader, GS_PRIM_COPY, NULL, out, bytes);
            p->recv_unit = (uint32_t)gs_coll_unit(op, op->col, c->hier_lmax - 1 + c->hier_hosts);
        }
    } else {
        leader_step(op, p, op->step, mine, out, bytes);
    }
    if (++op->step == own_steps(c)) {
        op->step = 0;
        op->col++;
    }
    return true;
}
