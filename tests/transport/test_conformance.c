/*
 * The transport conformance suite: written once, run against every built
 * transport (GS_TEST_TP: "<transport>.<case>", or only the one named by
 * GS_TEST_TRANSPORT), so `test_conformance shm.` or `--transport shm` runs
 * one backend and skips are counted per backend.
 *
 * Every case runs its ranks as forked processes of one job (multirank.h).
 * Access errors may surface either as the post's return value or as the
 * status of the op's completion (verbs reports them asynchronously); the
 * helpers accept both.
 */
#include "gs_test.h"
#include "multirank.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/clock.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define CT_TIMEOUT_MS 60000 /* the whole multirank run */
#define KIB           1024u
#define MIB           (1024u * 1024u)

/* ---- per-rank helpers --------------------------------------------------------- */

typedef struct ct_arg {
    const char *transport;
    int param; /* case-specific */
} ct_arg;

static gs_tp *ct_open(gs_ctx *ctx, const char *transport)
{
    gs_tp *tp = NULL;
    GS_ASSERT_OK(gs_tp_open(ctx, transport, &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), transport);
    return tp;
}

static unsigned ct_caps(gs_tp *tp)
{
    return tp->ops->caps(tp);
}

/* Every rank's descriptor of mr, in rank order (size entries). */
static gs_rmr *ct_exchange(gs_ctx *ctx, const char *tag, const gs_mr *mr)
{
    gs_rmr mine, *all = calloc((size_t)gs_ctx_size(ctx), sizeof(*all));
    GS_ASSERT(all);
    gs_mr_pack(mr, &mine);
    GS_ASSERT_OK(gs_store_allgather(ctx, tag, &mine, sizeof(mine), all));
    return all;
}

static uint8_t ct_byte(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 131u + i * 7u + (i >> 8) + 1u);
}

static void ct_fill(void *buf, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        ((uint8_t *)buf)[i] = ct_byte(seed, i);
}

/* First index where buf differs from the pattern, or len. */
static size_t ct_check(const void *buf, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        if (((const uint8_t *)buf)[i] != ct_byte(seed, i))
            return i;
    return len;
}

static size_t ct_check_const(const void *buf, size_t len, uint8_t value)
{
    for (size_t i = 0; i < len; i++)
        if (((const uint8_t *)buf)[i] != value)
            return i;
    return len;
}

/* Completions that arrived while waiting for another one. */
static gs_wc ct_stash[512];
static int ct_stashed;

static bool ct_match(const gs_wc *wc, gs_wc_opcode op, int peer, uint64_t wr_id, bool any_id)
{
    return wc->opcode == op && (peer < 0 || wc->peer == peer) && (any_id || wc->wr_id == wr_id);
}

/* The next completion of opcode op (from peer, -1: any; with wr_id unless
 * any_id), whatever its status. Others are kept for later calls. */
static gs_wc ct_next(gs_tp *tp, gs_wc_opcode op, int peer, uint64_t wr_id, bool any_id)
{
    for (int i = 0; i < ct_stashed; i++) {
        if (ct_match(&ct_stash[i], op, peer, wr_id, any_id)) {
            gs_wc wc = ct_stash[i];
            memmove(&ct_stash[i], &ct_stash[i + 1], (size_t)(ct_stashed - i - 1) * sizeof(gs_wc));
            ct_stashed--;
            return wc;
        }
    }
    for (;;) {
        gs_wc wcs[16];
        int n = 0;
        gs_wc found = {.opcode = 0};
        GS_ASSERT_OK(gs_tp_wait(tp, wcs, 16, &n, -1));
        for (int i = 0; i < n; i++) {
            if (!found.opcode && ct_match(&wcs[i], op, peer, wr_id, any_id)) {
                found = wcs[i];
                continue;
            }
            GS_ASSERT(ct_stashed < (int)(sizeof(ct_stash) / sizeof(ct_stash[0])));
            ct_stash[ct_stashed++] = wcs[i];
        }
        if (found.opcode)
            return found;
    }
}

/* The next completion of op from peer, which must have succeeded. */
static gs_wc ct_expect(gs_tp *tp, gs_wc_opcode op, int peer)
{
    gs_wc wc = ct_next(tp, op, peer, 0, true);
    if (wc.status != GS_OK)
        gs_test_fail_here(__FILE__, __LINE__, "completion (opcode %d, peer %d, wr_id %llu) has status %s: %s",
                          op, wc.peer, (unsigned long long)wc.wr_id, gs_status_name(wc.status),
                          gs_last_error());
    return wc;
}

/* The outcome of a signaled post: its error, or its completion's status. */
static gs_status ct_outcome(gs_tp *tp, gs_status posted, gs_wc_opcode op, int peer, uint64_t wr_id)
{
    if (posted != GS_OK)
        return posted;
    return ct_next(tp, op, peer, wr_id, false).status;
}

/* Posts until the transport takes it (GS_ERR_AGAIN: poll, keeping what comes). */
#define CT_POST(tp, call)                                                                                    \
    do {                                                                                                     \
        gs_status ct_st_;                                                                                    \
        while ((ct_st_ = (call)) == GS_ERR_AGAIN) {                                                          \
            gs_wc ct_w_[8];                                                                                  \
            int ct_n_ = 0;                                                                                   \
            GS_ASSERT_OK(gs_tp_poll(tp, ct_w_, 8, &ct_n_));                                                  \
            for (int ct_i_ = 0; ct_i_ < ct_n_; ct_i_++) {                                                    \
                GS_ASSERT(ct_stashed < (int)(sizeof(ct_stash) / sizeof(ct_stash[0])));                       \
                ct_stash[ct_stashed++] = ct_w_[ct_i_];                                                       \
            }                                                                                                \
        }                                                                                                    \
        GS_ASSERT_STATUS(ct_st_, GS_OK);                                                                     \
    } while (0)

