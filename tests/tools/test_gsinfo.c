/* gsinfo: summary, every parameter with default/current/meaning, markdown;
 * the configuration check (malformed values, unknown variables, exit 3). */
#include "gs_test.h"
#include "multirank.h"
#include "spawn.h"

#include <stdio.h>
#include <string.h>

#define BAD_CONFIG 3 /* gsinfo's exit status for a malformed or unknown GS_* variable */

static void run_gsinfo(gs_test_proc *p, const char *a1, const char *a2, const char *const *env)
{
    char *argv[] = {(char *)gs_test_tool("gsinfo"), (char *)a1, (char *)a2, NULL};
    if (!a1)
        argv[1] = NULL;
    gs_test_spawn(p, argv, env);
    gs_test_proc_wait(p, 20000);
}

GS_TEST(summary_names_version_and_transports)
{
    gs_test_proc p;
    run_gsinfo(&p, NULL, NULL, NULL);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    GS_ASSERT_CONTAINS(p.out, "gradsync " GS_VERSION_STRING);
    GS_ASSERT_CONTAINS(p.out, "transports: shm");
    for (int i = 0; gs_tp_builtin_name(i); i++) {
        char name[64];
        snprintf(name, sizeof(name), " %s", gs_tp_builtin_name(i));
        GS_ASSERT_CONTAINS(p.out, name);
    }
    GS_ASSERT_CONTAINS(p.out, "host id: ");
    gs_test_proc_free(&p);
}

GS_TEST(params_lists_every_parameter_with_current_and_default)
{
    static const char *const env[] = {"GS_TIMEOUT_MS=4321", "GS_JOB_TOKEN=hunter2", NULL};
    gs_test_proc p;
    char line[128];
    run_gsinfo(&p, "--params", NULL, env);
    GS_ASSERT(strstr(p.out, "hunter2") == NULL); /* a secret: only whether it is set */
    GS_ASSERT_CONTAINS(p.out, "GS_JOB_TOKEN             = (set)");
    GS_ASSERT_RANK_EXIT(p.status, 0);
    for (int i = 0; i < gs_param_count(); i++) {
        const gs_param_info *info = gs_param_at(i);
        GS_ASSERT_CONTAINS(p.out, info->name);
        GS_ASSERT_CONTAINS(p.out, info->help);
    }
    GS_ASSERT_CONTAINS(p.out, "= 4321");
    GS_ASSERT_CONTAINS(p.out, "(default 30000, set in the environment)");
    snprintf(line, sizeof(line), "GS_STORE_EXTERNAL");
    GS_ASSERT_CONTAINS(p.out, line);
    gs_test_proc_free(&p);
}

GS_TEST(params_markdown_is_the_readme_table)
{
    gs_test_proc p;
    run_gsinfo(&p, "--params", "--markdown", NULL);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    GS_ASSERT_EQ(strncmp(p.out, "| name | default | meaning |\n| --- | --- | --- |\n", 46), 0);
    GS_ASSERT_CONTAINS(p.out, "| `GS_TRANSPORT` | `auto` |");
    GS_ASSERT_CONTAINS(p.out, "(auto\\|shm\\|tcp\\|verbs)");
    GS_ASSERT_EQ(gs_test_count(p.out, "\n| `GS_"), gs_param_count());
    gs_test_proc_free(&p);
}

GS_TEST(bad_arguments_and_bad_config_are_reported)
{
    static const char *const bad_env[] = {"GS_TIMEOUT_MS=soon", NULL};
    gs_test_proc p;
    run_gsinfo(&p, "--frobnicate", NULL, NULL);
    GS_ASSERT_RANK_EXIT(p.status, 2);
    GS_ASSERT_CONTAINS(p.err, "usage: gsinfo");
    gs_test_proc_free(&p);
    run_gsinfo(&p, "--markdown", NULL, NULL);
    GS_ASSERT_RANK_EXIT(p.status, 2);
    gs_test_proc_free(&p);
    run_gsinfo(&p, "--params", NULL, bad_env);
    GS_ASSERT_RANK_EXIT(p.status, BAD_CONFIG);
    GS_ASSERT_CONTAINS(p.err, "GS_TIMEOUT_MS='soon'");
    gs_test_proc_free(&p);
}

