/*
 * GS_TRACE: a timeline of every collective and parameter-server operation
 * as Chrome Trace Event JSON (viewable in Perfetto or chrome://tracing).
 *
 * One file per process, opened with its first context when GS_TRACE is set
 * ("%r" in the name becomes the rank) and closed with its last. Each event
 * is a complete event ("ph": "X") on one line; the file begins with a
 * "gradsync" object naming the rank and the offset of this process's clock
 * to the store's (measured at open), which `gstrace merge` applies. A
 * process that dies leaves the file without its closing bracket; the merge
 * accepts that.
 *
 * When GS_TRACE is unset the cost is the one branch of gs_trace_enabled().
 */
#ifndef GS_UTIL_TRACE_H
#define GS_UTIL_TRACE_H

#include "gradsync.h"

#include <stdbool.h>
#include <stdint.h>

extern bool gs_trace_on;

static inline bool gs_trace_enabled(void)
{
    return __builtin_expect(gs_trace_on, 0);
}

/* How this process's clock relates to the store's: store = local + offset,
 * known to within bound_ns (half the best round trip). */
typedef struct gs_trace_clock {
    int64_t offset_ns;
    uint64_t bound_ns;
    const char *source; /* "store" (measured), "same host" (the store's process), "none" */
} gs_trace_clock;

/* Opens the file (pattern with %r, the rank) or, when it is already open,
 * counts one more user. */
gs_status gs_trace_open(const char *pattern, int rank, const gs_trace_clock *clock);
/* One user fewer; the last writes the closing bracket and closes the file. */
void gs_trace_close(void);
/* Tracks (the "tid" of an event): operations that may overlap in time get
 * tracks of their own, so every track's events nest: one per communicator
 * (its calls run one after the other), per parameter-server key and server
 * shard; an application's spans go on its thread's track. */
#define GS_TRACE_THREAD      (-1)
#define GS_TRACE_COMM(id)    (1000000 + (int)(id))
#define GS_TRACE_PS_KEY(k)   (2000000 + (int)((k) % 1000000))
#define GS_TRACE_PS_SHARD(g) (3000000 + (int)((g) % 1000000))

/* One argument of an event: a key (a string literal) and an integer, a
 * number or a string that outlives the process's trace (a literal or a
 * name table's entry): events are kept as records and written as JSON in
 * batches (GS_TRACE_BATCH events, and at close). */
typedef struct gs_trace_arg {
    const char *key;
    char type; /* 'i', 'd' or 's' */
    union {
        int64_t i;
        double d;
        const char *s;
    } v;
} gs_trace_arg;

#define GS_TARG_I(k, x)   ((gs_trace_arg){.key = (k), .type = 'i', .v.i = (int64_t)(x)})
#define GS_TARG_D(k, x)   ((gs_trace_arg){.key = (k), .type = 'd', .v.d = (double)(x)})
#define GS_TARG_S(k, x)   ((gs_trace_arg){.key = (k), .type = 's', .v.s = (x)})
#define GS_TRACE_ARGS_MAX 14
#define GS_TRACE_BATCH    8192

/* One complete event: category ("coll", "ps", "app"), name (a literal, or
 * copied when longer-lived text is not at hand: copy_name), track, its span
 * on gs_now_ns's clock and nargs arguments. A track's first event names it
 * (label_fmt with its one number, formatted then). Thread-safe; its cost: docs/trace.md. */
void gs_trace_event(const char *cat, const char *name, bool copy_name, int track, const char *label_fmt,
                    unsigned long long label_arg, uint64_t start_ns, uint64_t end_ns,
                    const gs_trace_arg *args, int nargs);

#endif
