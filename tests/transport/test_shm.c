/*
 * What only the shm transport promises: its shared-memory layout, nothing
 * left in /dev/shm or in the process after a run (a killed rank included),
 * the mapping cache across deregistration, wake-ups only for sleepers,
 * a ping-pong cycling through a few ring slots, the software cost of a
 * hop (two transports in one process), throughput with more ranks than
 * cores, and a clean close told apart from a lost peer.
 */
#include "gs_test.h"
#include "multirank.h"
#include "tp_check.h"

#include "bootstrap/boot.h"
#include "transport/shm/shm.h"
#include "util/clock.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

static void run(int n, gs_test_rank_fn fn, void *arg, const char *const *env)
{
    tpc_run(n, fn, arg, env, 20000, 60000);
}

static gs_wc wait_one(gs_tp *tp)
{
    gs_wc wc;
    int n = 0;
    GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &n, -1));
    GS_ASSERT_EQ(n, 1);
    return wc;
}

/* ---- layout ---------------------------------------------------------------------- */

GS_TEST(message_slots_follow_the_inline_sizes)
{
    GS_ASSERT_EQ(GS_SHM_MSG_SLOTS(0u), 1);
    GS_ASSERT_EQ(GS_SHM_MSG_SLOTS(44u), 1);
    GS_ASSERT_EQ(GS_SHM_MSG_SLOTS(45u), 2);
    GS_ASSERT_EQ(GS_SHM_MSG_SLOTS(104u), 2);
    GS_ASSERT_EQ(GS_SHM_MSG_SLOTS(105u), 3);
    GS_ASSERT_EQ(GS_SHM_MSG_SLOTS((uint32_t)GS_SEND_MAX), 69);
    GS_ASSERT_LT(GS_SHM_MSG_SLOTS((uint32_t)GS_SEND_MAX), GS_SHM_RING_SLOTS / 8);
    GS_ASSERT_EQ(gs_shm_ctrl_bytes(4) % 4096, 0);
    GS_ASSERT_GE(gs_shm_ctrl_bytes(4), GS_SHM_RING_OFF + 4 * sizeof(gs_shm_ring) +
                                           (size_t)GS_SHM_MAX_REGIONS * sizeof(gs_shm_region));
}

/* ---- nothing left behind ----------------------------------------------------------- */

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int n = 0;
    GS_ASSERT(d != NULL);
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Counts this process's open descriptors and its mappings of gradsync memfds. */
static void count_own(int *fds_p, int *maps_p)
{
    char line[512];
    FILE *f = fopen("/proc/self/maps", "r");
    *fds_p = count_dir("/proc/self/fd");
    *maps_p = 0;
    GS_ASSERT(f != NULL);
    while (fgets(line, sizeof(line), f))
        *maps_p += strstr(line, "memfd:gradsync") != NULL;
    fclose(f);
}

/* Rank 1 is killed while holding buffers that rank 0 has mapped; rank 0
 * checks that every shared mapping it had is a memfd (no named segment) and
 * that closing returns every descriptor and mapping. */
static void leftovers_body(gs_ctx *ctx, int rank, void *arg)
{
    int fds0, maps0, fds1, maps1, during = 0, fds_during;
    gs_tp *tp = NULL;
    gs_mr *mr[4];
    gs_rmr *all[4];
    (void)arg;

    count_own(&fds0, &maps0);
    GS_ASSERT_OK(gs_tp_open(ctx, "shm", &tp));
    for (int i = 0; i < 4; i++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "left.%d", i);
        GS_ASSERT_OK(gs_mr_alloc(tp, (size_t)(i + 1) * 70000, GS_ACCESS_ALL, &mr[i]));
        all[i] = tpc_exchange(ctx, tag, mr[i]);
    }
    if (rank == 0) {
        for (int i = 0; i < 4; i++)
            GS_ASSERT_OK(gs_ep_write(gs_tp_ep(tp, 1), gs_mr_addr(mr[i]), mr[i], 100, &all[i][1], 0, 0, 0));
        count_own(&fds_during, &during);
        GS_ASSERT_GE(during, 4 + 4 + 2); /* my 4 buffers, 4 of rank 1's, two control segments */
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "left.mapped"));
    if (rank == 1)
        raise(SIGKILL);
    GS_ASSERT_OK(gs_tp_close(tp));
    for (int i = 0; i < 4; i++)
        free(all[i]);
    count_own(&fds1, &maps1);
    GS_ASSERT_EQ(fds1, fds0);
    GS_ASSERT_EQ(maps1, maps0);
}

