/* The GS_TRACE writer (trace.h). */
#include "util/trace.h"

#include "util/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

bool gs_trace_on;

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
static int trace_users;
static int trace_rank;
static bool trace_first; /* no event written yet: the next one has no leading comma */

/* An event kept until its batch is written. */
typedef struct trace_rec {
    const char *cat, *name;
    char text[48]; /* the name, copied (copy_name), quotes, backslashes and controls made _ */
    int tid;
    int nargs;
    uint64_t start_ns, end_ns;
    gs_trace_arg args[GS_TRACE_ARGS_MAX];
} trace_rec;

static trace_rec *recs; /* [GS_TRACE_BATCH] */
static int nrecs;

/* Names a track the first time it is used (a few hundred at most; more are left unnamed). */
static void name_track(int track, const char *label_fmt, unsigned long long label_arg)
{
    char label[64];
    static int named[512];
    static int nnamed;
    for (int i = 0; i < nnamed; i++)
        if (named[i] == track)
            return;
    if (nnamed == (int)(sizeof(named) / sizeof(named[0])))
        return;
    named[nnamed++] = track;
    snprintf(label, sizeof(label), label_fmt, label_arg);
    fprintf(trace_file,
            "%s{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
            "\"%s\"}}",
            trace_first ? "" : ",\n", trace_rank, track, label);
    trace_first = false;
}

static void write_rec(const trace_rec *r)
{
    fprintf(trace_file,
            "%s{\"ph\": \"X\", \"cat\": \"%s\", \"name\": \"%s\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
            "\"dur\": %.3f, \"args\": {",
            trace_first ? "" : ",\n", r->cat, r->name ? r->name : r->text, trace_rank, r->tid,
            (double)r->start_ns / 1e3, (double)(r->end_ns - r->start_ns) / 1e3);
    for (int i = 0; i < r->nargs; i++) {
        const gs_trace_arg *a = &r->args[i];
        fprintf(trace_file, "%s\"%s\": ", i ? ", " : "", a->key);
        if (a->type == 'i')
            fprintf(trace_file, "%lld", (long long)a->v.i);
        else if (a->type == 'd')
            fprintf(trace_file, "%.3f", a->v.d);
        else
            fprintf(trace_file, "\"%s\"", a->v.s ? a->v.s : "");
    }
    fputs("}}", trace_file);
    trace_first = false;
}

/* Writes the batch (caller holds the lock). */
static void flush_recs(void)
{
    for (int i = 0; i < nrecs; i++)
        write_rec(&recs[i]);
    nrecs = 0;
}

/* pattern with every %r replaced by rank (and %% by %). */
static void expand(const char *pattern, int rank, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = pattern; *p && n + 1 < cap; p++) {
        if (p[0] == '%' && p[1] == 'r') {
            n += (size_t)snprintf(out + n, cap - n, "%d", rank);
            p++;
        } else if (p[0] == '%' && p[1] == '%') {
            out[n++] = '%';
            p++;
        } else {
            out[n++] = *p;
        }
        if (n >= cap)
            n = cap - 1;
    }
    out[n] = '\0';
}

gs_status gs_trace_open(const char *pattern, int rank, const gs_trace_clock *clock)
{
    char path[1024];
    gs_status st = GS_OK;
    pthread_mutex_lock(&trace_lock);
    if (trace_file) {
        trace_users++;
        goto out;
    }
    expand(pattern, rank, path, sizeof(path));
    if (!(trace_file = fopen(path, "w"))) {
        st = gs_fail(GS_SUBSYS_UTIL, GS_ERR_CONFIG, "rank %d: GS_TRACE=%s: cannot write %s: %s", rank,
                     pattern, path, strerror(errno));
        goto out;
    }
    if (!recs && !(recs = calloc(GS_TRACE_BATCH, sizeof(*recs)))) {
        fclose(trace_file);
        trace_file = NULL;
        st = GS_ERR_NOMEM;
        goto out;
    }
    setvbuf(trace_file, NULL, _IOFBF, 1 << 20);
    trace_users = 1;
    trace_rank = rank;
    trace_first = true;
    fprintf(trace_file,
            "{\"gradsync\": {\"version\": \"%s\", \"rank\": %d, \"pid\": %d, \"clock_offset_ns\": %lld, "
            "\"clock_bound_ns\": %llu, \"clock_source\": \"%s\"},\n\"displayTimeUnit\": \"ns\",\n"
            "\"traceEvents\": [\n",
            GS_VERSION_STRING, rank, (int)getpid(), (long long)clock->offset_ns,
            (unsigned long long)clock->bound_ns, clock->source);
    fprintf(
        trace_file,
        "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"rank "
        "%d\"}}",
        rank, rank);
    fprintf(trace_file,
            ",\n{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": %d, \"tid\": 0, \"args\": "
            "{\"sort_index\": %d}}",
            rank, rank);
    trace_first = false;
    __atomic_store_n(&gs_trace_on, true, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&trace_lock);
    return st;
}

void gs_trace_close(void)
{
    pthread_mutex_lock(&trace_lock);
    if (trace_file && --trace_users == 0) {
        __atomic_store_n(&gs_trace_on, false, __ATOMIC_RELEASE);
        flush_recs();
        fprintf(trace_file, "\n]}\n");
        if (fclose(trace_file) != 0)
            gs_log_warn(UTIL, "rank %d: closing the GS_TRACE file failed: %s", trace_rank, strerror(errno));
        trace_file = NULL;
        free(recs);
        recs = NULL;
    }
    pthread_mutex_unlock(&trace_lock);
}

void gs_trace_event(const char *cat, const char *name, bool copy_name, int track, const char *label_fmt,
                    unsigned long long label_arg, uint64_t start_ns, uint64_t end_ns,
                    const gs_trace_arg *args, int nargs)
{
    static __thread int tid;
    trace_rec *r;
    if (!tid)
        tid = (int)syscall(SYS_gettid);
    if (nargs > GS_TRACE_ARGS_MAX)
        nargs = GS_TRACE_ARGS_MAX;
    pthread_mutex_lock(&trace_lock);
    if (!trace_file)
        goto out;
    if (track != GS_TRACE_THREAD && label_fmt)
        name_track(track, label_fmt, label_arg);
    if (nrecs == GS_TRACE_BATCH)
        flush_recs();
    r = &recs[nrecs++];
    r->cat = cat;
    r->name = copy_name ? NULL : name;
    for (size_t n = 0; copy_name; n++) { /* a JSON string without escapes */
        char ch = n + 1 < sizeof(r->text) ? name[n] : '\0';
        r->text[n] = ch == '"' || ch == '\\' || (ch && (unsigned char)ch < 0x20) ? '_' : ch;
        if (!ch)
            break;
    }
    r->tid = track == GS_TRACE_THREAD ? tid : track;
    r->start_ns = start_ns;
    r->end_ns = end_ns < start_ns ? start_ns : end_ns;
    r->nargs = nargs;
    if (nargs)
        memcpy(r->args, args, (size_t)nargs * sizeof(*args));
out:
    pthread_mutex_unlock(&trace_lock);
}

uint64_t gs_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void gs_trace_span(const char *name, uint64_t start_ns, uint64_t end_ns)
{
    if (gs_trace_enabled() && name)
        gs_trace_event("app", name, true, GS_TRACE_THREAD, NULL, 0, start_ns, end_ns, NULL, 0);
}
