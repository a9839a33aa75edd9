/* gsrun: environment of the ranks, output prefixing, failure propagation,
 * stopping the others, signal forwarding, no leftover processes, usage. */
#include "gs_test.h"
#include "multirank.h"
#include "spawn.h"
#include "util/clock.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* gsrun args... -- sh -c script */
static void run_sh(gs_test_proc *p, const char *const *gsrun_args, const char *script)
{
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)gs_test_tool("gsrun");
    for (const char *const *a = gsrun_args; *a; a++)
        argv[n++] = (char *)*a;
    argv[n++] = "--";
    argv[n++] = "sh";
    argv[n++] = "-c";
    argv[n++] = (char *)script;
    argv[n] = NULL;
    gs_test_spawn(p, argv, NULL);
}

static int elapsed_ms(uint64_t start)
{
    return (int)((gs_now_ns() - start) / 1000000);
}

GS_TEST(ranks_get_their_variables_and_one_fresh_token)
{
    static const char *const args[] = {"-n", "3", "--transport", "tcp", "--timeout-ms", "1234", NULL};
    gs_test_proc p, q;
    char line[160];
    run_sh(&p, args,
           "echo \"vars $GS_RANK/$GS_WORLD_SIZE/$GS_LOCAL_RANK $GS_STORE $GS_STORE_EXTERNAL $GS_TRANSPORT "
           "$GS_TIMEOUT_MS token=$GS_JOB_TOKEN\"; "
           "echo \"torch $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT\"");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    for (int r = 0; r < 3; r++) {
        snprintf(line, sizeof(line), "[%d] vars %d/3/%d 127.0.0.1:", r, r, r);
        GS_ASSERT_CONTAINS(p.out, line);
    }
    GS_ASSERT_EQ(gs_test_count(p.out, " 1 tcp 1234 token="), 3);
    /* The same 64-hex-digit token for every rank, another one next run. */
    const char *token = strstr(p.out, "token=") + 6;
    GS_ASSERT_EQ(strspn(token, "0123456789abcdef"), 64);
    snprintf(line, sizeof(line), "token=%.64s", token);
    GS_ASSERT_EQ(gs_test_count(p.out, line), 3);
    /* torch.distributed's env:// variables, as torchrun sets them, one port for the job */
    for (int r = 0; r < 3; r++) {
        snprintf(line, sizeof(line), "[%d] torch %d/3/%d/3 127.0.0.1:", r, r, r);
        GS_ASSERT_CONTAINS(p.out, line);
    }
    const char *port = strstr(p.out, "torch 0/3/0/3 127.0.0.1:") + 24;
    GS_ASSERT(atoi(port) > 0 && atoi(port) < 65536);
    snprintf(line, sizeof(line), "127.0.0.1:%d\n", atoi(port));
    GS_ASSERT_EQ(gs_test_count(p.out, line), 3);
    static const char *const plain[] = {"-n", "1", NULL};
    run_sh(&q, plain, "echo token=$GS_JOB_TOKEN");
    gs_test_proc_wait(&q, 20000);
    GS_ASSERT_EQ(gs_test_count(q.out, line), 0);
    gs_test_proc_free(&p);
    gs_test_proc_free(&q);
}