static void ct_run(int n, gs_test_rank_fn fn, const char *transport, int param, const char *const *env)
{
    ct_arg arg = {.transport = transport, .param = param};
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = CT_TIMEOUT_MS, .rank_timeout_ms = 20000, .env = env};
    int status[GS_TEST_RANKS_MAX];
    char text[64];
    int skipped = 0;
    if (gs_test_run_ranks_opts(&opts, fn, &arg, status) == n)
        return;
    for (int r = 0; r < n; r++)
        skipped += WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 77;
    if (skipped == n)
        GS_SKIP("every rank skipped (see the reason above)");
    for (int r = 0; r < n; r++)
        fprintf(stderr, "  rank %d: %s\n", r, gs_test_status_text(status[r], text, sizeof(text)));
    gs_test_fail_here(__FILE__, __LINE__, "%s: not every one of %d ranks exited 0", transport, n);
}

/* ---- open, endpoints, close ---------------------------------------------------- */

static void open_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx);
    gs_tp *tp = ct_open(ctx, arg->transport);

    GS_ASSERT(gs_tp_ep(tp, rank) == NULL);
    GS_ASSERT(gs_tp_ep(tp, -1) == NULL && gs_tp_ep(tp, size) == NULL);
    for (int p = 0; p < size; p++)
        if (p != rank)
            GS_ASSERT(gs_tp_ep(tp, p) != NULL);
    GS_ASSERT_OK(gs_tp_close(tp));
    /* A second instance in the same job opens and closes as well. */
    tp = ct_open(ctx, arg->transport);
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.open.both"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(open_gives_an_endpoint_per_peer_with_2_3_4_ranks)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, open_body, transport, 0, NULL);
}

/* ---- WRITE and WRITE_IMM at every size and alignment ---------------------------- */

static const size_t ct_sizes[] = {0, 1, 7, 8, 4 * KIB, MIB + 3};
static const size_t ct_offsets[] = {0, 3, 4096 + 1, 8};
#define CT_NSIZES (sizeof(ct_sizes) / sizeof(ct_sizes[0]))
#define CT_NOFFS  (sizeof(ct_offsets) / sizeof(ct_offsets[0]))
#define CT_GUARD  64u
#define CT_FILL   0xa5u
#define CT_REGION (MIB + 3 + 8192 + 2 * CT_GUARD)

/* Rank 0 writes into rank 1 (write, or write_imm when arg->param); rank 1
 * checks the bytes and that the guard bytes around them stayed. */
static void write_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    bool imm = (arg->param & 1) != 0;
    unsigned flags = GS_OP_SIGNALED | ((arg->param & 2) ? GS_OP_STREAM : 0u);
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    int peer = 1 - rank;
    uint32_t iter = 0;

    GS_ASSERT_OK(gs_mr_alloc(tp, CT_REGION, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    memset(buf, CT_FILL, CT_REGION);
    all = ct_exchange(ctx, "ct.write.rmr", mr);
    for (size_t s = 0; s < CT_NSIZES; s++) {
        for (size_t o = 0; o < CT_NOFFS; o++, iter++) {
            size_t len = ct_sizes[s], dst_off = CT_GUARD + ct_offsets[o],
                   src_off = ct_offsets[(o + 1) % CT_NOFFS];
            if (rank == 0) {
                ct_fill(buf + src_off, len, iter);
                if (imm) {
                    CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), buf + src_off, mr, len, &all[peer],
                                                dst_off, iter, iter, flags));
                    GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_WRITE_IMM, peer).wr_id, iter);
                } else {
                    CT_POST(tp, gs_ep_write(gs_tp_ep(tp, peer), buf + src_off, mr, len, &all[peer], dst_off,
                                            iter, flags));
                    GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_WRITE, peer).wr_id, iter);
                    /* A zero-byte WRITE_IMM tells rank 1 the write is there. */
                    CT_POST(tp,
                            gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, iter, 0, 0));
                }
                ct_expect(tp, GS_WC_RECV_IMM, peer); /* rank 1 checked it */
            } else {
                gs_wc wc = ct_expect(tp, GS_WC_RECV_IMM, peer);
                GS_ASSERT_EQ(wc.imm, iter);
                GS_ASSERT_EQ(wc.len, imm ? len : 0);
                GS_ASSERT_EQ(ct_check(buf + dst_off, len, iter), len);
                GS_ASSERT_EQ(ct_check_const(buf, dst_off, CT_FILL), dst_off);
                GS_ASSERT_EQ(ct_check_const(buf + dst_off + len, CT_REGION - dst_off - len, CT_FILL),
                             CT_REGION - dst_off - len);
                memset(buf + dst_off, CT_FILL, len);
                CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, iter, 0, 0));
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.write.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(write_every_size_and_alignment_lands_exactly)
{
    ct_run(2, write_body, transport, 0, NULL);
}

GS_TEST_TP(write_imm_every_size_and_alignment_lands_before_its_notification)
{
    ct_run(2, write_body, transport, 1, NULL);
}

/* GS_OP_STREAM (streaming stores on shm, a hint others ignore): the same bytes. */
GS_TEST_TP(streamed_write_and_write_imm_land_exactly)
{
    ct_run(2, write_body, transport, 2, NULL);
    ct_run(2, write_body, transport, 3, NULL);
}

/* ---- READ ----------------------------------------------------------------------------- */

