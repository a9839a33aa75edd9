/*
 * The send mode of large calls where the transport offers two
 * (gs_tp_zcopy_mode_of: GS_TP_ZCOPY_TIMED; the transport's own settings
 * and size limits decide that, coll only times): copied into the socket,
 * or by reference (GS_OP_ZCOPY; over tcp its vmsplice + splice). On
 * loopback between cores that share a cache the kernel's copy is cheap and
 * the page references cost more; between cores that do not, the copy into
 * the socket is most of the time and the references win (the figures:
 * docs/collectives.md, "Two data planes"). The host may
 * move the processes between the two, so neither is fixed: each kind and
 * size class keeps both modes' last three call times per byte; the mode
 * in use gives way when the other's median is 5% lower, and every
 * GS_ZC_EXPLORE-th call tries the other one (every GS_ZC_EXPLORE_LATER-th
 * after the first GS_ZC_SETTLE calls: a try of the slower mode costs up to
 * half a call more; a move that slows the running mode shows in its own
 * times within two calls). Medians, not averages: on a shared machine a
 * single call is often slowed by something else. Both ranks count the
 * same calls, so they explore together. The choice only changes how bytes
 * leave: results are the same bits either way.
 */
#include "coll/coll.h"

#include "transport/tp.h"
#include "util/clock.h"
#include "util/log.h"

static int size_class(size_t bytes)
{
    int c = 0;
    for (size_t b = GS_ZC_MIN_BYTES * 2; b <= bytes && c < GS_ZC_CLASSES - 1; b *= 2)
        c++;
    return c;
}

/* A mode's call time per byte: the median of its last three (of two, the
 * smaller: a single slow call, a preemption, should not decide). */
static double estimate(const gs_zc_class *k, int m)
{
    const double *r = k->recent[m];
    if (k->samples[m] == 1)
        return r[0];
    if (k->samples[m] == 2)
        return r[0] < r[1] ? r[0] : r[1];
    double lo = r[0] < r[1] ? r[0] : r[1], hi = r[0] < r[1] ? r[1] : r[0];
    return r[2] < lo ? lo : r[2] > hi ? hi : r[2];
}

void gs_coll_zc_choose(gs_coll_op *op)
{
    gs_comm *comm = op->comm;
    size_t bytes = op->zc_bytes;
    gs_tp_zcopy_mode mode = gs_tp_zcopy_mode_of(comm->tp, bytes);
    op->zc_class = -1;
    op->zcopy = mode == GS_TP_ZCOPY_ALWAYS;
    if (mode != GS_TP_ZCOPY_TIMED)
        return;
    op->zc_class = size_class(bytes);
    gs_zc_class *k = &comm->zc[op->kind][op->zc_class];
    uint32_t call = k->calls++;
    if (k->samples[0] < 2 || k->samples[1] < 2) { /* first both twice, alternately */
        op->zcopy = call % 2 == 1;
        return;
    }
    /* the other mode takes over when it is 5% faster (no flapping on noise) */
    double mine = estimate(k, k->zcopy), other = estimate(k, !k->zcopy);
    if (other < mine * 0.95) {
        k->zcopy = !k->zcopy;
        gs_log_debug(COLL, "rank %d: %zu-byte calls now %s (%.3f against %.3f ns per byte)", comm->rank,
                     bytes, k->zcopy ? "send by reference" : "copy into the socket", other, mine);
    }
    uint32_t every = call < GS_ZC_SETTLE ? GS_ZC_EXPLORE : GS_ZC_EXPLORE_LATER;
    op->zcopy = call % every == every - 1 ? !k->zcopy : k->zcopy;
}

void gs_coll_zc_record(gs_coll_op *op, uint64_t now_ns)
{
    if (op->zc_class < 0 || !op->start_ns || now_ns <= op->start_ns)
        return;
    gs_zc_class *k = &op->comm->zc[op->kind][op->zc_class];
    int m = op->zcopy ? 1 : 0;
    k->recent[m][k->samples[m] % GS_ZC_KEEP] = (double)(now_ns - op->start_ns) / (double)op->zc_bytes;
    k->samples[m]++;
}