GS_TEST(output_lines_are_prefixed_per_stream)
{
    static const char *const args[] = {"-n", "2", NULL};
    gs_test_proc p;
    char text[64];
    run_sh(&p, args,
           "echo out-$GS_RANK; echo err-$GS_RANK >&2; echo second-$GS_RANK; "
           "head -c 20000 /dev/zero | tr '\\0' x; printf '\\npartial-%s' $GS_RANK");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    for (int r = 0; r < 2; r++) {
        snprintf(text, sizeof(text), "[%d] out-%d\n", r, r);
        GS_ASSERT_CONTAINS(p.out, text);
        snprintf(text, sizeof(text), "[%d] second-%d\n", r, r);
        GS_ASSERT_CONTAINS(p.out, text);
        snprintf(text, sizeof(text), "[%d] err-%d\n", r, r);
        GS_ASSERT_CONTAINS(p.err, text);
        snprintf(text, sizeof(text), "[%d] partial-%d\n", r, r); /* the last line, without its newline */
        GS_ASSERT_CONTAINS(p.out, text);
        snprintf(text, sizeof(text), "[%d] xxxxxxxx", r); /* a line longer than the buffer still gets out */
        GS_ASSERT_GE(gs_test_count(p.out, text), 1);
    }
    GS_ASSERT(!strstr(p.out, "err-"));
    GS_ASSERT(!strstr(p.err, "out-"));
    /* Every line starts with a prefix. */
    for (const char *l = p.out; *l; l = strchr(l, '\n') + 1) {
        GS_ASSERT_EQ(l[0], '[');
        if (!strchr(l, '\n'))
            break;
    }
    gs_test_proc_free(&p);
}

/* Whether the process whose pid is in pid_file runs (a zombie does not). */
static bool process_alive(const char *pid_file)
{
    FILE *f = fopen(pid_file, "r");
    char stat_path[64], state = 'X';
    int pid = 0;
    if (!f)
        return false;
    if (fscanf(f, "%d", &pid) != 1)
        pid = 0;
    fclose(f);
    if (pid <= 0)
        return false;
    snprintf(stat_path, sizeof(stat_path), "/proc/%d/stat", pid);
    f = fopen(stat_path, "r");
    if (!f)
        return false;
    if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1)
        state = 'X';
    fclose(f);
    return state != 'Z' && state != 'X';
}

/* Signals are delivered asynchronously: allow a moment for the process to die. */
static bool process_gone_soon(const char *pid_file)
{
    uint64_t deadline = gs_deadline_after_ms(2000);
    while (process_alive(pid_file)) {
        if (gs_deadline_passed(deadline))
            return false;
        usleep(10000);
    }
    return true;
}

GS_TEST(a_failing_rank_stops_the_others_and_sets_the_exit_status)
{
    char dir[] = "/tmp/gs_test_gsrun_XXXXXX", script[512], path[600];
    static const char *const args[] = {"-n", "3", NULL};
    gs_test_proc p;
    GS_ASSERT(mkdtemp(dir));
    /* Every rank leaves a grandchild behind; rank 1 then fails. */
    snprintf(script, sizeof(script),
             "sleep 60 & echo $! > %s/child.$GS_RANK; echo $$ > %s/rank.$GS_RANK; "
             "if [ $GS_RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 60",
             dir, dir);
    uint64_t start = gs_now_ns();
    run_sh(&p, args, script);
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 3);
    GS_ASSERT_LT(elapsed_ms(start), 10000);
    GS_ASSERT_CONTAINS(p.err, "gsrun: rank 1 exited with status 3; stopping the other ranks");
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof(path), "%s/rank.%d", dir, r);
        GS_ASSERT(process_gone_soon(path));
        unlink(path);
        snprintf(path, sizeof(path), "%s/child.%d", dir, r);
        GS_ASSERT(process_gone_soon(path));
        unlink(path);
    }
    rmdir(dir);
    gs_test_proc_free(&p);
}

GS_TEST(a_killed_rank_gives_128_plus_the_signal)
{
    static const char *const args[] = {"-n", "2", NULL};
    gs_test_proc p;
    run_sh(&p, args, "if [ $GS_RANK = 0 ]; then kill -9 $$; fi; sleep 60");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 137);
    GS_ASSERT_CONTAINS(p.err, "gsrun: rank 0 was killed by signal 9");
    gs_test_proc_free(&p);
}