static void read_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    unsigned flags = GS_OP_SIGNALED | (arg->param ? GS_OP_STREAM : 0u);
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    uint32_t iter = 0;

    GS_ASSERT_OK(gs_mr_alloc(tp, CT_REGION, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 1)
        ct_fill(buf, CT_REGION, 77);
    else
        memset(buf, CT_FILL, CT_REGION);
    all = ct_exchange(ctx, "ct.read.rmr", mr);
    if (rank == 0) {
        for (size_t s = 0; s < CT_NSIZES; s++) {
            for (size_t o = 0; o < CT_NOFFS; o++, iter++) {
                size_t len = ct_sizes[s], src_off = ct_offsets[o],
                       dst_off = CT_GUARD + ct_offsets[(o + 1) % CT_NOFFS];
                CT_POST(tp,
                        gs_ep_read(gs_tp_ep(tp, 1), buf + dst_off, mr, len, &all[1], src_off, iter, flags));
                GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_READ, 1).wr_id, iter);
                for (size_t i = 0; i < len; i++)
                    if (buf[dst_off + i] != ct_byte(77, src_off + i))
                        gs_test_fail_here(__FILE__, __LINE__, "read of %zu bytes at %zu: byte %zu differs",
                                          len, src_off, i);
                GS_ASSERT_EQ(ct_check_const(buf, dst_off, CT_FILL), dst_off);
                GS_ASSERT_EQ(ct_check_const(buf + dst_off + len, CT_REGION - dst_off - len, CT_FILL),
                             CT_REGION - dst_off - len);
                memset(buf + dst_off, CT_FILL, len);
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.read.done"));
    if (rank == 1) /* READ never changes the target */
        GS_ASSERT_EQ(ct_check(buf, CT_REGION, 77), CT_REGION);
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(read_every_size_and_alignment_returns_the_target_bytes)
{
    ct_run(2, read_body, transport, 0, NULL);
}

GS_TEST_TP(streamed_read_returns_the_target_bytes)
{
    ct_run(2, read_body, transport, 1, NULL);
}

/* ---- SEND / RECV ------------------------------------------------------------------------- */

static const size_t ct_send_sizes[] = {0, 1, 7, 8, 48, 49, 1000, GS_SEND_MAX};
#define CT_NSEND (sizeof(ct_send_sizes) / sizeof(ct_send_sizes[0]))

/* Rank 0 sends every size twice: first into receives posted in advance,
 * then (after a barrier) before rank 1 posts any. */
static void send_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    uint8_t *buf;
    size_t slot = GS_SEND_MAX + 64;

    GS_ASSERT_OK(gs_mr_alloc(tp, slot * CT_NSEND * 2, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    memset(buf, CT_FILL, slot * CT_NSEND * 2);
    for (int round = 0; round < 2; round++) {
        if (rank == 1 && round == 0)
            for (size_t i = 0; i < CT_NSEND; i++)
                GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + i * slot + 1, mr, slot - 1, 100 + i));
        GS_ASSERT_OK(gs_store_barrier(ctx, round ? "ct.send.r1" : "ct.send.r0"));
        if (rank == 0) {
            for (size_t i = 0; i < CT_NSEND; i++) {
                uint8_t *src = buf + i * slot + 3;
                ct_fill(src, ct_send_sizes[i], (uint32_t)(round * 100 + i));
                CT_POST(tp, gs_ep_send(gs_tp_ep(tp, 1), src, mr, ct_send_sizes[i], i, GS_OP_SIGNALED));
                GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_SEND, 1).wr_id, i);
            }
        } else {
            if (round == 1) { /* the sends are on their way or buffered: post now */
                usleep(20000);
                for (size_t i = 0; i < CT_NSEND; i++)
                    GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + (CT_NSEND + i) * slot, mr, slot, 200 + i));
            }
            for (size_t i = 0; i < CT_NSEND; i++) {
                gs_wc wc = ct_expect(tp, GS_WC_RECV, 0);
                uint8_t *dst = round ? buf + (CT_NSEND + i) * slot : buf + i * slot + 1;
                GS_ASSERT_U64_EQ(wc.wr_id, (round ? 200u : 100u) + i); /* in posting order */
                GS_ASSERT_EQ(wc.len, ct_send_sizes[i]);
                GS_ASSERT_EQ(ct_check(dst, ct_send_sizes[i], (uint32_t)(round * 100 + i)), ct_send_sizes[i]);
                GS_ASSERT_EQ(dst[ct_send_sizes[i]], CT_FILL);
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.send.done"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(send_recv_every_size_posted_before_and_after_arrival)
{
    ct_run(2, send_body, transport, 0, NULL);
}

/* ---- atomics ------------------------------------------------------------------------------- */

static void atomic_basic_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint64_t *words;

    if (!(ct_caps(tp) & GS_TP_CAP_ATOMIC)) {
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("the transport has no atomics");
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    words = gs_mr_addr(mr);
    words[0] = 1000;
    words[1] = 5;
    all = ct_exchange(ctx, "ct.atomic.rmr", mr);
    if (rank == 0) {
        gs_ep *ep = gs_tp_ep(tp, 1);
        CT_POST(tp, gs_ep_fetch_add(ep, &words[8], mr, &all[1], 0, 42, 1, GS_OP_SIGNALED));
        GS_ASSERT_U64_EQ(ct_expect(tp, GS_WC_FETCH_ADD, 1).wr_id, 1);
        GS_ASSERT_U64_EQ(words[8], 1000);
        CT_POST(tp, gs_ep_fetch_add(ep, &words[8], mr, &all[1], 0, (uint64_t)-2, 2, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_FETCH_ADD, 1);
        GS_ASSERT_U64_EQ(words[8], 1042);
        /* A failing compare returns the current value and changes nothing. */
        CT_POST(tp, gs_ep_cmp_swap(ep, &words[9], mr, &all[1], 8, 6, 99, 3, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_CMP_SWAP, 1);
        GS_ASSERT_U64_EQ(words[9], 5);
        CT_POST(tp,
                gs_ep_cmp_swap(ep, &words[9], mr, &all[1], 8, 5, 0xffffffffffffffffull, 4, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_CMP_SWAP, 1);
        GS_ASSERT_U64_EQ(words[9], 5);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.atomic.done"));
    if (rank == 1) {
        GS_ASSERT_U64_EQ(words[0], 1040);
        GS_ASSERT_U64_EQ(words[1], 0xffffffffffffffffull);
    }
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(atomics_return_the_old_value)
{
    ct_run(2, atomic_basic_body, transport, 0, NULL);
}

#define CT_ATOMIC_ITERS 300

/* Every rank adds to every other rank's counter (word 0) with FETCH_ADD and
 * with a CMP_SWAP loop (word 1); the old values a rank saw on one counter
 * never repeat across ranks, so their sums add up exactly. */
static void atomic_contention_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx);
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint64_t *words, *sums, *all_sums;

    if (!(ct_caps(tp) & GS_TP_CAP_ATOMIC)) {
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("the transport has no atomics");
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    words = gs_mr_addr(mr);
    sums = calloc((size_t)size, sizeof(*sums));
    all_sums = calloc((size_t)size * (size_t)size, sizeof(*all_sums));
    GS_ASSERT(sums && all_sums);
    all = ct_exchange(ctx, "ct.contend.rmr", mr);
    for (int i = 0; i < CT_ATOMIC_ITERS; i++) {
        for (int p = 0; p < size; p++) {
            uint64_t seen;
            if (p == rank)
                continue;
            CT_POST(tp, gs_ep_fetch_add(gs_tp_ep(tp, p), &words[16], mr, &all[p], 0, 1, 0, GS_OP_SIGNALED));
            ct_expect(tp, GS_WC_FETCH_ADD, p);
            sums[p] += words[16];
            /* compare-and-swap increment: retry with the value it returned */
            seen = 0;
            for (;;) {
                CT_POST(tp, gs_ep_cmp_swap(gs_tp_ep(tp, p), &words[17], mr, &all[p], 8, seen, seen + 3, 0,
                                           GS_OP_SIGNALED));
                ct_expect(tp, GS_WC_CMP_SWAP, p);
                if (words[17] == seen)
                    break;
                seen = words[17];
            }
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.contend.done"));
    GS_ASSERT_U64_EQ(words[0], (uint64_t)(size - 1) * CT_ATOMIC_ITERS);
    GS_ASSERT_U64_EQ(words[1], (uint64_t)(size - 1) * CT_ATOMIC_ITERS * 3);
    GS_ASSERT_OK(gs_store_allgather(ctx, "ct.contend.sums", sums, (size_t)size * sizeof(*sums), all_sums));
    {
        /* the old values seen on my counter are exactly 0 .. N-1 */
        uint64_t total = 0, n = (uint64_t)(size - 1) * CT_ATOMIC_ITERS;
        for (int r = 0; r < size; r++)
            total += all_sums[(size_t)r * (size_t)size + (size_t)rank];
        GS_ASSERT_U64_EQ(total, n * (n - 1) / 2);
    }
    free(sums);
    free(all_sums);
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(atomics_under_contention_from_2_3_4_ranks_count_exactly)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, atomic_contention_body, transport, 0, NULL);
}

/* ---- ordering: WRITE then WRITE_IMM under load ------------------------------------------------ */

#define CT_ORDER_SLOTS 16
#define CT_ORDER_MSGS  2000

/* Rank 0 streams unsignaled WRITEs of sequence-stamped chunks followed by a
 * zero-byte WRITE_IMM naming them; rank 1 must find each chunk whole when
 * its notification arrives. Credits (WRITE_IMM back) keep rank 0 from
 * reusing a slot rank 1 has not checked. Chunk sizes vary up to 64 KiB. */
static void order_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    const size_t slot = 64 * KIB;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;
    int peer = 1 - rank;

    GS_ASSERT_OK(gs_mr_alloc(tp, slot * CT_ORDER_SLOTS, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    all = ct_exchange(ctx, "ct.order.rmr", mr);
    if (rank == 0) {
        int credits = CT_ORDER_SLOTS;
        for (uint32_t m = 0; m < CT_ORDER_MSGS; m++) {
            size_t len = (m * 2654435761u) % slot + 1, at = (m % CT_ORDER_SLOTS) * slot;
            while (credits == 0) {
                ct_expect(tp, GS_WC_RECV_IMM, peer);
                credits++;
            }
            credits--;
            ct_fill(buf + at, len, m);
            CT_POST(tp, gs_ep_write(gs_tp_ep(tp, peer), buf + at, mr, len, &all[peer], at, 0, 0));
            CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, m, 0,
                                        (m % 64 == 63) ? GS_OP_SIGNALED : 0));
            if (m % 64 == 63)
                ct_expect(tp, GS_WC_WRITE_IMM, peer);
        }
        while (credits < CT_ORDER_SLOTS) {
            ct_expect(tp, GS_WC_RECV_IMM, peer);
            credits++;
        }
    } else {
        for (uint32_t m = 0; m < CT_ORDER_MSGS; m++) {
            gs_wc wc = ct_expect(tp, GS_WC_RECV_IMM, peer);
            size_t len = (m * 2654435761u) % slot + 1, at = (m % CT_ORDER_SLOTS) * slot;
            GS_ASSERT_EQ(wc.imm, m);
            if (ct_check(buf + at, len, m) != len)
                gs_test_fail_here(__FILE__, __LINE__, "message %u: %zu-byte chunk incomplete at byte %zu", m,
                                  len, ct_check(buf + at, len, m));
            CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, m, 0, 0));
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.order.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(write_then_write_imm_is_ordered_under_load)
{
    ct_run(2, order_body, transport, 0, NULL);
}

/* A receiver that polls late: the sender's notifications back up (it may see
 * GS_ERR_AGAIN and must retry) and still all arrive, in order. */
static void backlog_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    const uint32_t msgs = 6000;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;

    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    all = ct_exchange(ctx, "ct.backlog.rmr", mr);
    if (rank == 0) {
        for (uint32_t m = 0; m < msgs; m++)
            CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 1), NULL, NULL, 0, &all[1], 0, m, 0, 0));
    } else {
        usleep(100000);
        for (uint32_t m = 0; m < msgs; m++)
            GS_ASSERT_EQ(ct_expect(tp, GS_WC_RECV_IMM, 0).imm, m);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.backlog.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(notifications_to_a_late_poller_back_up_and_arrive_in_order)
{
    ct_run(2, backlog_body, transport, 0, NULL);
}

/* ---- every rank to every rank, 2 to 4 ranks, each completion mode --------------------------------- */

#define CT_A2A_ROUNDS 50

static void all_to_all_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx);
    const size_t chunk = 1000;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;

    GS_ASSERT_OK(gs_mr_alloc(tp, chunk * (size_t)size * 2, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    all = ct_exchange(ctx, "ct.a2a.rmr", mr);
    for (uint32_t round = 0; round < CT_A2A_ROUNDS; round++) {
        uint8_t *src = buf + chunk * (size_t)size; /* second half: my outgoing chunk */
        ct_fill(src, chunk, round * 64 + (uint32_t)rank);
        for (int p = 0; p < size; p++)
            if (p != rank)
                CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, p), src, mr, chunk, &all[p], chunk * (size_t)rank,
                                            round, 0, 0));
        for (int i = 0; i < size - 1; i++) {
            gs_wc wc = ct_expect(tp, GS_WC_RECV_IMM, -1);
            GS_ASSERT_EQ(wc.imm, round);
            GS_ASSERT_EQ(ct_check(buf + chunk * (size_t)wc.peer, chunk, round * 64 + (uint32_t)wc.peer),
                         chunk);
        }
        /* Nobody overwrites a chunk before its owner has checked it. */
        for (int p = 0; p < size; p++)
            if (p != rank)
                CT_POST(tp, gs_ep_send(gs_tp_ep(tp, p), NULL, NULL, 0, 0, 0));
        for (int i = 0; i < size - 1; i++) {
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, (rank + 1 + i) % size), NULL, NULL, 0, 0));
        }
        for (int i = 0; i < size - 1; i++)
            ct_expect(tp, GS_WC_RECV, -1);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.a2a.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

