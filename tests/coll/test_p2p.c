/*
 * Point-to-point send/recv on a communicator, over every built transport:
 * ping-pong of every size class (eager, the eager edge, rendezvous) and
 * several types with exact contents, FIFO per (peer, tag) with many
 * messages in flight, any-source receives, receives posted before and after
 * the message, sends interleaved with allreduces, sends to self, a message
 * longer than the receive buffer, a receive nothing matches, small
 * messages through the mailboxes (shm) in one order with the transport's
 * and a receiver blocked in the transport woken by one, and a peer that
 * dies during a receive; 2, 3 and 4 ranks.
 */
#include "coll_check.h"

#include "coll/coll.h"

#include <signal.h>
#include <unistd.h>

/* The byte at i of message seed: tells offset and message apart. */
static uint8_t pat(uint32_t seed, size_t i)
{
    uint32_t x = seed * 2654435761u ^ (uint32_t)(i * 40503u) ^ (uint32_t)(i >> 13);
    return (uint8_t)(x ^ (x >> 11) ^ (x >> 21));
}

static void fill(uint8_t *p, size_t bytes, uint32_t seed)
{
    for (size_t i = 0; i < bytes; i++)
        p[i] = pat(seed, i);
}

static void check(const uint8_t *p, size_t bytes, uint32_t seed, const char *what)
{
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != pat(seed, i))
            gs_test_fail_here(__FILE__, __LINE__, "%s: byte %zu of %zu differs (0x%02x, want 0x%02x)", what,
                              i, bytes, p[i], pat(seed, i));
}

static void check_status(const gs_p2p_status *st, int source, int tag, size_t count)
{
    GS_ASSERT_EQ(st->source, source);
    GS_ASSERT_EQ(st->tag, tag);
    GS_ASSERT_EQ(st->count, count);
}

/* ---- ping-pong ------------------------------------------------------------------- */

static const size_t counts[] = {0, 1, 7, 4095, 4096, (64u << 10) + 3, (4u << 20) + 1};
static const gs_dtype types[] = {GS_F32, GS_I64, GS_F16};

/* 2 ranks: rank 0 sends, rank 1 checks and sends back another message of
 * the same size. More ranks: around the ring, every rank at once. */
static void pingpong_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx), next = (rank + 1) % n, prev = (rank + n - 1) % n;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    if (a->param) /* large messages in fragments, as without user memory */
        gs_p2p_force_fragments(comm);
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            gs_dtype dt = types[t];
            size_t count = counts[c], bytes = count * gs_dtype_size(dt);
            uint32_t seed = (uint32_t)(t * 100 + c * 10);
            uint8_t *out = cc_alloc(bytes), *in = cc_alloc(bytes);
            gs_p2p_status st;
            int tag = (int)c;
            char what[96];
            snprintf(what, sizeof(what), "%zu %s", count, gs_dtype_name(dt));
            if (n == 2) {
                fill(out, bytes, seed + (uint32_t)rank);
                if (rank == 0) {
                    GS_ASSERT_OK(gs_send(comm, out, count, dt, 1, tag));
                    GS_ASSERT_OK(gs_recv(comm, in, count, dt, 1, tag, &st));
                    check(in, bytes, seed + 1, what);
                } else {
                    GS_ASSERT_OK(gs_recv(comm, in, count, dt, 0, tag, &st));
                    check(in, bytes, seed, what);
                    GS_ASSERT_OK(gs_send(comm, out, count, dt, 0, tag));
                }
                check_status(&st, 1 - rank, tag, count);
            } else {
                gs_req *rr, *sr;
                fill(out, bytes, seed + (uint32_t)rank);
                GS_ASSERT_OK(gs_irecv(comm, in, count, dt, prev, tag, &st, &rr));
                GS_ASSERT_OK(gs_isend(comm, out, count, dt, next, tag, &sr));
                GS_ASSERT_OK(gs_req_wait(sr));
                GS_ASSERT_OK(gs_req_wait(rr));
                check(in, bytes, seed + (uint32_t)prev, what);
                check_status(&st, prev, tag, count);
            }
            cc_check_guard(in, bytes, what);
            free(out);
            free(in);
        }
    cc_close(comm, tp);
}

GS_TEST_TP(pingpong_2)
{
    cc_run_env(transport, 2, pingpong_body, 0, NULL);
}

