/* Parsing of the GS_* environment into gs_config, driven by the table in util/params.def. */
#include "util/config.h"

#include "util/log.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

enum { T_INT, T_SIZE, T_BOOL, T_STR, T_ENUM };

typedef struct param_desc {
    gs_param_info info;
    int type;
    size_t offset;
} param_desc;

static const param_desc params[] = {
#define GS_PARAM(field, var, type, def, choices, help)                                                       \
    {{var, #type, def, choices, help}, T_##type, offsetof(gs_config, field)},
#include "util/params.def"
#undef GS_PARAM
};
#define PARAM_COUNT ((int)(sizeof(params) / sizeof(params[0])))

int gs_param_count(void)
{
    return PARAM_COUNT;
}

const gs_param_info *gs_param_at(int i)
{
    return i >= 0 && i < PARAM_COUNT ? &params[i].info : NULL;
}

gs_status gs_size_parse(const char *text, uint64_t *value_p)
{
    char *end;
    unsigned long long v;
    uint64_t mult = 1;

    if (!text || !*text || *text == '-')
        return GS_ERR_CONFIG;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno || end == text)
        return GS_ERR_CONFIG;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1ull << 30;
        end++;
        break;
    default: break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (mult > 1 && (*end == 'b' || *end == 'B'))
        end++;
    if (*end || v > UINT64_MAX / mult)
        return GS_ERR_CONFIG;
    *value_p = v * mult;
    return GS_OK;
}

static gs_status parse_int(const char *text, int64_t *value_p)
{
    char *end;
    long long v;
    errno = 0;
    v = strtoll(text, &end, 10);
    if (errno || end == text || *end)
        return GS_ERR_CONFIG;
    *value_p = v;
    return GS_OK;
}

static gs_status parse_bool(const char *text, bool *value_p)
{
    static const char *const yes[] = {"1", "yes", "true", "on", "y"};
    static const char *const no[] = {"0", "no", "false", "off", "n"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_p = true;
            return GS_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_p = false;
            return GS_OK;
        }
    }
    return GS_ERR_CONFIG;
}

/* Index of text among "a|b|c", or -1. */
static int enum_index(const char *choices, const char *text)
{
    int index = 0;
    size_t len = strlen(text);
    for (const char *p = choices; *p; index++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncasecmp(p, text, n) == 0)
            return index;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

static const char *accepted_forms(const param_desc *d)
{
    switch (d->type) {
    case T_INT: return "a decimal integer";
    case T_SIZE: return "a byte count such as 4096, 256K, 4M or 1G";
    case T_BOOL: return "1/0, yes/no, true/false or on/off";
    case T_ENUM: return d->info.choices;
    default: return "text";
    }
}

static gs_status parse_one(const param_desc *d, const char *text, gs_config *cfg)
{
    char *field = (char *)cfg + d->offset;
    gs_status status = GS_OK;
    int index;

    switch (d->type) {
    case T_INT: status = parse_int(text, (int64_t *)(void *)field); break;
    case T_SIZE: status = gs_size_parse(text, (uint64_t *)(void *)field); break;
    case T_BOOL: status = parse_bool(text, (bool *)(void *)field); break;
    case T_ENUM:
        index = enum_index(d->info.choices, text);
        if (index < 0)
            status = GS_ERR_CONFIG;
        else
            *(int *)(void *)field = index;
        break;
    default:
        if (strlen(text) >= GS_CONFIG_STR_MAX)
            status = GS_ERR_CONFIG;
        else
            snprintf(field, GS_CONFIG_STR_MAX, "%s", text);
        break;
    }
    return status;
}

#define PROBLEM_MAX (GS_CONFIG_STR_MAX + 256) /* one problem's sentence */

/* Reports one problem of parameter i and puts its default in its place.
 * Returns 1, the problem to count. */
static int __attribute__((format(printf, 5, 6)))
report_bad(gs_config *cfg, int i, gs_config_report_fn report, void *arg, const char *fmt, ...)
{
    char problem[PROBLEM_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof(problem), fmt, ap);
    va_end(ap);
    report(i, problem, arg);
    parse_one(&params[i], params[i].info.default_value, cfg);
    return 1;
}

static int param_at_offset(size_t offset)
{
    int i = 0;
    while (params[i].offset != offset)
        i++;
    return i;
}
#define PARAM_OF(field) param_at_offset(offsetof(gs_config, field))

/* The verbs transport's integer settings and their ranges (checked here, built with verbs or not, so
 * that gsinfo reports them; the transport checks them again at open). */
static int check_verbs_ranges(gs_config *cfg, gs_config_report_fn report, void *arg)
{
    static const struct {
        size_t offset;
        int64_t lo, hi;
        const char *meaning;
    } ranges[] = {
        {offsetof(gs_config, ib_port), 1, 255, "a port number 1-255"},
        {offsetof(gs_config, ib_gid_index), -1, 255, "-1 (automatic) or a GID index 0-255"},
        {offsetof(gs_config, ib_timeout), -1, 31,
         "-1 (automatic) or an exponent 1-31 (0, no ack timeout on hardware, is refused)"},
        {offsetof(gs_config, ib_retry_cnt), 0, 7, "a retry count 0-7"},
        {offsetof(gs_config, ib_rnr_retry), 0, 7, "a retry count 0-7"},
        {offsetof(gs_config, ib_rnr_timer), 0, 31, "a timer code 0-31"},
        {offsetof(gs_config, ib_sl), 0, 15, "a service level 0-15"},
        {offsetof(gs_config, ib_tc), 0, 255, "a traffic class 0-255 (RoCE v2: DSCP << 2)"},
        {offsetof(gs_config, ib_qps_per_peer), 1, 16, "1-16 queue pairs per peer"},
        {offsetof(gs_config, ib_stripe_min), 4096, 1 << 30, "4K-1G bytes"},
        {offsetof(gs_config, ib_rails), 1, 2, "1 or 2 devices"},
    };
    int problems = 0;
    for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
        int p = param_at_offset(ranges[i].offset);
        int64_t v = *(const int64_t *)(const void *)((const char *)cfg + ranges[i].offset);
        if (v >= ranges[i].lo && v <= ranges[i].hi &&
            !(ranges[i].offset == offsetof(gs_config, ib_timeout) && v == 0))
            continue;
        problems += report_bad(cfg, p, report, arg, "%s=%" PRId64 " is not valid: expected %s",
                               params[p].info.name, v, ranges[i].meaning);
    }
    if (cfg->ib_pkey[0]) {
        char *end;
        errno = 0;
        unsigned long key = strtoul(cfg->ib_pkey, &end, 0);
        if (errno || end == cfg->ib_pkey || *end || cfg->ib_pkey[0] == '-' || key > 0xffff ||
            (key & 0x7fff) == 0)
            problems += report_bad(
                cfg, PARAM_OF(ib_pkey), report, arg,
                "GS_IB_PKEY='%s' is not valid: expected a partition key 0x0001-0xffff with a nonzero "
                "base, e.g. 0x8001",
                cfg->ib_pkey);
    }
    return problems;
}