GS_TEST(elastic_a_killed_rank_does_not_stop_the_others)
{
    static const char *const args[] = {"-n", "3", "--elastic", NULL};
    gs_test_proc p;
    run_sh(&p, args, "if [ $GS_RANK = 1 ]; then kill -9 $$; fi; sleep 0.5; echo done $GS_RANK");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    GS_ASSERT_CONTAINS(p.err, "gsrun: rank 1 was killed by signal 9 (Killed); the others go on (--elastic)");
    GS_ASSERT_CONTAINS(p.out, "[0] done 0");
    GS_ASSERT_CONTAINS(p.out, "[2] done 2");
    gs_test_proc_free(&p);
    /* a survivor that fails still fails the job; every rank lost too */
    static const char *const two[] = {"-n", "2", "--elastic", NULL};
    run_sh(&p, two, "if [ $GS_RANK = 1 ]; then kill -9 $$; fi; sleep 0.3; exit 4");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 4);
    gs_test_proc_free(&p);
    run_sh(&p, two, "kill -9 $$");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 137);
    gs_test_proc_free(&p);
}

/* --restarts K: a failed rank is started again (GS_REJOIN=1, its output
 * under the same prefix), up to K times in all; then the old rules. */
GS_TEST(restarts_start_a_failed_rank_again_as_a_joiner)
{
    static const char *const one[] = {"-n", "3", "--restarts", "1", NULL};
    static const char *const two[] = {"-n", "2", "--restarts", "2", "--grace-ms", "300", NULL};
    gs_test_proc p;
    run_sh(&p, one,
           "if [ $GS_RANK = 1 ] && [ -z \"$GS_REJOIN\" ]; then kill -9 $$; fi; sleep 0.5; "
           "echo done $GS_RANK rejoin=${GS_REJOIN:-no}");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    GS_ASSERT_CONTAINS(p.err,
                       "gsrun: rank 1 was killed by signal 9; restarting it as a joiner (restart 1 of 1)");
    GS_ASSERT_CONTAINS(p.out, "[0] done 0 rejoin=no");
    GS_ASSERT_CONTAINS(p.out, "[1] done 1 rejoin=1");
    GS_ASSERT_CONTAINS(p.out, "[2] done 2 rejoin=no");
    gs_test_proc_free(&p);
    /* a rank that always fails: restarted twice, then its status is the job's */
    run_sh(&p, two, "if [ $GS_RANK = 1 ]; then echo try; exit 3; fi; sleep 2");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 3);
    GS_ASSERT_CONTAINS(p.err, "(restart 2 of 2)");
    GS_ASSERT(strstr(p.err, "(restart 3 of") == NULL);
    GS_ASSERT_CONTAINS(p.err, "gsrun: rank 1 exited with status 3; stopping the other ranks");
    gs_test_proc_free(&p);
    /* a restart still waiting when the others are done is stopped, not counted */
    run_sh(&p, two,
           "if [ $GS_RANK = 1 ] && [ -z \"$GS_REJOIN\" ]; then kill -9 $$; fi; "
           "if [ -n \"$GS_REJOIN\" ]; then sleep 30; fi; sleep 0.3");
    uint64_t start = gs_now_ns();
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 0);
    GS_ASSERT_LT(elapsed_ms(start), 10000);
    GS_ASSERT_CONTAINS(p.err, "gsrun: the job ended without restarted rank 1; stopping it");
    gs_test_proc_free(&p);
}

GS_TEST(a_rank_ignoring_sigterm_is_killed_after_the_grace_period)
{
    static const char *const args[] = {"-n", "2", "--grace-ms", "300", NULL};
    gs_test_proc p;
    uint64_t start = gs_now_ns();
    run_sh(&p, args, "trap '' TERM; if [ $GS_RANK = 1 ]; then exit 4; fi; sleep 60");
    gs_test_proc_wait(&p, 20000);
    GS_ASSERT_RANK_EXIT(p.status, 4);
    GS_ASSERT_LT(elapsed_ms(start), 5000);
    gs_test_proc_free(&p);
}

