/* gsperf runs under gsrun, prints every op's tables and the limits' ratios;
 * --user-mem measures caller memory (no atomics). */
#include "gs_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *run_capture(const char *cmd)
{
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    FILE *p = popen(cmd, "r");
    GS_ASSERT(out && p);
    while (len + 1 < cap) {
        size_t n = fread(out + len, 1, cap - 1 - len, p);
        if (n == 0)
            break;
        len += n;
    }
    out[len] = '\0';
    GS_ASSERT_EQ(pclose(p), 0);
    return out;
}

/* The output of gsperf with args under gsrun -n ranks (ranks 0: alone), and
 * a shell test after it (NULL: none, the run must succeed). */
static char *run_gsperf(const char *dir, int ranks, const char *args, const char *then)
{
    char cmd[1024];
    if (ranks)
        snprintf(cmd, sizeof(cmd), "%s/gsrun -n %d %s/gsperf %s 2>&1%s%s", dir, ranks, dir, args,
                 then ? "; " : "", then ? then : "");
    else
        snprintf(cmd, sizeof(cmd), "%s/gsperf %s 2>&1%s%s", dir, args, then ? "; " : "", then ? then : "");
    return run_capture(cmd);
}

GS_TEST(gsperf_measures_every_op_and_the_limits)
{
    const char *dir = getenv("GS_TOOLS_DIR");
    char *out;
    if (!dir)
        GS_SKIP("GS_TOOLS_DIR is not set (run through ctest)");
    out = run_gsperf(dir, 2, "--iters 64 --max 4096 --no-pin", NULL);
    static const char *const want[] = {"# limits: cache-line ping-pong one-way",
                                       "# write latency (half round trip), transport shm",
                                       "# write_imm latency",
                                       "# write_imm 8 B half round trip / cache-line one-way",
                                       "# read latency (one op",
                                       "# fetch_add bandwidth",
                                       "# cmp_swap latency",
                                       "# send latency",
                                       "# send bandwidth",
                                       "      4096 "};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        GS_ASSERT_CONTAINS(out, want[i]);
    free(out);
    /* an odd number of ranks is refused with a message */
    out = run_gsperf(dir, 3, "--iters 20", "true");
    GS_ASSERT_CONTAINS(out, "even number of ranks");
    free(out);
}

GS_TEST(gsperf_user_mem_reads_and_writes_caller_memory)
{
    const char *dir = getenv("GS_TOOLS_DIR");
    char *out;
    if (!dir)
        GS_SKIP("GS_TOOLS_DIR is not set (run through ctest)");
    out = run_gsperf(dir, 2, "--user-mem --bw --min 4096 --max 65536 --no-floor --no-pin", NULL);
    GS_ASSERT_CONTAINS(out, "# read bandwidth, transport shm, 2 ranks, caller memory (gs_mr_reg)");
    GS_ASSERT_CONTAINS(out, "# write bandwidth, transport shm, 2 ranks, caller memory");
    GS_ASSERT_CONTAINS(out, "     65536 ");
    GS_ASSERT(strstr(out, "fetch_add") == NULL); /* caller memory has no remote atomics */
    free(out);
    out = run_gsperf(dir, 0, "--user-mem --op cmp_swap", "test $? = 2");
    GS_ASSERT_CONTAINS(out, "cmp_swap needs remote atomics");
    free(out);
}
