/* The store through the public API: put/get/wait, allgather, barrier with
 * one to four ranks, served by the launcher (the test) or by rank 0. */
#include "gs_test.h"
#include "multirank.h"

#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void put_get_body(gs_ctx *ctx, int rank, void *arg)
{
    char key[64], value[64], buf[64];
    size_t len = 0;
    int size = gs_ctx_size(ctx);
    (void)arg;

    GS_ASSERT_EQ(gs_ctx_rank(ctx), rank);
    snprintf(key, sizeof(key), "addr/%d", rank);
    snprintf(value, sizeof(value), "value of rank %d", rank);
    GS_ASSERT_OK(gs_store_put(ctx, key, value, strlen(value) + 1));
    /* Every rank waits for every other rank's key (most are not there yet). */
    for (int peer = 0; peer < size; peer++) {
        snprintf(key, sizeof(key), "addr/%d", peer);
        snprintf(value, sizeof(value), "value of rank %d", peer);
        GS_ASSERT_OK(gs_store_get(ctx, key, buf, sizeof(buf), &len));
        GS_ASSERT_EQ(len, strlen(value) + 1);
        GS_ASSERT_STR_EQ(buf, value);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "done"));
}

GS_TEST(put_get_waits_for_keys_with_1_to_4_ranks)
{
    for (int n = 1; n <= 4; n++)
        gs_test_run_ranks(n, put_get_body, NULL, 20000);
}

static void allgather_body(gs_ctx *ctx, int rank, void *arg)
{
    int size = gs_ctx_size(ctx);
    size_t blob_len = (size_t)(uintptr_t)arg;
    unsigned char *blob = malloc(blob_len + 1), *all = malloc((size_t)size * blob_len + 1);

    GS_ASSERT(blob && all);
    for (size_t i = 0; i < blob_len; i++)
        blob[i] = (unsigned char)(rank * 31 + i);
    /* Twice with the same tag: rounds of one tag follow each other. */
    for (int round = 0; round < 2; round++) {
        memset(all, 0xee, (size_t)size * blob_len);
        GS_ASSERT_OK(gs_store_allgather(ctx, "blobs", blob, blob_len, all));
        for (int peer = 0; peer < size; peer++)
            for (size_t i = 0; i < blob_len; i++)
                GS_ASSERT_EQ(all[(size_t)peer * blob_len + i], (unsigned char)(peer * 31 + i));
    }
    free(blob);
    free(all);
}

GS_TEST(allgather_orders_blobs_by_rank)
{
    for (int n = 1; n <= 4; n++) {
        gs_test_run_ranks(n, allgather_body, (void *)(uintptr_t)4096, 20000);
        gs_test_run_ranks(n, allgather_body, (void *)(uintptr_t)1, 20000);
        gs_test_run_ranks(n, allgather_body, (void *)(uintptr_t)0, 20000);
    }
}

static void barrier_body(gs_ctx *ctx, int rank, void *arg)
{
    char key[32], tag[32];
    (void)arg;
    for (int step = 0; step < 20; step++) {
        snprintf(key, sizeof(key), "step%d/%d", step, rank);
        GS_ASSERT_OK(gs_store_put(ctx, key, &step, sizeof(step)));
        snprintf(tag, sizeof(tag), "step%d", step);
        GS_ASSERT_OK(gs_store_barrier(ctx, tag));
        /* After the barrier every rank's key of this step is there: get must not wait. */
        for (int peer = 0; peer < gs_ctx_size(ctx); peer++) {
            int got = -1;
            size_t len;
            snprintf(key, sizeof(key), "step%d/%d", step, peer);
            GS_ASSERT_OK(gs_store_get(ctx, key, &got, sizeof(got), &len));
            GS_ASSERT_EQ(got, step);
        }
        GS_ASSERT_OK(gs_store_barrier(ctx, "again")); /* one tag reused every step */
    }
}

GS_TEST(barrier_separates_steps)
{
    gs_test_run_ranks(4, barrier_body, NULL, 30000);
}

