/*
 * gsrun: start N local ranks of a gradsync job.
 *
 *   gsrun -n N [--transport T] [--timeout-ms MS] [--grace-ms MS] [--elastic] [--restarts K] [--] prog args...
 *
 * gsrun serves the job's store on 127.0.0.1 (an ephemeral port) with a fresh
 * random GS_JOB_TOKEN, and gives every rank GS_RANK, GS_WORLD_SIZE,
 * GS_LOCAL_RANK, GS_STORE, GS_STORE_EXTERNAL=1, GS_JOB_TOKEN (and
 * GS_TRANSPORT, GS_TIMEOUT_MS when asked), and torch.distributed's env://
 * variables as torchrun sets them: RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT, a port that was
 * free when gsrun started (rank 0's TCPStore listens there; gradsync's own
 * ranks keep using GS_STORE). Each line a rank writes to stdout
 * or stderr comes out on gsrun's stdout or stderr prefixed with "[rank] ".
 *
 * Each rank runs in its own process group with stdin from /dev/null, so a
 * Ctrl-C reaches gsrun alone, which forwards SIGINT (and SIGTERM, SIGHUP,
 * SIGQUIT) to every rank's group; a second one kills them. When a rank fails
 * (non-zero exit or a signal), gsrun sends SIGTERM to the others' groups,
 * SIGKILL after the grace period, and exits with the failed rank's status
 * (128 + signal for a signal). With --elastic a rank killed by a signal is
 * only reported: the others go on (they shrink their communicators,
 * docs/elastic.md), gsrun's store keeps serving them, and gsrun exits 0 if
 * every other rank exits 0. With --restarts K (which implies --elastic) a
 * rank that fails (a signal or a non-zero exit) is started again in its
 * place, with GS_REJOIN=1, as a joiner (docs/elastic.md), up to K times in
 * all; a restarted rank still waiting to join when every other rank has
 * exited 0 is stopped after the grace period, its status not counted.
 * Every rank's group is killed once the rank
 * is gone, and every rank dies with gsrun (PR_SET_PDEATHSIG): no process of
 * the job outlives it.
 */
#include "gradsync.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANKS_MAX      1024
#define LINE_MAX_BYTES 16384
#define PIPE_DRAIN_MS  2000 /* after the last rank: output of leftover writers */

extern char **environ;

typedef struct line_buf {
    int fd;     /* read end of the rank's pipe; -1 once closed */
    int out_fd; /* where prefixed lines go: 1 or 2 */
    size_t len;
    char data[LINE_MAX_BYTES];
} line_buf;

typedef struct rank_proc {
    pid_t pid; /* also its process group; 0 before start */
    bool running;
    int starts;     /* 1 + its restarts */
    bool abandoned; /* a restart stopped because the job ended without it */
    int status;     /* waitpid status once reaped */
    line_buf out, err;
} rank_proc;

typedef struct run_opts {
    int n;
    const char *transport;
    long timeout_ms; /* 0: the ranks' own GS_TIMEOUT_MS */
    long grace_ms;
    bool elastic;  /* a rank killed by a signal does not stop the others */
    long restarts; /* failed ranks started again as joiners, in all */
    char **argv;
} run_opts;

typedef struct job {
    run_opts opts;
    rank_proc *ranks;
    gs_store_server *server;
    char store[64];
    int master_port; /* torch.distributed's MASTER_PORT */
    char token[80];
    sigset_t orig_mask;
    struct rlimit orig_nofile;
    bool have_orig_nofile;
    int sigfd;
    int failed_rank;        /* the first rank that failed, -1 if none */
    int lost;               /* --elastic: ranks killed by a signal, the others going on */
    long restarted;         /* --restarts: restarts so far */
    uint64_t abandon_at_ns; /* --restarts: when to stop the restarts still waiting (0: not yet) */
    int interrupted;        /* the signal gsrun got, 0 if none */
    uint64_t kill_at_ns;    /* SIGKILL for ranks still running then; 0 if not stopping */
} job;

