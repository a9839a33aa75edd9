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

/* ---- span mode: one job over several machines ----------------------------
 * GS_TEST_SPAN=I/G@ADDR:PORT (with GS_TEST_SPAN_TOKEN) runs each job over G
 * machines that all run the same test binary with the same cases: this one
 * is machine I, rank r lives on machine r mod G, and machine 0 serves the
 * store at ADDR (one of its addresses) on PORT + k for the k-th job of the
 * process, so the machines meet job by job. The rxe guests' two-guest step
 * uses it (tests/rxe-vm/two.sh). A job's ranks on other machines are
 * reported as exit 0 here: their machine reports them. Cases that name
 * emulated hosts or let rank 0 serve the store do not run in span mode. */
typedef struct span {
    bool on;
    int index, machines, port;
    char addr[64], token[80];
    unsigned jobs;
} span;

static span *span_get(void)
{
    static span sp;
    static bool parsed;
    if (parsed)
        return sp.on ? &sp : NULL;
    parsed = true;
    const char *v = getenv("GS_TEST_SPAN"), *tok = getenv("GS_TEST_SPAN_TOKEN");
    if (!v || !*v)
        return NULL;
    int used = 0;
    if (sscanf(v, "%d/%d@%63[^:]:%d%n", &sp.index, &sp.machines, sp.addr, &sp.port, &used) != 4 ||
        v[used] != '\0' || sp.machines < 1 || sp.index < 0 || sp.index >= sp.machines || sp.port < 1 ||
        sp.port > 65000)
        gs_test_fail_here(__FILE__, __LINE__, "GS_TEST_SPAN='%s': expected I/G@ADDR:PORT", v);
    if (!tok || strlen(tok) < 16 || strlen(tok) >= sizeof(sp.token) - 16)
        gs_test_fail_here(__FILE__, __LINE__, "GS_TEST_SPAN needs GS_TEST_SPAN_TOKEN (16 to 63 characters)");
    snprintf(sp.token, sizeof(sp.token), "%s", tok);
    sp.on = true;
    return &sp;
}

static bool span_here(const span *sp, int rank)
{
    return !sp || rank % sp->machines == sp->index;
}

static const char *child_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

gs_ctx *gs_test_own_ctx(void)
{
    gs_config cfg;
    gs_ctx *ctx = NULL;
    gs_status st = gs_config_parse(&cfg, child_getenv, NULL);
    if (st == GS_OK)
        st = gs_log_configure(cfg.log_level, cfg.log_subsys, cfg.log_file);
    if (st == GS_OK)
        st = gs_boot_ctx_create(&cfg, child_getenv, NULL, &ctx);
    if (st != GS_OK)
        gs_test_fail_here(__FILE__, __LINE__, "rank %s: context creation failed: %s",
                          getenv("GS_RANK") ? getenv("GS_RANK") : "?", gs_last_error());
    return ctx;
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
    char store[96];
    gs_ctx *ctx = NULL;
    const span *sp = span_get();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    snprintf(store, sizeof(store), "%s:%d", sp ? sp->addr : "127.0.0.1", port);
    set_env_int("GS_RANK", rank);
    set_env_int("GS_WORLD_SIZE", opts->n);
    set_env_int("GS_LOCAL_RANK", sp ? rank / sp->machines : rank);
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
    if (!opts->no_ctx)
        ctx = gs_test_own_ctx();
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
    int left = 0;

    for (int r = 0; r < n; r++) /* span mode forks only this machine's ranks */
        left += pids[r] > 0;

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
    char token[96];
    pid_t pids[GS_TEST_RANKS_MAX] = {0};
    int port = 0, ok = 0;
    int rank_timeout_ms = opts->rank_timeout_ms > 0     ? opts->rank_timeout_ms
                          : opts->timeout_ms / 2 > 1000 ? opts->timeout_ms / 2
                                                        : 1000;
    span *sp = span_get();

    if (opts->n < 1 || opts->n > GS_TEST_RANKS_MAX)
        gs_test_fail_here(__FILE__, __LINE__, "multirank: %d ranks; expected 1 to %d", opts->n,
                          GS_TEST_RANKS_MAX);
    if (sp && (opts->rank0_serves || opts->host_of))
        gs_test_fail_here(__FILE__, __LINE__,
                          "multirank: a case with %s cannot run in span mode (GS_TEST_SPAN)",
                          opts->rank0_serves ? "rank 0 serving the store" : "emulated hosts");
    if (sp) { /* the same job number, port and token on every machine */
        port = sp->port + (int)(sp->jobs % 500);
        snprintf(token, sizeof(token), "%s-%u", sp->token, sp->jobs++);
    }
    if (opts->rank0_serves) {
        if (gs_boot_token_generate(token, sizeof(token)) != GS_OK)
            gs_test_fail_here(__FILE__, __LINE__, "multirank: %s", gs_last_error());
        port = gs_test_free_port();
    } else if (!sp || sp->index == 0) { /* the launcher's store, through the public calls */
        gs_store_server_params params = GS_STORE_SERVER_PARAMS_INIT;
        params.host = sp ? sp->addr : NULL;
        params.port = port;
        params.world_size = opts->n;
        params.job_token = sp ? token : NULL; /* NULL: a fresh one drawn */
        params.timeout_ms = rank_timeout_ms;
        if (gs_store_server_create(&params, &server) != GS_OK)
            gs_test_fail_here(__FILE__, __LINE__, "multirank: %s", gs_last_error());
        snprintf(token, sizeof(token), "%s", gs_store_server_token(server));
        port = gs_store_server_port(server);
    }
    fflush(NULL);
    for (int r = 0; r < opts->n; r++) {
        status_p[r] = 0; /* a rank of another machine (span mode): that machine reports it */
        if (!span_here(sp, r))
            continue;
        pids[r] = fork();
        if (pids[r] == 0)
            run_rank(opts, r, port, token, rank_timeout_ms, fn, arg);
        if (pids[r] < 0) {
            fprintf(stderr, "  multirank: fork of rank %d failed: %s\n", r, strerror(errno));
            kill_all(pids, r, SIGKILL);
            for (int k = 0; k < r; k++)
                if (pids[k] > 0)
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
    /* span mode: the other machines' ranks may still be leaving the store */
    gs_store_server_destroy(server, sp ? rank_timeout_ms : 0);
    server = NULL;
    for (int r = 0; r < opts->n; r++)
        ok += WIFEXITED(status_p[r]) && WEXITSTATUS(status_p[r]) == 0;
    return ok;
}

void gs_test_run_ranks_ok(const gs_test_ranks_opts *opts, gs_test_rank_fn fn, void *arg)
{
    int status[GS_TEST_RANKS_MAX], n = opts->n;
    char text[64];

    if (n < 1 || n > GS_TEST_RANKS_MAX)
        gs_test_fail_here(__FILE__, __LINE__, "multirank: %d ranks; expected 1 to %d", n, GS_TEST_RANKS_MAX);
    if (gs_test_run_ranks_opts(opts, fn, arg, status) == n)
        return;
    for (int r = 0; r < n; r++)
        fprintf(stderr, "  multirank: rank %d: %s\n", r, gs_test_status_text(status[r], text, sizeof(text)));
    gs_test_fail_here(__FILE__, __LINE__, "multirank: not every one of %d ranks exited 0", n);
}

void gs_test_run_ranks(int n, gs_test_rank_fn fn, void *arg, int timeout_ms)
{
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = timeout_ms};
    gs_test_run_ranks_ok(&opts, fn, arg);
}
