/*
 * gsinfo: what this build of gradsync has, and its configuration.
 *
 *   gsinfo                      version, transports built in, host id
 *   gsinfo --params             every GS_* parameter: current value, default, meaning
 *   gsinfo --params --markdown  the README's table (name | default | meaning)
 *
 * Where a user checks a configuration: every malformed GS_* value (the
 * variable, the value, the accepted forms) and every unknown GS_* variable
 * (with the closest known name) is reported on stderr, what can be printed
 * still is (defaults in place of malformed values), and the exit status is
 * GSINFO_BAD_CONFIG.
 */
#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

#define GSINFO_USAGE      2 /* exit status: bad arguments */
#define GSINFO_BAD_CONFIG 3 /* exit status: a malformed or unknown GS_* variable */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gsinfo [--params [--markdown]]\n"
            "  (no option)  version, transports built in, host id\n"
            "  --params     every GS_* parameter with its current value, default and meaning\n"
            "  --markdown   with --params: the README table (name | default | meaning)\n"
            "exit status: 0, %d bad arguments, %d a malformed or unknown GS_* variable (each reported)\n",
            GSINFO_USAGE, GSINFO_BAD_CONFIG);
}

#define GSINFO_X_COUNT(field, var, type, def, choices, help) +1
enum { GSINFO_PARAMS = 0 GS_PARAM_TABLE(GSINFO_X_COUNT) };
#undef GSINFO_X_COUNT

/* The configuration check: which parameters were malformed. */
typedef struct gsinfo_check {
    bool bad[GSINFO_PARAMS];
} gsinfo_check;

static void print_problem(int param, const char *problem, void *arg)
{
    gsinfo_check *check = arg;
    fprintf(stderr, "gsinfo: %s\n", problem);
    if (param >= 0 && param < GSINFO_PARAMS)
        check->bad[param] = true;
}

/* Checks the environment's configuration into cfg, reporting every problem.
 * Returns how many. */
static int check_config(gs_config *cfg, gsinfo_check *check)
{
    int problems = gs_config_check(environ, cfg, print_problem, check);
    if (problems > 0)
        fprintf(stderr,
                "gsinfo: %d problem%s in the GS_* configuration; defaults stand in for malformed values\n",
                problems, problems == 1 ? "" : "s");
    return problems;
}

/* What GS_TRANSPORT makes of the peers of this host and of other hosts. */
static void print_choice(const gs_config *cfg)
{
    static const char *const names[] = {"auto", "shm", "tcp", "verbs"};
    const char *near = NULL, *far = NULL;
    if (cfg->transport != GS_TRANSPORT_AUTO) {
        printf("GS_TRANSPORT=%s: %s to every peer, on this host and on others\n", names[cfg->transport],
               names[cfg->transport]);
        return;
    }
    for (int i = 0; gs_tp_builtin(i); i++) {
        const gs_tp_ops *ops = gs_tp_builtin(i);
        if (ops->available && !ops->available(cfg))
            continue;
        if (ops->id == GS_TRANSPORT_SHM)
            near = near ? near : ops->name;
        else
            far = far ? far : ops->name;
    }
    printf("GS_TRANSPORT=auto from this host: peers on it over %s, peers on other hosts over %s "
           "(when every rank can use them)\n",
           near  ? near
           : far ? far
                 : "none",
           far ? far : "none");
}

static void print_summary(const gs_config *cfg)
{
    char host_id[128];
    gs_boot_host_id(host_id, sizeof(host_id));
    printf("gradsync %s\n", gs_version());
    printf("transports:");
    for (int i = 0; gs_tp_builtin(i); i++) {
        const gs_tp_ops *ops = gs_tp_builtin(i);
        bool usable = !ops->available || ops->available(cfg);
        printf(" %s%s", ops->name, usable ? "" : " (unusable here: no device)");
    }
    printf("\n");
    print_choice(cfg);
    if (cfg->host_id[0])
        printf("host id: %s (GS_HOST_ID; the machine's own: %s)\n", cfg->host_id, host_id);
    else
        printf("host id: %s\n", host_id);
    printf("parameters: %d (gsinfo --params)\n", gs_param_count());
}

/* Prints text with '|' escaped for a markdown table cell. */
static void print_cell(const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '|')
            fputs("\\|", stdout);
        else
            putchar(*p);
    }
}

static void print_markdown(void)
{
    printf("| name | default | meaning |\n| --- | --- | --- |\n");
    for (int i = 0; i < gs_param_count(); i++) {
        const gs_param_info *p = gs_param_info_at(i);
        printf("| `%s` | ", p->var);
        if (p->def[0]) {
            putchar('`');
            print_cell(p->def);
            putchar('`');
        } else {
            printf("(empty)");
        }
        printf(" | ");
        print_cell(p->help);
        if (p->choices) {
            printf(" (");
            print_cell(p->choices);
            printf(")");
        }
        printf(" |\n");
    }
}

static void print_params(const gs_config *cfg, const gsinfo_check *check)
{
    char value[GS_CONFIG_STR_MAX + 8];
    for (int i = 0; i < gs_param_count(); i++) {
        const gs_param_info *p = gs_param_info_at(i);
        const char *set = getenv(p->var) ? ", set in the environment" : "";
        if (i < GSINFO_PARAMS && check->bad[i])
            set = ", set in the environment: not valid, see above";
        gs_param_format(cfg, i, value, sizeof(value));
        printf("%-24s = %-12s (default %s%s)\n", p->var, value[0] ? value : "\"\"",
               p->def[0] ? p->def : "\"\"", set);
        printf("    %s", p->help);
        if (p->choices)
            printf(" [%s]", p->choices);
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    bool params = false, markdown = false;
    gsinfo_check check = {{false}};
    gs_config cfg;
    int problems;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--params") == 0) {
            params = true;
        } else if (strcmp(argv[i], "--markdown") == 0) {
            markdown = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "gsinfo: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return GSINFO_USAGE;
        }
    }
    if (markdown && !params) {
        fprintf(stderr, "gsinfo: --markdown goes with --params\n");
        usage(stderr);
        return GSINFO_USAGE;
    }
    if (markdown) { /* the table of parameters, whatever this environment holds */
        print_markdown();
        return 0;
    }
    problems = check_config(&cfg, &check);
    if (params)
        print_params(&cfg, &check);
    else
        print_summary(&cfg);
    return problems > 0 ? GSINFO_BAD_CONFIG : 0;
}
