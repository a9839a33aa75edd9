/*
 * gsperf: transport latency and bandwidth per operation, like perftest's
 * ib_write_lat / ib_write_bw, over any gradsync transport.
 *
 *   gsrun -n 2 gsperf [--op OP|all] [--lat|--bw] [--min B] [--max B] [--iters N]
 *                     [--transport T] [--user-mem] [--no-pin] [--no-floor]
 *
 * Ranks pair up: 2k is the initiator, 2k+1 its target (more than 2 ranks run
 * the pairs at once; the table shows pair 0 and the worst pair). Latency:
 * write, write_imm and send are ping-pongs reported as half the round trip;
 * read, fetch_add and cmp_swap are reported as the time of one operation
 * (post to completion). Median and p99 over the iterations, each timed on
 * its own. Bandwidth: back-to-back posts, one completion every 64, then a
 * zero-byte WRITE_IMM answered by the target; GB/s = 1e9 bytes/s.
 *
 * In the same run it measures the limits to compare against: the
 * cross-process cache-line ping-pong between the two ranks of pair 0 (one
 * way, through a shared memfd) and single-thread memcpy bandwidth, and
 * prints the ratios.
 *
 * --user-mem: the buffers are the program's own memory registered with
 * gs_mr_reg, as a caller's tensors are, instead of gs_mr_alloc's: over
 * shm a peer reaches them by cross-memory attach (process_vm_readv and
 * writev), not through a shared mapping. It is registered without remote
 * atomics (shm gives caller memory none), so fetch_add and cmp_swap are
 * left out.
 */
#include "gradsync.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A spinning wait's pause between polls of a shared line. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define LAT_BATCH    16
#define COMPARE_RUNS 5

enum { OP_WRITE, OP_WRITE_IMM, OP_READ, OP_FETCH_ADD, OP_CMP_SWAP, OP_SEND, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"write", "write_imm", "read", "fetch_add", "cmp_swap", "send"};

typedef struct perf_opts {
    int op; /* -1: all */
    bool lat, bw, pin, floor, user_mem;
    size_t min, max;       /* latency sizes (default 8 B .. 4 MiB) */
    size_t bw_min, bw_max; /* bandwidth sizes (default 4 KiB .. 64 MiB) */
    long iters;            /* 0: by size */
    const char *transport;
} perf_opts;

typedef struct perf {
    perf_opts o;
    gs_ctx *ctx;
    gs_tp *tp;
    int rank, size, peer;
    bool initiator;
    gs_ep *ep;
    gs_mr *mr;
    uint8_t *recv_area, *send_area; /* halves of mr */
    void *user_buf;                 /* --user-mem: mr's memory, ours */
    size_t area;
    gs_rmr peer_rmr;
    uint64_t deadline_ns;
    unsigned barrier_no;
    int floor_fd; /* the limit's shared line */
    void *floor_map;
    uint32_t floor_seq;
} perf;

static void die(const char *what, gs_status st)
{
    fprintf(stderr, "gsperf: %s failed: %s (%s)\n", what, gs_status_name(st), gs_last_error());
    exit(1);
}

#define CHECK(what, expr)                                                                                    \
    do {                                                                                                     \
        gs_status st_ = (expr);                                                                              \
        if (st_ != GS_OK)                                                                                    \
            die(what, st_);                                                                                  \
    } while (0)

static void barrier(perf *p)
{
    char tag[32];
    snprintf(tag, sizeof(tag), "gsperf.b%u", p->barrier_no++);
    CHECK("store barrier", gs_store_barrier(p->ctx, tag));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t quantile(uint64_t *v, size_t n, double q)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    return v[(size_t)(q * (double)(n - 1) + 0.5)];
}

/* ---- completions ------------------------------------------------------------- */

/* Waits for one completion of opcode op; fails on any error. */
/* The next completion, whatever it is (a failed one ends the run). */
static gs_wc wait_any(perf *p)
{
    gs_wc wc;
    int n = 0;
    CHECK("gs_tp_wait", gs_tp_wait(p->tp, &wc, 1, &n, -1));
    if (wc.status != GS_OK)
        die(op_names[0], wc.status);
    return wc;
}

