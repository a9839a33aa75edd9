/* gsbench checks what it measures: every collective, in place and out of
 * place, over shm and tcp, reports a row per size with #wrong 0 and exits 0
 * (it exits 1 when any element is wrong). The in-place runs use buffers 16
 * bytes past a page boundary (--offset 16, what malloc gives). With
 * --comm-split 2 the 4 ranks run it as 2 groups at once. */
#include "gs_test.h"
#include "multirank.h"
#include "spawn.h"

#include <stdio.h>
#include <string.h>

static void run_gsbench_split(const char *transport, const char *coll, bool inplace, const char *groups)
{
    char gsbench[4200];
    snprintf(gsbench, sizeof(gsbench), "%s", gs_test_tool("gsbench"));
    char *argv[] = {(char *)gs_test_tool("gsrun"),
                    "-n",
                    groups ? "4" : "3",
                    "--transport",
                    (char *)transport,
                    gsbench,
                    "--coll",
                    (char *)coll,
                    "--sizes",
                    "12,4K,300K",
                    "--iters",
                    "5",
                    "--warmup",
                    "2",
                    "--no-pin",
                    "--json",
                    "--offset",
                    inplace ? "16" : "0",
                    inplace ? "--inplace" : "--json", /* --json again: a flag that changes nothing */
                    groups ? "--comm-split" : NULL,
                    (char *)groups,
                    NULL};
    gs_test_proc p;
    gs_test_spawn(&p, argv, NULL);
    gs_test_proc_wait(&p, 60000);
    if (!WIFEXITED(p.status) || WEXITSTATUS(p.status) != 0)
        fprintf(stderr, "gsbench %s %s%s:\n%s\n%s\n", transport, coll, inplace ? " in place" : "", p.out,
                p.err);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    int rows = 0;
    for (const char *s = p.out; (s = strstr(s, "\"wrong\": ")) != NULL; s++) {
        GS_ASSERT_EQ(strncmp(s, "\"wrong\": 0,", 11), 0);
        rows++;
    }
    GS_ASSERT_EQ(rows, 3);
    GS_ASSERT_CONTAINS(p.out, inplace ? "\"inplace\": true" : "\"inplace\": false");
    GS_ASSERT_CONTAINS(p.out, inplace ? "\"offset\": 16," : "\"offset\": 0,");
    if (groups)
        GS_ASSERT_CONTAINS(p.out, "\"groups\": 2,");
    gs_test_proc_free(&p);
}

static void run_gsbench(const char *transport, const char *coll, bool inplace)
{
    run_gsbench_split(transport, coll, inplace, NULL);
}

static void every_collective(const char *transport)
{
    static const char *const colls[] = {"allreduce", "reduce_scatter", "allgather",       "broadcast",
                                        "reduce",    "gather",         "scatter",         "alltoall",
                                        "alltoallv", "allgatherv",     "reduce_scatter_v"};
    for (size_t i = 0; i < sizeof(colls) / sizeof(colls[0]); i++) {
        run_gsbench(transport, colls[i], false);
        if (i < 4 || strcmp(transport, "shm") == 0)
            run_gsbench(transport, colls[i],
                        strcmp(colls[i], "alltoallv") != 0); /* alltoallv has no in-place form */
    }
    run_gsbench(transport, "sendrecv", false);
    run_gsbench_split(transport, "allreduce", false, "2");
    run_gsbench_split(transport, "alltoall", true, "2");
}

GS_TEST(gsbench_checks_every_collective_over_shm)
{
    every_collective("shm");
}

GS_TEST(gsbench_checks_every_collective_over_tcp)
{
    every_collective("tcp");
}

GS_TEST(gsbench_refuses_a_bad_offset)
{
    static const char *const bad[] = {"12", "4096", "-8", "x", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *argv[] = {(char *)gs_test_tool("gsbench"), "--offset", (char *)bad[i], NULL};
        gs_test_proc p;
        gs_test_spawn(&p, argv, NULL);
        gs_test_proc_wait(&p, 10000);
        GS_ASSERT(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 2);
        GS_ASSERT_CONTAINS(p.err, "bad --offset");
        gs_test_proc_free(&p);
    }
}
