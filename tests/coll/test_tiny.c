/*
 * The tiny path (src/coll/tiny.c): blocking allreduces and reduces of at
 * most GS_TINY_MAX_BYTES and barriers between 2 ranks over the shared-memory boxes. Its results
 * must be bit for bit those of the engine's path (gs_iallreduce, which never
 * takes it) for every type, operator, count and buffer placement; and
 * whatever goes wrong on it (a late peer, a mismatched call, a failure the
 * peer announced, a dead peer) must end as on the engine's path.
 *
 * Only the shm transport has the boxes. Over the others the same calls of
 * tiny size take the engine's path, and the tests check that they end the
 * same there (results, late peers, mismatches, a lost peer) and that none
 * went the tiny way; tests/rxe-vm runs them over verbs.
 */
#include "coll_check.h"

#include "coll/coll.h"

#include <unistd.h>

#define FAST_MS 8000 /* a mismatch is reported well before the deadline */

/* Whether the communicator takes the tiny path: over the boxes (shm), and
 * only there. */
static bool on_boxes(const gs_comm *comm, const char *transport)
{
    bool boxes = strcmp(transport, "shm") == 0;
    GS_ASSERT_EQ(comm->tiny, boxes);
    return boxes;
}

/* Off the boxes no call went the tiny way. */
static void none_went_tiny(const gs_comm *comm)
{
    GS_ASSERT_EQ(comm->tiny_done, 0);
    GS_ASSERT_EQ(comm->tiny_resumed, 0);
}

static void run2(const char *transport, gs_test_rank_fn fn, int rank_timeout_ms)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 60000, .rank_timeout_ms = rank_timeout_ms};
    int status[GS_TEST_RANKS_MAX];
    GS_ASSERT_EQ(gs_test_run_ranks_opts(&opts, fn, &a, status), 2);
}

/* ---- the same bits as the engine ------------------------------------------------ */

static uint64_t rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}

/* Values that round when added or multiplied, and the special ones: NaN,
 * infinities, both zeros, f16 subnormals, integers that wrap. */
static void random_fill(gs_dtype t, uint64_t *s, void *buf, size_t count)
{
    static const float special[] = {0.0f,        -0.0f, 1.0f / 0.0f, -1.0f / 0.0f,
                                    0.0f / 0.0f, 6e-8f, 65504.0f,    1e-40f};
    for (size_t i = 0; i < count; i++) {
        uint64_t r = rng(s);
        float f = r % 5 == 0 ? special[r % 8] : (float)((double)(r % 2000003) / 7919.0 - 120.0);
        switch (t) {
        case GS_F32: ((float *)buf)[i] = f; break;
        case GS_F64: ((double *)buf)[i] = r % 5 == 0 ? (double)f : (double)r / 3.0e12 - 1000.0; break;
        case GS_F16: ((uint16_t *)buf)[i] = r % 3 == 0 ? (uint16_t)r : gs_red_f32_to_f16(f); break;
        case GS_BF16: ((uint16_t *)buf)[i] = r % 3 == 0 ? (uint16_t)r : gs_red_f32_to_bf16(f); break;
        case GS_I32: ((int32_t *)buf)[i] = (int32_t)(uint32_t)(r * 2654435761u); break;
        case GS_I64: ((int64_t *)buf)[i] = (int64_t)(r * 0x9e3779b97f4a7c15ull); break;
        case GS_I16: ((uint16_t *)buf)[i] = (uint16_t)(r >> 17); break;
        default: ((uint8_t *)buf)[i] = (uint8_t)(r >> 23); break; /* u8, i8, bool (any byte) */
        }
    }
}