/* The next completion of kind op; others are dropped (only where none can
 * come that a later wait needs). */
static gs_wc wait_op(perf *p, gs_wc_opcode op)
{
    for (;;) {
        gs_wc wc = wait_any(p);
        if (wc.opcode == op)
            return wc;
    }
}

/* Retries a post while the transport says GS_ERR_AGAIN (driving progress). */
#define POST(p, what, call)                                                                                  \
    do {                                                                                                     \
        gs_status st_;                                                                                       \
        while ((st_ = (call)) == GS_ERR_AGAIN) {                                                             \
            gs_wc w_[8];                                                                                     \
            int n_ = 0;                                                                                      \
            CHECK("gs_tp_poll", gs_tp_poll((p)->tp, w_, 8, &n_));                                            \
        }                                                                                                    \
        if (st_ != GS_OK)                                                                                    \
            die(what, st_);                                                                                  \
    } while (0)

/* Spins until the byte at b becomes value, driving progress; bounded. */
static void spin_byte(perf *p, volatile uint8_t *b, uint8_t value)
{
    for (uint32_t i = 0; *b != value; i++) {
        if ((i & 1023u) == 1023u && gs_clock_ns() >= p->deadline_ns) {
            fprintf(stderr, "gsperf: rank %d: no write from rank %d within the deadline\n", p->rank, p->peer);
            exit(1);
        }
        if ((i & 15u) == 15u) {
            gs_wc w[8];
            int n = 0;
            CHECK("gs_tp_poll", gs_tp_poll(p->tp, w, 8, &n));
        }
        cpu_relax();
    }
}

/* ---- one operation ------------------------------------------------------------ */

static void post_op(perf *p, int op, size_t len, uint64_t wr_id, unsigned flags)
{
    switch (op) {
    case OP_WRITE:
        POST(p, "write", gs_ep_write(p->ep, p->send_area, p->mr, len, &p->peer_rmr, 0, wr_id, flags));
        break;
    case OP_WRITE_IMM:
        POST(
            p, "write_imm",
            gs_ep_write_imm(p->ep, p->send_area, p->mr, len, &p->peer_rmr, 0, (uint32_t)wr_id, wr_id, flags));
        break;
    case OP_READ:
        POST(p, "read", gs_ep_read(p->ep, p->recv_area, p->mr, len, &p->peer_rmr, 0, wr_id, flags));
        break;
    case OP_FETCH_ADD:
        POST(p, "fetch_add",
             gs_ep_fetch_add(p->ep, (uint64_t *)(void *)p->recv_area, p->mr, &p->peer_rmr, 0, 1, wr_id,
                             flags));
        break;
    case OP_CMP_SWAP:
        POST(p, "cmp_swap",
             gs_ep_cmp_swap(p->ep, (uint64_t *)(void *)p->recv_area, p->mr, &p->peer_rmr, 0, wr_id, wr_id + 1,
                            wr_id, flags));
        break;
    case OP_SEND: POST(p, "send", gs_ep_send(p->ep, p->send_area, p->mr, len, wr_id, flags)); break;
    }
}

static const gs_wc_opcode op_wc[OP_COUNT] = {GS_WC_WRITE,     GS_WC_WRITE_IMM, GS_WC_READ,
                                             GS_WC_FETCH_ADD, GS_WC_CMP_SWAP,  GS_WC_SEND};

/* ---- latency -------------------------------------------------------------------- */