GS_TEST(a_run_with_a_killed_rank_leaves_nothing_in_dev_shm_or_the_process)
{
    gs_test_ranks_opts opts = {.n = 2, .timeout_ms = 60000, .rank_timeout_ms = 20000};
    int status[2], before = 0;
    bool private_shm = false;

    /* A private /dev/shm (mount namespace) sees only what this job creates;
     * without the privilege, compare the shared one before and after. */
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
        mount("gs-test-shm", "/dev/shm", "tmpfs", 0, "size=64m") == 0)
        private_shm = true;
    else
        fprintf(stderr, "  no private /dev/shm (%s): comparing the shared one\n", strerror(errno));
    before = count_dir("/dev/shm");
    if (private_shm)
        GS_ASSERT_EQ(before, 0);
    gs_test_run_ranks_opts(&opts, leftovers_body, NULL, status);
    GS_ASSERT_RANK_EXIT(status[0], 0);
    GS_ASSERT_RANK_SIGNAL(status[1], SIGKILL);
    if (private_shm)
        GS_ASSERT_EQ(count_dir("/dev/shm"), 0);
    else
        GS_ASSERT_LE(count_dir("/dev/shm"), before);
}

/* ---- the mapping cache across deregistration -------------------------------------------- */

#define MANY 300

/* Rank 1 allocates MANY regions twice over (the second set reuses table
 * slots); rank 0 writes to each, and finds the first set's descriptors
 * dead after rank 1 freed them, even though it had them mapped. */
static void regions_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    gs_mr *local = NULL, **mrs = calloc(MANY, sizeof(*mrs));
    gs_rmr *mine = calloc(MANY, sizeof(*mine)), *old = calloc(MANY, sizeof(*old));
    (void)arg;

    GS_ASSERT(mrs && mine && old);
    GS_ASSERT_OK(gs_tp_open(ctx, "shm", &tp));
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &local));
    for (int round = 0; round < 2; round++) {
        char tag[32];
        if (rank == 1)
            for (int i = 0; i < MANY; i++) {
                GS_ASSERT_OK(gs_mr_alloc(tp, 4096 + (size_t)i, GS_ACCESS_ALL, &mrs[i]));
                gs_mr_pack(mrs[i], &mine[i]);
            }
        snprintf(tag, sizeof(tag), "regions.%d", round);
        if (rank == 1)
            GS_ASSERT_OK(gs_store_put(ctx, tag, mine, MANY * sizeof(gs_rmr)));
        else
            GS_ASSERT_OK(gs_store_get(ctx, tag, mine, MANY * sizeof(gs_rmr), NULL));
        if (rank == 0) {
            uint64_t *w = gs_mr_addr(local);
            for (int i = 0; round == 1 && i < MANY; i += 37) /* freed, though still mapped here */
                GS_ASSERT_STATUS(gs_ep_write(gs_tp_ep(tp, 1), w, local, 8, &old[i], 0, 0, 0),
                                 GS_ERR_REMOTE_ACCESS);
            for (int i = 0; i < MANY; i++) {
                w[0] = (uint64_t)(round * 1000 + i);
                GS_ASSERT_OK(gs_ep_write(gs_tp_ep(tp, 1), w, local, 8, &mine[i], (uint64_t)i, 0, 0));
            }
            memcpy(old, mine, MANY * sizeof(gs_rmr));
        }
        snprintf(tag, sizeof(tag), "regions.w%d", round);
        GS_ASSERT_OK(gs_store_barrier(ctx, tag));
        if (rank == 1)
            for (int i = 0; i < MANY; i++) {
                uint64_t v;
                memcpy(&v, (uint8_t *)gs_mr_addr(mrs[i]) + i, 8);
                GS_ASSERT_U64_EQ(v, (uint64_t)(round * 1000 + i));
                GS_ASSERT_OK(gs_mr_dereg(mrs[i]));
            }
        snprintf(tag, sizeof(tag), "regions.f%d", round);
        GS_ASSERT_OK(gs_store_barrier(ctx, tag));
    }
    GS_ASSERT_OK(gs_mr_dereg(local));
    GS_ASSERT_OK(gs_tp_close(tp));
    free(mrs);
    free(mine);
    free(old);
}

