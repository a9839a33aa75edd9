/* The status table's strings, and the per-thread detail of the last error. */
#include "util/log.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *gs_status_name(gs_status status)
{
    switch (status) {
#define GS_X_NAME(name, value, msg)                                                                          \
    case GS_##name: return "GS_" #name;
        GS_STATUS_TABLE(GS_X_NAME)
#undef GS_X_NAME
    }
    return "GS_UNKNOWN";
}

const char *gs_strerror(gs_status status)
{
    switch (status) {
#define GS_X_MSG(name, value, msg)                                                                           \
    case GS_##name: return msg;
        GS_STATUS_TABLE(GS_X_MSG)
#undef GS_X_MSG
    }
    return "unknown status";
}

const char *gs_last_error(void)
{
    return last_error;
}

const char *gs_version(void)
{
    return GS_VERSION_STRING;
}

void gs_error_clear(void)
{
    last_error[0] = '\0';
}

void gs_error_restore(const char *text)
{
    size_t len = strlen(text);
    if (text == last_error)
        return;
    if (len >= sizeof(last_error))
        len = sizeof(last_error) - 1;
    memmove(last_error, text, len); /* text may be a part of last_error */
    last_error[len] = '\0';
}

/* The detail is formatted apart and then copied: an argument may be
 * gs_last_error() itself (a caller adding its context to the detail). */
gs_status gs_fail_at(gs_log_level level, gs_log_subsys subsys, gs_status status, const char *fmt, ...)
{
    char text[sizeof(last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    memcpy(last_error, text, sizeof(last_error));
    if (gs_log_enabled(level, subsys))
        gs_log_write(level, subsys, "%s: %s", gs_status_name(status), last_error);
    return status;
}

gs_log_level gs_log_level_once(bool *logged)
{
    gs_log_level level = *logged ? GS_LOG_TRACE : GS_LOG_ERROR;
    *logged = true;
    return level;
}

#define PEER_LOST_END ": did it exit or crash?"

void gs_error_peer_lost_text(char *buf, size_t cap, int rank, int peer, const char *cause)
{
    /* strerror's "Connection reset by peer" reads "connection reset by peer" inside the sentence */
    bool lower = isupper((unsigned char)cause[0]) && !isupper((unsigned char)cause[1]);
    snprintf(buf, cap, "rank %d: rank %d lost (%c%s)" PEER_LOST_END, rank, peer,
             lower ? (char)tolower((unsigned char)cause[0]) : cause[0], *cause ? cause + 1 : "");
}

gs_status gs_fail_peer_lost(gs_log_subsys subsys, int rank, int peer, const char *fmt, ...)
{
    char cause[512], text[sizeof(last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof(cause), fmt, ap);
    va_end(ap);
    gs_error_peer_lost_text(text, sizeof(text), rank, peer, cause);
    return gs_fail(subsys, GS_ERR_PEER_LOST, "%s", text);
}

const char *gs_error_skip_rank(const char *text, int *rank_p)
{
    const char *p = text;
    int rank = 0;
    *rank_p = -1;
    if (strncmp(p, "rank ", 5) != 0 || p[5] < '0' || p[5] > '9')
        return text;
    for (p += 5; *p >= '0' && *p <= '9' && rank < 100000000; p++)
        rank = rank * 10 + (*p - '0');
    if (p[0] != ':' || p[1] != ' ')
        return text;
    *rank_p = rank;
    return p + 2;
}

bool gs_error_peer_lost_parse(const char *text, int *peer_p, char *cause, size_t cap)
{
    size_t len = strlen(text), tail = strlen(PEER_LOST_END);
    int peer, used = 0;
    if (sscanf(text, "rank %d lost (%n", &peer, &used) != 1 || used == 0 || len < (size_t)used + tail + 1)
        return false;
    if (strcmp(text + len - tail, PEER_LOST_END) != 0 || text[len - tail - 1] != ')')
        return false;
    *peer_p = peer;
    snprintf(cause, cap, "%.*s", (int)(len - tail - 1 - (size_t)used), text + used);
    return true;
}