/* ---- deadlines (gs_clock_ns; UINT64_MAX: none) ---------------------------- */

static uint64_t after_ms(long ms)
{
    return gs_clock_ns() + (uint64_t)ms * 1000000u;
}

static bool passed(uint64_t at_ns)
{
    return at_ns != UINT64_MAX && gs_clock_ns() >= at_ns;
}

/* Milliseconds until at_ns for poll(): -1 for none, at least 0. */
static int ms_until(uint64_t at_ns)
{
    uint64_t now = gs_clock_ns(), ms;
    if (at_ns == UINT64_MAX)
        return -1;
    if (now >= at_ns)
        return 0;
    ms = (at_ns - now + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: gsrun -n N [--transport auto|shm|tcp|verbs] [--timeout-ms MS] [--grace-ms MS] [--elastic] "
        "[--restarts K] [--] prog [args...]\n"
        "  -n, --np N        number of local ranks to start (1 to %d)\n"
        "  --transport T     sets GS_TRANSPORT for every rank\n"
        "  --timeout-ms MS   sets GS_TIMEOUT_MS for every rank (deadline of every wait)\n"
        "  --grace-ms MS     after a rank fails, time the others get between SIGTERM and SIGKILL "
        "(default 2000)\n"
        "  --elastic         a rank killed by a signal does not stop the others (they shrink and go on)\n"
        "  --restarts K      start a failed rank again as a joiner (GS_REJOIN=1), up to K times in all;\n"
        "                    implies --elastic\n"
        "  -h, --help        this text;  --version  the gradsync version\n"
        "Every output line is prefixed with \"[rank] \"; gsrun exits with the status of the first rank "
        "that failed (128+signal if killed), else 0.\n",
        RANKS_MAX);
}

static bool parse_long(const char *text, long min, long max, long *value_p)
{
    char *end;
    long v;
    errno = 0;
    v = text ? strtol(text, &end, 10) : 0;
    if (!text || errno || end == text || *end || v < min || v > max)
        return false;
    *value_p = v;
    return true;
}

/* Returns -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, run_opts *o)
{
    long n = 0;
    int i;
    *o = (run_opts){.grace_ms = 2000};
    for (i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-')
            break;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--elastic") == 0) { /* the one option without a value */
            o->elastic = true;
            i--;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            printf("gsrun (gradsync) %s\n", gs_version());
            return 0;
        }
        if (strcmp(a, "-n") == 0 || strcmp(a, "--np") == 0 || strcmp(a, "-np") == 0) {
            if (!parse_long(v, 1, RANKS_MAX, &n)) {
                fprintf(stderr, "gsrun: %s needs a number of ranks from 1 to %d, got '%s'\n", a, RANKS_MAX,
                        v ? v : "");
                return 2;
            }
        } else if (strcmp(a, "--transport") == 0) {
            if (!v || (strcmp(v, "auto") && strcmp(v, "shm") && strcmp(v, "tcp") && strcmp(v, "verbs"))) {
                fprintf(stderr, "gsrun: --transport needs auto, shm, tcp or verbs, got '%s'\n", v ? v : "");
                return 2;
            }
            o->transport = v;
        } else if (strcmp(a, "--restarts") == 0) {
            if (!parse_long(v, 0, INT_MAX, &o->restarts)) {
                fprintf(stderr, "gsrun: --restarts needs a number of restarts, got '%s'\n", v ? v : "");
                return 2;
            }
            o->elastic = o->elastic || o->restarts > 0;
        } else if (strcmp(a, "--timeout-ms") == 0 || strcmp(a, "--grace-ms") == 0) {
            long *dst = a[2] == 't' ? &o->timeout_ms : &o->grace_ms;
            if (!parse_long(v, a[2] == 't' ? 1 : 0, INT_MAX, dst)) {
                fprintf(stderr, "gsrun: %s needs milliseconds, got '%s'\n", a, v ? v : "");
                return 2;
            }
        } else {
            fprintf(stderr, "gsrun: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (n == 0 || i >= argc) {
        fprintf(stderr, "gsrun: %s\n", n == 0 ? "-n N is required" : "no program to run");
        usage(stderr);
        return 2;
    }
    o->n = (int)n;
    o->argv = argv + i;
    return -1;
}