GS_TEST(regions_freed_and_reallocated_are_told_apart_by_key)
{
    run(2, regions_body, NULL, NULL);
}

/* ---- wake-ups only for sleepers ------------------------------------------------------- */

static uint32_t doorbell_of(gs_tp *tp)
{
    return __atomic_load_n(&gs_shm_wake_of(gs_shm_tp_of(tp)->ctrl)->doorbell, __ATOMIC_ACQUIRE);
}

/* 500 ping-pongs: in spin mode nobody sleeps, so no writer rings the
 * doorbell; in event mode the sleeper's doorbell is rung. */
static void doorbell_body(gs_ctx *ctx, int rank, void *arg)
{
    bool expect_rings = arg != NULL;
    gs_tp *tp = NULL;
    gs_mr *mr = NULL;
    gs_rmr *all;
    int peer = 1 - rank;

    GS_ASSERT_OK(gs_tp_open(ctx, "shm", &tp));
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    all = tpc_exchange(ctx, "bell.rmr", mr);
    for (uint32_t i = 0; i < 500; i++) {
        if (rank == 1)
            GS_ASSERT_EQ(wait_one(tp).imm, i);
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, peer), NULL, NULL, 0, &all[peer], 0, i, 0, 0));
        if (rank == 0)
            GS_ASSERT_EQ(wait_one(tp).imm, i);
    }
    fprintf(stderr, "  rank %d: doorbell rung %u times\n", rank, doorbell_of(tp));
    if (expect_rings)
        GS_ASSERT_GT(doorbell_of(tp), 0);
    else
        GS_ASSERT_EQ(doorbell_of(tp), 0);
    GS_ASSERT_OK(gs_store_barrier(ctx, "bell.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(writers_wake_only_sleeping_readers)
{
    static const char *const spin[] = {"GS_POLL=spin", NULL};
    static const char *const event[] = {"GS_POLL=event", NULL};
    run(2, doorbell_body, NULL, spin);
    run(2, doorbell_body, (void *)1, event);
}

/* ---- a ping-pong stays in a few ring lines ---------------------------------------------- */

#define PP_ROUNDS 3000

/* The slot index of the next message to the peer: where this rank's ring to it is at. */
static uint32_t tx_slot(gs_tp *tp, int peer)
{
    return gs_shm_ep_of(gs_tp_ep(tp, peer))->tx_tail & (GS_SHM_RING_SLOTS - 1u);
}

/* WRITE_IMMs from rank 0 to rank 1 until the ring is full; how many. */
static uint32_t burst(gs_tp *tp, const gs_rmr *dst, uint32_t first)
{
    uint32_t n = 0;
    gs_status st;
    while ((st = gs_ep_write_imm(gs_tp_ep(tp, 1), NULL, NULL, 0, dst, 0, first + n, 0, 0)) == GS_OK)
        n++;
    GS_ASSERT_STATUS(st, GS_ERR_AGAIN);
    return n;
}

/* Rank 0 posts, rank 1 answers, mixing WRITE_IMMs and SENDs of every
 * slot count: the writers go back to slot 0 (WRAP) instead of cycling
 * through the whole ring, and every message arrives in order. Then rank 0
 * posts until the ring is full, twice, rank 1 reading everything in
 * between: the first burst may start with a WRAP (the last ack said
 * ping-pong) and get part of a ring, the second (a stream, no ack) the
 * whole ring: skipped slots are not lost. */
static void compact_body(gs_ctx *ctx, int rank, void *arg)
{
    static const size_t sizes[] = {0, 1, 44, 45, 104, 105, 1000, GS_SEND_MAX};
    const uint32_t bound = GS_SHM_RING_HOT + 2 * GS_SHM_MSG_SLOTS((uint32_t)GS_SEND_MAX);
    int peer = 1 - rank;
    gs_tp *tp = NULL;
    gs_mr *mr = NULL;
    uint8_t *in, *out;
    gs_rmr *all;
    uint32_t slots = 0, counts[2] = {0, 0};
    (void)arg;

    GS_ASSERT_OK(gs_tp_open(ctx, "shm", &tp));
    GS_ASSERT_OK(gs_mr_alloc(tp, 2 * GS_SEND_MAX, GS_ACCESS_ALL, &mr));
    in = gs_mr_addr(mr);
    out = in + GS_SEND_MAX;
    all = tpc_exchange(ctx, "compact.rmr", mr);
    for (uint32_t i = 0; i < PP_ROUNDS; i++) {
        size_t len = sizes[i % 8];
        bool send = i % 3 == 0;
        gs_wc wc;
        if (send)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, peer), in, mr, GS_SEND_MAX, i));
        for (int turn = 0; turn < 2; turn++) {
            if (turn == rank) { /* rank 0 posts first, rank 1 answers */
                memset(out, (int)(i & 0xff), len);
                if (send)
                    GS_ASSERT_OK(gs_ep_send(gs_tp_ep(tp, peer), out, mr, len, i, 0));
                else
                    GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, peer), out, mr, len, &all[peer], 0, i, 0, 0));
                slots += send ? GS_SHM_MSG_SLOTS((uint32_t)len) : 1u;
                GS_ASSERT_LT(tx_slot(tp, peer), bound);
                continue;
            }
            wc = wait_one(tp);
            GS_ASSERT_EQ(wc.opcode, send ? GS_WC_RECV : GS_WC_RECV_IMM);
            GS_ASSERT_EQ(send ? wc.wr_id : wc.imm, i);
            GS_ASSERT_EQ(wc.len, len);
            if (send && len > 0)
                GS_ASSERT_EQ(in[len - 1], i & 0xff);
        }
    }
    GS_ASSERT_GT(slots, 4 * GS_SHM_RING_SLOTS); /* without WRAP the ring would have gone round */
    for (int b = 0; b < 2; b++) {
        uint32_t mine, both[2];
        GS_ASSERT_OK(gs_store_barrier(ctx, b ? "compact.burst1" : "compact.burst0")); /* rank 1 read all */
        mine = rank == 0 ? burst(tp, &all[1], b ? counts[0] : 0) : 0;
        GS_ASSERT_OK(
            gs_store_allgather(ctx, b ? "compact.count1" : "compact.count0", &mine, sizeof(mine), both));
        counts[b] = both[0];
        for (uint32_t i = 0; rank == 1 && i < counts[b]; i++)
            GS_ASSERT_EQ(wait_one(tp).imm, (b ? counts[0] : 0) + i);
    }
    GS_ASSERT_GE(counts[0], GS_SHM_RING_HOT - GS_SHM_RING_HOT / 4);
    GS_ASSERT_EQ(counts[1], GS_SHM_RING_SLOTS);
    GS_ASSERT_OK(gs_store_barrier(ctx, "compact.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(a_ping_pong_cycles_through_a_few_ring_slots_and_a_burst_gets_the_whole_ring)
{
    run(2, compact_body, NULL, NULL);
}

/* ---- the hot path in one process ----------------------------------------------------------- */

#define SOLO_ROUNDS 200000

typedef struct solo {
    gs_tp *tp[2];
    gs_mr *mr[2];
    gs_rmr rmr[2];
} solo;

/* Two shm transports of one job (ranks 0 and 1) in this process, connected without a store. */
static void solo_open(solo *s)
{
    const gs_config *cfg;
    gs_shm_tp *t[2];
    gs_shm_addr addrs[2];
    gs_shm_ready ready[2];

    GS_ASSERT_OK(gs_config_get(&cfg));
    for (int r = 0; r < 2; r++) {
        GS_ASSERT_OK(gs_shm_tp_create(cfg, r, 2, &t[r]));
        gs_shm_tp_addr(t[r], "solo", &addrs[r]);
    }
    for (int r = 0; r < 2; r++)
        GS_ASSERT_OK(gs_shm_tp_connect(t[r], addrs, &ready[r]));
    for (int r = 0; r < 2; r++) {
        GS_ASSERT_OK(gs_shm_tp_finish(t[r], ready));
        s->tp[r] = &t[r]->base;
        GS_ASSERT_OK(gs_mr_alloc(s->tp[r], 4096, GS_ACCESS_ALL, &s->mr[r]));
        gs_mr_pack(s->mr[r], &s->rmr[r]);
    }
}

/* n WRITE_IMM round trips of 8 bytes, each side waiting for the other's:
 * one hop is a post and a wait that finds it. */
static void solo_rounds(solo *s, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (int r = 0; r < 2; r++) {
            gs_wc wc;
            int got = 0;
            GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(s->tp[r], 1 - r), gs_mr_addr(s->mr[r]), s->mr[r], 8,
                                         &s->rmr[1 - r], 0, i, 0, 0));
            GS_ASSERT_OK(gs_tp_wait(s->tp[1 - r], &wc, 1, &got, -1));
            GS_ASSERT_EQ(got, 1);
            GS_ASSERT_EQ(wc.imm, i);
        }
}

