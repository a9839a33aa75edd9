/*
 * Recursive doubling (butterfly) allreduce, for latency: log2(p) exchange
 * steps, where p is the largest power of two not above n.
 *
 * Any rank count: with n = p + rem, the first 2*rem ranks pair up first:
 * even rank 2i sends its data to 2i+1 and sits out; the p remaining ranks
 * (virtual ranks: 2i+1 -> i, r >= 2*rem -> r - rem) run the butterfly; at
 * the end 2i+1 sends the result back to 2i.
 *
 * In step k a rank exchanges its partial result with the virtual rank
 * v ^ 2^k and both compute lower-group op upper-group, so the two sides of
 * every exchange hold the same bits and all ranks end with the same value.
 * Large buffers are cut into chunk columns; each column runs every step.
 */
#include "coll/coll.h"

typedef struct rd_shape {
    int pof2;  /* ranks in the butterfly */
    int rem;   /* ranks paired up before it */
    int vrank; /* -1: sits out */
    int steps; /* butterfly steps: log2(pof2) */
} rd_shape;

static rd_shape shape_of(const gs_comm *comm)
{
    rd_shape s = {.pof2 = 1};
    int r = comm->rank;
    while (s.pof2 * 2 <= comm->size)
        s.pof2 *= 2;
    for (int p = s.pof2; p > 1; p /= 2)
        s.steps++;
    s.rem = comm->size - s.pof2;
    s.vrank = r < 2 * s.rem ? (r % 2 ? r / 2 : -1) : r - s.rem;
    return s;
}

static int real_rank(const rd_shape *s, int v)
{
    return v < s->rem ? 2 * v + 1 : v + s->rem;
}

static void rd_start(gs_coll_op *op)
{
    rd_shape s = shape_of(op->comm);
    gs_coll_layout(op, op->count);
    op->nsteps = s.steps + 2; /* pair-up, the butterfly, hand-back */
}

/* Step k of the column (0: pair-up, 1..steps: butterfly, steps+1:
 * hand-back) for this rank; false when this rank has no part in it. */
static bool fill(gs_coll_op *op, const rd_shape *s, int k, gs_prim *p)
{
    int r = op->comm->rank;
    size_t first, cnt;
    gs_coll_chunk(op, op->count, op->col, &first, &cnt);
    const uint8_t *in = gs_coll_at(op->send, first * op->es);
    uint8_t *out = gs_coll_at(op->recv, first * op->es);
    size_t bytes = cnt * op->es;
    bool paired = r < 2 * s->rem;
    bool avg = op->redop == GS_AVG;

    if (k == 0) { /* pair-up: 2i gives its data to 2i+1 */
        if (!paired)
            return false;
        if (s->vrank < 0) {
            *p = gs_prim_pair(r + 1, -1, GS_PRIM_COPY, in, NULL, bytes);
            p->send_local = true;
        } else {
            *p = gs_prim_pair(-1, r - 1, GS_PRIM_REDUCE, in, out, bytes);
            p->recv_first = true; /* rank 2i's data comes first */
        }
    } else if (k <= s->steps) { /* butterfly: exchange with v ^ 2^(k-1) */
        if (s->vrank < 0)
            return false;
        int partner = real_rank(s, s->vrank ^ (1 << (k - 1)));
        bool first_use = k == 1 && !paired; /* nothing in out yet */
        *p = gs_prim_pair(partner, partner, GS_PRIM_REDUCE, first_use ? in : out, out, bytes);
        p->send_local = true;
        p->recv_first = partner < r; /* the lower group's value first */
        p->finish = avg && k == s->steps;
    } else { /* hand-back: 2i+1 returns the result to 2i */
        if (!paired)
            return false;
        if (s->vrank < 0) {
            *p = gs_prim_pair(-1, r + 1, GS_PRIM_COPY, NULL, out, bytes);
        } else {
            *p = gs_prim_pair(r - 1, -1, GS_PRIM_COPY, out, NULL, bytes);
            p->send_local = true;
        }
    }
    p->send_unit = p->recv_unit = gs_coll_unit(op, op->col, k);
    return true;
}

static bool fill_step(gs_coll_op *op, int step, gs_prim *p, const void *shape)
{
    return fill(op, shape, step, p);
}

static bool rd_next(gs_coll_op *op, gs_prim *p)
{
    rd_shape s = shape_of(op->comm);
    return gs_coll_next_mine(op, p, fill_step, &s);
}

const gs_coll_algo gs_rd_algo = {
    .name = "rd",
    .id = GS_COLL_ALGO_RD,
    .start = rd_start,
    .next = rd_next,
};