/* One ping-pong round (or one op for read/atomics), as seen by each side. */
static void lat_round(perf *p, int op, size_t len, uint32_t i)
{
    uint8_t stamp = (uint8_t)(i % 251u + 1u);
    if (op == OP_WRITE) {
        if (p->initiator) {
            p->send_area[len - 1] = stamp;
            post_op(p, op, len, i, (i % 64u == 63u) ? GS_OP_SIGNALED : 0);
            spin_byte(p, &p->recv_area[len - 1], stamp);
        } else {
            spin_byte(p, &p->recv_area[len - 1], stamp);
            p->send_area[len - 1] = stamp;
            post_op(p, op, len, i, (i % 64u == 63u) ? GS_OP_SIGNALED : 0);
        }
        return;
    }
    if (op == OP_WRITE_IMM || op == OP_SEND) {
        gs_wc_opcode arrive = op == OP_SEND ? GS_WC_RECV : GS_WC_RECV_IMM;
        if (op == OP_SEND)
            CHECK("recv", gs_ep_recv(p->ep, p->recv_area, p->mr, len, i));
        if (!p->initiator)
            wait_op(p, arrive);
        post_op(p, op, len, i, 0);
        if (p->initiator)
            wait_op(p, arrive);
        return;
    }
    if (p->initiator) { /* read, atomics: one op, post to completion */
        post_op(p, op, len, i, GS_OP_SIGNALED);
        wait_op(p, op_wc[op]);
    }
}

/* The target of read/atomics serves until the initiator's zero-byte WRITE_IMM. */
static void serve_until_done(perf *p)
{
    if (p->initiator)
        POST(p, "write_imm", gs_ep_write_imm(p->ep, NULL, NULL, 0, &p->peer_rmr, 0, 0, 0, 0));
    else
        wait_op(p, GS_WC_RECV_IMM);
}

/* Rounds per timed batch: a clock read costs about a cache-line transfer
 * here, so small sizes are timed in batches (the floor is timed alike). */
static long lat_batch(size_t len)
{
    return len <= 64 * 1024 ? LAT_BATCH : 1;
}

/* Timed rounds for a size: a whole number of batches, at least 20 rounds. */
static long lat_iters(const perf *p, size_t len)
{
    long n = p->o.iters ? p->o.iters : (long)(len <= 64 * 1024 ? 20000 : (64u << 20) / len),
         b = lat_batch(len);
    n = n < 20 ? 20 : n;
    return (n + b - 1) / b * b;
}

/* Times batches of rounds. out: [0] median and [1] p99 (ns per round,
 * halved for ping-pongs) of pair 0, [2] the worst pair's median, [3] rounds
 * per second summed over the pairs (wall clock of the whole loop). */
static void lat_size(perf *p, int op, size_t len, uint64_t out[4])
{
    long batch = lat_batch(len), nb = lat_iters(p, len) / batch, warm = nb / 10 + 2;
    uint64_t *t = calloc((size_t)nb, sizeof(*t)), mine[3] = {0, 0, 0}, *all, start = 0;
    bool one_sided = op == OP_READ || op == OP_FETCH_ADD || op == OP_CMP_SWAP;
    uint32_t round = 0;

    all = calloc((size_t)p->size * 3, sizeof(*all));
    if (!t || !all)
        die("allocation", GS_ERR_NOMEM);
    memset(p->recv_area, 0, len);
    barrier(p);
    for (long b = -warm; b < nb; b++) {
        uint64_t t0 = gs_clock_ns();
        if (b == 0)
            start = t0;
        for (long i = 0; i < batch; i++)
            lat_round(p, op, len, round++);
        if (b >= 0)
            t[b] = (gs_clock_ns() - t0) / (uint64_t)batch / (one_sided ? 1u : 2u);
    }
    if (p->initiator) {
        mine[2] = (uint64_t)((double)(nb * batch) * 1e9 / (double)(gs_clock_ns() - start));
        mine[0] = quantile(t, (size_t)nb, 0.5);
        mine[1] = quantile(t, (size_t)nb, 0.99);
    }
    if (one_sided)
        serve_until_done(p);
    CHECK("allgather", gs_store_allgather(p->ctx, "gsperf.lat", mine, sizeof(mine), all));
    out[0] = all[0];
    out[1] = all[1];
    out[2] = out[3] = 0;
    for (int r = 0; r < p->size; r += 2) {
        out[2] = all[3 * r] > out[2] ? all[3 * r] : out[2];
        out[3] += all[3 * r + 2];
    }
    free(all);
    free(t);
}

/* ---- bandwidth ---------------------------------------------------------------------- */