static const char *const ct_env_spin[] = {"GS_POLL=spin", NULL};
static const char *const ct_env_event[] = {"GS_POLL=event", NULL};
static const char *const ct_env_hybrid[] = {"GS_POLL=hybrid", "GS_SPIN_US=20", NULL};

GS_TEST_TP(all_to_all_with_2_3_4_ranks_in_spin_mode)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, all_to_all_body, transport, 0, ct_env_spin);
}

GS_TEST_TP(all_to_all_with_2_3_4_ranks_in_event_mode)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, all_to_all_body, transport, 0, ct_env_event);
}

GS_TEST_TP(all_to_all_with_2_3_4_ranks_in_hybrid_mode)
{
    for (int n = 2; n <= 4; n++)
        ct_run(n, all_to_all_body, transport, 0, ct_env_hybrid);
}

/* In event mode a waiter sleeps: 300 ms of waiting costs little CPU. */
static void event_sleeps_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;

    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    all = ct_exchange(ctx, "ct.sleep.rmr", mr);
    if (rank == 1) {
        usleep(300000);
        CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 0), NULL, NULL, 0, &all[0], 0, 7, 0, 0));
    } else {
        struct rusage r0, r1;
        uint64_t t0 = gs_now_ns();
        double cpu_ms, wall_ms;
        getrusage(RUSAGE_SELF, &r0);
        GS_ASSERT_EQ(ct_expect(tp, GS_WC_RECV_IMM, 1).imm, 7);
        getrusage(RUSAGE_SELF, &r1);
        wall_ms = (double)(gs_now_ns() - t0) / 1e6;
        cpu_ms =
            (double)(r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) *
                1e3 +
            (double)(r1.ru_utime.tv_usec - r0.ru_utime.tv_usec + r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) /
                1e3;
        fprintf(stderr, "  rank 0 waited %.1f ms using %.1f ms of CPU\n", wall_ms, cpu_ms);
        GS_ASSERT(wall_ms >= 200);
        GS_ASSERT(cpu_ms < wall_ms / 4);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.sleep.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(event_mode_waits_without_burning_cpu)
{
    ct_run(2, event_sleeps_body, transport, 0, ct_env_event);
}

/* ---- access violations: GS_ERR_REMOTE_ACCESS and nothing touched ------------------------------------- */

enum {
    CT_BAD_KEY,
    CT_OUT_OF_BOUNDS,
    CT_FORGED_LENGTH,
    CT_NO_WRITE_PERMISSION,
    CT_FORGED_PERMISSION,
    CT_NO_READ_PERMISSION,
    CT_NO_ATOMIC_PERMISSION,
    CT_DEREGISTERED,
    CT_VIOLATIONS
};

static const char *const ct_violation_names[] = {"bad key",          "out of bounds",      "forged length",
                                                 "no write access",  "forged permission",  "no read access",
                                                 "no atomic access", "deregistered region"};

static unsigned ct_violation_access(int v)
{
    switch (v) {
    case CT_NO_WRITE_PERMISSION:
    case CT_FORGED_PERMISSION: return GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_READ;
    case CT_NO_READ_PERMISSION:
        return GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_ATOMIC;
    case CT_NO_ATOMIC_PERMISSION:
        return GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_READ;
    default: return GS_ACCESS_ALL;
    }
}

/* Rank 0 attempts violation v against rank 1's 4 KiB region; one fresh
 * transport per case (a verbs endpoint does not survive an access error). */
static void violation_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int v = arg->param;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all, bad;
    gs_rmr_head head;
    uint8_t *buf;
    gs_status st = GS_OK;

    if (v == CT_NO_ATOMIC_PERMISSION && !(ct_caps(tp) & GS_TP_CAP_ATOMIC)) {
        if (rank == 0)
            fprintf(stderr, "  case not run: the transport has no atomics\n");
        GS_ASSERT_OK(gs_tp_close(tp));
        return;
    }
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, ct_violation_access(v), &mr));
    buf = gs_mr_addr(mr);
    ct_fill(buf, 4096, (uint32_t)(rank + 10));
    all = ct_exchange(ctx, "ct.viol.rmr", mr);
    if (rank == 1 && v == CT_DEREGISTERED) {
        GS_ASSERT_OK(gs_mr_dereg(mr));
        mr = NULL;
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.viol.ready"));
    if (rank == 0) {
        gs_ep *ep = gs_tp_ep(tp, 1);
        bad = all[1];
        memcpy(&head, bad.bytes, sizeof(head));
        if (v == CT_BAD_KEY)
            head.key ^= 0x5a5a0001ull;
        if (v == CT_FORGED_LENGTH)
            head.len = 8192;
        if (v == CT_FORGED_PERMISSION)
            head.access |= GS_ACCESS_REMOTE_WRITE;
        memcpy(bad.bytes, &head, sizeof(head));
        switch (v) {
        case CT_NO_READ_PERMISSION:
            st = ct_outcome(tp, gs_ep_read(ep, buf + 64, mr, 64, &bad, 0, 9, GS_OP_SIGNALED), GS_WC_READ, 1,
                            9);
            GS_ASSERT_EQ(ct_check(buf, 4096, 10), 4096); /* nothing read into my buffer */
            break;
        case CT_NO_ATOMIC_PERMISSION:
            st = ct_outcome(
                tp, gs_ep_fetch_add(ep, (uint64_t *)(void *)(buf + 512), mr, &bad, 64, 1, 9, GS_OP_SIGNALED),
                GS_WC_FETCH_ADD, 1, 9);
            GS_ASSERT_EQ(ct_check(buf, 4096, 10), 4096);
            break;
        default:
            st = ct_outcome(tp,
                            gs_ep_write(ep, buf, mr, 64, &bad,
                                        v == CT_OUT_OF_BOUNDS   ? 4096 - 32
                                        : v == CT_FORGED_LENGTH ? 4096 + 64
                                                                : 128,
                                        9, GS_OP_SIGNALED),
                            GS_WC_WRITE, 1, 9);
        }
        if (st != GS_ERR_REMOTE_ACCESS)
            gs_test_fail_here(__FILE__, __LINE__, "%s: got %s, expected GS_ERR_REMOTE_ACCESS (%s)",
                              ct_violation_names[v], gs_status_name(st), gs_last_error());
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.viol.done"));
    if (rank == 1 && mr) /* the target is untouched */
        GS_ASSERT_EQ(ct_check(buf, 4096, 11), 4096);
    free(all);
    if (mr)
        GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(access_violations_fail_with_remote_access_and_touch_nothing)
{
    for (int v = 0; v < CT_VIOLATIONS; v++) {
        fprintf(stderr, "  case: %s\n", ct_violation_names[v]);
        ct_run(2, violation_body, transport, v, NULL);
    }
}

/* ---- local argument checks --------------------------------------------------------------------------- */

static void args_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL, *ro = NULL;
    gs_rmr *all, junk;
    uint8_t *buf;
    uint64_t *w;
    gs_ep *ep = gs_tp_ep(tp, 1 - rank);

    GS_ASSERT_OK(gs_mr_alloc(tp, 8192, GS_ACCESS_ALL, &mr));
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_REMOTE_READ, &ro));
    buf = gs_mr_addr(mr);
    w = (uint64_t *)(void *)buf;
    all = ct_exchange(ctx, "ct.args.rmr", mr);
    /* the caller's own rank has no endpoint */
    GS_ASSERT_STATUS(gs_ep_write(gs_tp_ep(tp, rank), buf, mr, 8, &all[rank], 0, 0, 0), GS_ERR_INVALID);
    /* local buffer outside its region */
    GS_ASSERT_STATUS(gs_ep_write(ep, buf + 8190, mr, 8, &all[1 - rank], 0, 0, 0), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_ep_write(ep, buf, NULL, 8, &all[1 - rank], 0, 0, 0), GS_ERR_INVALID);
    /* READ into a region without local write access */
    GS_ASSERT_STATUS(gs_ep_read(ep, gs_mr_addr(ro), ro, 8, &all[1 - rank], 0, 0, 0), GS_ERR_INVALID);
    /* a descriptor of my own region on the endpoint to the peer */
    GS_ASSERT_STATUS(gs_ep_write(ep, buf, mr, 8, &all[rank], 0, 0, 0), GS_ERR_INVALID);
    /* not a descriptor at all */
    memset(&junk, 0x33, sizeof(junk));
    GS_ASSERT_STATUS(gs_ep_write(ep, buf, mr, 8, &junk, 0, 0, 0), GS_ERR_INVALID);
    /* atomics: misaligned remote word and misaligned result */
    GS_ASSERT_STATUS(gs_ep_fetch_add(ep, &w[2], mr, &all[1 - rank], 4, 1, 0, 0), GS_ERR_INVALID);
    GS_ASSERT_STATUS(gs_ep_cmp_swap(ep, (uint64_t *)(void *)(buf + 3), mr, &all[1 - rank], 0, 0, 1, 0, 0),
                     GS_ERR_INVALID);
    /* SEND larger than GS_SEND_MAX */
    GS_ASSERT_STATUS(gs_ep_send(ep, buf, mr, GS_SEND_MAX + 1, 0, 0), GS_ERR_INVALID);
    /* unknown access bits, bad poll arguments */
    GS_ASSERT_STATUS(gs_mr_alloc(tp, 64, 0x100, &ro), GS_ERR_INVALID);
    {
        int n = -1;
        GS_ASSERT_STATUS(gs_tp_poll(tp, NULL, 4, &n), GS_ERR_INVALID);
        GS_ASSERT_EQ(n, -1);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.args.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_mr_dereg(ro));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(bad_arguments_are_rejected_before_anything_moves)
{
    ct_run(2, args_body, transport, 0, NULL);
}

