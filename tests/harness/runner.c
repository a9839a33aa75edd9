/* Runs every registered test in its own process group with a timeout. */
#include "gs_test.h"

#include "transport/tp.h"
#include "util/config.h"

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
    gs_test_fn fn;         /* a GS_TEST, or */
    gs_test_tp_fn tp_fn;   /* a GS_TEST_TP, run over transport */
    const char *transport; /* NULL for a GS_TEST */
    const char *file;
} test_entry;

static test_entry tests[MAX_TESTS];
static int test_count;

static void add_entry(test_entry e)
{
    if (test_count == MAX_TESTS) {
        fprintf(stderr, "harness: more than %d tests in one binary\n", MAX_TESTS);
        exit(2);
    }
    tests[test_count++] = e;
}

void gs_test_register(const char *name, gs_test_fn fn, const char *file)
{
    add_entry((test_entry){.name = name, .fn = fn, .file = file});
}

/* One entry per built transport (only GS_TEST_TRANSPORT's, if set). */
void gs_test_register_tp(const char *name, gs_test_tp_fn fn, const char *file)
{
    const char *only = getenv("GS_TEST_TRANSPORT");
    for (int i = 0; gs_tp_builtin(i); i++) {
        const char *transport = gs_tp_builtin(i)->name;
        char *full;
        if (only && *only && strcmp(only, transport) != 0)
            continue;
        if (asprintf(&full, "%s.%s", transport, name) < 0)
            abort();
        add_entry((test_entry){.name = full, .tp_fn = fn, .transport = transport, .file = file}); /* kept */
    }
}

/* Whether this machine can use the built transport (verbs: a device with
 * an active port). */
static bool transport_usable(const char *transport)
{
    const gs_config *cfg = NULL;
    for (int i = 0; gs_tp_builtin(i); i++) {
        const gs_tp_ops *ops = gs_tp_builtin(i);
        if (strcmp(ops->name, transport) == 0)
            return !ops->available || gs_config_get(&cfg) != GS_OK || ops->available(cfg);
    }
    return false;
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

/* Which cases a run or a list takes: those over transport (NULL: any,
 * "none": only those without one) whose name contains one of subs (any
 * name when there are none) and none of except. */
#define EXCEPT_MAX 16
typedef struct selection {
    const char *transport;
    char **subs;
    int nsubs;
    const char *except[EXCEPT_MAX];
    int nexcept;
} selection;

static bool selected(const test_entry *t, const selection *sel)
{
    if (sel->transport && strcmp(sel->transport, t->transport ? t->transport : "none") != 0)
        return false;
    for (int i = 0; i < sel->nexcept; i++)
        if (strstr(t->name, sel->except[i]))
            return false;
    if (sel->nsubs == 0)
        return true;
    for (int i = 0; i < sel->nsubs; i++)
        if (strstr(t->name, sel->subs[i]))
            return true;
    return false;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* In the test's own process: the case, or its skip. */
static void run_case(const test_entry *t)
{
    if (!t->tp_fn) {
        t->fn();
        return;
    }
    if (!transport_usable(t->transport))
        GS_SKIP("this machine cannot use the transport (verbs: no active port; tests/rxe-vm runs it)");
    t->tp_fn(t->transport);
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
        run_case(t);
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

static int list_tests(const selection *sel)
{
    for (int i = 0; i < test_count; i++)
        if (selected(&tests[i], sel))
            printf("%s\n", tests[i].name);
    return 0;
}

static bool has_cases_over(const char *transport)
{
    for (int i = 0; i < test_count; i++)
        if (tests[i].transport && strcmp(tests[i].transport, transport) == 0)
            return true;
    return false;
}

/* "none" if some case takes no transport, then each usable transport with cases. */
static int list_transports(void)
{
    for (int i = 0; i < test_count; i++) {
        if (!tests[i].transport) {
            printf("none\n");
            break;
        }
    }
    for (int b = 0; gs_tp_builtin(b); b++) {
        const char *transport = gs_tp_builtin(b)->name;
        if (has_cases_over(transport) && transport_usable(transport))
            printf("%s\n", transport);
    }
    return 0;
}

static int run_tests(const selection *sel)
{
    int passed = 0, failed = 0, skipped = 0;
    const char *env_timeout = getenv("GS_TEST_TIMEOUT_S");
    int timeout_s = env_timeout ? atoi(env_timeout) : 120;
    for (int i = 0; i < test_count; i++) {
        const test_entry *t = &tests[i];
        if (!selected(t, sel))
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

enum mode { MODE_RUN, MODE_LIST, MODE_TRANSPORTS };

/* [--list | --transports] [--transport NAME] [--except SUB]... [substring...];
 * -1 on a bad option. */
static int parse_args(int argc, char **argv, selection *sel)
{
    enum mode mode = MODE_RUN;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--list") == 0)
            mode = MODE_LIST;
        else if (strcmp(argv[i], "--transports") == 0)
            mode = MODE_TRANSPORTS;
        else if (strcmp(argv[i], "--transport") == 0 && i + 1 < argc)
            sel->transport = argv[++i];
        else if (strcmp(argv[i], "--except") == 0 && i + 1 < argc && sel->nexcept < EXCEPT_MAX)
            sel->except[sel->nexcept++] = argv[++i];
        else
            return -1;
    }
    sel->subs = argv + i;
    sel->nsubs = argc - i;
    return (int)mode;
}

int main(int argc, char **argv)
{
    selection sel = {0};
    int mode = parse_args(argc, argv, &sel);
    setvbuf(stdout, NULL, _IOLBF, 0);
    switch (mode) {
    case MODE_RUN: return run_tests(&sel);
    case MODE_LIST: return list_tests(&sel);
    case MODE_TRANSPORTS: return list_transports();
    default:
        fprintf(
            stderr,
            "usage: %s [--list | --transports] [--transport NAME|none] [--except SUB]... [substring...]\n",
            argv[0]);
        return 2;
    }
}