GS_TEST_TP(pingpong_2_fragments)
{
    cc_run_env(transport, 2, pingpong_body, 1, NULL);
}

GS_TEST_TP(ring_3)
{
    cc_run_env(transport, 3, pingpong_body, 0, NULL);
}

GS_TEST_TP(ring_4)
{
    cc_run_env(transport, 4, pingpong_body, 0, NULL);
}

/* ---- FIFO per (peer, tag) ---------------------------------------------------------- */

#define FIFO_MSGS 100
#define FIFO_TAGS 3

/* Message i from rank s: tag i % FIFO_TAGS, a few rendezvous sizes among
 * the eager ones. */
static size_t fifo_count(int i)
{
    return i % 10 == 0 ? 3000 + (size_t)i : (size_t)i + 1; /* i32 elements */
}

/* Every rank but 0 starts FIFO_MSGS sends to rank 0 at once; rank 0
 * receives them tag by tag, highest first, sender by sender. */
static void fifo_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx);
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    if (a->param && rank == 2) /* its large messages in fragments */
        gs_p2p_force_fragments(comm);
    if (rank != 0) {
        gs_req *req[FIFO_MSGS];
        int32_t *buf[FIFO_MSGS];
        for (int i = 0; i < FIFO_MSGS; i++) {
            size_t count = fifo_count(i);
            buf[i] = malloc(count * sizeof(int32_t));
            for (size_t e = 0; e < count; e++)
                buf[i][e] = rank * 100000 + i * 100 + (int32_t)(e % 100);
            GS_ASSERT_OK(gs_isend(comm, buf[i], count, GS_I32, 0, i % FIFO_TAGS, &req[i]));
        }
        for (int i = FIFO_MSGS - 1; i >= 0; i--) {
            GS_ASSERT_OK(gs_req_wait(req[i]));
            free(buf[i]);
        }
    } else {
        int32_t *in = malloc(4000 * sizeof(int32_t));
        for (int tag = FIFO_TAGS - 1; tag >= 0; tag--)
            for (int s = n - 1; s >= 1; s--)
                for (int i = tag; i < FIFO_MSGS; i += FIFO_TAGS) {
                    gs_p2p_status st;
                    GS_ASSERT_OK(gs_recv(comm, in, 4000, GS_I32, s, tag, &st));
                    check_status(&st, s, tag, fifo_count(i));
                    for (size_t e = 0; e < fifo_count(i); e++)
                        GS_ASSERT_EQ(in[e], s * 100000 + i * 100 + (int32_t)(e % 100));
                }
        free(in);
    }
    GS_ASSERT_OK(gs_barrier(comm));
    cc_close(comm, tp);
}

GS_TEST_TP(fifo_2)
{
    cc_run_env(transport, 2, fifo_body, 0, NULL);
}

GS_TEST_TP(fifo_3)
{
    cc_run_env(transport, 3, fifo_body, 1, NULL);
}

/* ---- any source ------------------------------------------------------------------------ */

#define ANY_MSGS 6

/* Ranks 1..3 each send ANY_MSGS messages with tag 7 (and one with tag 8)
 * to rank 0, which takes them with GS_ANY_SOURCE: every message once, each
 * sender's in order, the tag 8 ones only by their tag. */
static void any_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx);
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    if (rank != 0) {
        int64_t big[5000];
        for (size_t e = 0; e < 5000; e++)
            big[e] = rank * 1000 + (int64_t)e;
        GS_ASSERT_OK(gs_send(comm, big, 5000, GS_I64, 0, 8)); /* rendezvous, waits for its receive */
        for (int64_t i = 0; i < ANY_MSGS; i++) {
            int64_t v[2] = {rank, i};
            GS_ASSERT_OK(gs_send(comm, v, 2, GS_I64, 0, 7));
        }
    } else {
        int64_t next[8] = {0}, *big = malloc(5000 * sizeof(int64_t));
        gs_p2p_status st;
        for (int k = 1; k < n; k++) {
            GS_ASSERT_OK(gs_recv(comm, big, 5000, GS_I64, GS_ANY_SOURCE, 8, &st));
            GS_ASSERT(st.source >= 1 && st.source < n);
            GS_ASSERT_EQ(st.count, 5000u);
            GS_ASSERT_EQ(big[4999], st.source * 1000 + 4999);
        }
        for (int k = 0; k < (n - 1) * ANY_MSGS; k++) {
            int64_t v[2];
            GS_ASSERT_OK(gs_recv(comm, v, 2, GS_I64, GS_ANY_SOURCE, 7, &st));
            GS_ASSERT_EQ(st.tag, 7);
            GS_ASSERT_EQ(v[0], st.source);
            GS_ASSERT_EQ(v[1], next[st.source]);
            next[st.source]++;
        }
        for (int s = 1; s < n; s++)
            GS_ASSERT_EQ(next[s], ANY_MSGS);
        free(big);
    }
    GS_ASSERT_OK(gs_barrier(comm));
    cc_close(comm, tp);
}