/* ---- caller memory (gs_mr_reg) --------------------------------------------------------------------- */

static void user_mem_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    const size_t len = 256 * KIB + 5;
    uint8_t *mem = malloc(len + 64), *out = malloc(len);
    gs_mr *mr = NULL, *omr = NULL;
    gs_rmr *all;
    bool can = (ct_caps(tp) & GS_TP_CAP_USER_MEM) != 0;

    GS_ASSERT(mem && out);
    if (!can) {
        GS_ASSERT_STATUS(gs_mr_reg(tp, mem + 1, len, GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE, &mr),
                         GS_ERR_UNSUPPORTED);
        free(mem);
        free(out);
        GS_ASSERT_OK(gs_tp_close(tp));
        GS_SKIP("caller memory cannot be registered for remote access on this host");
    }
    ct_fill(mem + 1, len, (uint32_t)rank);
    GS_ASSERT_OK(gs_mr_reg(tp, mem + 1, len,
                           GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_READ, &mr));
    GS_ASSERT_OK(gs_mr_reg(tp, out, len, GS_ACCESS_LOCAL_WRITE, &omr));
    all = ct_exchange(ctx, "ct.user.rmr", mr);
    if (rank == 0) {
        /* read the peer's memory, then write it back incremented by one pattern */
        CT_POST(tp, gs_ep_read(gs_tp_ep(tp, 1), out, omr, len, &all[1], 0, 1, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_READ, 1);
        GS_ASSERT_EQ(ct_check(out, len, 1), len);
        ct_fill(out, len - 3, 5);
        CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, 1), out, omr, len - 3, &all[1], 3, 5, 2, GS_OP_SIGNALED));
        ct_expect(tp, GS_WC_WRITE_IMM, 1);
    } else {
        GS_ASSERT_EQ(ct_expect(tp, GS_WC_RECV_IMM, 0).imm, 5);
        GS_ASSERT_EQ(ct_check(mem + 1 + 3, len - 3, 5), len - 3);
        GS_ASSERT_EQ(ct_check(mem + 1, 3, 1), 3);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.user.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_mr_dereg(omr));
    GS_ASSERT_OK(gs_tp_close(tp));
    free(mem);
    free(out);
}

