/*
 * A rank killed in the middle of an allreduce: every survivor's error is one
 * sentence, read once and whole, of the shape
 *
 *   rank 2: allreduce #14: rank 1 lost (connection reset by peer): did it exit or crash?
 *
 * naming the survivor, the call and its sequence number, the lost rank and
 * the cause, with no text repeated or cut. Over each built transport (the
 * rxe guest runs it over verbs), with 3 and 4 ranks.
 */
#include "coll_check.h"

#include <regex.h>
#include <signal.h>

#define COUNT   (1u << 20) /* floats: 4 MiB, many chunks, so the victim dies inside a call */
#define CALLS   50
#define VICTIM  1
#define DIES_AT 7 /* the victim starts this call (0-based), then dies */

/* Matches the whole message: who, the call, the lost rank, one cause in
 * parentheses (itself with at most one level of them: verbs' hints), the
 * question. */
static void assert_peer_lost_shape(const char *text, int rank, int lost)
{
    char pattern[256], head[64];
    regex_t re;
    snprintf(
        pattern, sizeof(pattern),
        "^rank %d: allreduce #[0-9]+: rank %d lost \\(([^()]|\\([^()]*\\))+\\): did it exit or crash\\?$",
        rank, lost);
    GS_ASSERT_EQ(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        gs_test_fail_here(__FILE__, __LINE__, "rank %d's message has not the shape %s: \"%s\"", rank, pattern,
                          text);
    /* the cause is said once: the text after the call's name does not
     * come back later in the message */
    snprintf(head, sizeof(head), "rank %d lost", lost);
    GS_ASSERT(strstr(strstr(text, head) + 1, head) == NULL);
}

static void killed_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float *buf = malloc(COUNT * sizeof(float));
    gs_status st = GS_OK;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    char text[1024];
    int calls = 0;
    GS_ASSERT(buf != NULL);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = (float)(i % 7);
    if (rank == VICTIM) {
        gs_req *req;
        for (int c = 0; c < DIES_AT; c++)
            GS_ASSERT_OK(gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_MAX));
        GS_ASSERT_OK(gs_iallreduce(comm, buf, buf, COUNT, GS_F32, GS_MAX, &req));
        gs_req_test(req); /* its first chunks leave, the rest never will */
        raise(SIGKILL);
    }
    for (; calls < CALLS && st == GS_OK; calls++)
        st = gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_MAX);
    snprintf(text, sizeof(text), "%s", gs_last_error());
    fprintf(stderr, "  rank %d: %s after %d calls: %s\n", rank, gs_status_name(st), calls, text);
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    GS_ASSERT(calls >= DIES_AT && calls <= DIES_AT + 1);
    assert_peer_lost_shape(text, rank, VICTIM);
    /* a later call fails the same way, with the same words */
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, COUNT, GS_F32, GS_MAX), GS_ERR_PEER_LOST);
    assert_peer_lost_shape(gs_last_error(), rank, VICTIM);
    gs_comm_destroy(comm);
    gs_tp_close(tp);
    free(buf);
}

static void run_killed(const char *transport, int n)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = 60000, .rank_timeout_ms = 15000};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, killed_body, &a, status);
    for (int r = 0; r < n; r++)
        if (r == VICTIM)
            GS_ASSERT_RANK_SIGNAL(status[r], SIGKILL);
        else
            GS_ASSERT_RANK_EXIT(status[r], 0);
}

GS_TEST_TP(rank_killed_mid_allreduce_is_one_whole_sentence)
{
    run_killed(transport, 3);
    run_killed(transport, 4);
}
