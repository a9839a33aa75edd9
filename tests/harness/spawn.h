/*
 * Running programs from tests: spawn with extra environment, collect stdout
 * and stderr, wait with a deadline (the process group is killed if it
 * overruns), find the built tools.
 *
 *   gs_test_proc p;
 *   char *argv[] = {(char *)gs_test_tool("gsinfo"), "--params", NULL};
 *   gs_test_spawn(&p, argv, NULL);
 *   gs_test_proc_wait(&p, 10000);
 *   GS_ASSERT_RANK_EXIT(p.status, 0);
 *   GS_ASSERT_CONTAINS(p.out, "GS_TIMEOUT_MS");
 *   gs_test_proc_free(&p);
 */
#ifndef GS_TEST_SPAWN_H
#define GS_TEST_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct gs_test_proc {
    pid_t pid; /* also its process group */
    int out_fd, err_fd;
    char *out, *err; /* everything read so far, NUL-terminated */
    size_t out_len, err_len;
    int status; /* waitpid status once done */
    bool done;
} gs_test_proc;

/* Starts argv[0] (searched in PATH) in its own process group with the test's
 * environment plus env ("NAME=VALUE" strings, NULL-terminated, or NULL),
 * stdin from /dev/null. */
void gs_test_spawn(gs_test_proc *p, char *const argv[], const char *const *env);
/* Collects output until the process exited and its pipes closed. Past
 * timeout_ms it kills the process group and fails the test. */
void gs_test_proc_wait(gs_test_proc *p, int timeout_ms);
/* Collects output until stdout holds needle count times (true) or the
 * process ended or timeout_ms passed (false). */
bool gs_test_proc_wait_output(gs_test_proc *p, const char *needle, int count, int timeout_ms);
/* Kills what is left of the process group and frees the output. */
void gs_test_proc_free(gs_test_proc *p);
/* How many times needle occurs in text. */
int gs_test_count(const char *text, const char *needle);

/* The path of a built tool: $GS_TOOLS_DIR/name (set by ctest), else
 * <this test's directory>/../tools/name. */
const char *gs_test_tool(const char *name);
/* The same for a built example (build/examples/name); skips the case when
 * the examples are not built. */
const char *gs_test_example(const char *name);

#endif