GS_TEST_TP(caller_memory_is_written_and_read_where_supported)
{
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = CT_TIMEOUT_MS, .rank_timeout_ms = 20000};
    ct_arg arg = {.transport = transport};
    int status[2];
    gs_test_run_ranks_opts(&opts, user_mem_body, &arg, status);
    /* both ranks skip together, or both pass */
    if (WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 77 && WIFEXITED(status[1]) &&
        WEXITSTATUS(status[1]) == 77)
        GS_SKIP("caller memory cannot be registered for remote access on this host");
    GS_ASSERT_RANK_EXIT(status[0], 0);
    GS_ASSERT_RANK_EXIT(status[1], 0);
}

/* ---- a peer killed mid-stream ----------------------------------------------------------------------- */

/* The last rank streams WRITE_IMMs to every other rank and is killed
 * (SIGKILL) after a few hundred; the others must get GS_ERR_PEER_LOST naming
 * it well within their deadline, having received what it sent. */
static void killed_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    int size = gs_ctx_size(ctx), victim = size - 1;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    gs_rmr *all;
    uint8_t *buf;

    GS_ASSERT_OK(gs_mr_alloc(tp, 64 * KIB, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    /* a receive posted for a SEND that never comes; posted before the
     * exchange lets the victim start, so it cannot already be gone */
    if (rank != victim)
        GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, victim), buf + 8192, mr, 128, 4242));
    all = ct_exchange(ctx, "ct.kill.rmr", mr);
    if (rank == victim) {
        for (uint32_t m = 0; m < 300; m++)
            for (int p = 0; p < size - 1; p++)
                CT_POST(tp, gs_ep_write_imm(gs_tp_ep(tp, p), buf, mr, 4096, &all[p], 0, m, 0, 0));
        raise(SIGKILL);
    } else {
        char why[64];
        uint64_t t0 = gs_now_ns();
        uint32_t got = 0;
        gs_status st = GS_OK;
        gs_wc wc;
        int n = 0;
        while (st == GS_OK) {
            st = gs_tp_wait(tp, &wc, 1, &n, -1);
            if (st != GS_OK)
                break;
            if (wc.opcode == GS_WC_RECV_IMM && wc.status == GS_OK) {
                GS_ASSERT_EQ(wc.imm, got);
                got++;
            } else {
                /* the posted receive comes back flushed (or peer lost) */
                GS_ASSERT_EQ(wc.opcode, GS_WC_RECV);
                GS_ASSERT_U64_EQ(wc.wr_id, 4242);
                GS_ASSERT(wc.status == GS_ERR_FLUSHED || wc.status == GS_ERR_PEER_LOST);
            }
        }
        fprintf(stderr, "  rank %d: %u notifications, then %s after %.0f ms\n", rank, got, gs_status_name(st),
                (double)(gs_now_ns() - t0) / 1e6);
        GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
        snprintf(why, sizeof(why), "rank %d", victim);
        GS_ASSERT_CONTAINS(gs_last_error(), why);
        GS_ASSERT(gs_now_ns() - t0 < 10000ull * 1000000ull); /* the deadline is 20 s */
        GS_ASSERT_EQ(got, 300);
        /* later posts to it fail instead of vanishing */
        st = gs_ep_write(gs_tp_ep(tp, victim), buf, mr, 8, &all[victim], 0, 1, GS_OP_SIGNALED);
        GS_ASSERT(st == GS_ERR_PEER_LOST || st == GS_ERR_FLUSHED);
        GS_ASSERT_OK(gs_mr_dereg(mr));
        GS_ASSERT_OK(gs_tp_close(tp));
        free(all);
    }
}

