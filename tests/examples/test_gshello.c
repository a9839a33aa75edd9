/* gshello runs unchanged alone, under gsrun, under mpirun (with GS_STORE and
 * with the derived single-host default) and under torchrun's variables. */
#include "gs_test.h"
#include "multirank.h"
#include "spawn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void expect_hello(const char *out, int size, const char *prefix_fmt)
{
    char host[65] = {0}, line[256], prefix[16] = "";
    GS_ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
    for (int r = 0; r < size; r++) {
        if (prefix_fmt)
            snprintf(prefix, sizeof(prefix), prefix_fmt, r);
        snprintf(line, sizeof(line), "%shello from rank %d of %d on %s", prefix, r, size, host);
        GS_ASSERT_CONTAINS(out, line);
    }
    if (prefix_fmt)
        snprintf(prefix, sizeof(prefix), prefix_fmt, 0);
    int n = snprintf(line, sizeof(line), "%s%d ranks:", prefix, size);
    for (int r = 0; r < size; r++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, " %d@%s", r, host);
    GS_ASSERT_CONTAINS(out, line);
}

GS_TEST(gshello_alone_is_one_rank)
{
    char *argv[] = {(char *)gs_test_example("gshello"), NULL};
    gs_test_proc p;
    gs_test_spawn(&p, argv, NULL);
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    expect_hello(p.out, 1, NULL);
    gs_test_proc_free(&p);
}

GS_TEST(gshello_under_gsrun_with_4_ranks)
{
    char gshello[4200];
    snprintf(gshello, sizeof(gshello), "%s", gs_test_example("gshello"));
    char *argv[] = {(char *)gs_test_tool("gsrun"), "-n", "4", gshello, NULL};
    gs_test_proc p;
    gs_test_spawn(&p, argv, NULL);
    gs_test_proc_wait(&p, 30000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    expect_hello(p.out, 4, "[%d] ");
    GS_ASSERT_EQ(p.err_len, 0);
    gs_test_proc_free(&p);
}

static bool have_mpirun(void)
{
    return system("command -v mpirun >/dev/null 2>&1") == 0;
}

static void run_mpirun(const char *store_arg)
{
    char gshello[4200];
    snprintf(gshello, sizeof(gshello), "%s", gs_test_example("gshello"));
    char *with_store[] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4",
                          "-x",     (char *)store_arg,     gshello,           NULL};
    char *without[] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", gshello, NULL};
    static const char *const env[] = {"OMPI_MCA_btl_vader_single_copy_mechanism=none", NULL};
    gs_test_proc p;
    gs_test_spawn(&p, store_arg ? with_store : without, env);
    gs_test_proc_wait(&p, 60000);
    if (!WIFEXITED(p.status) || WEXITSTATUS(p.status) != 0)
        fprintf(stderr, "--- mpirun stdout:\n%s\n--- stderr:\n%s\n", p.out, p.err);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    expect_hello(p.out, 4, NULL);
    gs_test_proc_free(&p);
}

GS_TEST(gshello_under_mpirun_with_gs_store)
{
    char store[64];
    if (!have_mpirun())
        GS_SKIP("mpirun not found (apt-get install openmpi-bin)");
    snprintf(store, sizeof(store), "GS_STORE=127.0.0.1:%d", gs_test_free_port());
    run_mpirun(store);
}

GS_TEST(gshello_under_mpirun_on_one_host_without_gs_store)
{
    if (!have_mpirun())
        GS_SKIP("mpirun not found (apt-get install openmpi-bin)");
    run_mpirun(NULL);
}

GS_TEST(gshello_under_torchrun_variables)
{
    enum { N = 3 };
    gs_test_proc p[N];
    char vars[N][4][64];
    int port = gs_test_free_port(); /* gradsync's store takes MASTER_PORT + 1 */
    for (int r = 0; r < N; r++) {
        const char *env[6];
        snprintf(vars[r][0], sizeof(vars[r][0]), "RANK=%d", r);
        snprintf(vars[r][1], sizeof(vars[r][1]), "WORLD_SIZE=%d", N);
        snprintf(vars[r][2], sizeof(vars[r][2]), "LOCAL_RANK=%d", r);
        snprintf(vars[r][3], sizeof(vars[r][3]), "MASTER_PORT=%d", port - 1);
        for (int k = 0; k < 4; k++)
            env[k] = vars[r][k];
        env[4] = "MASTER_ADDR=localhost";
        env[5] = NULL;
        char *argv[] = {(char *)gs_test_example("gshello"), NULL};
        gs_test_spawn(&p[r], argv, env);
    }
    for (int r = 0; r < N; r++) {
        gs_test_proc_wait(&p[r], 30000);
        GS_ASSERT_RANK_EXIT(p[r].status, 0);
    }
    char all[8192] = "";
    for (int r = 0; r < N; r++)
        strncat(all, p[r].out, sizeof(all) - strlen(all) - 1);
    expect_hello(all, N, NULL);
    GS_ASSERT_CONTAINS(p[2].out, "hello from rank 2 of 3");
    GS_ASSERT(!strstr(p[2].out, "3 ranks:")); /* only rank 0 prints the list */
    for (int r = 0; r < N; r++)
        gs_test_proc_free(&p[r]);
}

GS_TEST(gshello_reports_a_bad_launcher_variable)
{
    static const char *const env[] = {"RANK=1", "WORLD_SIZE=two", NULL};
    char *argv[] = {(char *)gs_test_example("gshello"), NULL};
    gs_test_proc p;
    gs_test_spawn(&p, argv, env);
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 1);
    GS_ASSERT_CONTAINS(p.err, "GS_ERR_CONFIG");
    GS_ASSERT_CONTAINS(p.err, "WORLD_SIZE='two' is not valid");
    gs_test_proc_free(&p);
}