static long bw_iters(const perf *p, size_t len)
{
    long n = p->o.iters ? p->o.iters : (long)((1u << 30) / len);
    if (!p->o.iters && n > 20000)
        n = 20000;
    return n < 4 ? 4 : n;
}

static void bw_run(perf *p, int op, size_t len, long iters)
{
    if (p->initiator) {
        for (long i = 0; i < iters; i++) {
            bool sig = (i % 64) == 63 || i == iters - 1;
            post_op(p, op, len, (uint64_t)i, sig ? GS_OP_SIGNALED : 0);
            if (sig)
                wait_op(p, op_wc[op]);
        }
        POST(p, "write_imm", gs_ep_write_imm(p->ep, NULL, NULL, 0, &p->peer_rmr, 0, 1, 0, 0));
        wait_op(p, GS_WC_RECV_IMM);
    } else {
        /* the initiator's last WRITE_IMM may complete before SENDs that found no receive
         * posted (they complete as receives are posted): count both kinds, in any order */
        long want_recvs = op == OP_SEND ? iters : 0, want_imms = (op == OP_WRITE_IMM ? iters : 0) + 1;
        long recvs = 0, imms = 0, posted = iters < 64 ? iters : 64;
        while (recvs < want_recvs || imms < want_imms) {
            gs_wc wc = wait_any(p);
            if (wc.opcode == GS_WC_RECV_IMM) {
                imms++;
            } else if (wc.opcode == GS_WC_RECV) {
                recvs++;
                if (posted < iters) { /* keep 64 receives posted */
                    CHECK("recv", gs_ep_recv(p->ep, p->recv_area, p->mr, len, 0));
                    posted++;
                }
            }
        }
        POST(p, "write_imm", gs_ep_write_imm(p->ep, NULL, NULL, 0, &p->peer_rmr, 0, 2, 0, 0));
    }
}

/* GB/s of pair 0 and the sum over pairs. */
static void bw_size(perf *p, int op, size_t len, double out[2], long *iters_p)
{
    long iters = bw_iters(p, len);
    double mine = 0, *all = calloc((size_t)p->size, sizeof(*all));
    uint64_t t0;

    if (!all)
        die("allocation", GS_ERR_NOMEM);
    for (int pass = 0; pass < 2; pass++) { /* a short warm-up pass, then the timed one */
        long n = pass ? iters : (iters / 16 + 1);
        if (!p->initiator && op == OP_SEND)
            for (long k = 0; k < (n < 64 ? n : 64); k++)
                CHECK("recv", gs_ep_recv(p->ep, p->recv_area, p->mr, len, 0));
        barrier(p);
        t0 = gs_clock_ns();
        bw_run(p, op, len, n);
        if (pass)
            mine = p->initiator ? (double)len * (double)iters / (double)(gs_clock_ns() - t0) : 0;
    }
    CHECK("allgather", gs_store_allgather(p->ctx, "gsperf.bw", &mine, sizeof(mine), all));
    out[0] = all[0];
    out[1] = 0;
    for (int r = 0; r < p->size; r++)
        out[1] += all[r];
    *iters_p = iters;
    free(all);
}

/* ---- the limits ---------------------------------------------------------------------- */

/* One-way cache-line latency between the ranks of each pair: a memfd of the
 * target mapped by the initiator through /proc, two lines 128 bytes apart. */
/* Maps the cache line(s) of the limit: a memfd of the target, mapped by the
 * initiator through /proc, two lines 128 bytes apart. */
static void floor_setup(perf *p)
{
    int info[2];
    char key[48];
    void *map;

    snprintf(key, sizeof(key), "gsperf.floor.%d", p->rank | 1);
    if (!p->initiator) {
        p->floor_fd = memfd_create("gsperf-floor", MFD_CLOEXEC);
        if (p->floor_fd < 0 || ftruncate(p->floor_fd, 4096) != 0) {
            perror("gsperf: memfd");
            exit(1);
        }
        info[0] = (int)getpid();
        info[1] = p->floor_fd;
        CHECK("store put", gs_store_put(p->ctx, key, info, sizeof(info)));
    } else {
        char path[64];
        size_t len = 0;
        CHECK("store get", gs_store_get(p->ctx, key, info, sizeof(info), &len));
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", info[0], info[1]);
        p->floor_fd = open(path, O_RDWR | O_CLOEXEC);
        if (p->floor_fd < 0) {
            fprintf(stderr, "gsperf: opening %s: %s\n", path, strerror(errno));
            exit(1);
        }
    }
    map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, p->floor_fd, 0);
    if (map == MAP_FAILED) {
        perror("gsperf: mmap");
        exit(1);
    }
    p->floor_map = map;
    barrier(p);
}

