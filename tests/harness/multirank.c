/* Forked multi-rank jobs for tests; see multirank.h. */
#include "multirank.h"

#include "bootstrap/boot.h"
#include "gs_test.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

const char *gs_test_status_text(int status, char *buf, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(buf, cap, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, cap, "status 0x%x", status);
    return buf;
}

int gs_test_free_port(void)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sin, &len) == 0)
        port = ntohs(sin.sin_port);
    if (fd >= 0)
        close(fd);
    if (port < 0)
        gs_test_fail_here(__FILE__, __LINE__, "no free port on 127.0.0.1: %s", strerror(errno));
    return port;
}

static const char *child_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

static void set_env(const char *name, const char *value)
{
    if (setenv(name, value, 1) != 0)
        gs_test_fail_here(__FILE__, __LINE__, "setenv %s failed", name);
}

static void set_env_int(const char *name, int value)
{
    char text[32];
    snprintf(text, sizeof(text), "%d", value);
    set_env(name, text);
}

/* The rank's side: environment, context, fn, exit. Never returns. */
static void run_rank(const gs_test_ranks_opts *opts, int rank, int port, const char *token,
                     int rank_timeout_ms, gs_test_rank_fn fn, void *arg)
{
    char store[64];
    gs_config cfg;
    gs_ctx *ctx = NULL;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    snprintf(store, sizeof(store), "127.0.0.1:%d", port);
    set_env_int("GS_RANK", rank);
    set_env_int("GS_WORLD_SIZE", opts->n);
    set_env_int("GS_LOCAL_RANK", rank);
    set_env_int("GS_TIMEOUT_MS", rank_timeout_ms);
    set_env("GS_STORE", store);
    set_env("GS_STORE_EXTERNAL", opts->rank0_serves ? "0" : "1");
    set_env("GS_JOB_TOKEN", token);
    for (const char *const *e = opts->env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[128];
        if (!eq || (size_t)(eq - *e) >= sizeof(name))
            gs_test_fail_here(__FILE__, __LINE__, "bad env entry '%s': expected NAME=VALUE", *e);
        snprintf(name, sizeof(name), "%.*s", (int)(eq - *e), *e);
        set_env(name, eq + 1);
    }
    if (opts->host_of) {
        char host[48];
        snprintf(host, sizeof(host), "gs-test-host-%d", opts->host_of[rank]);
        set_env("GS_HOST_ID", host);
    }
    gs_log_set_rank(rank);
    if (!opts->no_ctx) {
        gs_status st = gs_config_parse(&cfg, child_getenv, NULL);
        if (st == GS_OK)
            st = gs_log_configure(cfg.log_level, cfg.log_subsys, cfg.log_file);
        if (st == GS_OK)
            st = gs_boot_ctx_create(&cfg, child_getenv, NULL, &ctx);
        if (st != GS_OK)
            gs_test_fail_here(__FILE__, __LINE__, "rank %d: context creation failed: %s", rank,
                              gs_last_error());
    }
    fn(ctx, rank, arg);
    if (ctx && gs_ctx_destroy(ctx) != GS_OK)
        gs_test_fail_here(__FILE__, __LINE__, "rank %d: gs_ctx_destroy failed: %s", rank, gs_last_error());
    fflush(NULL);
    exit(0);
}

static void kill_all(const pid_t *pids, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (pids[r] > 0)
            kill(pids[r], sig);
}

/* Reaps every rank, killing those alive at the deadline. */
static void reap_all(pid_t *pids, int n, int *status_p, int timeout_ms)
{
    uint64_t deadline = gs_deadline_after_ms(timeout_ms);
    int left = n;

    while (left > 0) {
        for (int r = 0; r < n; r++) {
            if (pids[r] <= 0 || waitpid(pids[r], &status_p[r], WNOHANG) != pids[r])
                continue;
            pids[r] = 0;
            left--;
        }
        if (left == 0)
            break;
        if (gs_deadline_passed(deadline)) {
            for (int r = 0; r < n; r++)
                if (pids[r] > 0)
                    fprintf(stderr, "  multirank: rank %d still running after %d ms; killing it\n", r,
                            timeout_ms);
            kill_all(pids, n, SIGKILL);
            deadline = UINT64_MAX;
        }
        usleep(2000);
    }
}