/* The timed rounds, out of line for
 * `valgrind --tool=callgrind --toggle-collect=solo_timed`. */
static __attribute__((noinline)) uint64_t solo_timed(solo *s, uint32_t n)
{
    uint64_t t0 = gs_now_ns();
    solo_rounds(s, n);
    return gs_now_ns() - t0;
}

/* n polls that find nothing, out of line for --toggle-collect=solo_idle. */
static __attribute__((noinline)) uint64_t solo_idle(solo *s, uint32_t n)
{
    uint64_t t0 = gs_now_ns();
    for (uint32_t i = 0; i < n; i++) {
        gs_wc wc;
        int got = -1;
        GS_ASSERT_OK(gs_tp_poll(s->tp[0], &wc, 1, &got));
        GS_ASSERT_EQ(got, 0);
    }
    return gs_now_ns() - t0;
}

/* Both ends in one thread: no cache line moves between cores, so the time
 * per round trip is the software's alone (printed; gsperf's write_imm
 * figure is about a cache-line transfer plus half of it). */
GS_TEST(two_transports_in_one_process_ping_pong_in_order)
{
    solo s;
    uint64_t ns;
    uint32_t n = SOLO_ROUNDS;
    const char *env = getenv("GS_TEST_SOLO_ROUNDS");

    if (env)
        n = (uint32_t)strtoul(env, NULL, 10);
    solo_open(&s);
    solo_rounds(&s, 1000);
    ns = solo_timed(&s, n);
    fprintf(stderr, "  %u round trips, %.1f ns each\n", n, (double)ns / (double)(n ? n : 1));
    ns = solo_idle(&s, n);
    fprintf(stderr, "  %u idle polls, %.1f ns each\n", n, (double)ns / (double)(n ? n : 1));
    for (int r = 0; r < 2; r++) {
        GS_ASSERT_OK(gs_mr_dereg(s.mr[r]));
        GS_ASSERT_OK(gs_tp_close(s.tp[r]));
    }
}