static void ct_run_killed(const char *transport, int n, const char *const *env)
{
    gs_test_ranks_opts opts = {.n = n, .timeout_ms = CT_TIMEOUT_MS, .rank_timeout_ms = 20000, .env = env};
    ct_arg arg = {.transport = transport};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, killed_body, &arg, status);
    for (int r = 0; r < n - 1; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
    GS_ASSERT_RANK_SIGNAL(status[n - 1], SIGKILL);
}

GS_TEST_TP(a_peer_killed_mid_stream_is_reported_lost_in_every_mode)
{
    ct_run_killed(transport, 2, ct_env_spin);
    ct_run_killed(transport, 2, ct_env_event);
    ct_run_killed(transport, 3, ct_env_hybrid);
}

/* ---- SEND streams, receives posted late, deadlines ------------------------------------------- */

#define CT_STREAM 1500

/* Rank 0 streams SENDs of sizes 0 .. GS_SEND_MAX; rank 1 keeps 8 receives
 * posted; every message arrives whole and in order. */
static void send_stream_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    uint8_t *buf;
    const size_t slot = GS_SEND_MAX;

    GS_ASSERT_OK(gs_mr_alloc(tp, slot * 8, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 1)
        for (uint32_t k = 0; k < 8; k++)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + k * slot, mr, slot, k));
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.stream.ready"));
    for (uint32_t m = 0; m < CT_STREAM; m++) {
        size_t len = (m * 977u) % (GS_SEND_MAX + 1);
        if (rank == 0) {
            ct_fill(buf, len, m);
            CT_POST(tp, gs_ep_send(gs_tp_ep(tp, 1), buf, mr, len, m, (m % 8 == 7) ? GS_OP_SIGNALED : 0));
            if (m % 8 == 7) /* the buffer is reused: wait until the SEND is done with it */
                ct_expect(tp, GS_WC_SEND, 1);
        } else {
            gs_wc wc = ct_expect(tp, GS_WC_RECV, 0);
            GS_ASSERT_U64_EQ(wc.wr_id, m % 8);
            GS_ASSERT_EQ(wc.len, len);
            GS_ASSERT_EQ(ct_check(buf + (m % 8) * slot, len, m), len);
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), buf + (m % 8) * slot, mr, slot, m % 8));
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.stream.done"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(send_stream_of_mixed_sizes_arrives_whole_and_in_order)
{
    ct_run(2, send_stream_body, transport, 0, NULL);
}

