/* Rank, size and store address from each launcher's variables; malformed
 * values name the variable; the host id. */
#include "bootstrap/boot.h"
#include "gs_test.h"

#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *fake_getenv(const char *name, void *arg)
{
    for (const char *const *p = arg; *p; p += 2)
        if (strcmp(*p, name) == 0)
            return p[1];
    return NULL;
}

/* Parses the configuration and discovers from pairs (name, value, ..., NULL). */
static gs_status discover(const char *const *pairs, gs_boot_info *info)
{
    gs_config cfg;
    gs_status status = gs_config_parse(&cfg, fake_getenv, (void *)pairs);
    if (status == GS_OK)
        status = gs_boot_discover(&cfg, fake_getenv, (void *)pairs, info);
    return status;
}

static void expect_error(const char *const *pairs, const char *needle)
{
    gs_boot_info info;
    GS_ASSERT_STATUS(discover(pairs, &info), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), needle);
}

GS_TEST(nothing_set_is_a_single_process)
{
    static const char *const env[] = {NULL};
    gs_boot_info info;
    GS_ASSERT_OK(discover(env, &info));
    GS_ASSERT_EQ(info.rank, 0);
    GS_ASSERT_EQ(info.size, 1);
    GS_ASSERT_EQ(info.local_rank, 0);
    GS_ASSERT_EQ(info.store_port, 0);
    GS_ASSERT_STR_EQ(info.source, "single process");
}

GS_TEST(gs_variables_come_first)
{
    static const char *const env[] = {"GS_RANK",
                                      "2",
                                      "GS_WORLD_SIZE",
                                      "4",
                                      "GS_STORE",
                                      "10.1.2.3:29400",
                                      "GS_LOCAL_RANK",
                                      "1",
                                      "RANK",
                                      "0",
                                      "WORLD_SIZE",
                                      "8",
                                      "OMPI_COMM_WORLD_RANK",
                                      "5",
                                      NULL};
    gs_boot_info info;
    GS_ASSERT_OK(discover(env, &info));
    GS_ASSERT_EQ(info.rank, 2);
    GS_ASSERT_EQ(info.size, 4);
    GS_ASSERT_EQ(info.local_rank, 1);
    GS_ASSERT_STR_EQ(info.store_host, "10.1.2.3");
    GS_ASSERT_EQ(info.store_port, 29400);
    GS_ASSERT_STR_EQ(info.source, "GS_*");
    GS_ASSERT(!info.store_external);
}