/* Moves both rings of a fresh solo pair to position pos, as if that many
 * slots had gone through each. */
static void solo_seek(solo *s, uint32_t pos)
{
    for (int r = 0; r < 2; r++) {
        gs_shm_ep *ep = gs_shm_ep_of(gs_tp_ep(s->tp[r], 1 - r));
        ep->tx_tail = ep->tx_head = ep->tx_acked = ep->rx_head = pos;
        __atomic_store_n(&ep->rx->ctl.head, pos, __ATOMIC_RELEASE);
    }
}

/* A ping-pong across the 2^32 wrap of the position counter: messages stay
 * in order, the lap ending at 2^32 (one in GS_SHM_FULL_LAP_EVERY) is
 * written through without WRAP, so every slot's seq is renewed, and the
 * laps after it wrap again. */
GS_TEST(positions_wrap_around_2_to_the_32_and_one_lap_in_65536_is_written_through)
{
    const uint32_t bound = GS_SHM_RING_HOT + 2, last_lap = (0u - GS_SHM_RING_SLOTS) / GS_SHM_RING_SLOTS;
    solo s;
    uint32_t full_max = 0, after_max = 0;

    solo_open(&s);
    solo_seek(&s, 0u - GS_SHM_RING_SLOTS - 40u); /* near the end of the lap before */
    for (uint32_t i = 0; i < GS_SHM_RING_SLOTS + 400; i++) {
        uint32_t pos = gs_shm_ep_of(gs_tp_ep(s.tp[0], 1))->tx_tail, slot = pos & (GS_SHM_RING_SLOTS - 1u);
        if (pos / GS_SHM_RING_SLOTS == last_lap)
            full_max = slot > full_max ? slot : full_max;
        else if (pos < 0x80000000u) /* past 2^32 */
            after_max = slot > after_max ? slot : after_max;
        solo_rounds(&s, 1);
    }
    GS_ASSERT_EQ(full_max, GS_SHM_RING_SLOTS - 1);
    GS_ASSERT_GT(after_max, 0);
    GS_ASSERT_LT(after_max, bound);
    for (int r = 0; r < 2; r++) {
        GS_ASSERT_OK(gs_mr_dereg(s.mr[r]));
        GS_ASSERT_OK(gs_tp_close(s.tp[r]));
    }
}

