/*
 * A context from the caller's parameters: rank and size given, and an
 * external key-value store given as callbacks (here a toy store the test
 * keeps in shared memory mapped before the ranks fork, as a framework's
 * store would be its own). Over it: the store calls, a transport, a
 * communicator and its collectives, sub-communicators; the token rank 0
 * publishes; a store that fails or a rank that never comes is a clear
 * error naming it; bad parameters are refused.
 */
#include "gs_test.h"
#include "multirank.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* ---- the toy store: a table in shared memory ---------------------------------- */

#define TOY_KEYS  512
#define TOY_VALUE 2048

typedef struct toy_entry {
    char key[256];
    size_t len;
    uint8_t value[TOY_VALUE];
} toy_entry;

typedef struct toy_store {
    pthread_mutex_t lock; /* process-shared */
    int count;
    int sets, gets; /* calls seen, all ranks together */
    int fail_sets;  /* set fails while > 0 */
    toy_entry entries[TOY_KEYS];
} toy_store;

static toy_store *toy;

static toy_entry *toy_find(const char *key)
{
    for (int i = 0; i < toy->count; i++)
        if (strcmp(toy->entries[i].key, key) == 0)
            return &toy->entries[i];
    return NULL;
}

static gs_status toy_set(void *arg, const char *key, const void *value, size_t len)
{
    toy_store *t = arg;
    toy_entry *e;
    gs_status st = GS_OK;
    pthread_mutex_lock(&t->lock);
    t->sets++;
    if (t->fail_sets > 0 || len > TOY_VALUE || strlen(key) >= sizeof(e->key)) {
        st = GS_ERR_IO;
    } else if ((e = toy_find(key)) || t->count < TOY_KEYS) {
        if (!e)
            e = &t->entries[t->count++];
        snprintf(e->key, sizeof(e->key), "%s", key);
        if (len)
            memcpy(e->value, value, len);
        e->len = len;
    } else {
        st = GS_ERR_NOMEM;
    }
    pthread_mutex_unlock(&t->lock);
    return st;
}

static gs_status toy_get(void *arg, const char *key, void *buf, size_t cap, size_t *len_p, int timeout_ms)
{
    toy_store *t = arg;
    struct timespec nap = {0, 200000};
    for (int waited_us = 0;; waited_us += 200) {
        pthread_mutex_lock(&t->lock);
        t->gets++;
        toy_entry *e = toy_find(key);
        if (e) {
            if (cap && e->len)
                memcpy(buf, e->value, e->len < cap ? e->len : cap);
            *len_p = e->len;
            pthread_mutex_unlock(&t->lock);
            return GS_OK;
        }
        pthread_mutex_unlock(&t->lock);
        if (waited_us / 1000 >= timeout_ms)
            return GS_ERR_TIMEOUT;
        nanosleep(&nap, NULL);
    }
}

