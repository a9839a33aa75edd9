/*
 * The public configuration calls (gradsync.h, "Configuration"): a
 * configuration read from an environment without a context, and a
 * parameter's value by name, for gsinfo, launchers and gs_ctx_param. Knows
 * the table only through config.h; nothing of contexts or transports.
 */
#include "util/config.h"

#include "util/alloc.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static void ignore_problem(int param, const char *problem, void *arg)
{
    (void)param;
    (void)problem;
    (void)arg;
}

gs_status gs_config_create(char *const *envp, gs_config_report_fn report, void *arg, int *problems_p,
                           gs_config **cfg_p)
{
    gs_config *cfg;
    int problems;

    if (!cfg_p)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "gs_config_create: cfg_p is NULL");
    cfg = gs_calloc(1, sizeof(*cfg));
    if (!cfg)
        return GS_ERR_NOMEM;
    problems = gs_config_check(envp ? envp : environ, cfg, report ? report : ignore_problem, arg);
    if (problems_p)
        *problems_p = problems;
    *cfg_p = cfg;
    return GS_OK;
}

void gs_config_destroy(gs_config *cfg)
{
    free(cfg);
}

gs_status gs_config_param_value(const gs_config *cfg, const char *caller, const char *name, char *buf,
                                size_t cap)
{
    const char *near;
    if (!cfg || !name || !buf || cap == 0)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "%s: NULL %s", caller,
                       !cfg    ? "configuration"
                       : !name ? "name"
                               : "buf (or cap 0)");
    for (int i = 0; i < gs_param_count(); i++) {
        if (strcmp(gs_param_at(i)->name, name) != 0)
            continue;
        if (strcmp(name, "GS_JOB_TOKEN") == 0) /* a secret: say only whether there is one */
            snprintf(buf, cap, "%s", cfg->job_token[0] ? "(set)" : "");
        else
            gs_param_format(cfg, i, buf, cap);
        return GS_OK;
    }
    near = gs_param_closest(name);
    return gs_fail(GS_SUBSYS_UTIL, GS_ERR_INVALID, "%s: no parameter %s%s%s%s", caller, name,
                   near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
}

gs_status gs_config_value(const gs_config *cfg, const char *name, char *buf, size_t cap)
{
    return gs_config_param_value(cfg, "gs_config_value", name, buf, cap);
}
