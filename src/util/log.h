/* Logging with levels and subsystems; every line carries host, pid and rank. */
#ifndef GS_UTIL_LOG_H
#define GS_UTIL_LOG_H

#include "gradsync.h"

#include <stdbool.h>

typedef enum gs_log_level {
    GS_LOG_NONE = 0,
    GS_LOG_ERROR,
    GS_LOG_WARN,
    GS_LOG_INFO,
    GS_LOG_DEBUG,
    GS_LOG_TRACE,
} gs_log_level;

/* X(name, string): one bit each in GS_LOG_SUBSYS. */
#define GS_LOG_SUBSYS_TABLE(X)                                                                               \
    X(UTIL, "util")                                                                                          \
    X(BOOT, "boot")                                                                                          \
    X(TP, "tp")                                                                                              \
    X(SHM, "shm")                                                                                            \
    X(TCP, "tcp")                                                                                            \
    X(VERBS, "verbs")                                                                                        \
    X(COLL, "coll")                                                                                          \
    X(PS, "ps")                                                                                              \
    X(TOOL, "tool")

typedef enum gs_log_subsys {
#define GS_X_SUBSYS(name, str) GS_SUBSYS_##name,
    GS_LOG_SUBSYS_TABLE(GS_X_SUBSYS)
#undef GS_X_SUBSYS
        GS_SUBSYS_COUNT
} gs_log_subsys;

extern int gs_log_level_now;        /* current level, checked before formatting */
extern unsigned gs_log_subsys_mask; /* bit per gs_log_subsys */

static inline bool gs_log_enabled(gs_log_level level, gs_log_subsys subsys)
{
    return (int)level <= gs_log_level_now && (gs_log_subsys_mask & (1u << subsys));
}

/* The bit mask of a GS_LOG_SUBSYS list ("all" or names, comma separated);
 * GS_ERR_CONFIG for a name no subsystem has. */
gs_status gs_log_parse_subsys(const char *list, unsigned *mask_p);
/* Applies GS_LOG_LEVEL, GS_LOG_SUBSYS, GS_LOG_FILE from the configuration. */
gs_status gs_log_configure(int level, const char *subsys_list, const char *file);
/* The rank printed on every line (-1 until known). */
void gs_log_set_rank(int rank);
void gs_log_write(gs_log_level level, gs_log_subsys subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define GS_LOG_AT(level, subsys, ...)                                                                        \
    do {                                                                                                     \
        if (gs_log_enabled(level, GS_SUBSYS_##subsys))                                                       \
            gs_log_write(level, GS_SUBSYS_##subsys, __VA_ARGS__);                                            \
    } while (0)

#define gs_log_error(subsys, ...) GS_LOG_AT(GS_LOG_ERROR, subsys, __VA_ARGS__)
#define gs_log_warn(subsys, ...)  GS_LOG_AT(GS_LOG_WARN, subsys, __VA_ARGS__)
#define gs_log_info(subsys, ...)  GS_LOG_AT(GS_LOG_INFO, subsys, __VA_ARGS__)
#define gs_log_debug(subsys, ...) GS_LOG_AT(GS_LOG_DEBUG, subsys, __VA_ARGS__)
#define gs_log_trace(subsys, ...) GS_LOG_AT(GS_LOG_TRACE, subsys, __VA_ARGS__)

/* Records the detail as gs_last_error(), logs it at level in subsys (when
 * that level is enabled) and returns status; the macros below name the
 * level. */
gs_status gs_fail_at(gs_log_level level, gs_log_subsys subsys, gs_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An error, logged at error level: `return gs_fail(GS_SUBSYS_BOOT, GS_ERR_TIMEOUT, ...)`. */
#define gs_fail(subsys, status, ...) gs_fail_at(GS_LOG_ERROR, (subsys), (status), __VA_ARGS__)
/* The same for an outcome the caller decides about (a wait's deadline that
 * its caller may treat as "nothing yet"): recorded, logged at debug level. */
#define gs_fail_quiet(subsys, status, ...) gs_fail_at(GS_LOG_DEBUG, (subsys), (status), __VA_ARGS__)
/* The same for an error an object gives again on every later call (an
 * endpoint in error: every poll, wait and post after it repeats it, and a
 * caller may loop on them): logged at error level the first time (*logged
 * false; it is set), at trace level after, recorded every time. */
#define gs_fail_once(logged, subsys, status, ...)                                                            \
    gs_fail_at(gs_log_level_once(logged), (subsys), (status), __VA_ARGS__)
gs_log_level gs_log_level_once(bool *logged);
void gs_error_clear(void);
/* Sets gs_last_error() to text (already logged elsewhere); text may be
 * gs_last_error() or a part of it. */
void gs_error_restore(const char *text);

/* A lost peer, in the one sentence every transport writes:
 *   "rank R: rank P lost (CAUSE): did it exit or crash?"
 * (a capital first letter of CAUSE, as strerror's, is lowered). Writes it
 * to buf; gs_fail_peer_lost records and logs it as GS_ERR_PEER_LOST. */
void gs_error_peer_lost_text(char *buf, size_t cap, int rank, int peer, const char *cause);
gs_status gs_fail_peer_lost(gs_log_subsys subsys, int rank, int peer, const char *cause_fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reads such a sentence back, without its leading "rank R: ": "rank P lost
 * (CAUSE): did it exit or crash?" gives P and CAUSE; false for any other text. */
bool gs_error_peer_lost_parse(const char *text, int *peer_p, char *cause, size_t cap);
/* text after its leading "rank N: " (N to *rank_p), or text itself (-1). */
const char *gs_error_skip_rank(const char *text, int *rank_p);

#endif