GS_TEST(sigint_and_sigterm_are_forwarded_to_every_rank)
{
    static const char *const args[] = {"-n", "2", NULL};
    const int sigs[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        gs_test_proc p;
        char script[256];
        snprintf(script, sizeof(script),
                 "trap 'echo got-%d; exit 5' %s; echo ready; while :; do sleep 0.05; done", sigs[i],
                 sigs[i] == SIGINT ? "INT" : "TERM");
        run_sh(&p, args, script);
        GS_ASSERT(gs_test_proc_wait_output(&p, "ready", 2, 10000));
        kill(p.pid, sigs[i]); /* gsrun alone, as a terminal's Ctrl-C would not reach the ranks' groups */
        gs_test_proc_wait(&p, 10000);
        snprintf(script, sizeof(script), "got-%d", sigs[i]);
        GS_ASSERT_EQ(gs_test_count(p.out, script), 2);
        GS_ASSERT_RANK_EXIT(p.status, 5);
        gs_test_proc_free(&p);
    }
}

GS_TEST(a_killed_gsrun_takes_its_ranks_along)
{
    char dir[] = "/tmp/gs_test_gsrun_XXXXXX", script[256], path[300];
    static const char *const args[] = {"-n", "2", NULL};
    gs_test_proc p;
    GS_ASSERT(mkdtemp(dir));
    snprintf(script, sizeof(script), "echo $$ > %s/rank.$GS_RANK; echo ready; exec sleep 60", dir);
    run_sh(&p, args, script);
    GS_ASSERT(gs_test_proc_wait_output(&p, "ready", 2, 10000));
    kill(p.pid, SIGKILL);
    gs_test_proc_wait(&p, 10000);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof(path), "%s/rank.%d", dir, r);
        GS_ASSERT(process_gone_soon(path));
        unlink(path);
    }
    rmdir(dir);
    gs_test_proc_free(&p);
}

static void expect_usage_error(const char *const *args, int code, const char *needle)
{
    char *argv[16];
    int n = 0;
    gs_test_proc p;
    argv[n++] = (char *)gs_test_tool("gsrun");
    for (const char *const *a = args; *a; a++)
        argv[n++] = (char *)*a;
    argv[n] = NULL;
    gs_test_spawn(&p, argv, NULL);
    gs_test_proc_wait(&p, 10000);
    GS_ASSERT_RANK_EXIT(p.status, code);
    GS_ASSERT_CONTAINS(p.err, needle);
    gs_test_proc_free(&p);
}

GS_TEST(bad_arguments_get_a_clear_usage)
{
    static const char *const none[] = {NULL};
    static const char *const zero[] = {"-n", "0", "true", NULL};
    static const char *const text[] = {"-n", "four", "true", NULL};
    static const char *const no_prog[] = {"-n", "2", NULL};
    static const char *const no_prog_dash[] = {"-n", "2", "--", NULL};
    static const char *const bad_tp[] = {"-n", "2", "--transport", "ib", "true", NULL};
    static const char *const bad_ms[] = {"-n", "2", "--timeout-ms", "0", "true", NULL};
    static const char *const unknown[] = {"-n", "2", "--verbose", "true", NULL};
    static const char *const missing[] = {"-n", "2", "/nonexistent/program", NULL};
    expect_usage_error(none, 2, "usage: gsrun -n N");
    expect_usage_error(zero, 2, "-n needs a number of ranks from 1 to");
    expect_usage_error(text, 2, "got 'four'");
    expect_usage_error(no_prog, 2, "no program to run");
    expect_usage_error(no_prog_dash, 2, "no program to run");
    expect_usage_error(bad_tp, 2, "--transport needs auto, shm, tcp or verbs, got 'ib'");
    expect_usage_error(bad_ms, 2, "--timeout-ms needs milliseconds");
    static const char *const bad_restarts[] = {"-n", "2", "--restarts", "-1", "true", NULL};
    expect_usage_error(bad_restarts, 2, "--restarts needs a number of restarts");
    expect_usage_error(unknown, 2, "unknown option '--verbose'");
    expect_usage_error(missing, 127, "cannot run /nonexistent/program");
}
