/* The store under faults: ranks that never arrive or die, strangers, port
 * scanners, half-open connections, garbage, oversized messages, a rank
 * claimed twice, a lost store. The job must get a clear error naming who
 * is at fault within its deadline, or carry on undisturbed. */
#include "bootstrap/boot.h"
#include "bootstrap/store_proto.h"
#include "gs_test.h"
#include "multirank.h"
#include "util/clock.h"
#include "util/log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define RANK_TIMEOUT_MS 1500

static int elapsed_ms(uint64_t start_ns)
{
    return (int)((gs_now_ns() - start_ns) / 1000000);
}

/* A raw connection to this job's store (from GS_STORE). */
static int raw_connect(void)
{
    char host[256];
    int port, fd;
    GS_ASSERT_OK(gs_boot_parse_hostport(getenv("GS_STORE"), host, sizeof(host), &port));
    GS_ASSERT_OK(gs_boot_sock_connect(host, port, gs_deadline_after_ms(2000), &fd));
    return fd;
}

/* Whether the store closes fd within 3 s (reading and dropping any answer). */
static bool closed_by_store(int fd)
{
    uint64_t deadline = gs_deadline_after_ms(3000);
    char buf[2048];
    while (!gs_deadline_passed(deadline)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, gs_deadline_left_ms(deadline)) <= 0)
            break;
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
    }
    return false;
}

static void send_hdr(int fd, int type, uint32_t rank, uint32_t arg, uint16_t key_len, uint64_t value_len)
{
    gs_store_hdr hdr = {.version = GS_STORE_PROTO_VERSION,
                        .type = (uint8_t)type,
                        .key_len = key_len,
                        .rank = rank,
                        .arg = arg,
                        .value_len = value_len};
    GS_ASSERT_OK(gs_boot_sock_send(fd, &hdr, sizeof(hdr), gs_deadline_after_ms(1000)));
}

/* ---- ranks that never arrive, die, or disagree ------------------------- */

static void late_ranks_body(gs_ctx *ctx, int rank, void *arg)
{
    (void)arg;
    if (rank >= 2) { /* alive, but never enter the barrier */
        usleep((RANK_TIMEOUT_MS + 500) * 1000);
        return;
    }
    uint64_t start = gs_now_ns();
    GS_ASSERT_STATUS(gs_store_barrier(ctx, "x"), GS_ERR_TIMEOUT);
    GS_ASSERT_CONTAINS(gs_last_error(), "barrier 'x' timed out after 1500 ms: ranks 2,3 of 4 never arrived");
    GS_ASSERT_GE(elapsed_ms(start), RANK_TIMEOUT_MS - 50);
    GS_ASSERT_LT(elapsed_ms(start), RANK_TIMEOUT_MS + 1000);
}

GS_TEST(barrier_timeout_names_the_ranks_that_never_arrived)
{
    gs_test_ranks_opts opts = {.n = 4, .timeout_ms = 20000, .rank_timeout_ms = RANK_TIMEOUT_MS};
    int status[4];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, late_ranks_body, NULL, status), 4);
}

static void late_allgather_body(gs_ctx *ctx, int rank, void *arg)
{
    int out[3];
    (void)arg;
    if (rank == 1) {
        usleep((RANK_TIMEOUT_MS + 500) * 1000);
        return;
    }
    GS_ASSERT_STATUS(gs_store_allgather(ctx, "addrs", &rank, sizeof(rank), out), GS_ERR_TIMEOUT);
    GS_ASSERT_CONTAINS(gs_last_error(),
                       "allgather 'addrs' timed out after 1500 ms: rank 1 of 3 never arrived");
    GS_ASSERT_STATUS(gs_store_get(ctx, "never-put", out, sizeof(out), NULL), GS_ERR_TIMEOUT);
    GS_ASSERT_CONTAINS(gs_last_error(), "get 'never-put' timed out after 1500 ms");
}

GS_TEST(allgather_and_get_time_out_with_the_culprit_named)
{
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 20000, .rank_timeout_ms = RANK_TIMEOUT_MS};
    int status[3];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, late_allgather_body, NULL, status), 3);
}