GS_TEST_TP(any_source_4)
{
    cc_run_env(transport, 4, any_body, 0, NULL);
}

/* ---- posted before and after the message arrives ------------------------------------ */

/* For an eager and a rendezvous size: a receive posted before the sender
 * starts (a barrier between), then one posted after the message is surely
 * there (the sender's barrier after the send). */
static void before_after_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    static const size_t sizes[] = {100, 300000};
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    for (size_t k = 0; k < 2; k++) {
        size_t bytes = sizes[k] * sizeof(double);
        uint8_t *buf = cc_alloc(bytes);
        gs_p2p_status st;
        gs_req *req;
        if (rank == 1) {
            GS_ASSERT_OK(gs_irecv(comm, buf, sizes[k], GS_F64, 0, 3, &st, &req));
            GS_ASSERT_STATUS(gs_req_test(req), GS_INPROGRESS);
            GS_ASSERT_OK(gs_barrier(comm)); /* posted: now rank 0 sends */
            GS_ASSERT_OK(gs_req_wait(req));
            check(buf, bytes, 11 + (uint32_t)k, "posted before");
            check_status(&st, 0, 3, sizes[k]);
            memset(buf, 0, bytes);
            GS_ASSERT_OK(gs_barrier(comm)); /* rank 0 sent the second one */
            usleep(20000);
            GS_ASSERT_OK(gs_recv(comm, buf, sizes[k], GS_F64, 0, 3, &st));
            check(buf, bytes, 12 + (uint32_t)k, "posted after");
            check_status(&st, 0, 3, sizes[k]);
        } else {
            uint8_t *two = cc_alloc(bytes);
            fill(buf, bytes, 11 + (uint32_t)k);
            fill(two, bytes, 12 + (uint32_t)k);
            GS_ASSERT_OK(gs_barrier(comm));
            GS_ASSERT_OK(gs_send(comm, buf, sizes[k], GS_F64, 1, 3));
            GS_ASSERT_OK(gs_isend(comm, two, sizes[k], GS_F64, 1, 3, &req));
            GS_ASSERT_OK(gs_barrier(comm));
            GS_ASSERT_OK(gs_req_wait(req));
            free(two);
        }
        free(buf);
    }
    cc_close(comm, tp);
}

GS_TEST_TP(posted_before_and_after)
{
    cc_run_env(transport, 2, before_after_body, 0, NULL);
}

/* ---- beside allreduces ------------------------------------------------------------------- */

#define MIX_ROUNDS 40

/* Every round: receives from the left and sends to the right in flight
 * (eager and rendezvous sizes by turns), an allreduce (blocking, or
 * non-blocking with a blocking send inside it), then the p2p waits. */
