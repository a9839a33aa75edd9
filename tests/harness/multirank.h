/*
 * Multi-rank tests: run one function in n forked ranks of one job.
 *
 *   static void body(gs_ctx *ctx, int rank, void *arg)
 *   {
 *       GS_ASSERT_OK(gs_store_barrier(ctx, "start"));
 *       ...
 *   }
 *   GS_TEST(four_ranks_agree) { gs_test_run_ranks(4, body, NULL, 20000); }
 *
 * How it works. The parent (the test process) opens the job's store on
 * 127.0.0.1 with an ephemeral port and a fresh job token before forking, forks
 * the ranks, then serves the store in a thread while it waits for them. Each
 * rank gets GS_RANK, GS_WORLD_SIZE, GS_LOCAL_RANK (= rank), GS_STORE,
 * GS_STORE_EXTERNAL=1, GS_JOB_TOKEN and GS_TIMEOUT_MS in its environment,
 * parses its configuration from that environment, creates its context,
 * runs fn(ctx, rank, arg), destroys the context and exits 0. A failed
 * GS_ASSERT in fn exits the rank non-zero (1); fn may also _exit() or
 * raise a signal on purpose to play a rank that dies.
 *
 * Ranks read their configuration from ctx->cfg: gs_config_get() in a rank
 * may return a copy the test process cached before forking.
 *
 * Every rank dies with the test process (PR_SET_PDEATHSIG), and ranks still
 * running at timeout_ms are killed (SIGKILL) and reported. Each rank is a
 * separate process, so it runs its own ASan leak check at exit.
 *
 * Span mode (GS_TEST_SPAN=I/G@ADDR:PORT, GS_TEST_SPAN_TOKEN): every job is
 * spread over G machines running the same cases, rank r on machine r mod G,
 * the store served by machine 0 at ADDR (multirank.c). The two-guest step of
 * tests/rxe-vm runs cases across the guests this way.
 */
#ifndef GS_TEST_MULTIRANK_H
#define GS_TEST_MULTIRANK_H

#include "gradsync.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/wait.h>

#define GS_TEST_RANKS_MAX 64

typedef void (*gs_test_rank_fn)(gs_ctx *ctx, int rank, void *arg);

typedef struct gs_test_ranks_opts {
    int n;                  /* ranks, 1 to GS_TEST_RANKS_MAX */
    int timeout_ms;         /* the whole run: ranks still running then are killed */
    int rank_timeout_ms;    /* each rank's GS_TIMEOUT_MS; 0: timeout_ms / 2 (at least 1000) */
    const char *const *env; /* extra "NAME=VALUE" strings for every rank, NULL-terminated; or NULL */
    bool no_ctx;            /* fn gets ctx NULL and creates its own (tests of gs_ctx_create) */
    bool rank0_serves;      /* rank 0 serves the store (on a port the parent picked), not the parent */
    const int *host_of;     /* [n] or NULL: rank r plays emulated host host_of[r] (GS_HOST_ID=gs-test-host-H:
                             * shm among a host's ranks, tcp or verbs between hosts) */
} gs_test_ranks_opts;

/* Runs fn on n ranks and fails the test (naming each rank and how it
 * ended) unless every rank exited 0. */
void gs_test_run_ranks(int n, gs_test_rank_fn fn, void *arg, int timeout_ms);
/* The same with every option of gs_test_run_ranks_opts. */
void gs_test_run_ranks_ok(const gs_test_ranks_opts *opts, gs_test_rank_fn fn, void *arg);

/* Runs fn on opts->n ranks and stores each rank's waitpid() status in
 * status_p[0..n-1] (a rank killed at the timeout shows SIGKILL) without
 * asserting anything about them; returns how many ranks exited 0. */
int gs_test_run_ranks_opts(const gs_test_ranks_opts *opts, gs_test_rank_fn fn, void *arg, int *status_p);

/* This process's own context from its environment as it is now (the
 * harness's variables, and whatever the rank set since: GS_REJOIN=1 for a
 * replacement); what a rank gets unless no_ctx. Fails the test on error. */
gs_ctx *gs_test_own_ctx(void);

/* "exit 0", "exit 3", "signal 9 (Killed)" for a waitpid() status. */
const char *gs_test_status_text(int status, char *buf, size_t cap);

/* A TCP port on 127.0.0.1 that was free a moment ago (for tests that start
 * their own store or launcher). */
int gs_test_free_port(void);

/* The rank exited with code (or, for GS_ASSERT_RANK_SIGNAL, died of sig). */
#define GS_ASSERT_RANK_EXIT(status, code)                                                                    \
    do {                                                                                                     \
        char gs_buf_[64];                                                                                    \
        int gs_st_ = (status);                                                                               \
        if (!WIFEXITED(gs_st_) || WEXITSTATUS(gs_st_) != (code))                                             \
            gs_test_fail_here(__FILE__, __LINE__, "expected %s to be exit %d: %s", #status, (code),          \
                              gs_test_status_text(gs_st_, gs_buf_, sizeof(gs_buf_)));                        \
    } while (0)
#define GS_ASSERT_RANK_SIGNAL(status, sig)                                                                   \
    do {                                                                                                     \
        char gs_buf_[64];                                                                                    \
        int gs_st_ = (status);                                                                               \
        if (!WIFSIGNALED(gs_st_) || WTERMSIG(gs_st_) != (sig))                                               \
            gs_test_fail_here(__FILE__, __LINE__, "expected %s to be signal %d: %s", #status, (sig),         \
                              gs_test_status_text(gs_st_, gs_buf_, sizeof(gs_buf_)));                        \
    } while (0)

#endif