int gs_test_run_ranks_opts(const gs_test_ranks_opts *opts, gs_test_rank_fn fn, void *arg, int *status_p)
{
    static gs_store_server *server; /* static: still reachable in the ranks at their leak check */
    char token[80];
    pid_t pids[GS_TEST_RANKS_MAX] = {0};
    int port, ok = 0;
    int rank_timeout_ms = opts->rank_timeout_ms > 0     ? opts->rank_timeout_ms
                          : opts->timeout_ms / 2 > 1000 ? opts->timeout_ms / 2
                                                        : 1000;

    if (opts->n < 1 || opts->n > GS_TEST_RANKS_MAX)
        gs_test_fail_here(__FILE__, __LINE__, "multirank: %d ranks; expected 1 to %d", opts->n,
                          GS_TEST_RANKS_MAX);
    if (opts->rank0_serves) {
        if (gs_boot_token_generate(token, sizeof(token)) != GS_OK)
            gs_test_fail_here(__FILE__, __LINE__, "multirank: %s", gs_last_error());
        port = gs_test_free_port();
    } else { /* the launcher's store, through the public calls (a fresh token drawn) */
        gs_store_server_params params = GS_STORE_SERVER_PARAMS_INIT;
        params.world_size = opts->n;
        params.timeout_ms = rank_timeout_ms;
        if (gs_store_server_create(&params, &server) != GS_OK)
            gs_test_fail_here(__FILE__, __LINE__, "multirank: %s", gs_last_error());
        snprintf(token, sizeof(token), "%s", gs_store_server_token(server));
        port = gs_store_server_port(server);
    }
    fflush(NULL);
    for (int r = 0; r < opts->n; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            run_rank(opts, r, port, token, rank_timeout_ms, fn, arg);
        if (pids[r] < 0) {
            fprintf(stderr, "  multirank: fork of rank %d failed: %s\n", r, strerror(errno));
            kill_all(pids, r, SIGKILL);
            for (int k = 0; k < r; k++)
                waitpid(pids[k], NULL, 0);
            gs_store_server_destroy(server, 0);
            server = NULL;
            gs_test_fail_here(__FILE__, __LINE__, "multirank: fork failed");
        }
    }
    if (server && gs_store_server_start(server) != GS_OK) {
        kill_all(pids, opts->n, SIGKILL);
        gs_test_fail_here(__FILE__, __LINE__, "multirank: %s", gs_last_error());
    }
    reap_all(pids, opts->n, status_p, opts->timeout_ms);
    gs_store_server_destroy(server, 0);
    server = NULL;
    for (int r = 0; r < opts->n; r++)
        ok += WIFEXITED(status_p[r]) && WEXITSTATUS(status_p[r]) == 0;
    return ok;
}

void gs_test_run_ranks(int n, gs_test_rank_fn fn, void *arg, int timeout_ms)
{
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = timeout_ms};
    int status[GS_TEST_RANKS_MAX];
    char text[64];

    if (n < 1 || n > GS_TEST_RANKS_MAX)
        gs_test_fail_here(__FILE__, __LINE__, "multirank: %d ranks; expected 1 to %d", n, GS_TEST_RANKS_MAX);
    if (gs_test_run_ranks_opts(&opts, fn, arg, status) == n)
        return;
    for (int r = 0; r < n; r++)
        fprintf(stderr, "  multirank: rank %d: %s\n", r, gs_test_status_text(status[r], text, sizeof(text)));
    gs_test_fail_here(__FILE__, __LINE__, "multirank: not every one of %d ranks exited 0", n);
}