/* ---- output ------------------------------------------------------------- */

static void write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* our own output is gone (EPIPE): keep draining the ranks */
        p += n;
        len -= (size_t)n;
    }
}

static void emit_line(int rank, const line_buf *b, const char *line, size_t len)
{
    char prefix[24];
    int plen = snprintf(prefix, sizeof(prefix), "[%d] ", rank);
    char *out = malloc((size_t)plen + len + 1);
    if (!out)
        return;
    memcpy(out, prefix, (size_t)plen);
    memcpy(out + plen, line, len);
    out[(size_t)plen + len] = '\n';
    write_all(b->out_fd, out, (size_t)plen + len + 1); /* one write per line keeps lines whole */
    free(out);
}

/* Emits every complete line; with flush, the partial rest too. */
static void emit_lines(int rank, line_buf *b, bool flush)
{
    size_t start = 0;
    for (size_t i = 0; i < b->len; i++) {
        if (b->data[i] == '\n') {
            emit_line(rank, b, b->data + start, i - start);
            start = i + 1;
        }
    }
    if ((flush || (start == 0 && b->len == sizeof(b->data))) && start < b->len) {
        emit_line(rank, b, b->data + start, b->len - start);
        start = b->len;
    }
    memmove(b->data, b->data + start, b->len - start);
    b->len -= start;
}