/* ---- more ranks than cores ------------------------------------------------------------------ */

#define HOPS 3000

/* A token goes round 4 ranks pinned to 2 cores; prints hops per second. */
static void token_body(gs_ctx *ctx, int rank, void *arg)
{
    int size = gs_ctx_size(ctx), next = (rank + 1) % size;
    gs_tp *tp = NULL;
    gs_mr *mr = NULL;
    gs_rmr *all;
    cpu_set_t set;
    uint64_t t0;
    (void)arg;

    CPU_ZERO(&set);
    CPU_SET(rank % 2, &set);
    sched_setaffinity(0, sizeof(set), &set); /* best effort: fewer cores only makes it harder */
    GS_ASSERT_OK(gs_tp_open(ctx, "shm", &tp));
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    all = tpc_exchange(ctx, "token.rmr", mr);
    t0 = gs_now_ns();
    for (uint32_t hop = (uint32_t)rank; hop < HOPS; hop += (uint32_t)size) {
        if (hop > 0)
            GS_ASSERT_EQ(wait_one(tp).imm, hop - 1);
        GS_ASSERT_OK(gs_ep_write_imm(gs_tp_ep(tp, next), NULL, NULL, 0, &all[next], 0, hop, 0, 0));
    }
    if (rank == 0) {
        double s = (double)(gs_now_ns() - t0) / 1e9;
        GS_ASSERT_EQ(wait_one(tp).imm, HOPS - 1); /* HOPS is a multiple of 4: rank 3 sends the last */
        fprintf(stderr, "  %d hops in %.3f s: %.0f hops/s\n", HOPS, s, HOPS / s);
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "token.done"));
    free(all);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(four_ranks_on_two_cores_keep_passing_in_hybrid_and_event_modes)
{
    static const char *const hybrid[] = {"GS_POLL=hybrid", NULL};
    static const char *const event[] = {"GS_POLL=event", NULL};
    uint64_t t0 = gs_now_ns();
    run(4, token_body, NULL, hybrid);
    fprintf(stderr, "  hybrid: %.2f s for the whole job\n", (double)(gs_now_ns() - t0) / 1e9);
    t0 = gs_now_ns();
    run(4, token_body, NULL, event);
    fprintf(stderr, "  event: %.2f s for the whole job\n", (double)(gs_now_ns() - t0) / 1e9);
}

/* ---- clean close versus loss ----------------------------------------------------------------- */

static void close_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    gs_mr *mr = NULL;
    gs_rmr *all;
    (void)arg;

    GS_ASSERT_OK(gs_tp_open(ctx, "shm", &tp));
    GS_ASSERT_OK(gs_mr_alloc(tp, 4096, GS_ACCESS_ALL, &mr));
    all = tpc_exchange(ctx, "close.rmr", mr);
    if (rank == 1) {
        GS_ASSERT_OK(gs_tp_close(tp)); /* region freed with it */
        GS_ASSERT_OK(gs_store_barrier(ctx, "close.closed"));
        _exit(0); /* gone, but cleanly */
    } else {
        gs_wc wc;
        int n = 0;
        uint64_t t0;
        GS_ASSERT_OK(gs_store_barrier(ctx, "close.closed"));
        usleep(50000); /* let it exit */
        t0 = gs_now_ns();
        GS_ASSERT_STATUS(gs_tp_wait(tp, &wc, 1, &n, 200), GS_ERR_TIMEOUT);
        GS_ASSERT_GE(gs_now_ns() - t0, 150ull * 1000000ull);
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 0");
        GS_ASSERT_STATUS(gs_ep_write(gs_tp_ep(tp, 1), gs_mr_addr(mr), mr, 8, &all[1], 0, 0, 0),
                         GS_ERR_PEER_LOST);
        GS_ASSERT_CONTAINS(gs_last_error(), "closed");
        GS_ASSERT_OK(gs_mr_dereg(mr));
        GS_ASSERT_OK(gs_tp_close(tp));
    }
    free(all);
}