static void same_bits_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    uint64_t seed = 12345u + (uint64_t)rank * 777u, hash = 1469598103934665603ull, calls = 0;
    for (int round = 0; round < 4; round++) {
        for (int t = 0; t < GS_DTYPE_COUNT; t++) {
            size_t es = gs_dtype_size((gs_dtype)t);
            for (int op = 0; op < GS_REDOP_COUNT; op++) {
                if (!gs_red_valid((gs_dtype)t, (gs_redop)op))
                    continue;
                static const size_t counts[] = {0,  1,  2,  3,  4,  5,  7,  8,   9,
                                                15, 16, 17, 31, 32, 33, 64, 127, 128};
                for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                    size_t count = counts[ci];
                    uint8_t in[GS_TINY_MAX_BYTES + 16], tiny[GS_TINY_MAX_BYTES + 16],
                        engine[GS_TINY_MAX_BYTES + 16], inplace[GS_TINY_MAX_BYTES + 16];
                    if (count * es > GS_TINY_MAX_BYTES)
                        break;
                    char what[96];
                    gs_req *req;
                    snprintf(what, sizeof(what), "%s %s count %zu round %d", gs_dtype_name((gs_dtype)t),
                             gs_redop_name((gs_redop)op), count, round);
                    random_fill((gs_dtype)t, &seed, in, count);
                    memset(tiny, CC_GUARD, sizeof(tiny));
                    memset(engine, CC_GUARD, sizeof(engine));
                    GS_ASSERT_OK(gs_allreduce(comm, in, tiny, count, (gs_dtype)t, (gs_redop)op));
                    GS_ASSERT_OK(gs_iallreduce(comm, in, engine, count, (gs_dtype)t, (gs_redop)op, &req));
                    GS_ASSERT_OK(gs_req_wait(req));
                    memcpy(inplace, in, sizeof(in));
                    GS_ASSERT_OK(gs_allreduce(comm, inplace, inplace, count, (gs_dtype)t, (gs_redop)op));
                    calls += 2;
                    if (memcmp(tiny, engine, sizeof(tiny)) != 0 || memcmp(inplace, engine, count * es) != 0)
                        gs_test_fail_here(__FILE__, __LINE__, "rank %d, %s: the tiny path's bits differ",
                                          rank, what);
                    /* reduce: the root gets the allreduce's bits, the other rank's buffer stays */
                    int root = (round + (int)ci) % 2;
                    uint8_t reduced[GS_TINY_MAX_BYTES + 16];
                    memset(reduced, CC_GUARD, sizeof(reduced));
                    GS_ASSERT_OK(gs_reduce(comm, in, reduced, count, (gs_dtype)t, (gs_redop)op, root));
                    calls++;
                    for (size_t b = 0; b < sizeof(reduced); b++)
                        if (reduced[b] != (rank == root && b < count * es ? engine[b] : CC_GUARD))
                            gs_test_fail_here(__FILE__, __LINE__, "rank %d, %s: tiny reduce to %d: byte %zu",
                                              rank, what, root, b);
                    for (size_t b = count * es; b < sizeof(tiny); b++)
                        if (tiny[b] != CC_GUARD)
                            gs_test_fail_here(__FILE__, __LINE__, "%s: wrote past the result", what);
                    hash = cc_hash(hash, tiny, count * es);
                }
            }
        }
    }
    /* the exact values too, as test_allreduce checks them */
    for (int t = 0; t < GS_DTYPE_COUNT; t++)
        for (int op = 0; op < GS_REDOP_COUNT; op++) {
            if (!gs_red_valid((gs_dtype)t, (gs_redop)op))
                continue;
            size_t count = GS_TINY_MAX_BYTES / gs_dtype_size((gs_dtype)t);
            uint8_t in[GS_TINY_MAX_BYTES], out[GS_TINY_MAX_BYTES];
            cc_fill((gs_dtype)t, (gs_redop)op, rank, in, count);
            GS_ASSERT_OK(gs_allreduce(comm, in, out, count, (gs_dtype)t, (gs_redop)op));
            cc_check_reduced("tiny", (gs_dtype)t, (gs_redop)op, 2, out, 0, count);
            calls++;
        }
    cc_same_everywhere(ctx, "tiny-bits", hash);
    if (on_boxes(comm, a->transport)) {
        /* every blocking call went the tiny way (finished there, or resumed) */
        GS_ASSERT_EQ(comm->tiny_done + comm->tiny_resumed, calls);
        GS_ASSERT_GT(comm->tiny_done, 0);
    } else {
        none_went_tiny(comm);
    }
    cc_close(comm, tp);
}

GS_TEST_TP(tiny_same_bits_as_the_engine)
{
    run2(transport, same_bits_body, 20000);
}

/* ---- a late peer: the engine finishes the call ------------------------------------ */