GS_TEST(clean_environment_exits_0_without_a_word_on_stderr)
{
    const char *const modes[] = {NULL, "--params"};
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        char *argv[] = {"env", "-i", (char *)gs_test_tool("gsinfo"), (char *)modes[m], NULL};
        gs_test_proc p;
        gs_test_spawn(&p, argv, NULL);
        gs_test_proc_wait(&p, 20000);
        GS_ASSERT_RANK_EXIT(p.status, 0);
        GS_ASSERT_STR_EQ(p.err, "");
        GS_ASSERT_CONTAINS(p.out, modes[m] ? "GS_TIMEOUT_MS" : "transports: shm");
        gs_test_proc_free(&p);
    }
}

GS_TEST(malformed_value_is_reported_with_its_accepted_forms)
{
    static const char *const env[] = {"GS_TIMEOUT_MS=soon", NULL};
    gs_test_proc p;
    run_gsinfo(&p, NULL, NULL, env);
    GS_ASSERT_RANK_EXIT(p.status, BAD_CONFIG);
    GS_ASSERT_CONTAINS(p.err, "gsinfo: GS_TIMEOUT_MS='soon' is not valid: expected a decimal integer");
    GS_ASSERT_CONTAINS(p.err, "1 problem in the GS_* configuration");
    GS_ASSERT_EQ(gs_test_count(p.err, "GS_TIMEOUT_MS='soon'"), 1);
    /* the summary is still printed */
    GS_ASSERT_CONTAINS(p.out, "gradsync " GS_VERSION_STRING);
    GS_ASSERT_CONTAINS(p.out, "transports: shm");
    gs_test_proc_free(&p);
    /* and every parameter, the default standing in for the malformed one */
    run_gsinfo(&p, "--params", NULL, env);
    GS_ASSERT_RANK_EXIT(p.status, BAD_CONFIG);
    GS_ASSERT_CONTAINS(p.out, "= 30000        (default 30000, set in the environment: not valid, see above)");
    GS_ASSERT_EQ(gs_test_count(p.out, "\nGS_"), gs_param_count() - 1);
    gs_test_proc_free(&p);
}

GS_TEST(every_problem_is_reported_not_only_the_first)
{
    static const char *const env[] = {"GS_TRANSPORT=rdma",     "GS_CHUNK_BYTES=100", "GS_LOG_SUBSYS=tcp,disk",
                                      "GS_IB_FORK_SAFE=maybe", "GS_TIMEOUT=5",       NULL};
    gs_test_proc p;
    run_gsinfo(&p, "--params", NULL, env);
    GS_ASSERT_RANK_EXIT(p.status, BAD_CONFIG);
    GS_ASSERT_CONTAINS(p.err, "GS_TRANSPORT='rdma' is not valid: expected auto|shm|tcp|verbs");
    GS_ASSERT_CONTAINS(p.err, "GS_CHUNK_BYTES=100 is not valid: expected at least 4K");
    GS_ASSERT_CONTAINS(p.err,
                       "GS_LOG_SUBSYS='tcp,disk' is not valid: expected all or a comma-separated list");
    GS_ASSERT_CONTAINS(p.err,
                       "GS_IB_FORK_SAFE='maybe' is not valid: expected 1/0, yes/no, true/false or on/off");
    GS_ASSERT_CONTAINS(p.err, "unknown variable GS_TIMEOUT ignored; did you mean GS_TIMEOUT_MS?");
    GS_ASSERT_CONTAINS(p.err, "5 problems in the GS_* configuration");
    gs_test_proc_free(&p);
}

GS_TEST(unknown_variable_is_reported_with_the_closest_name)
{
    static const char *const env[] = {"GS_TIMEOUT=5", NULL};
    gs_test_proc p;
    run_gsinfo(&p, NULL, NULL, env);
    GS_ASSERT_RANK_EXIT(p.status, BAD_CONFIG);
    GS_ASSERT_CONTAINS(p.err, "gsinfo: unknown variable GS_TIMEOUT ignored; did you mean GS_TIMEOUT_MS?");
    GS_ASSERT_EQ(gs_test_count(p.err, "GS_TIMEOUT ignored"), 1); /* once, not also as a library warning */
    GS_ASSERT_CONTAINS(p.out, "host id: ");
    gs_test_proc_free(&p);
}