/* One read of the rank's pipe; false when nothing more is there now. */
static bool pump(int rank, line_buf *b)
{
    ssize_t n = read(b->fd, b->data + b->len, sizeof(b->data) - b->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return false;
    if (n <= 0) {
        emit_lines(rank, b, true);
        close(b->fd);
        b->fd = -1;
        return false;
    }
    b->len += (size_t)n;
    emit_lines(rank, b, false);
    return true;
}

/* ---- ranks -------------------------------------------------------------- */

static bool overridden(const char *entry, const job *j)
{
    static const char *const ours[] = {
        "GS_RANK=",      "GS_WORLD_SIZE=", "GS_LOCAL_RANK=", "GS_STORE=",   "GS_STORE_EXTERNAL=",
        "GS_JOB_TOKEN=", "RANK=",          "WORLD_SIZE=",    "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
        "MASTER_ADDR=",  "MASTER_PORT=",   "GS_REJOIN="};
    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (strncmp(entry, ours[i], strlen(ours[i])) == 0)
            return true;
    return (j->opts.transport && strncmp(entry, "GS_TRANSPORT=", 13) == 0) ||
           (j->opts.timeout_ms && strncmp(entry, "GS_TIMEOUT_MS=", 14) == 0);
}

static void free_env(char **env)
{
    for (char **e = env; e && *e; e++)
        free(*e);
    free(env);
}

static bool add_env(char **env, size_t *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool add_env(char **env, size_t *k, const char *fmt, ...)
{
    va_list ap;
    int rc;
    va_start(ap, fmt);
    rc = vasprintf(&env[*k], fmt, ap);
    va_end(ap);
    if (rc < 0) {
        env[*k] = NULL;
        return false;
    }
    (*k)++;
    return true;
}

/* The rank's environment: ours plus everything else of gsrun's. */
static char **rank_env(const job *j, int rank)
{
    size_t count = 0, k = 0;
    char **env;
    bool ok = true;

    while (environ[count])
        count++;
    env = calloc(count + 16, sizeof(*env));
    if (!env)
        return NULL;
    for (size_t i = 0; i < count && ok; i++)
        if (!overridden(environ[i], j))
            ok = add_env(env, &k, "%s", environ[i]);
    ok = ok && add_env(env, &k, "GS_RANK=%d", rank) && add_env(env, &k, "GS_WORLD_SIZE=%d", j->opts.n) &&
         add_env(env, &k, "GS_LOCAL_RANK=%d", rank) && add_env(env, &k, "GS_STORE=%s", j->store) &&
         add_env(env, &k, "GS_STORE_EXTERNAL=1") && add_env(env, &k, "GS_JOB_TOKEN=%s", j->token);
    /* torch.distributed's env:// (init_process_group without init_method), as torchrun sets it */
    ok = ok && add_env(env, &k, "RANK=%d", rank) && add_env(env, &k, "WORLD_SIZE=%d", j->opts.n) &&
         add_env(env, &k, "LOCAL_RANK=%d", rank) && add_env(env, &k, "LOCAL_WORLD_SIZE=%d", j->opts.n) &&
         add_env(env, &k, "MASTER_ADDR=127.0.0.1") && add_env(env, &k, "MASTER_PORT=%d", j->master_port);
    if (ok && j->opts.transport)
        ok = add_env(env, &k, "GS_TRANSPORT=%s", j->opts.transport);
    if (ok && j->opts.timeout_ms)
        ok = add_env(env, &k, "GS_TIMEOUT_MS=%ld", j->opts.timeout_ms);
    if (ok && j->ranks[rank].starts > 0) /* a restart: it takes the lost rank's place and joins */
        ok = add_env(env, &k, "GS_REJOIN=1");
    if (!ok) {
        free_env(env);
        return NULL;
    }
    return env;
}

/* In the child: its own group, dies with gsrun, pipes as stdout/stderr. */
static void exec_rank(const job *j, char **env, int out_w, int err_w, pid_t gsrun_pid)
{
    int null_fd = open("/dev/null", O_RDONLY);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != gsrun_pid)
        _exit(127); /* gsrun died before prctl took effect */
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
        _exit(127);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &j->orig_mask, NULL);
    if (j->have_orig_nofile)
        setrlimit(RLIMIT_NOFILE, &j->orig_nofile);
    execvpe(j->opts.argv[0], j->opts.argv, env);
    dprintf(2, "gsrun: cannot run %s: %s\n", j->opts.argv[0], strerror(errno));
    _exit(127);
}

static int start_rank(job *j, int rank)
{
    rank_proc *r = &j->ranks[rank];
    int out[2] = {-1, -1}, err[2] = {-1, -1}, rc = -1;
    char **env = rank_env(j, rank);

    if (!env || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "gsrun: cannot set up rank %d: %s\n", rank, strerror(errno));
        goto out;
    }
    pid_t self = getpid();
    r->pid = fork();
    if (r->pid == 0)
        exec_rank(j, env, out[1], err[1], self);
    if (r->pid < 0) {
        fprintf(stderr, "gsrun: fork of rank %d failed: %s\n", rank, strerror(errno));
        r->pid = 0;
        goto out;
    }
    setpgid(r->pid, r->pid); /* also in the child: whichever runs first */
    r->running = true;
    r->starts++;
    r->out = (line_buf){.fd = out[0], .out_fd = 1};
    r->err = (line_buf){.fd = err[0], .out_fd = 2};
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    out[0] = err[0] = -1;
    rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0)
            close(out[i]);
        if (err[i] >= 0)
            close(err[i]);
    }
    free_env(env);
    return rc;
}

/* ---- stopping ----------------------------------------------------------- */

static void signal_ranks(job *j, int sig)
{
    for (int r = 0; r < j->opts.n; r++)
        if (j->ranks[r].running)
            kill(-j->ranks[r].pid, sig);
}