static void dying_rank_body(gs_ctx *ctx, int rank, void *arg)
{
    int how = *(int *)arg, out[4];
    if (rank == 2) {
        usleep(200 * 1000); /* let the others enter first */
        if (how == 0)
            _exit(7);
        raise(SIGKILL);
    }
    uint64_t start = gs_now_ns();
    if (how == 0)
        GS_ASSERT_STATUS(gs_store_barrier(ctx, "x"), GS_ERR_PEER_LOST);
    else
        GS_ASSERT_STATUS(gs_store_allgather(ctx, "x", &rank, sizeof(rank), out), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 2 of 4 was lost");
    GS_ASSERT_LT(elapsed_ms(start), 1000); /* at once, not at the deadline */
    /* The job is broken for every later round that needs rank 2. */
    GS_ASSERT_STATUS(gs_store_barrier(ctx, "later"), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "barrier 'later': rank 2 of 4 was lost");
    /* (rank 0 may have left by now: it is named after the lost rank) */
}

GS_TEST(a_rank_dying_during_barrier_or_allgather_is_named_to_the_others)
{
    gs_test_ranks_opts opts = {.n = 4, .timeout_ms = 20000, .rank_timeout_ms = 5000};
    int status[4];
    for (int how = 0; how < 2; how++) {
        GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, dying_rank_body, &how, status), 3);
        GS_ASSERT_RANK_EXIT(status[0], 0);
        GS_ASSERT_RANK_EXIT(status[1], 0);
        GS_ASSERT_RANK_EXIT(status[3], 0);
        if (how == 0)
            GS_ASSERT_RANK_EXIT(status[2], 7);
        else
            GS_ASSERT_RANK_SIGNAL(status[2], SIGKILL);
    }
}

static void departed_rank_body(gs_ctx *ctx, int rank, void *arg)
{
    (void)arg;
    if (rank == 1)
        return; /* destroys its context at once: a clean departure */
    GS_ASSERT_STATUS(gs_store_barrier(ctx, "x"), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 1 of 2 left the job");
}

GS_TEST(a_rank_that_left_cleanly_is_named_too)
{
    gs_test_run_ranks(2, departed_rank_body, NULL, 20000);
}

static void mismatch_body(gs_ctx *ctx, int rank, void *arg)
{
    char blob[16] = {0}, out[64];
    (void)arg;
    GS_ASSERT_STATUS(gs_store_allgather(ctx, "sizes", blob, rank == 1 ? 16 : 8, out), GS_ERR_MISMATCH);
    GS_ASSERT_CONTAINS(gs_last_error(), "allgather 'sizes'");
    GS_ASSERT_CONTAINS(gs_last_error(), "bytes");
    GS_ASSERT_OK(gs_store_barrier(ctx, "after"));
}

GS_TEST(allgather_of_different_sizes_is_a_mismatch_on_every_rank)
{
    gs_test_run_ranks(3, mismatch_body, NULL, 20000);
}

static void lost_store_body(gs_ctx *ctx, int rank, void *arg)
{
    (void)arg;
    GS_ASSERT_OK(gs_store_barrier(ctx, "up"));
    if (rank == 0) {
        usleep(200 * 1000);
        _exit(9); /* takes the store with it */
    }
    uint64_t start = gs_now_ns();
    GS_ASSERT_STATUS(gs_store_barrier(ctx, "x"), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "lost the connection to the store");
    GS_ASSERT_LT(elapsed_ms(start), 2000);
    GS_ASSERT_STATUS(gs_store_put(ctx, "k", "v", 1), GS_ERR_PEER_LOST);
}

GS_TEST(ranks_see_the_store_lost_when_rank_0_dies)
{
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 20000, .rank_timeout_ms = 5000, .rank0_serves = true};
    int status[3];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, lost_store_body, NULL, status), 2);
    GS_ASSERT_RANK_EXIT(status[0], 9);
}

GS_TEST(joining_a_store_nobody_serves_times_out_with_advice)
{
    gs_store_client *client;
    char addr[64];
    int port = gs_test_free_port();
    uint64_t start = gs_now_ns();
    GS_ASSERT_STATUS(gs_boot_client_connect("127.0.0.1", port, 1, 2, "t", 500, &client), GS_ERR_TIMEOUT);
    GS_ASSERT_GE(elapsed_ms(start), 450);
    snprintf(addr, sizeof(addr), "cannot join the store at 127.0.0.1:%d within 500 ms", port);
    GS_ASSERT_CONTAINS(gs_last_error(), addr);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_STORE");
}