static void mixed_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx), next = (rank + 1) % n, prev = (rank + n - 1) % n;
    const size_t acount = 3000;
    float *x = malloc(acount * sizeof(float)), *y = malloc(acount * sizeof(float));
    uint8_t *out = malloc(100000), *in = malloc(100000);
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    for (int round = 0; round < MIX_ROUNDS; round++) {
        size_t bytes = round % 3 == 2 ? 100000 : (size_t)(round * 37 % 4000);
        gs_req *rr, *sr, *ar = NULL;
        gs_p2p_status st;
        fill(out, bytes, (uint32_t)(round * 8 + rank));
        cc_fill(GS_F32, GS_SUM, rank + round, x, acount);
        GS_ASSERT_OK(gs_irecv(comm, in, 100000, GS_F32 + 0, prev, round, &st, &rr));
        if (round % 2 == 0) {
            GS_ASSERT_OK(gs_isend(comm, out, bytes / 4, GS_F32, next, round, &sr));
            GS_ASSERT_OK(gs_allreduce(comm, x, y, acount, GS_F32, GS_SUM));
        } else {
            GS_ASSERT_OK(gs_iallreduce(comm, x, y, acount, GS_F32, GS_SUM, &ar));
            GS_ASSERT_OK(gs_isend(comm, out, bytes / 4, GS_F32, next, round, &sr));
        }
        GS_ASSERT_OK(gs_req_wait(sr));
        GS_ASSERT_OK(gs_req_wait(rr));
        if (ar)
            GS_ASSERT_OK(gs_req_wait(ar));
        check(in, bytes / 4 * 4, (uint32_t)(round * 8 + prev), "p2p beside allreduce");
        check_status(&st, prev, round, bytes / 4);
        for (size_t e = 0; e < acount; e++) {
            float want = 0, v;
            for (int r = 0; r < n; r++) {
                cc_put(GS_F32, GS_SUM, r + round, e, &v);
                want += v;
            }
            GS_ASSERT(y[e] == want);
        }
    }
    cc_close(comm, tp);
    free(x);
    free(y);
    free(out);
    free(in);
}

GS_TEST_TP(beside_allreduce_2)
{
    cc_run_env(transport, 2, mixed_body, 0, NULL);
}

GS_TEST_TP(beside_allreduce_3)
{
    cc_run_env(transport, 3, mixed_body, 0, NULL);
}

/* ---- self, errors, arguments ------------------------------------------------------------ */

/* Sends to itself (eager and large, before and after the receive), bad
 * arguments, a message longer than the receive buffer and one of another
 * type (eager and rendezvous: the communicator stays usable), and a
 * receive nothing matches (GS_ERR_TIMEOUT, alone). */
static void errors_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int peer = 1 - rank;
    float *buf = malloc(20000 * sizeof(float)), *in = malloc(20000 * sizeof(float));
    gs_p2p_status st;
    gs_req *req;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    fill((uint8_t *)buf, 20000 * sizeof(float), 5);
    /* self */
    GS_ASSERT_OK(gs_send(comm, buf, 20000, GS_F32, rank, 1));
    GS_ASSERT_OK(gs_irecv(comm, in, 20000, GS_F32, rank, 2, &st, &req));
    GS_ASSERT_OK(gs_send(comm, buf, 10, GS_F32, rank, 2));
    GS_ASSERT_OK(gs_req_wait(req));
    check_status(&st, rank, 2, 10);
    GS_ASSERT_OK(gs_recv(comm, in, 20000, GS_F32, GS_ANY_SOURCE, 1, &st));
    check_status(&st, rank, 1, 20000);
    check((uint8_t *)in, 20000 * sizeof(float), 5, "self");
    /* arguments */
    GS_ASSERT_STATUS(gs_send(comm, buf, 1, GS_F32, 2, 0), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_send(comm, buf, 1, GS_F32, GS_ANY_SOURCE, 0), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_recv(comm, in, 1, GS_F32, 0, -1, NULL), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_recv(comm, NULL, 1, GS_F32, 0, 0, NULL), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_isend(comm, buf, SIZE_MAX / 2, GS_F32, peer, 0, &req), GS_ERR_INVALID);
    /* too long, eager then rendezvous, then another type, then all right */
    if (rank == 0) {
        GS_ASSERT_OK(gs_send(comm, buf, 100, GS_F32, 1, 4));
        GS_ASSERT_STATUS(gs_send(comm, buf, 20000, GS_F32, 1, 4), GS_ERR_MISMATCH);
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 0: send to rank 1 (tag 4, 80000 bytes): rank 1 refused");
        GS_ASSERT_CONTAINS(gs_last_error(), "4000 bytes");
        GS_ASSERT_OK(gs_send(comm, buf, 8, GS_F32, 1, 4));
        GS_ASSERT_OK(gs_send(comm, buf, 8, GS_F32, 1, 4));
    } else {
        char want[200];
        GS_ASSERT_STATUS(gs_recv(comm, in, 50, GS_F32, 0, 4, &st), GS_ERR_MISMATCH);
        GS_ASSERT_STR_EQ(gs_last_error(),
                         "rank 1: recv from rank 0 (tag 4): rank 0's message of 400 bytes is "
                         "longer than the receive buffer of 200 bytes (50 f32)");
        GS_ASSERT_STATUS(gs_recv(comm, in, 1000, GS_F32, 0, 4, &st), GS_ERR_MISMATCH);
        snprintf(want, sizeof(want), "message of %zu bytes is longer than the receive buffer of 4000 bytes",
                 20000 * sizeof(float));
        GS_ASSERT_CONTAINS(gs_last_error(), want);
        GS_ASSERT_STATUS(gs_recv(comm, in, 8, GS_I32, 0, 4, &st), GS_ERR_MISMATCH);
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 0 sent f32, the receive takes i32");
        GS_ASSERT_OK(gs_recv(comm, in, 8, GS_F32, 0, 4, &st));
        check_status(&st, 0, 4, 8);
    }
    /* nothing comes: this receive times out alone (on both ranks, so
     * neither waits in the barrier below for the other's deadline) */
    {
        uint64_t t0 = gs_now_ns();
        char want[160];
        GS_ASSERT_STATUS(gs_recv(comm, in, 1, GS_F32, peer, 99, &st), GS_ERR_TIMEOUT);
        snprintf(want, sizeof(want),
                 "rank %d: recv from rank %d (tag 99): no message came for 1000 ms (GS_TIMEOUT_MS): did the "
                 "sender send it?",
                 rank, peer);
        GS_ASSERT_STR_EQ(gs_last_error(), want);
        GS_ASSERT_LT(gs_now_ns() - t0, 3000000000ull);
    }
    GS_ASSERT_OK(gs_barrier(comm));
    GS_ASSERT_OK(gs_allreduce(comm, buf, in, 1000, GS_F32, GS_MAX));
    cc_close(comm, tp);
    free(buf);
    free(in);
}