static void stop_ranks(job *j, int sig)
{
    signal_ranks(j, sig);
    if (!j->kill_at_ns)
        j->kill_at_ns = after_ms(j->opts.grace_ms);
}

static int exit_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

static bool any_restart_running(const job *j);

/* The rest of a dead rank's output, then its pipes closed (a restart gets
 * new ones). */
static void drain(int rank, line_buf *b)
{
    while (b->fd >= 0 && pump(rank, b))
        ;
    if (b->fd >= 0) { /* a writer escaped the rank's group: its pipe is the old rank's, closed */
        emit_lines(rank, b, true);
        close(b->fd);
        b->fd = -1;
    }
}

/* --restarts: the rank failed; starts it again as a joiner if restarts are
 * left. The store's thread runs by now: the child only calls what is safe
 * between fork and exec (exec_rank). */
static bool restart(job *j, int rank, int status)
{
    if (j->restarted >= j->opts.restarts || j->interrupted)
        return false;
    j->restarted++;
    fprintf(stderr, "gsrun: rank %d %s %d; restarting it as a joiner (restart %ld of %ld)\n", rank,
            WIFSIGNALED(status) ? "was killed by signal" : "exited with status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), j->restarted, j->opts.restarts);
    drain(rank, &j->ranks[rank].out);
    drain(rank, &j->ranks[rank].err);
    return start_rank(j, rank) == 0;
}

/* --restarts: once every rank never restarted has exited 0, a restarted
 * rank still running may wait for a grow point that never comes: it gets
 * the grace period, then is stopped. */
static void maybe_abandon(job *j)
{
    for (int r = 0; r < j->opts.n; r++)
        if (j->ranks[r].running && j->ranks[r].starts == 1)
            return;
    if (!j->abandon_at_ns && any_restart_running(j))
        j->abandon_at_ns = after_ms(j->opts.grace_ms);
}

static void rank_ended(job *j, int rank, int status)
{
    rank_proc *r = &j->ranks[rank];
    r->running = false;
    r->status = status;
    if (r->abandoned)
        return;
    if (exit_code(status) == 0 || j->failed_rank >= 0) {
        if (j->opts.restarts && j->failed_rank < 0)
            maybe_abandon(j);
        return;
    }
    if (j->opts.restarts && restart(j, rank, status))
        return;
    if (j->opts.elastic && WIFSIGNALED(status) && !j->interrupted && ++j->lost < j->opts.n) {
        fprintf(stderr, "gsrun: rank %d was killed by signal %d (%s); the others go on (--elastic)\n", rank,
                WTERMSIG(status), strsignal(WTERMSIG(status)));
        return;
    }
    j->failed_rank = rank;
    const char *then = j->interrupted || j->opts.n == 1 ? "" : "; stopping the other ranks";
    if (WIFSIGNALED(status))
        fprintf(stderr, "gsrun: rank %d was killed by signal %d (%s)%s\n", rank, WTERMSIG(status),
                strsignal(WTERMSIG(status)), then);
    else
        fprintf(stderr, "gsrun: rank %d exited with status %d%s\n", rank, WEXITSTATUS(status), then);
    /* After an interrupt the others are already handling the forwarded
     * signal; they get the grace period to finish before SIGKILL. */
    if (!j->interrupted)
        stop_ranks(j, SIGTERM);
}

/* Reaps every rank that ended. Its process group is killed first, while the
 * unreaped rank still holds its pid (so the group id cannot be reused). */
static void reap(job *j)
{
    for (;;) {
        siginfo_t si = {0};
        int status;
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0)
            return;
        kill(-si.si_pid, SIGKILL); /* whatever the rank left behind in its group */
        if (waitpid(si.si_pid, &status, 0) != si.si_pid)
            return;
        for (int r = 0; r < j->opts.n; r++)
            if (j->ranks[r].pid == si.si_pid && j->ranks[r].running)
                rank_ended(j, r, status);
    }
}