/* ---- strangers and garbage while the job runs -------------------------- */

static void stranger_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_store_client *client;
    char host[256];
    int port;
    (void)arg;
    GS_ASSERT_OK(gs_store_barrier(ctx, "everyone-joined"));
    if (rank == 0) {
        GS_ASSERT_OK(gs_boot_parse_hostport(getenv("GS_STORE"), host, sizeof(host), &port));
        GS_ASSERT_STATUS(gs_boot_client_connect(host, port, 1, 3, "not-the-token", 2000, &client),
                         GS_ERR_AUTH);
        GS_ASSERT_CONTAINS(gs_last_error(), "wrong job token");
        /* The right token, but rank 1 is taken: a second process claiming it. */
        GS_ASSERT_STATUS(gs_boot_client_connect(host, port, 1, 3, getenv("GS_JOB_TOKEN"), 2000, &client),
                         GS_ERR_CONFIG);
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 1 already joined this job");
        /* And a world of the wrong size. */
        GS_ASSERT_STATUS(gs_boot_client_connect(host, port, 1, 5, getenv("GS_JOB_TOKEN"), 2000, &client),
                         GS_ERR_CONFIG);
        GS_ASSERT_CONTAINS(gs_last_error(), "this job has 3 ranks");
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "after-strangers"));
}

GS_TEST(strangers_and_a_second_claim_on_a_rank_are_refused_and_logged)
{
    char path[] = "/tmp/gs_test_store_log_XXXXXX", text[16384] = {0};
    int fd = mkstemp(path);
    GS_ASSERT_GE(fd, 0);
    GS_ASSERT_OK(gs_log_configure(GS_LOG_WARN, "all", path));
    gs_test_run_ranks(3, stranger_body, NULL, 20000);
    GS_ASSERT_GT(read(fd, text, sizeof(text) - 1), 0);
    close(fd);
    unlink(path);
    GS_ASSERT_CONTAINS(text, "store: refused connection from 127.0.0.1:");
    GS_ASSERT_CONTAINS(text, "wrong job token");
    GS_ASSERT_CONTAINS(text, "rank 1 already joined this job");
}

static void garbage_body(gs_ctx *ctx, int rank, void *arg)
{
    int kind = *(int *)arg, fd = -1;
    unsigned char junk[1024];
    uint64_t start;

    if (rank != 0)
        usleep(100 * 1000); /* rank 0's odd connection comes first */
    if (rank == 0) {
        fd = raw_connect();
        switch (kind) {
        case 0: /* port scanner: connect and close */
            close(fd);
            fd = -1;
            break;
        case 1: /* half-open: says nothing at all while the job goes on */ break;
        case 2: /* half a header, then silence */
            GS_ASSERT_OK(gs_boot_sock_send(fd, "\x01\x02\x00", 3, gs_deadline_after_ms(1000)));
            break;
        case 3: /* random bytes */
        case 4: /* random bytes after a valid version byte */
            GS_ASSERT_EQ(getrandom(junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
            junk[0] = kind == 3 ? 0xff : GS_STORE_PROTO_VERSION;
            junk[2] |= 1; /* a HELLO never has a key */
            GS_ASSERT_OK(gs_boot_sock_send(fd, junk, sizeof(junk), gs_deadline_after_ms(1000)));
            GS_ASSERT(closed_by_store(fd));
            break;
        case 5: /* a HELLO announcing a huge token */
            send_hdr(fd, GS_STORE_HELLO, 0, 2, 0, 1ull << 40);
            GS_ASSERT(closed_by_store(fd));
            break;
        case 6: /* a request before HELLO */
            send_hdr(fd, GS_STORE_PUT, 0, 0, 1, 1);
            GS_ASSERT(closed_by_store(fd));
            break;
        }
    }
    GS_ASSERT_OK(gs_ctx_create(&ctx));
    /* The job proceeds at full speed meanwhile. */
    start = gs_now_ns();
    for (int i = 0; i < 5; i++)
        GS_ASSERT_OK(gs_store_barrier(ctx, "meanwhile"));
    GS_ASSERT_LT(elapsed_ms(start), 1000);
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
    if (fd >= 0)
        close(fd);
}

GS_TEST(scanners_half_open_connections_and_garbage_do_not_disturb_the_job)
{
    for (int kind = 0; kind <= 6; kind++) {
        gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 20000, .rank_timeout_ms = 5000, .no_ctx = true};
        int status[3];
        GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, garbage_body, &kind, status), 3);
    }
}