/* Values that parse but are out of range; each reported, the default put in
 * its place. Returns how many. */
static int check_ranges(gs_config *cfg, gs_config_report_fn report, void *arg)
{
    int problems = check_verbs_ranges(cfg, report, arg);
    unsigned mask;
    if (cfg->timeout_ms <= 0)
        problems +=
            report_bad(cfg, PARAM_OF(timeout_ms), report, arg,
                       "GS_TIMEOUT_MS=%" PRId64 " is not valid: expected a positive number of milliseconds",
                       cfg->timeout_ms);
    if (cfg->chunk_bytes < 4096)
        problems +=
            report_bad(cfg, PARAM_OF(chunk_bytes), report, arg,
                       "GS_CHUNK_BYTES=%" PRIu64 " is not valid: expected at least 4K", cfg->chunk_bytes);
    if (gs_log_parse_subsys(cfg->log_subsys, &mask) != GS_OK)
        problems += report_bad(cfg, PARAM_OF(log_subsys), report, arg,
                               "GS_LOG_SUBSYS='%s' is not valid: expected all or a comma-separated list of "
                               "util,boot,tp,shm,tcp,verbs,coll,ps,tool",
                               cfg->log_subsys);
    return problems;
}

/* Parses every parameter through getenv_fn (defaults where unset) into cfg,
 * reporting each malformed value and putting its default in its place.
 * Returns how many were malformed. */
static int parse_all(gs_config *cfg, gs_getenv_fn getenv_fn, void *arg, gs_config_report_fn report,
                     void *report_arg)
{
    int problems = 0;
    memset(cfg, 0, sizeof(*cfg));
    for (int i = 0; i < PARAM_COUNT; i++) {
        const param_desc *d = &params[i];
        const char *text = getenv_fn(d->info.name, arg);
        if (!text)
            text = d->info.default_value;
        if (parse_one(d, text, cfg) == GS_OK)
            continue;
        problems +=
            report_bad(cfg, i, report, report_arg, "%s='%s' is not valid: expected %s%s", d->info.name, text,
                       accepted_forms(d), d->type == T_STR ? " shorter than 256 bytes" : "");
    }
    return problems + check_ranges(cfg, report, report_arg);
}

static void keep_first(int param, const char *problem, void *arg)
{
    char *first = arg;
    (void)param;
    if (!first[0])
        snprintf(first, PROBLEM_MAX, "%s", problem);
}