GS_TEST(rank0_serves_the_store_when_no_launcher_does)
{
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 20000, .rank0_serves = true};
    int status[3];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, put_get_body, NULL, status), 3);
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, allgather_body, (void *)(uintptr_t)100, status), 3);
}

static void single_body(gs_ctx *ctx, int rank, void *arg)
{
    char buf[8] = {0};
    size_t len;
    int one = 1, all = 0;
    (void)rank;
    (void)arg;
    /* No launcher variables at all: rank 0 of 1, store served in-process. */
    GS_ASSERT_OK(gs_ctx_create(&ctx));
    GS_ASSERT_EQ(gs_ctx_rank(ctx), 0);
    GS_ASSERT_EQ(gs_ctx_size(ctx), 1);
    GS_ASSERT_OK(gs_store_put(ctx, "k", "v", 2));
    GS_ASSERT_OK(gs_store_get(ctx, "k", buf, sizeof(buf), &len));
    GS_ASSERT_STR_EQ(buf, "v");
    GS_ASSERT_OK(gs_store_allgather(ctx, "one", &one, sizeof(one), &all));
    GS_ASSERT_EQ(all, 1);
    GS_ASSERT_OK(gs_store_barrier(ctx, "b"));
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

GS_TEST(a_plain_program_is_rank_0_of_1)
{
    const char *vars[] = {
        "GS_RANK",    "GS_WORLD_SIZE", "GS_STORE",    "GS_STORE_EXTERNAL",    "GS_JOB_TOKEN", "RANK",
        "WORLD_SIZE", "MASTER_ADDR",   "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
    single_body(NULL, 0, NULL);
}

GS_TEST(get_copies_up_to_cap_and_reports_the_full_length)
{
    gs_ctx *ctx;
    char big[1000], buf[10];
    size_t len = 0;
    memset(big, 'x', sizeof(big));
    unsetenv("GS_RANK");
    unsetenv("GS_WORLD_SIZE");
    unsetenv("GS_STORE");
    GS_ASSERT_OK(gs_ctx_create(&ctx));
    GS_ASSERT_OK(gs_store_put(ctx, "big", big, sizeof(big)));
    memset(buf, 0, sizeof(buf));
    GS_ASSERT_OK(gs_store_get(ctx, "big", buf, sizeof(buf), &len));
    GS_ASSERT_EQ(len, sizeof(big));
    GS_ASSERT_EQ(buf[9], 'x');
    /* Replacing a value. */
    GS_ASSERT_OK(gs_store_put(ctx, "big", "y", 1));
    GS_ASSERT_OK(gs_store_get(ctx, "big", buf, sizeof(buf), &len));
    GS_ASSERT_EQ(len, 1);
    GS_ASSERT_EQ(buf[0], 'y');
    /* Zero-length values exist. */
    GS_ASSERT_OK(gs_store_put(ctx, "empty", NULL, 0));
    GS_ASSERT_OK(gs_store_get(ctx, "empty", NULL, 0, &len));
    GS_ASSERT_EQ(len, 0);
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

static bool ipv6_loopback_works(void)
{
    struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&sin6, sizeof(sin6)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void ipv6_body(gs_ctx *ctx, int rank, void *arg)
{
    char store[64];
    int all[3];
    snprintf(store, sizeof(store), "[::1]:%d", *(int *)arg);
    setenv("GS_STORE", store, 1);
    setenv("GS_STORE_EXTERNAL", "0", 1); /* rank 0 serves, on ::1 */
    GS_ASSERT_OK(gs_ctx_create(&ctx));
    GS_ASSERT_OK(gs_store_allgather(ctx, "v6", &rank, sizeof(rank), all));
    for (int r = 0; r < 3; r++)
        GS_ASSERT_EQ(all[r], r);
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

GS_TEST(the_store_works_over_ipv6)
{
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 20000, .no_ctx = true};
    int status[3], port;
    if (!ipv6_loopback_works())
        GS_SKIP("no IPv6 loopback here");
    port = gs_test_free_port();
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, ipv6_body, &port, status), 3);
}

static void rank0_leaves_first_body(gs_ctx *ctx, int rank, void *arg)
{
    char buf[8];
    size_t len;
    int drain_ms = *(int *)arg;
    (void)len;
    GS_ASSERT_OK(gs_ctx_create(&ctx));
    if (rank == 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        GS_ASSERT_OK(gs_ctx_destroy(ctx)); /* keeps serving until the others left, or the deadline */
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        GS_ASSERT_GE(ms, drain_ms ? 250 : 450);
        GS_ASSERT_LT(ms, drain_ms ? 3000 : 1500);
        return;
    }
    usleep(300 * 1000);
    if (drain_ms) { /* the others leave within the deadline: the store serves them to the end */
        GS_ASSERT_OK(gs_store_put(ctx, rank == 1 ? "one" : "two", "x", 2));
        GS_ASSERT_OK(gs_store_get(ctx, rank == 1 ? "two" : "one", buf, sizeof(buf), &len));
    } else { /* rank 2 stays past the deadline: rank 0 stops serving */
        if (rank == 2) {
            usleep(700 * 1000);
            GS_ASSERT_STATUS(gs_store_put(ctx, "late", "x", 2), GS_ERR_PEER_LOST);
        }
    }
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

GS_TEST(rank_0_serves_until_the_others_left_within_the_deadline)
{
    int status[3], drain;
    gs_test_ranks_opts opts = {
        .n = 3, .timeout_ms = 20000, .rank_timeout_ms = 5000, .no_ctx = true, .rank0_serves = true};
    drain = 1;
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, rank0_leaves_first_body, &drain, status), 3);
    opts.rank_timeout_ms = 500;
    drain = 0;
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, rank0_leaves_first_body, &drain, status), 3);
}