static void half_open_expiry_body(gs_ctx *ctx, int rank, void *arg)
{
    (void)arg;
    (void)ctx;
    if (rank != 0)
        return;
    int fd = raw_connect();
    /* The store drops a connection that never says HELLO (GS_TIMEOUT_MS = 1000 here). */
    uint64_t start = gs_now_ns();
    GS_ASSERT(closed_by_store(fd));
    GS_ASSERT_GE(elapsed_ms(start), 800);
    close(fd);
}

GS_TEST(a_silent_connection_is_dropped_after_the_deadline)
{
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 20000, .rank_timeout_ms = 1000};
    int status[2];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, half_open_expiry_body, NULL, status), 2);
}

static void oversized_body(gs_ctx *ctx, int rank, void *arg)
{
    char key[GS_STORE_KEY_MAX + 2];
    (void)arg;
    if (rank == 0)
        GS_ASSERT_OK(gs_ctx_create(&ctx));
    if (rank == 1) {
        /* Rank 1 speaks raw: a proper HELLO, then a PUT announcing 1 TiB. */
        const char *token = getenv("GS_JOB_TOKEN");
        gs_store_hdr reply;
        int fd = raw_connect();
        send_hdr(fd, GS_STORE_HELLO, 1, 2, 0, strlen(token));
        GS_ASSERT_OK(gs_boot_sock_send(fd, token, strlen(token), gs_deadline_after_ms(1000)));
        GS_ASSERT_OK(gs_boot_sock_recv(fd, &reply, sizeof(reply), gs_deadline_after_ms(2000)));
        GS_ASSERT_EQ(reply.status, GS_OK);
        send_hdr(fd, GS_STORE_PUT, 0, 0, 1, 1ull << 40);
        GS_ASSERT(closed_by_store(fd));
        close(fd);
        return;
    }
    memset(key, 'k', sizeof(key));
    key[sizeof(key) - 1] = '\0';
    GS_ASSERT_STATUS(gs_store_put(ctx, key, "v", 1), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "1 to 255 bytes");
    GS_ASSERT_STATUS(gs_store_put(ctx, "", "v", 1), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_store_put(ctx, "k", key, GS_STORE_VALUE_MAX + 1), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_STORE_VALUE_MAX");
    GS_ASSERT_STATUS(gs_store_allgather(ctx, "big", key, GS_STORE_VALUE_MAX + 1, key), GS_ERR_INVALID);
    /* The store closed rank 1 for its oversized message: rank 1 is lost. */
    GS_ASSERT_STATUS(gs_store_barrier(ctx, "x"), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 1 of 2 was lost");
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

GS_TEST(oversized_keys_and_values_are_refused)
{
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 20000, .rank_timeout_ms = 5000, .no_ctx = true};
    int status[2];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, oversized_body, NULL, status), 2);
}

GS_TEST(tokens_compare_whole)
{
    char a[80], b[80];
    GS_ASSERT(gs_boot_token_equal("", ""));
    GS_ASSERT(gs_boot_token_equal("abc", "abc"));
    GS_ASSERT(!gs_boot_token_equal("abc", "abd"));
    GS_ASSERT(!gs_boot_token_equal("abc", "abcd"));
    GS_ASSERT(!gs_boot_token_equal("", "a"));
    GS_ASSERT_OK(gs_boot_token_generate(a, sizeof(a)));
    GS_ASSERT_OK(gs_boot_token_generate(b, sizeof(b)));
    GS_ASSERT_EQ(strlen(a), 64);
    GS_ASSERT(!gs_boot_token_equal(a, b));
    GS_ASSERT_STATUS(gs_boot_token_generate(a, 10), GS_ERR_INVALID);
}