static void late_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    float in[2] = {1.5f + (float)rank, -2.0f}, out[2];
    for (int i = 0; i < 3; i++) {
        if (rank == i % 2)
            usleep(30000); /* far beyond the tiny path's spin */
        GS_ASSERT_OK(gs_allreduce(comm, in, out, 2, GS_F32, GS_AVG));
        GS_ASSERT(out[0] == 2.0f && out[1] == -2.0f);
        if (rank == (i + 1) % 2)
            usleep(30000);
        out[0] = 0.0f;
        GS_ASSERT_OK(gs_reduce(comm, in, out, 2, GS_F32, GS_SUM, i % 2));
        GS_ASSERT(rank != i % 2 || (out[0] == 4.0f && out[1] == -4.0f));
        GS_ASSERT_OK(gs_barrier(comm));
    }
    if (on_boxes(comm, a->transport))
        GS_ASSERT_GT(comm->tiny_resumed, 0); /* the waiting rank handed over to the engine */
    else
        none_went_tiny(comm);
    cc_close(comm, tp);
}

GS_TEST_TP(tiny_late_peer_resumes_in_the_engine)
{
    run2(transport, late_body, 20000);
}

/* ---- mismatched calls on the tiny path ----------------------------------------- */

typedef enum tm_kind { TM_COUNT, TM_DTYPE, TM_OP, TM_BARRIER, TM_ZERO, TM_KINDS } tm_kind;

static gs_status tm_call(gs_comm *comm, tm_kind k, bool odd, float *buf)
{
    switch (k) {
    case TM_COUNT: return gs_allreduce(comm, buf, buf, odd ? 1 : 2, GS_F32, GS_SUM);
    case TM_DTYPE: return gs_allreduce(comm, buf, buf, 2, odd ? GS_I32 : GS_F32, GS_SUM);
    case TM_OP: return gs_allreduce(comm, buf, buf, 2, GS_F32, odd ? GS_AVG : GS_SUM);
    case TM_BARRIER: return odd ? gs_barrier(comm) : gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM);
    default: return gs_allreduce(comm, buf, buf, odd ? 0 : 1, GS_F64, GS_MAX);
    }
}

static void mismatch_body(gs_ctx *ctx, int rank, void *argp)
{
    static const char *const want[TM_KINDS][2] = {
        {"count 2, f32, sum", "count 1, f32, sum"},
        {"count 2, f32", "count 2, i32"},
        {"f32, sum", "f32, avg"},
        {"barrier #2", "allreduce #2"},
        {"count 1, f64", "count 0, f64"},
    };
    const cc_arg *a = argp;
    tm_kind k = (tm_kind)a->param;
    bool odd = rank == 1;
    float buf[4] = {1, 2, 3, 4};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    GS_ASSERT_OK(gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM)); /* a good call first */
    uint64_t t0 = gs_now_ns();
    GS_ASSERT_STATUS(tm_call(comm, k, odd, buf), GS_ERR_MISMATCH);
    GS_ASSERT_LT((gs_now_ns() - t0) / 1000000u, FAST_MS);
    GS_ASSERT_CONTAINS(gs_last_error(), "mismatched collective calls");
    GS_ASSERT_CONTAINS(gs_last_error(), want[k][0]);
    GS_ASSERT_CONTAINS(gs_last_error(), want[k][1]);
    /* the communicator stays failed, tiny calls included */
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM), GS_ERR_MISMATCH);
    GS_ASSERT_STATUS(gs_barrier(comm), GS_ERR_MISMATCH);
    if (!on_boxes(comm, a->transport))
        none_went_tiny(comm);
    cc_close(comm, tp);
}

GS_TEST_TP(tiny_mismatch_on_every_rank)
{
    for (int k = 0; k < TM_KINDS; k++) {
        cc_arg a = {.transport = transport, .param = k};
        gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 60000, .rank_timeout_ms = 20000};
        int status[GS_TEST_RANKS_MAX];
        if (gs_test_run_ranks_opts(&opts, mismatch_body, &a, status) != 2)
            gs_test_fail_here(__FILE__, __LINE__, "mismatch kind %d: a rank did not pass", k);
    }
}

/* ---- mixed with non-blocking calls and other collectives ----------------------------- */