static void floor_teardown(perf *p)
{
    munmap(p->floor_map, 4096);
    close(p->floor_fd);
}

/* One-way cache-line latency between the ranks of each pair, timed like the
 * latency tables (batches of LAT_BATCH round trips); pair 0's median, ns. */
static double floor_measure(perf *p)
{
    const long nb = 20000 / LAT_BATCH, warm = nb / 10 + 2;
    volatile uint32_t *ping = (volatile uint32_t *)p->floor_map;
    volatile uint32_t *pong = (volatile uint32_t *)((char *)p->floor_map + 128);
    uint64_t *t = calloc((size_t)nb, sizeof(*t)), med = 0;

    if (!t)
        die("allocation", GS_ERR_NOMEM);
    barrier(p);
    for (long b = -warm; b < nb; b++) {
        uint64_t t0 = gs_clock_ns();
        for (long i = 0; i < LAT_BATCH; i++) {
            uint32_t seq = ++p->floor_seq;
            if (p->initiator) {
                __atomic_store_n(ping, seq, __ATOMIC_RELEASE);
                while (__atomic_load_n(pong, __ATOMIC_ACQUIRE) != seq)
                    cpu_relax();
            } else {
                while (__atomic_load_n(ping, __ATOMIC_ACQUIRE) != seq)
                    cpu_relax();
                __atomic_store_n(pong, seq, __ATOMIC_RELEASE);
            }
        }
        if (b >= 0)
            t[b] = (gs_clock_ns() - t0) / LAT_BATCH / 2;
    }
    if (p->initiator)
        med = quantile(t, (size_t)nb, 0.5);
    free(t);
    barrier(p);
    return (double)med;
}

/* Single-thread memcpy between private pre-touched 64 MiB buffers: GB/s over
 * 16 copies after one warm-up copy (the same bytes as a 64 MiB WRITE run). */
static double memcpy_gbps(void)
{
    const size_t len = 64u << 20;
    uint8_t *a = malloc(len), *b = malloc(len);
    uint64_t t0;
    double gbps;
    if (!a || !b) {
        fprintf(stderr, "gsperf: out of memory for the memcpy limit\n");
        exit(1);
    }
    memset(a, 1, len);
    memset(b, 2, len);
    memcpy(b, a, len);
    t0 = gs_clock_ns();
    for (int r = 0; r < 16; r++) {
        memcpy(b, a, len);
        __asm__ __volatile__("" : : "r"(b) : "memory");
    }
    gbps = 16.0 * (double)len / (double)(gs_clock_ns() - t0);
    free(a);
    free(b);
    return gbps;
}

/* ---- driver ------------------------------------------------------------------------------ */

static bool op_fits(int op, size_t len)
{
    if (op == OP_FETCH_ADD || op == OP_CMP_SWAP)
        return len == 8;
    if (op == OP_SEND)
        return len <= GS_SEND_MAX;
    return len >= 1;
}

static bool is_shm(const perf *p)
{
    return strcmp(gs_tp_name(p->tp), "shm") == 0;
}

/* 8-byte WRITE_IMM against the cache-line limit, alternated COMPARE_RUNS
 * times (the host moves the vCPUs, and the limit with them): the median of
 * the per-pair ratios and their range. */