/* A launcher's server (gradsync.h "Store server"; the harness runs every
 * multi-rank test on one): its parameters checked, a token drawn when none
 * is given, the given one kept, one start. */
GS_TEST(a_launchers_store_server_checks_its_params_and_draws_a_token)
{
    gs_store_server_params p;
    gs_store_server *a = NULL, *b = NULL;
    char too_long[300];
    const char *token;

    gs_store_server_params_init(&p);
    GS_ASSERT_STATUS(gs_store_server_create(&p, &a), GS_ERR_INVALID); /* world_size 0 */
    p.world_size = 2;
    p.version = GS_STORE_SERVER_PARAMS_VERSION + 1;
    GS_ASSERT_STATUS(gs_store_server_create(&p, &a), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "start from gs_store_server_params_init()");
    p.version = GS_STORE_SERVER_PARAMS_VERSION;
    p.timeout_ms = 0;
    GS_ASSERT_STATUS(gs_store_server_create(&p, &a), GS_ERR_INVALID);
    p.timeout_ms = 5000;
    memset(too_long, 'a', sizeof(too_long) - 1);
    too_long[sizeof(too_long) - 1] = '\0';
    p.job_token = too_long;
    GS_ASSERT_STATUS(gs_store_server_create(&p, &a), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_store_server_create(NULL, &a), GS_ERR_INVALID);
    GS_ASSERT(a == NULL);

    p.job_token = NULL; /* drawn: 64 hex digits, another for another server */
    GS_ASSERT_OK(gs_store_server_create(&p, &a));
    GS_ASSERT_OK(gs_store_server_create(&p, &b));
    token = gs_store_server_token(a);
    GS_ASSERT_EQ(strlen(token), 64);
    GS_ASSERT_EQ(strspn(token, "0123456789abcdef"), 64);
    GS_ASSERT(strcmp(token, gs_store_server_token(b)) != 0);
    GS_ASSERT(gs_store_server_port(a) > 0 && gs_store_server_port(a) != gs_store_server_port(b));
    GS_ASSERT_OK(gs_store_server_start(a));
    GS_ASSERT_STATUS(gs_store_server_start(a), GS_ERR_INVALID);
    gs_store_server_destroy(a, 0);
    gs_store_server_destroy(b, 0); /* never started */
    gs_store_server_destroy(NULL, 0);

    p.job_token = "given";
    GS_ASSERT_OK(gs_store_server_create(&p, &a));
    GS_ASSERT_STR_EQ(gs_store_server_token(a), "given");
    gs_store_server_destroy(a, 0);
}