/* 200 SENDs before rank 1 posts any receive: none is lost or reordered. */
static void send_early_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    const uint32_t msgs = 200;
    gs_tp *tp = ct_open(ctx, arg->transport);
    gs_mr *mr = NULL;
    uint32_t *buf;

    GS_ASSERT_OK(gs_mr_alloc(tp, msgs * sizeof(uint32_t) * 2, GS_ACCESS_ALL, &mr));
    buf = gs_mr_addr(mr);
    if (rank == 0) {
        for (uint32_t m = 0; m < msgs; m++) {
            buf[m] = m * 3 + 1;
            CT_POST(tp, gs_ep_send(gs_tp_ep(tp, 1), &buf[m], mr, sizeof(uint32_t), m, 0));
        }
    } else {
        usleep(100000);
        for (uint32_t m = 0; m < msgs; m++)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, 0), &buf[m], mr, sizeof(uint32_t), m));
        for (uint32_t m = 0; m < msgs; m++) {
            gs_wc wc = ct_expect(tp, GS_WC_RECV, 0);
            GS_ASSERT_U64_EQ(wc.wr_id, m);
            GS_ASSERT_EQ(buf[m], m * 3 + 1);
        }
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.early.done"));
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(sends_before_any_receive_is_posted_are_kept_in_order)
{
    ct_run(2, send_early_body, transport, 0, NULL);
}

/* A wait with nothing coming ends at its timeout, naming the rank. */
static void timeout_body(gs_ctx *ctx, int rank, void *varg)
{
    ct_arg *arg = varg;
    gs_tp *tp = ct_open(ctx, arg->transport);
    char who[32];
    gs_wc wc;
    int n = 0;
    uint64_t t0 = gs_now_ns(), ms;

    GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 150), GS_ERR_TIMEOUT);
    ms = (gs_now_ns() - t0) / 1000000ull;
    GS_ASSERT_GE(ms, 140);
    GS_ASSERT_LT(ms, 2000);
    snprintf(who, sizeof(who), "rank %d", rank);
    GS_ASSERT_CONTAINS(gs_last_error(), who);
    GS_ASSERT_OK(gs_store_barrier(ctx, "ct.timeout.done"));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST_TP(wait_with_nothing_coming_times_out_naming_the_rank)
{
    static const char *const event[] = {"GS_POLL=event", NULL};
    ct_run(2, timeout_body, transport, 0, NULL);
    ct_run(2, timeout_body, transport, 0, event);
}