GS_TEST_TP(self_and_errors)
{
    static const char *const env[] = {"GS_TIMEOUT_MS=1000", NULL};
    cc_run_env(transport, 2, errors_body, 0, env);
}

/* ---- mailboxes and the transport, in one order -------------------------------------- */

#define MAIL_MSGS 61 /* more than three rings' worth (GS_MAIL_SLOTS) */

/* Message i's bytes: mailbox sizes (up to GS_MAIL_MAX), just past it, and
 * a rendezvous one now and then, so that the two paths interleave. */
static size_t mail_bytes(int i)
{
    static const size_t cycle[] = {8, GS_MAIL_MAX, 0, GS_MAIL_MAX + 1, 20, 1, 200};
    return i % 13 == 12 ? 100000 : cycle[i % 7];
}

/* Rank 0 sends MAIL_MSGS messages with one tag, blocking sends for the
 * small ones and isends for the large; rank 1 receives them in order
 * (every third from any source), first after a pause (the ring fills and
 * the transport carries the rest), then while they come. */
static void mail_order_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    uint8_t *buf[MAIL_MSGS];
    for (int round = 0; round < 2; round++) {
        gs_req *req[MAIL_MSGS] = {0};
        GS_ASSERT_OK(gs_barrier(comm));
        for (int i = 0; i < MAIL_MSGS; i++) {
            size_t bytes = mail_bytes(i);
            uint32_t seed = 1000u * (uint32_t)round + (uint32_t)i;
            buf[i] = cc_alloc(bytes ? bytes : 1);
            if (rank == 0) {
                fill(buf[i], bytes, seed);
                if (bytes > 4096)
                    GS_ASSERT_OK(gs_isend(comm, buf[i], bytes, GS_U8, 1, 9, &req[i]));
                else
                    GS_ASSERT_OK(gs_send(comm, buf[i], bytes, GS_U8, 1, 9));
                continue;
            }
            if (round == 0 && i == 0)
                usleep(30000);
            gs_p2p_status st;
            GS_ASSERT_OK(gs_recv(comm, buf[i], 100000, GS_U8, i % 3 == 2 ? GS_ANY_SOURCE : 0, 9, &st));
            check_status(&st, 0, 9, bytes);
            check(buf[i], bytes, seed, "mailbox and transport in order");
        }
        for (int i = 0; i < MAIL_MSGS; i++) {
            if (req[i])
                GS_ASSERT_OK(gs_req_wait(req[i]));
            free(buf[i]);
        }
    }
    GS_ASSERT_OK(gs_barrier(comm));
    cc_close(comm, tp);
}

GS_TEST_TP(mail_and_transport_in_order)
{
    cc_run_env(transport, 2, mail_order_body, 0, NULL);
}