static void on_signal(job *j)
{
    struct signalfd_siginfo si;
    while (read(j->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            reap(j);
        } else if (!j->interrupted) {
            j->interrupted = sig;
            fprintf(stderr, "gsrun: got %s; passing it to the ranks (again to kill them)\n", strsignal(sig));
            stop_ranks(j, sig);
        } else {
            signal_ranks(j, SIGKILL);
        }
    }
}

/* ---- the loop ----------------------------------------------------------- */

static bool any_restart_running(const job *j)
{
    for (int r = 0; r < j->opts.n; r++)
        if (j->ranks[r].running && j->ranks[r].starts > 1)
            return true;
    return false;
}

static bool any_running(const job *j)
{
    for (int r = 0; r < j->opts.n; r++)
        if (j->ranks[r].running)
            return true;
    return false;
}

static bool any_pipe_open(const job *j)
{
    for (int r = 0; r < j->opts.n; r++)
        if (j->ranks[r].out.fd >= 0 || j->ranks[r].err.fd >= 0)
            return true;
    return false;
}

/* When the loop must wake up next: the SIGKILL deadline of a stop, or the
 * end of the output drain once every rank is gone. false: the job is over. */
static bool next_wake(job *j, uint64_t *drain_until, uint64_t *wake_p)
{
    uint64_t wake = UINT64_MAX;
    if (!any_running(j)) {
        if (!any_pipe_open(j))
            return false;
        if (!*drain_until)
            *drain_until = after_ms(PIPE_DRAIN_MS);
        if (passed(*drain_until))
            return false; /* a writer escaped the rank's group: stop waiting for it */
        wake = *drain_until;
    } else if (j->abandon_at_ns && !j->kill_at_ns) {
        if (passed(j->abandon_at_ns)) {
            for (int r = 0; r < j->opts.n; r++)
                if (j->ranks[r].running && j->ranks[r].starts > 1) {
                    fprintf(stderr, "gsrun: the job ended without restarted rank %d; stopping it\n", r);
                    j->ranks[r].abandoned = true;
                    kill(-j->ranks[r].pid, SIGTERM);
                }
            j->kill_at_ns = after_ms(j->opts.grace_ms);
        } else {
            wake = j->abandon_at_ns;
        }
    } else if (j->kill_at_ns) {
        if (passed(j->kill_at_ns)) {
            signal_ranks(j, SIGKILL);
            j->kill_at_ns = UINT64_MAX;
        } else {
            wake = j->kill_at_ns;
        }
    }
    *wake_p = wake;
    return true;
}

/* Relays output and signals until every rank has ended and its output is
 * in; false if it had to give up (teardown kills what is left). */
static bool serve(job *j)
{
    struct pollfd *pfds = calloc(1 + 2 * (size_t)j->opts.n, sizeof(*pfds));
    uint64_t drain_until = 0, wake;

    if (!pfds) {
        fprintf(stderr, "gsrun: out of memory for the poll set; stopping the ranks\n");
        return false;
    }
    while (next_wake(j, &drain_until, &wake)) {
        pfds[0] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
        for (int r = 0; r < j->opts.n; r++) {
            pfds[1 + 2 * r] = (struct pollfd){.fd = j->ranks[r].out.fd, .events = POLLIN};
            pfds[2 + 2 * r] = (struct pollfd){.fd = j->ranks[r].err.fd, .events = POLLIN};
        }
        if (poll(pfds, 1 + 2 * (nfds_t)j->opts.n, ms_until(wake)) < 0 && errno != EINTR) {
            fprintf(stderr, "gsrun: poll failed: %s; stopping the ranks\n", strerror(errno));
            free(pfds);
            return false;
        }
        if (pfds[0].revents & POLLIN)
            on_signal(j);
        for (int r = 0; r < j->opts.n; r++) {
            if (pfds[1 + 2 * r].revents && j->ranks[r].out.fd >= 0)
                pump(r, &j->ranks[r].out);
            if (pfds[2 + 2 * r].revents && j->ranks[r].err.fd >= 0)
                pump(r, &j->ranks[r].err);
        }
    }
    free(pfds);
    return true;
}