static void mixed_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    enum { BIG = 5000 };
    float *big = malloc(2 * BIG * sizeof(float)), *bigout = malloc(2 * BIG * sizeof(float));
    for (int round = 0; round < 20; round++) {
        float small[2] = {(float)(rank + round), 0.5f}, out[2], rs;
        int64_t i64 = rank ? -3 : INT64_MAX, i64out;
        gs_req *req[2];
        for (size_t i = 0; i < 2 * BIG; i++)
            big[i] = (float)(i % 7);
        /* a blocking tiny-sized call with requests in flight goes the engine's way */
        GS_ASSERT_OK(gs_iallreduce(comm, big, bigout, BIG, GS_F32, GS_SUM, &req[0]));
        GS_ASSERT_OK(gs_ibarrier(comm, &req[1]));
        GS_ASSERT_OK(gs_allreduce(comm, small, out, 2, GS_F32, GS_SUM));
        GS_ASSERT_OK(gs_req_wait(req[0]));
        GS_ASSERT_OK(gs_req_wait(req[1]));
        GS_ASSERT(out[0] == (float)(1 + 2 * round) && out[1] == 1.0f);
        GS_ASSERT(bigout[BIG - 1] == (float)(2 * ((BIG - 1) % 7)));
        /* then tiny calls between other collectives */
        GS_ASSERT_OK(gs_allreduce(comm, &i64, &i64out, 1, GS_I64, GS_SUM));
        GS_ASSERT_EQ(i64out, (int64_t)((uint64_t)INT64_MAX - 3u));
        GS_ASSERT_OK(gs_reduce_scatter(comm, big, &rs, 1, GS_F32, GS_SUM));
        GS_ASSERT(rs == (float)(2 * rank));
        GS_ASSERT_OK(gs_barrier(comm));
        GS_ASSERT_OK(gs_allreduce(comm, big, bigout, 2 * BIG, GS_F32, GS_MAX));
        GS_ASSERT_OK(gs_allreduce(comm, small, small, 2, GS_F32, GS_AVG));
        GS_ASSERT(small[0] == (float)round + 0.5f && small[1] == 0.5f);
        cc_set_algo(ctx, round % 3 == 1 ? GS_ALGO_RING : GS_ALGO_AUTO); /* and not at all */
    }
    if (on_boxes(comm, a->transport))
        GS_ASSERT_GT(comm->tiny_done + comm->tiny_resumed, 0);
    else
        none_went_tiny(comm);
    free(big);
    free(bigout);
    cc_close(comm, tp);
}

GS_TEST_TP(tiny_mixed_with_requests_and_collectives)
{
    run2(transport, mixed_body, 20000);
}

/* ---- failures ---------------------------------------------------------------------- */

/* Rank 0 times out and announces it in its box; rank 1 comes late, finds
 * rank 0's post of that call matching, and must still fail with rank 0's
 * words instead of returning a result. */
static void absent_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float buf[2] = {1, 2};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    GS_ASSERT_OK(gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM));
    if (rank == 1)
        usleep(2000000);
    GS_ASSERT_STATUS(gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM), GS_ERR_TIMEOUT);
    GS_ASSERT_CONTAINS(gs_last_error(), "made no progress");
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 0");
    if (!on_boxes(comm, a->transport))
        none_went_tiny(comm);
    gs_comm_destroy(comm);
    gs_tp_close(tp);
}

GS_TEST_TP(tiny_announced_timeout_is_not_a_result)
{
    run2(transport, absent_body, 1000);
}

static void dying_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    float buf[2] = {1, 2};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    GS_ASSERT_OK(gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM));
    GS_ASSERT_OK(gs_store_barrier(ctx, "first-done"));
    if (rank == 1)
        _exit(3);
    gs_status st = gs_allreduce(comm, buf, buf, 2, GS_F32, GS_SUM);
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST); /* seen before the 5 s deadline */
    GS_ASSERT_CONTAINS(gs_last_error(), "rank");
    GS_ASSERT_STATUS(gs_barrier(comm), st);
    if (!on_boxes(comm, a->transport))
        none_went_tiny(comm);
    gs_comm_destroy(comm);
    gs_tp_close(tp);
}

GS_TEST_TP(tiny_dead_peer_is_an_error_not_a_hang)
{
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 30000, .rank_timeout_ms = 5000};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, dying_body, &a, status);
    GS_ASSERT_RANK_EXIT(status[0], 0);
    GS_ASSERT_RANK_EXIT(status[1], 3);
}
