/*
 * GS_TRACE events of the collectives (util/trace.h): one complete event per
 * call, from when it reached the head of its communicator's queue to when
 * it finished, with its descriptor, algorithm and transport, and how much
 * of that time it waited with nothing moving (a peer's data or a credit not
 * there yet: the wait for the slowest peer) apart from the time it moved
 * data. The engine ticks at each progress pass: an interval between two
 * ticks in which the communicator's progress count did not change is
 * waiting.
 */
#include "coll/coll.h"

#include "util/clock.h"
#include "util/trace.h"

#include <stdio.h>

void gs_coll_trace_start(gs_coll_op *op)
{
    gs_comm *comm = op->comm;
    op->trace_ns = op->trace_tick_ns = comm->trace_t0 ? comm->trace_t0 : gs_now_ns();
    comm->trace_t0 = 0;
    op->trace_wait_ns = 0;
    op->trace_seen = op->comm->progress_count;
}

void gs_coll_trace_tick(gs_comm *comm)
{
    gs_coll_op *op = comm->head ? &comm->head->op : NULL;
    uint64_t now;
    if (!op || !op->trace_ns)
        return;
    now = gs_now_ns();
    if (comm->progress_count == op->trace_seen)
        op->trace_wait_ns += now - op->trace_tick_ns;
    op->trace_seen = comm->progress_count;
    op->trace_tick_ns = now;
}

/* The bytes one rank contributes (the v-variants: what it receives). */
static size_t call_bytes(const gs_coll_op *op)
{
    size_t n = 0;
    if (op->kind == GS_COLL_ALLGATHERV || op->kind == GS_COLL_REDUCE_SCATTER_V ||
        op->kind == GS_COLL_ALLTOALLV) {
        for (int q = 0; op->rcounts && q < op->comm->size; q++)
            n += op->rcounts[q];
        return n * op->es;
    }
    return (size_t)op->count * op->es;
}

void gs_coll_trace_event(const gs_comm *comm, const char *kind, const char *algo, uint64_t seq, size_t count,
                         size_t bytes, gs_dtype dtype, gs_redop redop, int root, uint64_t start_ns,
                         uint64_t wait_ns, gs_status status)
{
    uint64_t end = gs_now_ns(), span = end > start_ns ? end - start_ns : 0;
    gs_trace_arg args[] = {
        GS_TARG_I("comm", comm->id),
        GS_TARG_I("seq", seq),
        GS_TARG_I("count", count),
        GS_TARG_I("bytes", bytes),
        GS_TARG_S("dtype", gs_dtype_name(dtype)),
        GS_TARG_S("op", gs_redop_name(redop)),
        GS_TARG_I("root", root),
        GS_TARG_S("algo", algo),
        GS_TARG_S("transport", gs_tp_name(comm->tp)),
        GS_TARG_I("ranks", comm->size),
        GS_TARG_D("wait_us", (double)(wait_ns < span ? wait_ns : span) / 1e3),
        GS_TARG_D("move_us", (double)(span - (wait_ns < span ? wait_ns : span)) / 1e3),
        GS_TARG_S("status", gs_status_name(status)),
    };
    gs_trace_event("coll", kind, false, GS_TRACE_COMM(comm->id), "communicator %llu", comm->id, start_ns, end,
                   args, (int)(sizeof(args) / sizeof(args[0])));
}

void gs_coll_trace_end(gs_coll_op *op, gs_status status)
{
    if (!op->trace_ns)
        return;
    gs_coll_trace_tick(op->comm);
    gs_coll_trace_event(op->comm, gs_coll_kind_name(op->kind), op->algo ? op->algo->name : "?", op->seq,
                        (size_t)op->count, call_bytes(op), op->dtype, op->redop, op->root, op->trace_ns,
                        op->trace_wait_ns, status);
    op->trace_ns = 0;
}