static void compare_floor(perf *p)
{
    double f[COMPARE_RUNS], w[COMPARE_RUNS], ratio[COMPARE_RUNS];
    for (int k = 0; k < COMPARE_RUNS; k++) {
        uint64_t r[4];
        f[k] = floor_measure(p);
        lat_size(p, OP_WRITE_IMM, 8, r);
        w[k] = (double)r[0];
        ratio[k] = f[k] > 0 ? w[k] / f[k] : 0;
    }
    qsort(f, COMPARE_RUNS, sizeof(double), cmp_double);
    qsort(w, COMPARE_RUNS, sizeof(double), cmp_double);
    qsort(ratio, COMPARE_RUNS, sizeof(double), cmp_double);
    if (p->rank == 0)
        printf("# write_imm 8 B half round trip / cache-line one-way, %d alternated runs: median ratio %.2f "
               "(range "
               "%.2f-%.2f; medians %.0f / %.0f ns)%s\n",
               COMPARE_RUNS, ratio[COMPARE_RUNS / 2], ratio[0], ratio[COMPARE_RUNS - 1], w[COMPARE_RUNS / 2],
               f[COMPARE_RUNS / 2], is_shm(p) ? " (shm target <= 2x)" : "");
}

static void run_lat(perf *p, int op)
{
    if (p->rank == 0) {
        printf("\n# %s latency (%s), transport %s, %d ranks%s\n", op_names[op],
               op == OP_READ || op == OP_FETCH_ADD || op == OP_CMP_SWAP ? "one op, post to completion"
                                                                        : "half round trip",
               gs_tp_name(p->tp), p->size, p->o.user_mem ? ", caller memory (gs_mr_reg)" : "");
        printf("# median and p99 over batches of %d rounds (single rounds above 64 KiB)\n", LAT_BATCH);
        printf("%10s %8s %11s %11s %14s %14s\n", "bytes", "iters", "median_us", "p99_us", "worst_pair_us",
               "rounds/s_all");
    }
    for (size_t len = p->o.min; len <= p->o.max; len *= 2) {
        uint64_t r[4];
        if (!op_fits(op, len))
            continue;
        lat_size(p, op, len, r);
        if (p->rank == 0)
            printf("%10zu %8ld %11.3f %11.3f %14.3f %14llu\n", len, lat_iters(p, len), (double)r[0] / 1e3,
                   (double)r[1] / 1e3, (double)r[2] / 1e3, (unsigned long long)r[3]);
    }
    if (p->o.floor && op == OP_WRITE_IMM && p->o.min <= 8)
        compare_floor(p);
}

/* 64 MiB WRITE against single-thread memcpy, alternated COMPARE_RUNS times
 * (memory bandwidth here drifts with what else runs): prints the median
 * WRITE row and the median of the per-pair ratios. */
static void compare_memcpy(perf *p, double r[2], long *iters_p)
{
    const size_t len = 64u << 20;
    double w[COMPARE_RUNS], m[COMPARE_RUNS], ratio[COMPARE_RUNS], all[COMPARE_RUNS];
    for (int k = 0; k < COMPARE_RUNS; k++) {
        m[k] = p->rank == 0 ? memcpy_gbps() : 0; /* the target waits in bw_size's barrier */
        bw_size(p, OP_WRITE, len, r, iters_p);
        w[k] = r[0];
        all[k] = r[1];
        ratio[k] = m[k] > 0 ? w[k] / m[k] : 0;
    }
    qsort(w, COMPARE_RUNS, sizeof(double), cmp_double);
    qsort(m, COMPARE_RUNS, sizeof(double), cmp_double);
    qsort(ratio, COMPARE_RUNS, sizeof(double), cmp_double);
    qsort(all, COMPARE_RUNS, sizeof(double), cmp_double);
    if (p->rank != 0)
        return;
    printf("%10zu %8ld %10.3f %10.3f %14.3f   (median of %d runs)\n", len, *iters_p, w[COMPARE_RUNS / 2],
           w[COMPARE_RUNS / 2] * 1e3 / (double)len, all[COMPARE_RUNS / 2], COMPARE_RUNS);
    printf("# write 64 MiB / single-thread memcpy, %d alternated runs: median ratio %.2f (range %.2f-%.2f; "
           "memcpy "
           "median %.2f GB/s)%s\n",
           COMPARE_RUNS, ratio[COMPARE_RUNS / 2], ratio[0], ratio[COMPARE_RUNS - 1], m[COMPARE_RUNS / 2],
           is_shm(p) ? " (shm target >= 0.80)" : "");
}

