/* The status table's strings, and the per-thread detail of the last error. */
#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>

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
    snprintf(last_error, sizeof(last_error), "%s", text);
}

gs_status gs_fail(gs_log_subsys subsys, gs_status status, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(last_error, sizeof(last_error), "%s: ", gs_status_name(status));
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(last_error))
        vsnprintf(last_error + n, sizeof(last_error) - (size_t)n, fmt, ap);
    va_end(ap);
    gs_log_write(GS_LOG_ERROR, subsys, "%s", last_error);
    return status;
}
