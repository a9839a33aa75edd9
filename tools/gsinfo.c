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
#include "gradsync.h"

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

/* The configuration check: which parameters were malformed ([i] for
 * gs_param_at(i), allocated for gs_param_count()). */
typedef struct gsinfo_check {
    bool *bad;
} gsinfo_check;

static void print_problem(int param, const char *problem, void *arg)
{
    gsinfo_check *check = arg;
    fprintf(stderr, "gsinfo: %s\n", problem);
    if (param >= 0 && param < gs_param_count())
        check->bad[param] = true;
}

/* Reads the environment's configuration into *cfg_p, reporting every
 * problem. Returns how many, or -1 if it could not be read at all. */
static int check_config(gs_config **cfg_p, gsinfo_check *check)
{
    int problems = 0;
    gs_status st = gs_config_create(environ, print_problem, check, &problems, cfg_p);
    if (st != GS_OK) {
        fprintf(stderr, "gsinfo: cannot read the configuration: %s\n", gs_last_error());
        return -1;
    }
    if (problems > 0)
        fprintf(stderr,
                "gsinfo: %d problem%s in the GS_* configuration; defaults stand in for malformed values\n",
                problems, problems == 1 ? "" : "s");
    return problems;
}

/* The value of parameter name in cfg ("?" if there is none). */
static const char *value_of(const gs_config *cfg, const char *name, char *buf, size_t cap)
{
    return gs_config_value(cfg, name, buf, cap) == GS_OK ? buf : "?";
}

/* What GS_TRANSPORT makes of the peers of this host and of other hosts:
 * shm is the one among the ranks of a host, the others are between hosts. */
static void print_choice(const gs_config *cfg)
{
    char transport[64];
    const char *near = NULL, *far = NULL;
    value_of(cfg, "GS_TRANSPORT", transport, sizeof(transport));
    if (strcmp(transport, "auto") != 0) {
        printf("GS_TRANSPORT=%s: %s to every peer, on this host and on others\n", transport, transport);
        return;
    }
    for (int i = 0; gs_tp_builtin_name(i); i++) {
        const char *name = gs_tp_builtin_name(i);
        if (!gs_tp_usable(cfg, name))
            continue;
        if (strcmp(name, "shm") == 0)
            near = near ? near : name;
        else
            far = far ? far : name;
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
    char host_id[128], configured[512];
    gs_host_id(host_id, sizeof(host_id));
    printf("gradsync %s\n", gs_version());
    printf("transports:");
    for (int i = 0; gs_tp_builtin_name(i); i++) {
        const char *name = gs_tp_builtin_name(i);
        printf(" %s%s", name, gs_tp_usable(cfg, name) ? "" : " (unusable here: no device)");
    }
    printf("\n");
    for (int i = 0; gs_tp_builtin_name(i); i++) {
        char devices[1024];
        if (gs_tp_devices(cfg, gs_tp_builtin_name(i), devices, sizeof(devices)))
            printf("%s devices: %s\n", gs_tp_builtin_name(i), devices);
    }
    print_choice(cfg);
    if (value_of(cfg, "GS_HOST_ID", configured, sizeof(configured))[0])
        printf("host id: %s (GS_HOST_ID; the machine's own: %s)\n", configured, host_id);
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
        const gs_param_info *p = gs_param_at(i);
        printf("| `%s` | ", p->name);
        if (p->default_value[0]) {
            putchar('`');
            print_cell(p->default_value);
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
    char value[512];
    for (int i = 0; i < gs_param_count(); i++) {
        const gs_param_info *p = gs_param_at(i);
        const char *set = getenv(p->name) ? ", set in the environment" : "";
        if (check->bad[i])
            set = ", set in the environment: not valid, see above";
        value_of(cfg, p->name, value, sizeof(value));
        printf("%-24s = %-12s (default %s%s)\n", p->name, value[0] ? value : "\"\"",
               p->default_value[0] ? p->default_value : "\"\"", set);
        printf("    %s", p->help);
        if (p->choices)
            printf(" [%s]", p->choices);
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    bool params = false, markdown = false;
    gsinfo_check check = {NULL};
    gs_config *cfg = NULL;
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
    check.bad = calloc((size_t)gs_param_count(), sizeof(*check.bad));
    if (!check.bad) {
        fprintf(stderr, "gsinfo: out of memory\n");
        return 1;
    }
    problems = check_config(&cfg, &check);
    if (problems >= 0 && params)
        print_params(cfg, &check);
    else if (problems >= 0)
        print_summary(cfg);
    gs_config_destroy(cfg);
    free(check.bad);
    return problems < 0 ? 1 : problems > 0 ? GSINFO_BAD_CONFIG : 0;
}