static void run_bw(perf *p, int op)
{
    size_t lo = p->o.bw_min, hi = p->o.bw_max;
    if (op == OP_FETCH_ADD || op == OP_CMP_SWAP)
        lo = hi = 8;
    if (op == OP_SEND)
        lo = hi = GS_SEND_MAX;
    if (p->rank == 0) {
        printf("\n# %s bandwidth, transport %s, %d ranks%s\n", op_names[op], gs_tp_name(p->tp), p->size,
               p->o.user_mem ? ", caller memory (gs_mr_reg)" : "");
        printf("%10s %8s %10s %10s %14s\n", "bytes", "iters", "GB/s", "Mmsg/s", "all_pairs_GB/s");
    }
    for (size_t len = lo; len <= hi; len *= 2) {
        double r[2];
        long iters = 0;
        if (!op_fits(op, len))
            continue;
        if (p->o.floor && op == OP_WRITE && len == (64u << 20)) {
            compare_memcpy(p, r, &iters);
            break;
        }
        bw_size(p, op, len, r, &iters);
        if (p->rank == 0)
            printf("%10zu %8ld %10.3f %10.3f %14.3f\n", len, iters, r[0], r[0] * 1e3 / (double)len, r[1]);
        if (hi == lo)
            break;
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: gsperf [--op write|write_imm|read|fetch_add|cmp_swap|send|all] [--lat|--bw]\n"
            "              [--min BYTES] [--max BYTES] [--iters N] [--transport auto|shm|tcp|verbs]\n"
            "              [--user-mem] [--no-pin] [--no-floor]\n"
            "run under gsrun (or with GS_RANK, GS_WORLD_SIZE, GS_STORE set), an even number of ranks\n");
    exit(2);
}

static void parse(int argc, char **argv, perf_opts *o)
{
    static const struct option longs[] = {{"op", required_argument, 0, 'o'},
                                          {"lat", no_argument, 0, 'l'},
                                          {"bw", no_argument, 0, 'b'},
                                          {"min", required_argument, 0, 'm'},
                                          {"max", required_argument, 0, 'M'},
                                          {"iters", required_argument, 0, 'n'},
                                          {"transport", required_argument, 0, 't'},
                                          {"no-pin", no_argument, 0, 'P'},
                                          {"no-floor", no_argument, 0, 'F'},
                                          {"user-mem", no_argument, 0, 'U'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    bool min_set = false, max_set = false;
    *o = (perf_opts){.op = -1, .pin = true, .floor = true, .min = 8, .max = 4u << 20};
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'o':
            o->op = -2;
            for (int i = 0; i < OP_COUNT; i++)
                if (strcmp(optarg, op_names[i]) == 0)
                    o->op = i;
            if (strcmp(optarg, "all") == 0)
                o->op = -1;
            if (o->op == -2)
                usage();
            break;
        case 'l': o->lat = true; break;
        case 'b': o->bw = true; break;
        case 'm': o->min = strtoull(optarg, NULL, 0), min_set = true; break;
        case 'M': o->max = strtoull(optarg, NULL, 0), max_set = true; break;
        case 'n': o->iters = strtol(optarg, NULL, 0); break;
        case 't': o->transport = optarg; break;
        case 'P': o->pin = false; break;
        case 'F': o->floor = false; break;
        case 'U': o->user_mem = true; break;
        default: usage();
        }
    }
    if (!o->lat && !o->bw)
        o->lat = o->bw = true;
    /* --min/--max set both ranges; otherwise each has its own default */
    o->bw_min = min_set ? o->min : 4096;
    o->bw_max = max_set ? o->max : 64u << 20;
    if (o->bw_min > o->bw_max)
        o->bw_min = o->bw_max;
    if (o->max < o->min && !max_set)
        o->max = o->min;
    if (o->min < 1 || o->max < o->min)
        usage();
    if (o->user_mem && (o->op == OP_FETCH_ADD || o->op == OP_CMP_SWAP)) {
        fprintf(stderr, "gsperf: --user-mem: %s needs remote atomics, which caller memory is not given\n",
                op_names[o->op]);
        exit(2);
    }
}