GS_TEST(a_peer_that_closed_cleanly_is_not_reported_lost)
{
    run(2, close_body, NULL, NULL);
}

/* ---- one host only ------------------------------------------------------------------------------- */

static void hosts_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    (void)arg;
    if (rank == 1) /* play a rank on another machine */
        snprintf(ctx->host_id, sizeof(ctx->host_id), "elsewhere:0000");
    GS_ASSERT_STATUS(gs_tp_open(ctx, "shm", &tp), GS_ERR_UNSUPPORTED);
    GS_ASSERT_CONTAINS(gs_last_error(), "one host");
    GS_ASSERT(tp == NULL);
}

GS_TEST(shm_across_hosts_fails_clearly_on_every_rank)
{
    run(2, hosts_body, NULL, NULL);
}

/* ---- selection ---------------------------------------------------------------------------------- */

static void select_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    (void)rank;
    (void)arg;
    /* auto (GS_TRANSPORT unset) on one host is shm, by NULL or by name */
    GS_ASSERT_OK(gs_tp_open(ctx, NULL, &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), "shm");
    GS_ASSERT_OK(gs_tp_close(tp));
    GS_ASSERT_OK(gs_tp_open(ctx, "auto", &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), "shm");
    GS_ASSERT_OK(gs_tp_close(tp));
    tp = NULL;
    GS_ASSERT_STATUS(gs_tp_open(ctx, "carrier-pigeon", &tp), GS_ERR_INVALID);
    GS_ASSERT_CONTAINS(gs_last_error(), "carrier-pigeon");
    GS_ASSERT(tp == NULL);
}

GS_TEST(auto_picks_shm_when_every_rank_shares_the_host)
{
    run(3, select_body, NULL, NULL);
}

static void select_env_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    (void)rank;
    (void)arg;
    GS_ASSERT_EQ(ctx->cfg.transport, GS_TRANSPORT_SHM);
    GS_ASSERT_OK(gs_tp_open(ctx, NULL, &tp)); /* NULL follows GS_TRANSPORT */
    GS_ASSERT_STR_EQ(gs_tp_name(tp), "shm");
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(gs_transport_names_the_backend)
{
    static const char *const env[] = {"GS_TRANSPORT=shm", NULL};
    run(2, select_env_body, NULL, env);
}

static void auto_hosts_body(gs_ctx *ctx, int rank, void *arg)
{
    gs_tp *tp = NULL;
    bool other = false;
    (void)arg;
    for (int i = 0; gs_tp_builtin(i); i++) /* another backend this machine can use (verbs needs a port) */
        other = other || (strcmp(gs_tp_builtin(i)->name, "shm") != 0 &&
                          (!gs_tp_builtin(i)->available || gs_tp_builtin(i)->available(&ctx->cfg)));
    if (rank == 1) /* play a rank on another machine */
        snprintf(ctx->host_id, sizeof(ctx->host_id), "elsewhere:0000");
    if (!other) { /* only shm usable: a clear error on every rank */
        GS_ASSERT_STATUS(gs_tp_open(ctx, "auto", &tp), GS_ERR_UNSUPPORTED);
        GS_ASSERT_CONTAINS(gs_last_error(), "do not share");
        return;
    }
    GS_ASSERT_OK(gs_tp_open(ctx, "auto", &tp)); /* never shm across hosts */
    GS_ASSERT(strcmp(gs_tp_name(tp), "shm") != 0);
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(auto_across_hosts_never_picks_shm)
{
    run(2, auto_hosts_body, NULL, NULL);
}
