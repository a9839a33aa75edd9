/* Runs every registered test in its own process group with a timeout. */
#include "gs_test.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 512
#define SKIP_EXIT 77

typedef struct test_entry {
    const char *name;
    gs_test_fn fn;
    const char *file;
} test_entry;

static test_entry tests[MAX_TESTS];
static int test_count;

void gs_test_register(const char *name, gs_test_fn fn, const char *file)
{
    if (test_count == MAX_TESTS) {
        fprintf(stderr, "harness: more than %d tests in one binary\n", MAX_TESTS);
        exit(2);
    }
    tests[test_count++] = (test_entry){name, fn, file};
}

void gs_test_fail_here(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "  FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(1);
}

void gs_test_skip_here(const char *why)
{
    fprintf(stderr, "  SKIP: %s\n", why);
    fflush(stderr);
    exit(SKIP_EXIT);
}

static int selected(const char *name, int argc, char **argv)
{
    if (argc < 2)
        return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i]))
            return 1;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Returns 0 pass, 1 fail, 2 skip. */
static int run_one(const test_entry *t, int timeout_s)
{
    double start = now_s();
    int status = 0, result;
    pid_t pid = fork();
    if (pid < 0) {
        perror("harness: fork");
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        alarm(0);
        t->fn();
        fflush(NULL);
        exit(0);
    }
    setpgid(pid, pid);
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            perror("harness: waitpid");
            return 1;
        }
        if (now_s() - start > timeout_s) {
            fprintf(stderr, "  FAIL: timed out after %d s; killing its process group\n", timeout_s);
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 1;
        }
        usleep(2000);
    }
    kill(-pid, SIGKILL); /* anything the test left behind */
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        result = 0;
    else if (WIFEXITED(status) && WEXITSTATUS(status) == SKIP_EXIT)
        result = 2;
    else {
        if (WIFSIGNALED(status))
            fprintf(stderr, "  FAIL: killed by signal %d (%s)\n", WTERMSIG(status),
                    strsignal(WTERMSIG(status)));
        else
            fprintf(stderr, "  FAIL: exit status %d\n", WEXITSTATUS(status));
        result = 1;
    }
    fprintf(stderr, "  (%.2f s)\n", now_s() - start);
    return result;
}

/* --list [substring...]: the names a run would run, one a line, none run. */
static int list_tests(int argc, char **argv)
{
    for (int i = 0; i < test_count; i++)
        if (selected(tests[i].name, argc, argv))
            printf("%s\n", tests[i].name);
    return 0;
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    const char *env_timeout = getenv("GS_TEST_TIMEOUT_S");
    int timeout_s = env_timeout ? atoi(env_timeout) : 120;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "--list") == 0)
        return list_tests(argc - 1, argv + 1);
    for (int i = 0; i < test_count; i++) {
        const test_entry *t = &tests[i];
        if (!selected(t->name, argc, argv))
            continue;
        fprintf(stderr, "[ RUN  ] %s\n", t->name);
        int r = run_one(t, timeout_s);
        fprintf(stderr, "[ %s ] %s\n", r == 0 ? " OK " : r == 1 ? "FAIL" : "SKIP", t->name);
        passed += r == 0;
        failed += r == 1;
        skipped += r == 2;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