static void pin_rank(int rank)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)(rank % (cores > 0 ? cores : 1)), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fprintf(stderr, "gsperf: rank %d: pinning failed: %s\n", rank, strerror(errno));
}

static void setup(perf *p)
{
    gs_rmr mine, *all;
    size_t max = p->o.lat ? p->o.max : 8;

    if (p->o.bw && p->o.bw_max > max)
        max = p->o.bw_max;
    if (max < GS_SEND_MAX)
        max = GS_SEND_MAX;
    p->area = (max + 4095) / 4096 * 4096;
    CHECK("gs_tp_open", gs_tp_open(p->ctx, p->o.transport, &p->tp));
    if (p->o.user_mem) {
        if (posix_memalign(&p->user_buf, 4096, 2 * p->area) != 0)
            die("allocation", GS_ERR_NOMEM);
        memset(p->user_buf, 0, 2 * p->area);
        CHECK("gs_mr_reg",
              gs_mr_reg(p->tp, p->user_buf, 2 * p->area, GS_ACCESS_ALL & ~GS_ACCESS_REMOTE_ATOMIC, &p->mr));
    } else {
        CHECK("gs_mr_alloc", gs_mr_alloc(p->tp, 2 * p->area, GS_ACCESS_ALL, &p->mr));
    }
    p->recv_area = gs_mr_addr(p->mr);
    p->send_area = p->recv_area + p->area;
    p->ep = gs_tp_ep(p->tp, p->peer);
    all = calloc((size_t)p->size, sizeof(*all));
    if (!all)
        die("allocation", GS_ERR_NOMEM);
    gs_mr_pack(p->mr, &mine);
    CHECK("allgather", gs_store_allgather(p->ctx, "gsperf.rmr", &mine, sizeof(mine), all));
    p->peer_rmr = all[p->peer];
    free(all);
    p->deadline_ns = gs_clock_ns() + 600000ull * 1000000u; /* 10 minutes */
}

int main(int argc, char **argv)
{
    perf p = {0};
    double floor_ns = 0, memcpy_bw = 0;

    parse(argc, argv, &p.o);
    CHECK("gs_ctx_create", gs_ctx_create(&p.ctx));
    p.rank = gs_ctx_rank(p.ctx);
    p.size = gs_ctx_size(p.ctx);
    if (p.size < 2 || p.size % 2) {
        fprintf(stderr, "gsperf: needs an even number of ranks (got %d)\n", p.size);
        gs_ctx_destroy(p.ctx);
        return 2;
    }
    p.initiator = p.rank % 2 == 0;
    p.peer = p.rank ^ 1;
    if (p.o.pin)
        pin_rank(p.rank);
    setup(&p);
    if (p.o.floor) {
        floor_setup(&p);
        floor_ns = floor_measure(&p);
        if (p.rank == 0)
            memcpy_bw = memcpy_gbps();
        if (p.rank == 0)
            printf("# limits: cache-line ping-pong one-way %.0f ns (median); single-thread memcpy 64 MiB "
                   "%.2f GB/s\n",
                   floor_ns, memcpy_bw);
    }
    for (int op = 0; op < OP_COUNT; op++) {
        if ((p.o.op >= 0 && op != p.o.op) || (p.o.user_mem && (op == OP_FETCH_ADD || op == OP_CMP_SWAP)))
            continue;
        if (p.o.lat)
            run_lat(&p, op);
        if (p.o.bw)
            run_bw(&p, op);
        fflush(stdout);
    }
    barrier(&p);
    if (p.o.floor)
        floor_teardown(&p);
    CHECK("gs_mr_dereg", gs_mr_dereg(p.mr));
    free(p.user_buf);
    CHECK("gs_tp_close", gs_tp_close(p.tp));
    CHECK("gs_ctx_destroy", gs_ctx_destroy(p.ctx));
    return 0;
}