GS_TEST(gs_store_accepts_names_and_bracketed_ipv6)
{
    static const char *const v6[] = {
        "GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "[fe80::1]:5000", "GS_STORE_EXTERNAL", "1", NULL};
    static const char *const name[] = {
        "GS_RANK", "1", "GS_WORLD_SIZE", "2", "GS_STORE", "node-7.cluster:65535", NULL};
    gs_boot_info info;
    GS_ASSERT_OK(discover(v6, &info));
    GS_ASSERT_STR_EQ(info.store_host, "fe80::1");
    GS_ASSERT_EQ(info.store_port, 5000);
    GS_ASSERT(info.store_external);
    GS_ASSERT_OK(discover(name, &info));
    GS_ASSERT_STR_EQ(info.store_host, "node-7.cluster");
    GS_ASSERT_EQ(info.store_port, 65535);
}

GS_TEST(malformed_gs_variables_are_named)
{
    static const char *const bad_store[][7] = {
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "localhost", NULL},
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "localhost:0", NULL},
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "localhost:70000", NULL},
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "fe80::1:5000", NULL},
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "[fe80::1]5000", NULL},
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", ":5000", NULL},
        {"GS_RANK", "0", "GS_WORLD_SIZE", "2", "GS_STORE", "host:50x", NULL},
    };
    static const char *const rank_big[] = {"GS_RANK", "4", "GS_WORLD_SIZE", "4", "GS_STORE", "h:1", NULL};
    static const char *const rank_neg[] = {"GS_RANK", "-2", "GS_WORLD_SIZE", "4", "GS_STORE", "h:1", NULL};
    static const char *const rank_text[] = {"GS_RANK", "one", "GS_WORLD_SIZE", "4", "GS_STORE", "h:1", NULL};
    static const char *const size_zero[] = {"GS_RANK", "0", "GS_WORLD_SIZE", "0", "GS_STORE", "h:1", NULL};
    static const char *const size_only[] = {"GS_WORLD_SIZE", "4", "GS_STORE", "h:1", NULL};
    static const char *const rank_only[] = {"GS_RANK", "1", "GS_STORE", "h:1", NULL};
    static const char *const no_store[] = {"GS_RANK", "1", "GS_WORLD_SIZE", "2", NULL};
    static const char *const external_no_store[] = {"GS_STORE_EXTERNAL", "1", NULL};
    for (size_t i = 0; i < sizeof(bad_store) / sizeof(bad_store[0]); i++)
        expect_error(bad_store[i], "GS_STORE=");
    expect_error(rank_big, "GS_RANK=4 is not valid");
    expect_error(rank_neg, "GS_RANK=-2 is not valid");
    expect_error(rank_text, "GS_RANK='one' is not valid");
    expect_error(size_zero, "GS_WORLD_SIZE=0 is not valid");
    expect_error(size_only, "GS_WORLD_SIZE is set but GS_RANK is not");
    expect_error(rank_only, "GS_RANK is set but GS_WORLD_SIZE is not");
    expect_error(no_store, "GS_STORE is not set");
    expect_error(external_no_store, "GS_STORE_EXTERNAL=1");
}

GS_TEST(torchrun_variables)
{
    static const char *const env[] = {"RANK",        "3",         "WORLD_SIZE",  "8",     "LOCAL_RANK", "1",
                                      "MASTER_ADDR", "trainer-0", "MASTER_PORT", "29500", NULL};
    static const char *const v6[] = {"RANK", "0",           "WORLD_SIZE", "2", "MASTER_ADDR",
                                     "::1",  "MASTER_PORT", "29500",      NULL};
    static const char *const with_store[] = {"RANK",        "1", "WORLD_SIZE", "2",   "MASTER_ADDR", "a",
                                             "MASTER_PORT", "1", "GS_STORE",   "b:7", NULL};
    static const char *const single[] = {"RANK", "0", "WORLD_SIZE", "1", NULL};
    gs_boot_info info;
    GS_ASSERT_OK(discover(env, &info));
    GS_ASSERT_EQ(info.rank, 3);
    GS_ASSERT_EQ(info.size, 8);
    GS_ASSERT_EQ(info.local_rank, 1);
    GS_ASSERT_STR_EQ(info.store_host, "trainer-0");
    GS_ASSERT_EQ(info.store_port, 29501); /* torchrun's own store holds MASTER_PORT */
    GS_ASSERT_STR_EQ(info.source, "torchrun");
    GS_ASSERT_OK(discover(v6, &info));
    GS_ASSERT_STR_EQ(info.store_host, "::1");
    GS_ASSERT_OK(discover(with_store, &info));
    GS_ASSERT_STR_EQ(info.store_host, "b");
    GS_ASSERT_EQ(info.store_port, 7);
    GS_ASSERT_OK(discover(single, &info));
    GS_ASSERT_EQ(info.store_port, 0);
}

