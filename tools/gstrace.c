/*
 * gstrace: joins the GS_TRACE files of a job's ranks into one timeline.
 *
 *   gstrace merge -o OUT.json FILE...
 *
 * Each rank's file (GS_TRACE=FILE with %r) starts with a "gradsync" object
 * holding that process's clock offset to the store's, measured at init;
 * every event's "ts" is moved by it, so all ranks' events stand on the
 * store's clock (within each file's stated bound). The output is one
 * Chrome Trace Event JSON file for Perfetto (ui.perfetto.dev) or
 * chrome://tracing; its "gradsync" object lists the ranks, their offsets
 * and the largest bound. A file cut short (its process died) is merged up
 * to its last whole event, with a warning.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GSTRACE_USAGE 2
#define GSTRACE_LINE  8192

typedef struct trace_file {
    const char *path;
    int rank;
    long long offset_ns;
    unsigned long long bound_ns;
    char source[32];
    size_t events;
    bool cut; /* no closing bracket */
} trace_file;

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: gstrace merge -o OUT.json FILE...   join the ranks' GS_TRACE files on the store's clock\n");
}

/* The number after "name": in line, or fallback. */
static long long field_ll(const char *line, const char *name, long long fallback)
{
    const char *p = strstr(line, name);
    return p ? strtoll(p + strlen(name), NULL, 10) : fallback;
}

static bool read_header(FILE *in, trace_file *t)
{
    char line[GSTRACE_LINE];
    const char *src;
    if (!fgets(line, sizeof(line), in) || strncmp(line, "{\"gradsync\": {", 14) != 0) {
        fprintf(stderr, "gstrace: %s: not a GS_TRACE file (no \"gradsync\" object on its first line)\n",
                t->path);
        return false;
    }
    t->rank = (int)field_ll(line, "\"rank\": ", -1);
    t->offset_ns = field_ll(line, "\"clock_offset_ns\": ", 0);
    t->bound_ns = (unsigned long long)field_ll(line, "\"clock_bound_ns\": ", 0);
    src = strstr(line, "\"clock_source\": \"");
    snprintf(t->source, sizeof(t->source), "%.*s", src ? (int)strcspn(src + 17, "\"") : 1,
             src ? src + 17 : "?");
    return true;
}

/* Writes one event line with its "ts" moved by offset_ns (metadata events have none). */
static void write_event(FILE *out, const char *line, long long offset_ns, bool first)
{
    const char *ts = strstr(line, "\"ts\": ");
    fputs(first ? "" : ",\n", out);
    if (!ts) {
        fputs(line, out);
        return;
    }
    char *end;
    double us = strtod(ts + 6, &end);
    fprintf(out, "%.*s\"ts\": %.3f%s", (int)(ts - line), line, us + (double)offset_ns / 1e3, end);
}

static bool merge_one(FILE *out, trace_file *t, bool *first)
{
    char line[GSTRACE_LINE];
    FILE *in = fopen(t->path, "r");
    if (!in) {
        fprintf(stderr, "gstrace: cannot read %s: %s\n", t->path, strerror(errno));
        return false;
    }
    bool ok = read_header(in, t);
    t->cut = true;
    while (ok && fgets(line, sizeof(line), in)) {
        size_t n = strcspn(line, "\n");
        line[n] = '\0';
        if (n && line[n - 1] == ',') /* tolerate a trailing comma */
            line[--n] = '\0';
        if (strcmp(line, "]}") == 0) {
            t->cut = false;
            break;
        }
        if (strncmp(line, "{\"ph\": ", 7) != 0 || n < 2 || line[n - 1] != '}')
            continue; /* the header's other lines, or a last line cut short */
        write_event(out, line, t->offset_ns, *first);
        *first = false;
        t->events++;
    }
    fclose(in);
    if (ok && t->cut)
        fprintf(stderr,
                "gstrace: warning: %s (rank %d) ends without its closing bracket (did it exit cleanly?); "
                "merged its %zu whole events\n",
                t->path, t->rank, t->events);
    return ok;
}

static int merge(const char *out_path, char **paths, int n)
{
    trace_file *files = calloc((size_t)n, sizeof(*files));
    FILE *out = fopen(out_path, "w");
    bool first = true, ok = files && out;
    unsigned long long bound = 0;
    if (!out)
        fprintf(stderr, "gstrace: cannot write %s: %s\n", out_path, strerror(errno));
    if (ok)
        fprintf(out, "{\"displayTimeUnit\": \"ns\",\n\"traceEvents\": [\n");
    for (int i = 0; ok && i < n; i++) {
        files[i].path = paths[i];
        ok = merge_one(out, &files[i], &first);
        bound = files[i].bound_ns > bound ? files[i].bound_ns : bound;
    }
    if (ok) {
        fprintf(out, "\n],\n\"gradsync\": {\"merged\": [");
        for (int i = 0; i < n; i++)
            fprintf(out,
                    "%s{\"rank\": %d, \"file\": \"%s\", \"events\": %zu, \"clock_offset_ns\": %lld, "
                    "\"clock_bound_ns\": %llu, \"clock_source\": \"%s\", \"complete\": %s}",
                    i ? ", " : "", files[i].rank, files[i].path, files[i].events, files[i].offset_ns,
                    files[i].bound_ns, files[i].source, files[i].cut ? "false" : "true");
        fprintf(out, "], \"clock_bound_ns\": %llu}}\n", bound);
        printf("gstrace: %d ranks merged into %s; clocks agree within %.1f us\n", n, out_path,
               (double)bound / 1e3);
    }
    if (out && fclose(out) != 0 && ok) {
        fprintf(stderr, "gstrace: writing %s failed: %s\n", out_path, strerror(errno));
        ok = false;
    }
    free(files);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc < 5 || strcmp(argv[1], "merge") != 0 || strcmp(argv[2], "-o") != 0) {
        usage(stderr);
        return GSTRACE_USAGE;
    }
    return merge(argv[3], argv + 4, argc - 4);
}
