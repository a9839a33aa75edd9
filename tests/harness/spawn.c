/* Spawning programs from tests; see spawn.h. */
#include "spawn.h"

#include "gs_test.h"
#include "util/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

void gs_test_spawn(gs_test_proc *p, char *const argv[], const char *const *env)
{
    int out[2], err[2];
    *p = (gs_test_proc){.out_fd = -1, .err_fd = -1};
    p->out = calloc(1, 1);
    p->err = calloc(1, 1);
    if (!p->out || !p->err || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
        gs_test_fail_here(__FILE__, __LINE__, "spawn %s: %s", argv[0], strerror(errno));
    fflush(NULL);
    p->pid = fork();
    if (p->pid == 0) {
        int null_fd = open("/dev/null", O_RDONLY);
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(null_fd, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        unsetenv("GS_TOOLS_DIR"); /* the harness's, not the program's: no unknown-variable warning */
        unsetenv("GS_SOURCE_DIR");
        for (const char *const *e = env; e && *e; e++)
            putenv((char *)*e);
        execvp(argv[0], argv);
        dprintf(2, "spawn: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (p->pid < 0)
        gs_test_fail_here(__FILE__, __LINE__, "spawn %s: fork: %s", argv[0], strerror(errno));
    setpgid(p->pid, p->pid);
    close(out[1]);
    close(err[1]);
    p->out_fd = out[0];
    p->err_fd = err[0];
}

static void append(int *fd, char **text, size_t *len)
{
    char buf[4096];
    ssize_t n = read(*fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
        return;
    if (n <= 0) {
        close(*fd);
        *fd = -1;
        return;
    }
    char *grown = realloc(*text, *len + (size_t)n + 1);
    if (!grown)
        gs_test_fail_here(__FILE__, __LINE__, "spawn: out of memory for output");
    memcpy(grown + *len, buf, (size_t)n);
    *len += (size_t)n;
    grown[*len] = '\0';
    *text = grown;
}

/* One round: reads what is there (up to wait_ms), reaps if exited. */
static void collect(gs_test_proc *p, int wait_ms)
{
    struct pollfd pfds[2] = {{.fd = p->out_fd, .events = POLLIN}, {.fd = p->err_fd, .events = POLLIN}};
    if (p->out_fd >= 0 || p->err_fd >= 0) {
        if (poll(pfds, 2, wait_ms) > 0) {
            if (pfds[0].revents)
                append(&p->out_fd, &p->out, &p->out_len);
            if (pfds[1].revents)
                append(&p->err_fd, &p->err, &p->err_len);
        }
    } else if (!p->done) {
        usleep((useconds_t)(wait_ms < 10 ? wait_ms : 10) * 1000u);
    }
    if (!p->done && waitpid(p->pid, &p->status, WNOHANG) == p->pid)
        p->done = true;
}

void gs_test_proc_wait(gs_test_proc *p, int timeout_ms)
{
    uint64_t deadline = gs_deadline_after_ms(timeout_ms);
    while (!p->done || p->out_fd >= 0 || p->err_fd >= 0) {
        if (gs_deadline_passed(deadline)) {
            kill(-p->pid, SIGKILL);
            fprintf(stderr, "--- stdout so far:\n%s\n--- stderr so far:\n%s\n", p->out, p->err);
            gs_test_fail_here(__FILE__, __LINE__, "spawned process %d still running after %d ms; killed",
                              (int)p->pid, timeout_ms);
        }
        collect(p, gs_deadline_left_ms(deadline) < 50 ? gs_deadline_left_ms(deadline) : 50);
    }
}

int gs_test_count(const char *text, const char *needle)
{
    int count = 0;
    for (const char *at = strstr(text, needle); at; at = strstr(at + strlen(needle), needle))
        count++;
    return count;
}

bool gs_test_proc_wait_output(gs_test_proc *p, const char *needle, int count, int timeout_ms)
{
    uint64_t deadline = gs_deadline_after_ms(timeout_ms);
    while (gs_test_count(p->out, needle) < count) {
        if (gs_deadline_passed(deadline) || (p->done && p->out_fd < 0))
            return false;
        collect(p, 50);
    }
    return true;
}

void gs_test_proc_free(gs_test_proc *p)
{
    if (p->pid > 0) {
        kill(-p->pid, SIGKILL);
        if (!p->done)
            waitpid(p->pid, &p->status, 0);
    }
    if (p->out_fd >= 0)
        close(p->out_fd);
    if (p->err_fd >= 0)
        close(p->err_fd);
    free(p->out);
    free(p->err);
    *p = (gs_test_proc){.out_fd = -1, .err_fd = -1};
}

const char *gs_test_tool(const char *name)
{
    static char path[PATH_MAX + 64];
    const char *dir = getenv("GS_TOOLS_DIR");
    char self[PATH_MAX];
    ssize_t n;

    if (dir && *dir) {
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        return path;
    }
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        gs_test_fail_here(__FILE__, __LINE__, "GS_TOOLS_DIR is not set and /proc/self/exe is unreadable");
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(path, sizeof(path), "%.*s/../tools/%s", (int)(sizeof(path) - 64), self, name);
    return path;
}

const char *gs_test_example(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "../examples/%s", name);
    const char *path = gs_test_tool(rel);
    if (access(path, X_OK) != 0) {
        fprintf(stderr, "  %s is missing\n", path);
        GS_SKIP("examples not built (configure with -DGS_BUILD_EXAMPLES=ON)");
    }
    return path;
}
