/*
 * gsinfo: what this build of gradsync has, and its configuration.
 *
 *   gsinfo                      version, transports built in, host id
 *   gsinfo --params             every GS_* parameter: current value, default, meaning
 *   gsinfo --params --markdown  the README's table (name | default | meaning)
 */
#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: gsinfo [--params [--markdown]]\n"
               "  (no option)  version, transports built in, host id\n"
               "  --params     every GS_* parameter with its current value, default and meaning\n"
               "  --markdown   with --params: the README table (name | default | meaning)\n");
}

static void print_summary(void)
{
    char host_id[128];
    gs_boot_host_id(host_id, sizeof(host_id));
    printf("gradsync %s\n", gs_version());
    const gs_config *cfg = NULL;
    printf("transports:");
    if (gs_config_get(&cfg) != GS_OK)
        cfg = NULL;
    for (int i = 0; gs_tp_builtin(i); i++) {
        const gs_tp_ops *ops = gs_tp_builtin(i);
        bool usable = !ops->available || (cfg && ops->available(cfg));
        printf(" %s%s", ops->name, usable ? "" : " (unusable here: no device)");
    }
    printf("\n");
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

static int print_params(void)
{
    const gs_config *cfg;
    char value[GS_CONFIG_STR_MAX + 8];
    if (gs_config_get(&cfg) != GS_OK) {
        fprintf(stderr, "gsinfo: %s\n", gs_last_error());
        return 1;
    }
    for (int i = 0; i < gs_param_count(); i++) {
        const gs_param_info *p = gs_param_info_at(i);
        gs_param_format(cfg, i, value, sizeof(value));
        printf("%-24s = %-12s (default %s%s)\n", p->var, value[0] ? value : "\"\"",
               p->def[0] ? p->def : "\"\"", getenv(p->var) ? ", set in the environment" : "");
        printf("    %s", p->help);
        if (p->choices)
            printf(" [%s]", p->choices);
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    bool params = false, markdown = false;
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
            return 2;
        }
    }
    if (markdown && !params) {
        fprintf(stderr, "gsinfo: --markdown goes with --params\n");
        usage(stderr);
        return 2;
    }
    if (!params) {
        print_summary();
        return 0;
    }
    if (markdown) {
        print_markdown();
        return 0;
    }
    return print_params();
}