/* Two pipes per rank: lift gsrun's soft descriptor limit to the hard one
 * (the ranks get the original back). */
static void raise_fd_limit(job *j)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &j->orig_nofile) != 0)
        return;
    j->have_orig_nofile = true;
    rl = j->orig_nofile;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* A loopback port free now, for rank 0's TCPStore (as torchrun --standalone
 * picks its own): bound, read and released; 0 if none could be bound. */
static int free_loopback_port(void)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = 0;

    if (fd < 0)
        return 0;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}

static int setup(job *j)
{
    sigset_t mask;
    gs_store_server_params params = GS_STORE_SERVER_PARAMS_INIT;
    gs_status st;

    params.world_size = j->opts.n; /* on 127.0.0.1, a fresh job token */
    params.timeout_ms = j->opts.timeout_ms ? (int)j->opts.timeout_ms : -1;
    raise_fd_limit(j);
    if ((st = gs_store_server_create(&params, &j->server)) != GS_OK) {
        fprintf(stderr, "gsrun: cannot serve the job's store: %s\n", gs_last_error());
        return st == GS_ERR_CONFIG ? 2 : 1;
    }
    snprintf(j->token, sizeof(j->token), "%s", gs_store_server_token(j->server));
    snprintf(j->store, sizeof(j->store), "127.0.0.1:%d", gs_store_server_port(j->server));
    j->master_port = free_loopback_port();
    if (j->master_port == 0) {
        fprintf(stderr, "gsrun: cannot find a free loopback port for MASTER_PORT: %s\n", strerror(errno));
        return 1;
    }
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGQUIT);
    sigprocmask(SIG_BLOCK, &mask, &j->orig_mask);
    signal(SIGPIPE, SIG_IGN);
    j->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (j->sigfd < 0) {
        fprintf(stderr, "gsrun: signalfd failed: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

static void teardown(job *j)
{
    for (int r = 0; r < j->opts.n; r++) {
        rank_proc *rp = &j->ranks[r];
        if (rp->running) { /* only after a failed start: the others are killed and reaped */
            kill(-rp->pid, SIGKILL);
            waitpid(rp->pid, &rp->status, 0);
            rp->running = false;
        }
        if (rp->out.fd >= 0)
            close(rp->out.fd);
        if (rp->err.fd >= 0)
            close(rp->err.fd);
    }
    gs_store_server_destroy(j->server, 0);
    if (j->sigfd >= 0)
        close(j->sigfd);
    free(j->ranks);
}

int main(int argc, char **argv)
{
    job j = {.failed_rank = -1, .sigfd = -1};
    int rc = parse_args(argc, argv, &j.opts);

    if (rc >= 0)
        return rc;
    j.ranks = calloc((size_t)j.opts.n, sizeof(*j.ranks));
    if (!j.ranks) {
        fprintf(stderr, "gsrun: out of memory for %d ranks\n", j.opts.n);
        return 1;
    }
    for (int r = 0; r < j.opts.n; r++)
        j.ranks[r].out.fd = j.ranks[r].err.fd = -1;
    rc = setup(&j);
    /* Fork every rank before the store's thread starts: no thread in a forked child. */
    for (int r = 0; rc == 0 && r < j.opts.n; r++)
        rc = start_rank(&j, r) == 0 ? 0 : 1;
    if (rc == 0 && gs_store_server_start(j.server) != GS_OK)
        rc = 1;
    if (rc == 0) {
        bool served = serve(&j);
        rc = j.failed_rank >= 0 ? exit_code(j.ranks[j.failed_rank].status) : served ? 0 : 1;
    }
    teardown(&j);
    return rc;
}
