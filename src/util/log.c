/* Log lines: "[gradsync host:pid r<rank>] LEVEL subsys: message". */
#include "util/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

int gs_log_level_now = GS_LOG_WARN;
unsigned gs_log_subsys_mask = ~0u;

static FILE *log_stream;
static int log_rank = -1;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
static const char *const subsys_names[] = {
#define GS_X_SUBSYS_NAME(name, str) str,
    GS_LOG_SUBSYS_TABLE(GS_X_SUBSYS_NAME)
#undef GS_X_SUBSYS_NAME
};

void gs_log_set_rank(int rank)
{
    log_rank = rank;
}

gs_status gs_log_parse_subsys(const char *list, unsigned *mask_p)
{
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        if (strcmp(tok, "all") == 0) {
            mask = ~0u;
            continue;
        }
        for (int i = 0; i < GS_SUBSYS_COUNT; i++) {
            if (strcmp(tok, subsys_names[i]) == 0) {
                mask |= 1u << i;
                found = 1;
            }
        }
        if (!found)
            return GS_ERR_CONFIG;
    }
    *mask_p = mask;
    return GS_OK;
}

/* Expands %h (host), %p (pid) and %r (rank) in a GS_LOG_FILE pattern. */
static void expand_path(const char *pattern, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = pattern; *p && n + 1 < cap; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p' || p[1] == 'r')) {
            char part[80];
            if (p[1] == 'h')
                snprintf(part, sizeof(part), "%s", log_host);
            else if (p[1] == 'p')
                snprintf(part, sizeof(part), "%d", (int)getpid());
            else
                snprintf(part, sizeof(part), "%d", log_rank);
            n += (size_t)snprintf(out + n, cap - n, "%s", part);
            p++;
        } else {
            out[n++] = *p;
        }
    }
    out[n < cap ? n : cap - 1] = '\0';
}

gs_status gs_log_configure(int level, const char *subsys_list, const char *file)
{
    unsigned mask;
    if (gethostname(log_host, sizeof(log_host)) != 0)
        snprintf(log_host, sizeof(log_host), "?");
    if (gs_log_parse_subsys(subsys_list && *subsys_list ? subsys_list : "all", &mask) != GS_OK)
        return GS_ERR_CONFIG;
    gs_log_level_now = level;
    gs_log_subsys_mask = mask;
    if (file && *file) {
        char path[512];
        FILE *f;
        expand_path(file, path, sizeof(path));
        f = fopen(path, "a");
        if (!f) {
            fprintf(stderr, "gradsync: cannot open GS_LOG_FILE %s: %s; logging to stderr\n", path,
                    strerror(errno));
            return GS_OK;
        }
        setvbuf(f, NULL, _IOLBF, 0);
        pthread_mutex_lock(&log_lock);
        if (log_stream && log_stream != stderr)
            fclose(log_stream);
        log_stream = f;
        pthread_mutex_unlock(&log_lock);
    }
    return GS_OK;
}

void gs_log_write(gs_log_level level, gs_log_subsys subsys, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    struct timeval tv;
    int saved_errno = errno;

    if (!log_host[0] && gethostname(log_host, sizeof(log_host)) != 0)
        snprintf(log_host, sizeof(log_host), "?");
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    gettimeofday(&tv, NULL);
    pthread_mutex_lock(&log_lock);
    fprintf(log_stream ? log_stream : stderr, "[gradsync %s:%d r%d %ld.%06ld] %s %s: %s\n", log_host,
            (int)getpid(), log_rank, (long)tv.tv_sec, (long)tv.tv_usec, level_names[level],
            subsys_names[subsys], msg);
    pthread_mutex_unlock(&log_lock);
    errno = saved_errno;
}