GS_TEST(malformed_torchrun_variables_are_named)
{
    static const char *const rank_text[] = {"RANK", "x",           "WORLD_SIZE", "2", "MASTER_ADDR",
                                            "a",    "MASTER_PORT", "5",          NULL};
    static const char *const rank_big[] = {"RANK", "2",           "WORLD_SIZE", "2", "MASTER_ADDR",
                                           "a",    "MASTER_PORT", "5",          NULL};
    static const char *const size_neg[] = {"RANK", "0", "WORLD_SIZE", "-1", NULL};
    static const char *const port_bad[] = {"RANK", "0",           "WORLD_SIZE", "2", "MASTER_ADDR",
                                           "a",    "MASTER_PORT", "http",       NULL};
    static const char *const port_top[] = {"RANK", "0",           "WORLD_SIZE", "2", "MASTER_ADDR",
                                           "a",    "MASTER_PORT", "65535",      NULL};
    static const char *const no_addr[] = {"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "5", NULL};
    static const char *const no_port[] = {"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "a", NULL};
    static const char *const local_bad[] = {"RANK", "0", "WORLD_SIZE", "1", "LOCAL_RANK", "-1", NULL};
    static const char *const rank_only[] = {"RANK", "0", NULL};
    expect_error(rank_text, "RANK='x' is not valid");
    expect_error(rank_big, "RANK='2' is not valid: expected an integer from 0 to 1");
    expect_error(size_neg, "WORLD_SIZE='-1' is not valid");
    expect_error(port_bad, "MASTER_PORT='http' is not valid");
    expect_error(port_top, "MASTER_PORT='65535' is not valid");
    expect_error(no_addr, "MASTER_ADDR is not set");
    expect_error(no_port, "MASTER_PORT is not set");
    expect_error(local_bad, "LOCAL_RANK='-1' is not valid");
    expect_error(rank_only, "RANK is set but WORLD_SIZE is not");
}

GS_TEST(open_mpi_variables)
{
    static const char *const with_store[] = {"OMPI_COMM_WORLD_RANK",
                                             "1",
                                             "OMPI_COMM_WORLD_SIZE",
                                             "4",
                                             "OMPI_COMM_WORLD_LOCAL_RANK",
                                             "1",
                                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                                             "2",
                                             "GS_STORE",
                                             "head:4000",
                                             NULL};
    static const char *const one_host[] = {"OMPI_COMM_WORLD_RANK",
                                           "3",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "4",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "4",
                                           "OMPI_MCA_ess_base_jobid",
                                           "1177681921",
                                           NULL};
    static const char *const one_host_other_job[] = {"OMPI_COMM_WORLD_RANK",
                                                     "0",
                                                     "OMPI_COMM_WORLD_SIZE",
                                                     "4",
                                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                     "4",
                                                     "OMPI_MCA_ess_base_jobid",
                                                     "1177681922",
                                                     NULL};
    gs_boot_info info, other;
    GS_ASSERT_OK(discover(with_store, &info));
    GS_ASSERT_EQ(info.rank, 1);
    GS_ASSERT_EQ(info.size, 4);
    GS_ASSERT_EQ(info.local_rank, 1);
    GS_ASSERT_STR_EQ(info.store_host, "head");
    GS_ASSERT_STR_EQ(info.source, "Open MPI");
    /* One host, no GS_STORE: a loopback port derived from the job id. */
    GS_ASSERT_OK(discover(one_host, &info));
    GS_ASSERT_STR_EQ(info.store_host, "127.0.0.1");
    GS_ASSERT_GE(info.store_port, 20000);
    GS_ASSERT_LT(info.store_port, 32000);
    GS_ASSERT_OK(discover(one_host_other_job, &other));
    GS_ASSERT_NE(info.store_port, other.store_port);
}

GS_TEST(open_mpi_across_hosts_needs_gs_store)
{
    static const char *const many_hosts[] = {"OMPI_COMM_WORLD_RANK",
                                             "1",
                                             "OMPI_COMM_WORLD_SIZE",
                                             "4",
                                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                                             "2",
                                             "OMPI_MCA_ess_base_jobid",
                                             "5",
                                             NULL};
    static const char *const bad_rank[] = {"OMPI_COMM_WORLD_RANK", "1.5", "OMPI_COMM_WORLD_SIZE", "4", NULL};
    static const char *const no_size[] = {"OMPI_COMM_WORLD_RANK", "1", NULL};
    expect_error(many_hosts, "set GS_STORE=host:port");
    expect_error(many_hosts, "mpirun -x GS_STORE");
    expect_error(bad_rank, "OMPI_COMM_WORLD_RANK='1.5' is not valid");
    expect_error(no_size, "OMPI_COMM_WORLD_SIZE is not set");
}

GS_TEST(slurm_variables)
{
    static const char *const one_node[] = {"SLURM_PROCID",
                                           "2",
                                           "SLURM_NTASKS",
                                           "3",
                                           "SLURM_LOCALID",
                                           "2",
                                           "SLURM_JOB_ID",
                                           "777",
                                           "SLURM_STEP_ID",
                                           "0",
                                           "SLURM_NNODES",
                                           "1",
                                           NULL};
    static const char *const with_store[] = {
        "SLURM_PROCID", "0", "SLURM_NTASKS", "3", "SLURM_NNODES", "3", "GS_STORE", "[::1]:9", NULL};
    static const char *const many_nodes[] = {
        "SLURM_PROCID", "0", "SLURM_NTASKS", "3", "SLURM_NNODES", "3", "SLURM_JOB_ID", "1", NULL};
    static const char *const bad_local[] = {
        "SLURM_PROCID", "0", "SLURM_NTASKS", "1", "SLURM_LOCALID", "a", NULL};
    gs_boot_info info;
    GS_ASSERT_OK(discover(one_node, &info));
    GS_ASSERT_EQ(info.rank, 2);
    GS_ASSERT_EQ(info.size, 3);
    GS_ASSERT_EQ(info.local_rank, 2);
    GS_ASSERT_STR_EQ(info.store_host, "127.0.0.1");
    GS_ASSERT_STR_EQ(info.source, "Slurm");
    GS_ASSERT_OK(discover(with_store, &info));
    GS_ASSERT_STR_EQ(info.store_host, "::1");
    GS_ASSERT_EQ(info.store_port, 9);
    expect_error(many_nodes, "under srun across nodes");
    expect_error(bad_local, "SLURM_LOCALID='a' is not valid");
}

GS_TEST(host_id_is_stable_and_names_the_host)
{
    char a[128], b[128], host[65] = {0};
    gs_boot_host_id(a, sizeof(a));
    gs_boot_host_id(b, sizeof(b));
    GS_ASSERT_STR_EQ(a, b);
    GS_ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
    GS_ASSERT_EQ(strncmp(a, host, strlen(host)), 0);
    GS_ASSERT_EQ(a[strlen(host)], ':');
    GS_ASSERT_EQ(strlen(a), strlen(host) + 17);
}

GS_TEST(host_id_differs_in_another_network_namespace)
{
    char mine[128], theirs[128] = {0};
    int fds[2];
    GS_ASSERT_EQ(pipe(fds), 0);
    gs_boot_host_id(mine, sizeof(mine));
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (unshare(CLONE_NEWNET) != 0)
            _exit(77);
        gs_boot_host_id(theirs, sizeof(theirs));
        _exit(write(fds[1], theirs, strlen(theirs)) > 0 ? 0 : 1);
    }
    close(fds[1]);
    int status;
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    GS_ASSERT(read(fds[0], theirs, sizeof(theirs) - 1) >= 0);
    close(fds[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
        GS_SKIP("unshare(CLONE_NEWNET) not permitted here");
    GS_ASSERT_EQ(status, 0);
    GS_ASSERT(strcmp(mine, theirs) != 0);
}

GS_TEST(context_reports_rank_size_and_bad_config)
{
    setenv("GS_RANK", "0", 1);
    setenv("GS_WORLD_SIZE", "2", 1);
    unsetenv("GS_STORE");
    gs_ctx *ctx = NULL;
    GS_ASSERT_STATUS(gs_ctx_create(&ctx), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_STORE is not set");
    GS_ASSERT(ctx == NULL);
    GS_ASSERT_STATUS(gs_ctx_create(NULL), GS_ERR_INVALID);
    GS_ASSERT_EQ(gs_ctx_rank(NULL), -1);
    GS_ASSERT_EQ(gs_ctx_size(NULL), -1);
    GS_ASSERT_OK(gs_ctx_destroy(NULL));
    GS_ASSERT_STATUS(gs_store_put(NULL, "k", "v", 1), GS_ERR_INVALID);
}