gs_status gs_config_parse(gs_config *cfg, gs_getenv_fn getenv_fn, void *arg)
{
    gs_config parsed;
    char first[PROBLEM_MAX] = "";
    if (parse_all(&parsed, getenv_fn, arg, keep_first, first) > 0)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_CONFIG, "%s", first);
    *cfg = parsed;
    return GS_OK;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (lb >= 64 || la >= 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *gs_param_closest(const char *name)
{
    const char *best = NULL;
    size_t best_dist = SIZE_MAX;
    for (int i = 0; i < PARAM_COUNT; i++) {
        size_t d = edit_distance(name, params[i].info.name);
        if (d < best_dist) {
            best_dist = d;
            best = params[i].info.name;
        }
    }
    return best_dist <= strlen(name) / 2 ? best : NULL;
}

/* Variables of gradsync's own test harnesses (GS_TEST_*, GS_RXE_*, and the
 * two ctest sets), not of the library: never warned about. */
static bool harness_variable(const char *name, size_t len)
{
    static const char *const exact[] = {"GS_TOOLS_DIR", "GS_SOURCE_DIR"};
    if (strncmp(name, "GS_TEST_", 8) == 0 || strncmp(name, "GS_RXE_", 7) == 0)
        return true;
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++)
        if (strlen(exact[i]) == len && strncmp(exact[i], name, len) == 0)
            return true;
    return false;
}

static bool param_known(const char *name, size_t len)
{
    for (int i = 0; i < PARAM_COUNT; i++)
        if (strlen(params[i].info.name) == len && strncmp(params[i].info.name, name, len) == 0)
            return true;
    return false;
}

/* Reports each GS_* variable in envp that no parameter has, with the closest
 * known name. Returns how many. */
static int report_unknown(char *const *envp, gs_config_report_fn report, void *arg)
{
    int count = 0;
    for (char *const *e = envp; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[128], problem[256];
        const char *closest;
        if (strncmp(*e, "GS_", 3) != 0 || !eq || param_known(*e, (size_t)(eq - *e)) ||
            harness_variable(*e, (size_t)(eq - *e)))
            continue;
        snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
        closest = gs_param_closest(name);
        snprintf(problem, sizeof(problem),
                 "unknown variable %s ignored%s%s%s (gsinfo --params lists them all)", name,
                 closest ? "; did you mean " : "", closest ? closest : "", closest ? "?" : "");
        report(-1, problem, arg);
        count++;
    }
    return count;
}

static void warn_problem(int param, const char *problem, void *arg)
{
    (void)param;
    (void)arg;
    gs_log_warn(UTIL, "%s", problem);
}

int gs_config_warn_unknown(char *const *envp)
{
    return report_unknown(envp, warn_problem, NULL);
}

/* getenv over an environment array. */
static const char *envp_getenv(const char *name, void *arg)
{
    char *const *envp = arg;
    size_t len = strlen(name);
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            return *e + len + 1;
    return NULL;
}

int gs_config_check(char *const *envp, gs_config *cfg, gs_config_report_fn report, void *arg)
{
    return parse_all(cfg, envp_getenv, (void *)envp, report, arg) + report_unknown(envp, report, arg);
}

void gs_param_format(const gs_config *cfg, int i, char *buf, size_t cap)
{
    const param_desc *d = &params[i];
    const char *field = (const char *)cfg + d->offset;
    switch (d->type) {
    case T_INT: snprintf(buf, cap, "%" PRId64, *(const int64_t *)(const void *)field); break;
    case T_SIZE: snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)(const void *)field); break;
    case T_BOOL: snprintf(buf, cap, "%d", *(const bool *)(const void *)field ? 1 : 0); break;
    case T_ENUM: {
        int index = *(const int *)(const void *)field;
        const char *p = d->info.choices;
        for (int k = 0; k < index && p; k++) {
            p = strchr(p, '|');
            p = p ? p + 1 : NULL;
        }
        const char *bar = p ? strchr(p, '|') : NULL;
        snprintf(buf, cap, "%.*s", p ? (int)(bar ? (size_t)(bar - p) : strlen(p)) : 1, p ? p : "?");
        break;
    }
    default: snprintf(buf, cap, "%s", field); break;
    }
}

static const char *real_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

static gs_config process_config;
static gs_status process_status;
static pthread_once_t process_once = PTHREAD_ONCE_INIT;
static char process_error[1024];

static void load_process_config(void)
{
    process_status = gs_config_parse(&process_config, real_getenv, NULL);
    if (process_status == GS_OK) /* the parse checked GS_LOG_SUBSYS */
        process_status =
            gs_log_configure(process_config.log_level, process_config.log_subsys, process_config.log_file);
    if (process_status != GS_OK) {
        snprintf(process_error, sizeof(process_error), "%s", gs_last_error());
        return;
    }
    gs_config_warn_unknown(environ);
}

gs_status gs_config_get(const gs_config **cfg_p)
{
    pthread_once(&process_once, load_process_config);
    if (process_status != GS_OK) {
        gs_error_restore(process_error);
        return process_status;
    }
    *cfg_p = &process_config;
    return GS_OK;
}