static void toy_open(void)
{
    pthread_mutexattr_t attr;
    toy = mmap(NULL, sizeof(*toy), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    GS_ASSERT(toy != MAP_FAILED);
    memset(toy, 0, sizeof(*toy));
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&toy->lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

static void toy_close(void)
{
    pthread_mutex_destroy(&toy->lock);
    munmap(toy, sizeof(*toy));
    toy = NULL;
}

static gs_ctx_params toy_params(int rank, int size, const gs_kv_store *kv)
{
    gs_ctx_params p;
    gs_ctx_params_init(&p);
    p.rank = rank;
    p.world_size = size;
    p.local_rank = rank;
    p.local_size = size;
    p.store = kv;
    return p;
}

/* ---- the ranks ------------------------------------------------------------------- */

typedef struct params_arg {
    const char *transport;
} params_arg;

static void over_toy_body(gs_ctx *unused, int rank, void *argp)
{
    const params_arg *a = argp;
    gs_kv_store kv = {.arg = toy, .set = toy_set, .get = toy_get};
    gs_ctx_params p = toy_params(rank, 3, &kv);
    gs_ctx *ctx;
    gs_tp *tp;
    p.job_token = ""; /* none (the harness sets GS_JOB_TOKEN): rank 0 draws one */
    gs_comm *comm, *sub;
    char value[32], all[3][8];
    size_t len;
    float x[5];
    (void)unused;
    GS_ASSERT_OK(gs_ctx_create_with(&p, &ctx));
    GS_ASSERT_EQ(gs_ctx_rank(ctx), rank);
    GS_ASSERT_EQ(gs_ctx_size(ctx), 3);
    GS_ASSERT_EQ(gs_ctx_local_rank(ctx), rank);
    GS_ASSERT_EQ(gs_ctx_local_size(ctx), 3);
    GS_ASSERT(strlen(gs_ctx_host(ctx)) > 0);
    /* the store calls go through the callbacks */
    snprintf(value, sizeof(value), "from %d", rank);
    GS_ASSERT_OK(gs_store_put(ctx, rank == 0 ? "k0" : rank == 1 ? "k1" : "k2", value, strlen(value)));
    GS_ASSERT_OK(gs_store_get(ctx, "k2", value, sizeof(value), &len));
    GS_ASSERT_EQ(len, 6);
    GS_ASSERT_EQ(memcmp(value, "from 2", 6), 0);
    snprintf(all[rank], sizeof(all[rank]), "r%d", rank);
    GS_ASSERT_OK(gs_store_allgather(ctx, "names", all[rank], sizeof(all[rank]), all));
    GS_ASSERT_STR_EQ(all[0], "r0");
    GS_ASSERT_STR_EQ(all[2], "r2");
    GS_ASSERT_OK(gs_store_barrier(ctx, "b"));
    GS_ASSERT_OK(gs_store_barrier(ctx, "b")); /* the same tag twice is two barriers */
    /* a transport, a communicator and a sub-communicator over it */
    GS_ASSERT_OK(gs_tp_open(ctx, a->transport, &tp));
    GS_ASSERT_OK(gs_comm_create(ctx, tp, &comm));
    for (int i = 0; i < 5; i++)
        x[i] = (float)(rank + i);
    GS_ASSERT_OK(gs_allreduce(comm, x, x, 5, GS_F32, GS_SUM));
    for (int i = 0; i < 5; i++)
        GS_ASSERT(x[i] == (float)(3 + 3 * i));
    GS_ASSERT_OK(gs_comm_split(comm, rank == 1 ? GS_COMM_NO_COLOR : 0, -rank, &sub));
    if (rank == 1) {
        GS_ASSERT(sub == NULL);
    } else {
        GS_ASSERT_EQ(gs_comm_size(sub), 2);
        GS_ASSERT_EQ(gs_comm_rank(sub), rank == 2 ? 0 : 1); /* key -rank: rank 2 first */
        x[0] = (float)rank;
        GS_ASSERT_OK(gs_allreduce(sub, x, x, 1, GS_F32, GS_MAX));
        GS_ASSERT(x[0] == 2.0f);
        GS_ASSERT_OK(gs_comm_destroy(sub));
    }
    GS_ASSERT_OK(gs_comm_destroy(comm));
    GS_ASSERT_OK(gs_tp_close(tp));
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

static void run_over_toy(const char *transport)
{
    params_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 60000, .rank_timeout_ms = 20000, .no_ctx = true};
    int status[GS_TEST_RANKS_MAX];
    toy_open();
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, over_toy_body, &a, status), 3);
    GS_ASSERT(toy_find("gs.job_token") != NULL); /* rank 0 published the transports' token */
    GS_ASSERT_EQ(toy_find("gs.job_token")->len, 64);
    GS_ASSERT(toy->sets > 10 && toy->gets > 10);
    toy_close();
}

GS_TEST(context_over_an_external_store_shm)
{
    run_over_toy("shm");
}

GS_TEST(context_over_an_external_store_tcp)
{
    run_over_toy("tcp");
}

/* Rank 2 never comes: the others' barrier fails at the deadline naming it. */
static void missing_body(gs_ctx *unused, int rank, void *argp)
{
    gs_kv_store kv = {.arg = toy, .set = toy_set, .get = toy_get};
    gs_ctx_params p = toy_params(rank, 3, &kv);
    gs_ctx *ctx;
    (void)unused;
    (void)argp;
    if (rank == 2)
        return;
    p.timeout_ms = 800;
    p.job_token = "given"; /* no token exchange: the barrier is the first wait */
    GS_ASSERT_OK(gs_ctx_create_with(&p, &ctx));
    GS_ASSERT_STATUS(gs_store_barrier(ctx, "all"), GS_ERR_TIMEOUT);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 2 did not come within 800 ms");
    GS_ASSERT_CONTAINS(gs_last_error(), "'all'");
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

GS_TEST(a_rank_missing_from_an_external_store_is_named)
{
    gs_test_ranks_opts opts = {.n = 3, .timeout_ms = 30000, .rank_timeout_ms = 5000, .no_ctx = true};
    int status[GS_TEST_RANKS_MAX];
    toy_open();
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, missing_body, NULL, status), 3);
    toy_close();
}