#define WAKE_ROUNDS 6

/* The receiver waits past its spin (GS_SPIN_US) and blocks in the
 * transport before the small message comes: the sender must wake it (the
 * deadline is long enough for the test's own to catch a lost wake-up, short
 * enough that a lost one fails as GS_ERR_TIMEOUT). Blocking and
 * non-blocking receives, both directions. */
static void mail_wake_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    for (int r = 0; r < WAKE_ROUNDS; r++) {
        int receiver = r % 2;
        uint64_t v = 0;
        if (rank == receiver) {
            gs_req *req;
            if (r % 4 < 2) {
                GS_ASSERT_OK(gs_recv(comm, &v, 1, GS_I64, 1 - rank, r, NULL));
            } else {
                GS_ASSERT_OK(gs_irecv(comm, &v, 1, GS_I64, 1 - rank, r, NULL, &req));
                GS_ASSERT_OK(gs_req_wait(req));
            }
            GS_ASSERT_EQ(v, 77u + (uint64_t)r);
        } else {
            usleep(20000);
            v = 77u + (uint64_t)r;
            GS_ASSERT_OK(gs_send(comm, &v, 1, GS_I64, 1 - rank, r));
        }
    }
    GS_ASSERT_OK(gs_barrier(comm));
    cc_close(comm, tp);
}

GS_TEST_TP(mail_wakes_a_blocked_receiver)
{
    const char *hybrid[] = {"GS_TIMEOUT_MS=8000", "GS_SPIN_US=50", NULL};
    const char *event[] = {"GS_TIMEOUT_MS=8000", "GS_POLL=event", NULL};
    cc_run_env(transport, 2, mail_wake_body, 0, hybrid);
    cc_run_env(transport, 2, mail_wake_body, 0, event);
}

/* ---- a peer dies ----------------------------------------------------------------------- */

/* The last rank answers one message, then dies; every other rank's next
 * receive from it is GS_ERR_PEER_LOST naming it, well within the deadline,
 * and a later send fails the same way. */
static void dead_body(gs_ctx *ctx, int rank, void *argp)
{
    const cc_arg *a = argp;
    int n = gs_ctx_size(ctx), victim = n - 1;
    int32_t v[1000] = {0};
    char prefix[128];
    gs_tp *tp;
    gs_comm *comm = cc_open(ctx, a->transport, &tp);
    if (rank == victim) {
        for (int p = 0; p < n - 1; p++)
            GS_ASSERT_OK(gs_send(comm, v, 10, GS_I32, p, 0));
        raise(SIGKILL);
    }
    GS_ASSERT_OK(gs_recv(comm, v, 10, GS_I32, victim, 0, NULL));
    uint64_t t0 = gs_now_ns();
    gs_status st = gs_recv(comm, v, 1000, GS_I32, victim, 5, NULL);
    uint64_t ms = (gs_now_ns() - t0) / 1000000u;
    fprintf(stderr, "  rank %d: %s after %llu ms: %s\n", rank, gs_status_name(st), (unsigned long long)ms,
            gs_last_error());
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    GS_ASSERT_LT(ms, 8000u);
    snprintf(prefix, sizeof(prefix), "rank %d: recv from rank %d (tag 5): rank %d lost (", rank, victim,
             victim);
    GS_ASSERT_EQ(strncmp(gs_last_error(), prefix, strlen(prefix)), 0);
    GS_ASSERT_CONTAINS(gs_last_error(), "): did it exit or crash?");
    GS_ASSERT_STATUS(gs_send(comm, v, 10, GS_I32, victim, 5), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "send to rank");
    gs_comm_destroy(comm);
    gs_tp_close(tp);
}

static void run_dead(const char *transport, int n)
{
    static const char *const env[] = {"GS_TIMEOUT_MS=10000", NULL};
    cc_arg a = {.transport = transport};
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = 60000, .rank_timeout_ms = 20000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, dead_body, &a, status);
    for (int r = 0; r < n; r++)
        if (r == n - 1)
            GS_ASSERT_RANK_SIGNAL(status[r], SIGKILL);
        else
            GS_ASSERT_RANK_EXIT(status[r], 0);
}

GS_TEST_TP(dead_peer_2)
{
    run_dead(transport, 2);
}

GS_TEST_TP(dead_peer_3)
{
    run_dead(transport, 3);
}