GS_TEST(a_failing_external_store_is_an_error)
{
    gs_kv_store kv = {.set = toy_set, .get = toy_get};
    gs_ctx_params p = toy_params(0, 2, &kv);
    gs_ctx *ctx = NULL;
    toy_open();
    kv.arg = toy;
    toy->fail_sets = 1;
    GS_ASSERT_STATUS(gs_ctx_create_with(&p, &ctx), GS_ERR_IO); /* rank 0 cannot publish the token */
    GS_ASSERT_CONTAINS(gs_last_error(), "gs.job_token");
    GS_ASSERT_CONTAINS(gs_last_error(), "external store");
    GS_ASSERT(ctx == NULL);
    toy_close();
}

GS_TEST(bad_parameters_are_refused)
{
    gs_kv_store kv = {.set = toy_set};
    gs_ctx_params p;
    gs_ctx *ctx = NULL;
    GS_ASSERT_STATUS(gs_ctx_create_with(NULL, &ctx), GS_ERR_INVALID);
    gs_ctx_params_init(&p);
    p.version = 99;
    GS_ASSERT_STATUS(gs_ctx_create_with(&p, &ctx), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "gs_ctx_params_init");
    gs_ctx_params_init(&p);
    p.rank = 3;
    p.world_size = 2;
    GS_ASSERT_STATUS(gs_ctx_create_with(&p, &ctx), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 3 of world_size 2");
    p.rank = 0;
    p.store = &kv; /* no get */
    GS_ASSERT_STATUS(gs_ctx_create_with(&p, &ctx), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "set and get");
    gs_ctx_params_init(&p);
    p.rank = 1;
    p.world_size = 4; /* no store at all */
    GS_ASSERT_STATUS(gs_ctx_create_with(&p, &ctx), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "need a store");
    GS_ASSERT(ctx == NULL);
}

/* One process, its own store, parameters only: as gs_ctx_create. */
GS_TEST(parameters_of_a_single_process)
{
    gs_ctx_params p = GS_CTX_PARAMS_INIT;
    gs_ctx *ctx;
    p.rank = 0;
    p.world_size = 1;
    p.timeout_ms = 1234;
    GS_ASSERT_OK(gs_ctx_create_with(&p, &ctx));
    GS_ASSERT_EQ(gs_ctx_size(ctx), 1);
    GS_ASSERT_EQ(gs_ctx_local_size(ctx), 1);
    GS_ASSERT_OK(gs_store_put(ctx, "a", "b", 1));
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}

/* The configuration in force, read through the public accessor (what tools
 * use instead of the context's inside): a given field wins over the
 * environment, the job token is never shown, an unknown name is refused. */
GS_TEST(parameters_in_force_are_readable)
{
    gs_ctx_params p = GS_CTX_PARAMS_INIT;
    gs_ctx *ctx;
    char buf[64];
    setenv("GS_CHUNK_BYTES", "64K", 1);
    setenv("GS_ALGO", "ring", 1);
    p.rank = 0;
    p.world_size = 1;
    p.timeout_ms = 1234;
    p.job_token = "secret";
    GS_ASSERT_OK(gs_ctx_create_with(&p, &ctx));
    GS_ASSERT_OK(gs_ctx_param(ctx, "GS_TIMEOUT_MS", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "1234");
    GS_ASSERT_OK(gs_ctx_param(ctx, "GS_CHUNK_BYTES", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "65536");
    GS_ASSERT_OK(gs_ctx_param(ctx, "GS_ALGO", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "ring");
    GS_ASSERT_OK(gs_ctx_param(ctx, "GS_JOB_TOKEN", buf, sizeof(buf)));
    GS_ASSERT_STR_EQ(buf, "(set)");
    GS_ASSERT_STATUS(gs_ctx_param(ctx, "GS_CHUNK_BYTE", buf, sizeof(buf)), GS_ERR_INVALID);
    GS_ASSERT(strstr(gs_last_error(), "GS_CHUNK_BYTES") != NULL);
    GS_ASSERT_STATUS(gs_ctx_param(ctx, "GS_ALGO", buf, 0), GS_ERR_INVALID);
    GS_ASSERT_OK(gs_ctx_destroy(ctx));
}
