/*
 * gsbench: collective latency and bandwidth, like nccl-tests, over any
 * gradsync transport.
 *
 *   gsrun -n N gsbench [-c allreduce|reduce_scatter|allgather|broadcast|reduce|gather|scatter|
 *                          alltoall|alltoallv|allgatherv|reduce_scatter_v|sendrecv]
 *                      [-t f32|f64|f16|bf16|i32|i64|u8|i8|i16|bool] [-o sum|avg|...|band|bor|bxor]
 *                      [-b MIN] [-e MAX] [-f FACTOR] [--sizes LIST] [--iters N]
 *                      [--warmup N] [--scale S] [--batch N] [--transport T] [--root R]
 *                      [--inplace] [--offset B] [--no-pin] [--json]
 *   gsbench --kernels      reduction-kernel throughput, one process, no gsrun
 *
 * Method (the same as the Open MPI and gloo baselines', docs/figures.md, so
 * the numbers compare): per size, a warm-up, then iterations each
 * preceded by a barrier; each rank times its own call; an iteration's time is
 * the max over ranks; the table shows the median (and min, max) over the
 * iterations. Iterations per size: 2^28 / bytes (about 256 MiB moved) times
 * --scale, between 20 and 1000 x scale, like the baseline. --batch N
 * times N calls back to back after each barrier and counts a call as the
 * batch's time / N (as gsperf --lat and osu_latency time ping-pongs).
 *
 * size is what nccl-tests calls size: the vector of allreduce, broadcast and
 * reduce, the whole (n x block) buffer of reduce_scatter, allgather,
 * alltoall(v), gather and scatter (the root's), allgatherv and
 * reduce_scatter_v (their blocks uneven: weights 1..n). algbw = size / time;
 * busbw = algbw x 2(n-1)/n for allreduce, x 1 for broadcast and reduce,
 * x (n-1)/n for the rest (as the Open MPI baseline's mpi_coll and nccl-tests).
 * sendrecv: ranks 0 and 1 ping-pong (gs_send, then gs_recv of the answer;
 * the others idle), the time is half the round trip and busbw = algbw, as
 * nccl-tests' sendrecv and mpi_coll's sendrecv count it.
 *
 * #wrong: the inputs hold values whose reduction is exact; after the timed
 * calls every element of the last result is compared with the value
 * computed here, and the count of wrong elements is summed over ranks.
 */
#include "gradsync.h"
#include "gsbench.h"

#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum {
    C_ALLREDUCE,
    C_REDUCE_SCATTER,
    C_ALLGATHER,
    C_BROADCAST,
    C_REDUCE,
    C_GATHER,
    C_SCATTER,
    C_ALLTOALL,
    C_ALLTOALLV,
    C_ALLGATHERV,
    C_REDUCE_SCATTER_V,
    C_SENDRECV,
    C_COUNT
} coll_kind;
static const char *const coll_names[C_COUNT] = {
    "allreduce", "reduce_scatter", "allgather", "broadcast",  "reduce",           "gather",
    "scatter",   "alltoall",       "alltoallv", "allgatherv", "reduce_scatter_v", "sendrecv"};

typedef struct bench_opts {
    coll_kind coll;
    gs_dtype dtype;
    gs_redop op;
    size_t min_bytes, max_bytes;
    double factor;
    size_t sizes[64];
    int nsizes; /* --sizes: an explicit list */
    long iters, warmup;
    long batch; /* --batch: calls timed back to back between barriers (0: 1) */
    double scale;
    const char *transport;
    int root;
    size_t offset; /* --offset: the buffers start this far past a page boundary */
    int groups;    /* --comm-split K: K sub-communicators (rank mod K) run it at once; 0: the world */
    bool inplace, no_pin, json, kernels;
    bool pin; /* decided at setup */
} bench_opts;

typedef struct bench_row {
    size_t bytes, count;
    double med_us, min_us, max_us, algbw, busbw;
    uint64_t wrong;
    long iters;
} bench_row;

typedef struct bench {
    bench_opts o;
    gs_ctx *ctx;
    gs_tp *tp;
    gs_comm *comm;              /* what the calls run on: the world's, or this rank's group's */
    gs_comm *world;             /* with --comm-split: the world's communicator */
    int rank, n;                /* in comm */
    bool printer;               /* world rank 0: prints the table */
    uint8_t *send, *recv;       /* offset bytes into their pages */
    uint8_t *send_at, *recv_at; /* the pages */
    size_t cap;                 /* bytes of each buffer, from its pages */
    double *times, *tmax;
    size_t *counts, *displs; /* the v-variants: per rank, in elements */
} bench;

/* ---- options ----------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gsrun -n N gsbench [options]\n"
            "  -c, --coll C      allreduce (default), reduce_scatter, allgather, broadcast, reduce, gather,\n"
            "                    scatter, alltoall, alltoallv, allgatherv, reduce_scatter_v,\n"
            "                    sendrecv (ranks 0 and 1 ping-pong; time: half the round trip)\n"
            "  -t, --type T      f32 (default), f64, f16, bf16, i32, i64, u8, i8, i16, bool\n"
            "  -o, --op OP       sum (default), avg, min, max, prod, band, bor, bxor\n"
            "  -b, --min B       smallest size (default 8; K, M, G suffixes)\n"
            "  -e, --max B       largest size (default 64M)\n"
            "  -f, --factor F    size step factor (default 2)\n"
            "      --sizes LIST  explicit sizes, comma separated (e.g. 8,64,1K,4K,64K,1M,16M,64M)\n"
            "      --iters N     timed iterations per size (default: 2^28/size x scale, 20..1000 x scale)\n"
            "      --warmup N    warm-up calls per size (default iters/10, at least 5)\n"
            "      --scale S     iteration scale (e.g. 0.25 when ranks outnumber cores)\n"
            "      --batch N     time N calls back to back after each barrier, report one call's share\n"
            "                    (default 1; gsperf --lat and osu_latency time batches of 16)\n"
            "      --transport T shm, tcp, verbs or auto (default: GS_TRANSPORT)\n"
            "      --root R      broadcast, reduce, gather, scatter root (default 0)\n"
            "      --inplace     in place (recvbuf == sendbuf or its block)\n"
            "      --comm-split K  split the ranks into K groups (rank mod K) and run on all at once;\n"
            "                    rank 0 prints its group's figures\n"
            "      --offset B    buffers start B bytes past a page boundary (default 0; a multiple of 8\n"
            "                    below 4096: malloc gives 16, many tensor allocators 64)\n"
            "      --no-pin      do not pin ranks to cores (default: rank i on the i-th usable core when\n"
            "                    the ranks fit the cores, as Open MPI binds; never when they do not)\n"
            "      --json        one JSON object instead of the table\n"
            "      --ps          the parameter-server benchmark instead (gsbench --ps --help)\n"
            "Algorithm: GS_ALGO; chunk: GS_CHUNK_BYTES (gsinfo --params lists them).\n");
}

static int parse_name(const char *arg, const char *const *names, int count, const char *what)
{
    for (int i = 0; i < count; i++)
        if (strcmp(arg, names[i]) == 0)
            return i;
    fprintf(stderr, "gsbench: unknown %s '%s'\n", what, arg);
    exit(2);
}

static size_t parse_bytes(const char *arg, const char *what)
{
    uint64_t v;
    if (gs_size_parse(arg, &v) != GS_OK || v == 0) {
        fprintf(stderr, "gsbench: bad %s '%s' (a size such as 8, 4K, 64M)\n", what, arg);
        exit(2);
    }
    return (size_t)v;
}

/* len bytes, page-aligned, every page touched (no page fault inside a timed
 * call); NULL if there is no memory. free() releases it. */
static void *pages_alloc(size_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    void *p = NULL;
    if (posix_memalign(&p, page > 0 ? (size_t)page : 4096u, len ? len : 1) != 0)
        return NULL;
    memset(p, 0, len);
    return p;
}

static void parse_opts(int argc, char **argv, bench_opts *o)
{
    static const struct option longs[] = {
        {"coll", required_argument, NULL, 'c'},
        {"type", required_argument, NULL, 't'},
        {"op", required_argument, NULL, 'o'},
        {"min", required_argument, NULL, 'b'},
        {"max", required_argument, NULL, 'e'},
        {"factor", required_argument, NULL, 'f'},
        {"sizes", required_argument, NULL, 'S'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'},
        {"scale", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'B'},
        {"transport", required_argument, NULL, 'T'},
        {"root", required_argument, NULL, 'r'},
        {"inplace", no_argument, NULL, 'i'},
        {"offset", required_argument, NULL, 'O'},
        {"no-pin", no_argument, NULL, 'p'},
        {"json", no_argument, NULL, 'j'},
        {"kernels", no_argument, NULL, 'k'},
        {"comm-split", required_argument, NULL, 'K'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const char *const types[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "i8", "i16", "bool"};
    static const char *const ops[] = {"sum", "avg", "min", "max", "prod", "band", "bor", "bxor"};
    int c;
    *o = (bench_opts){.min_bytes = 8, .max_bytes = 64u << 20, .factor = 2, .scale = 1};
    while ((c = getopt_long(argc, argv, "c:t:o:b:e:f:h", longs, NULL)) != -1) {
        switch (c) {
        case 'c': o->coll = (coll_kind)parse_name(optarg, coll_names, C_COUNT, "collective"); break;
        case 't': o->dtype = (gs_dtype)parse_name(optarg, types, GS_DTYPE_COUNT, "type"); break;
        case 'o': o->op = (gs_redop)parse_name(optarg, ops, GS_REDOP_COUNT, "operator"); break;
        case 'b': o->min_bytes = parse_bytes(optarg, "--min"); break;
        case 'e': o->max_bytes = parse_bytes(optarg, "--max"); break;
        case 'f': o->factor = atof(optarg); break;
        case 'S':
            for (char *save = NULL, *tok = strtok_r(optarg, ",", &save); tok && o->nsizes < 64;
                 tok = strtok_r(NULL, ",", &save))
                o->sizes[o->nsizes++] = parse_bytes(tok, "--sizes entry");
            break;
        case 'n': o->iters = atol(optarg); break;
        case 'w': o->warmup = atol(optarg); break;
        case 's': o->scale = atof(optarg); break;
        case 'B':
            if ((o->batch = atol(optarg)) < 1 || o->batch > 1024) {
                fprintf(stderr, "gsbench: bad --batch '%s' (calls per timed batch, 1 to 1024)\n", optarg);
                exit(2);
            }
            break;
        case 'T': o->transport = optarg; break;
        case 'r': o->root = atoi(optarg); break;
        case 'i': o->inplace = true; break;
        case 'O': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || v >= 4096 || v % 8 != 0) {
                fprintf(stderr, "gsbench: bad --offset '%s' (a multiple of 8 from 0 to 4088)\n", optarg);
                exit(2);
            }
            o->offset = (size_t)v;
            break;
        }
        case 'p': o->no_pin = true; break;
        case 'j': o->json = true; break;
        case 'k': o->kernels = true; break;
        case 'K':
            if ((o->groups = atoi(optarg)) < 1) {
                fprintf(stderr, "gsbench: bad --comm-split '%s' (a number of groups, 1 or more)\n", optarg);
                exit(2);
            }
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (o->factor <= 1.0 || o->scale <= 0 || o->min_bytes > o->max_bytes) {
        fprintf(stderr, "gsbench: need --factor > 1, --scale > 0 and --min <= --max\n");
        exit(2);
    }
    if (!o->nsizes)
        for (double s = (double)o->min_bytes; s <= (double)o->max_bytes && o->nsizes < 64; s *= o->factor)
            o->sizes[o->nsizes++] = (size_t)s;
}

/* ---- values whose reduction is exact (as in tests/coll) -------------------------- */

static double value(gs_redop op, bool integer, int rank, size_t i)
{
    static const double prod_f[] = {1, -1, 2, 0.5, -0.5};
    switch (op) {
    case GS_PROD: return integer ? (double)((long)((rank + i) % 5) - 2) : prod_f[(rank + i) % 5];
    case GS_MIN:
    case GS_MAX: return (double)((long)((rank * 31 + i * 17) % 101) - 50);
    default: return (double)((long)((rank * 7 + i * 13) % 17) - 8);
    }
}

static void store(gs_dtype t, double v, void *p)
{
    switch (t) {
    case GS_F32: *(float *)p = (float)v; break;
    case GS_F64: *(double *)p = v; break;
    case GS_F16: *(uint16_t *)p = gs_f16_from_f32((float)v); break;
    case GS_BF16: *(uint16_t *)p = gs_bf16_from_f32((float)v); break;
    case GS_I32: *(int32_t *)p = (int32_t)v; break;
    case GS_I64: *(int64_t *)p = (int64_t)v; break;
    case GS_I16: *(int16_t *)p = (int16_t)v; break;
    case GS_I8: *(int8_t *)p = (int8_t)v; break;
    case GS_U8: *(uint8_t *)p = (uint8_t)(int64_t)v; break;
    case GS_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

static bool is_integer(gs_dtype t)
{
    return t == GS_I32 || t == GS_I64 || t == GS_U8 || t == GS_I8 || t == GS_I16 || t == GS_BOOL;
}

/* The integer (or bool) stored at p, as the kernels read it. */
static int64_t load_int(gs_dtype t, const uint8_t *p)
{
    int64_t v = 0;
    switch (t) {
    case GS_I32: return *(const int32_t *)p;
    case GS_I16: return *(const int16_t *)p;
    case GS_I8: return *(const int8_t *)p;
    case GS_U8:
    case GS_BOOL: return *p;
    default: memcpy(&v, p, 8); return v;
    }
}

/* Element i of an integer or bool reduction: wrapping, bitwise, logical. */
static void expected_int(const bench *b, size_t i, void *p)
{
    gs_dtype t = b->o.dtype;
    gs_redop op = b->o.op;
    uint8_t tmp[8];
    uint64_t acc = 0;
    for (int r = 0; r < b->n; r++) {
        store(t, value(op, true, r, i), tmp);
        int64_t v = load_int(t, tmp);
        uint64_t u = (uint64_t)v;
        bool bl = t == GS_BOOL, mn = op == GS_MIN || (bl && (op == GS_PROD || op == GS_BAND));
        bool mx = op == GS_MAX || (bl && (op == GS_SUM || op == GS_BOR));
        acc = r == 0          ? u
              : mn            ? ((int64_t)u < (int64_t)acc ? u : acc)
              : mx            ? ((int64_t)u > (int64_t)acc ? u : acc)
              : op == GS_PROD ? acc * u
              : op == GS_BAND ? acc & u
              : op == GS_BOR  ? acc | u
              : op == GS_BXOR ? (bl ? (uint64_t)((acc != 0) != (u != 0)) : acc ^ u)
                              : acc + u;
    }
    int64_t res = op == GS_AVG ? load_int(t, (const uint8_t *)&acc) / b->n : (int64_t)acc;
    memcpy(p, &res, gs_dtype_size(t)); /* little-endian: the low bytes are the wrap */
}

/* Element i of the reduction over n ranks. */
static void expected(const bench *b, size_t i, void *p)
{
    gs_redop op = b->o.op;
    bool integer = is_integer(b->o.dtype);
    if (integer) {
        expected_int(b, i, p);
        return;
    }
    double acc = value(op, integer, 0, i);
    for (int r = 1; r < b->n; r++) {
        double v = value(op, integer, r, i);
        acc = op == GS_PROD  ? acc * v
              : op == GS_MIN ? (v < acc ? v : acc)
              : op == GS_MAX ? (v > acc ? v : acc)
                             : acc + v;
    }
    if (op == GS_AVG) {
        if (b->o.dtype == GS_F64)
            acc /= b->n;
        else
            acc = (double)((float)acc / (float)b->n);
    }
    store(b->o.dtype, acc, p);
}

/* ---- one size ------------------------------------------------------------------ */

/* Elements of the vector (allreduce, broadcast, reduce, sendrecv) or per rank's block. */
static size_t block_count(const bench *b, size_t bytes)
{
    size_t es = gs_dtype_size(b->o.dtype);
    if (b->o.coll == C_ALLREDUCE || b->o.coll == C_BROADCAST || b->o.coll == C_REDUCE ||
        b->o.coll == C_SENDRECV)
        return bytes / es;
    return bytes / es / (size_t)b->n; /* a block: of the n x block buffer */
}

/* ---- the newer collectives --------------------------------------------------------- */

/* What rank src sends rank dst at element i (exact in every type, bool:
 * 0 or 1): a misplaced block shows. */
static double tag(const bench *b, int src, int dst, size_t i)
{
    long v = (src * 7 + dst * 3 + (long)(i % 61)) % 61;
    return b->o.dtype == GS_BOOL ? (double)(v & 1) : (double)v;
}

/* allgatherv, reduce_scatter_v: uneven counts (weights 1 .. n) over n blocks;
 * alltoallv: blocks of count. */
static void set_counts(bench *b, size_t count)
{
    size_t total = count * (size_t)b->n, used = 0, w = (size_t)b->n * (size_t)(b->n + 1) / 2;
    for (int q = 0; q < b->n; q++) {
        b->counts[q] = b->o.coll == C_ALLTOALLV ? count
                       : q == b->n - 1          ? total - used
                                                : total * (size_t)(q + 1) / w;
        b->displs[q] = used;
        used += b->counts[q];
    }
}

/* The block this rank passes as its input and result (in place: inside the other). */
static uint8_t *more_send(const bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype), me = (size_t)b->rank;
    bool root = b->rank == b->o.root, ip = b->o.inplace;
    switch (b->o.coll) {
    case C_REDUCE:
    case C_ALLTOALL: return ip ? b->recv : b->send;
    case C_GATHER: return ip && root ? b->recv + me * count * es : b->send;
    case C_ALLGATHERV: return ip ? b->recv + b->displs[me] * es : b->send;
    default: return b->send;
    }
}

static uint8_t *more_recv(const bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype), me = (size_t)b->rank;
    bool root = b->rank == b->o.root, ip = b->o.inplace;
    switch (b->o.coll) {
    case C_SCATTER: return ip && root ? b->send + me * count * es : b->recv;
    case C_REDUCE_SCATTER_V: return ip ? b->send + b->displs[me] * es : b->recv;
    default: return b->recv;
    }
}

static void more_fill(bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype), n = (size_t)b->n;
    uint8_t *src = more_send(b, count);
    set_counts(b, count);
    switch (b->o.coll) {
    case C_REDUCE:
    case C_REDUCE_SCATTER_V:
        for (size_t i = 0; i < count * (b->o.coll == C_REDUCE ? 1 : n); i++)
            store(b->o.dtype, value(b->o.op, is_integer(b->o.dtype), b->rank, i), src + i * es);
        break;
    case C_GATHER:
    case C_ALLGATHERV: {
        size_t k = b->o.coll == C_GATHER ? count : b->counts[b->rank];
        for (size_t i = 0; i < k; i++)
            store(b->o.dtype, tag(b, b->rank, 0, i), src + i * es);
        break;
    }
    default: /* scatter (the root), alltoall(v): block q for rank q */
        for (size_t q = 0; q < n && (b->o.coll != C_SCATTER || b->rank == b->o.root); q++)
            for (size_t i = 0; i < count; i++)
                store(b->o.dtype, tag(b, b->rank, (int)q, i), src + (q * count + i) * es);
        break;
    }
}

static gs_status more_call(bench *b, size_t count)
{
    gs_dtype t = b->o.dtype;
    uint8_t *s = more_send(b, count), *r = more_recv(b, count);
    switch (b->o.coll) {
    case C_REDUCE: return gs_reduce(b->comm, s, r, count, t, b->o.op, b->o.root);
    case C_GATHER: return gs_gather(b->comm, s, r, count, t, b->o.root);
    case C_SCATTER: return gs_scatter(b->comm, s, r, count, t, b->o.root);
    case C_ALLTOALL: return gs_alltoall(b->comm, s, r, count, t);
    case C_ALLTOALLV: return gs_alltoallv(b->comm, s, b->counts, b->displs, r, b->counts, b->displs, t);
    case C_ALLGATHERV: return gs_allgatherv(b->comm, s, r, b->counts, b->displs, t);
    case C_REDUCE_SCATTER_V: return gs_reduce_scatter_v(b->comm, s, r, b->counts, t, b->o.op);
    default: return GS_ERR_INVALID;
    }
}

/* Wrong elements of n blocks of k elements at out + q * stride: block q from rank q (or from root to me). */
static uint64_t more_wrong(bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype), n = (size_t)b->n;
    const uint8_t *out = more_recv(b, count);
    uint8_t want[8];
    uint64_t wrong = 0;
    bool root = b->rank == b->o.root;
    switch (b->o.coll) {
    case C_REDUCE:
    case C_REDUCE_SCATTER_V: {
        size_t first = b->o.coll == C_REDUCE ? 0 : b->displs[b->rank];
        size_t k = b->o.coll == C_REDUCE ? (root ? count : 0) : b->counts[b->rank];
        for (size_t i = 0; i < k; i++) {
            expected(b, first + i, want);
            wrong += memcmp(out + i * es, want, es) != 0;
        }
        break;
    }
    case C_SCATTER:
        for (size_t i = 0; i < count; i++) {
            store(b->o.dtype, tag(b, b->o.root, b->rank, i), want);
            wrong += memcmp(out + i * es, want, es) != 0;
        }
        break;
    default: /* gather (the root), allgatherv, alltoall(v): block q from rank q */
        for (size_t q = 0; q < n && (b->o.coll != C_GATHER || root); q++) {
            bool v = b->o.coll == C_ALLGATHERV;
            size_t k = v ? b->counts[q] : count, at = v ? b->displs[q] : q * count;
            int dst = b->o.coll == C_ALLTOALL || b->o.coll == C_ALLTOALLV ? b->rank : 0;
            for (size_t i = 0; i < k; i++) {
                store(b->o.dtype, tag(b, (int)q, dst, i), want);
                wrong += memcmp(out + (at + i) * es, want, es) != 0;
            }
        }
        break;
    }
    return wrong;
}

static void fill_inputs(bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype), n = (size_t)b->n;
    bool integer = is_integer(b->o.dtype);
    switch (b->o.coll) {
    case C_ALLREDUCE: {
        uint8_t *src = b->o.inplace ? b->recv : b->send; /* in place: the call's input is recv */
        for (size_t i = 0; i < count; i++)
            store(b->o.dtype, value(b->o.op, integer, b->rank, i), src + i * es);
        break;
    }
    case C_REDUCE_SCATTER:
        for (size_t i = 0; i < count * n; i++)
            store(b->o.dtype, value(b->o.op, integer, b->rank, i), b->send + i * es);
        break;
    case C_ALLGATHER: {
        uint8_t *src = b->o.inplace ? b->recv + (size_t)b->rank * count * es : b->send;
        for (size_t i = 0; i < count; i++)
            store(b->o.dtype, (double)b->rank * 1000 + (double)(i % 1000), src + i * es);
        break;
    }
    case C_BROADCAST:
        for (size_t i = 0; i < count; i++)
            store(b->o.dtype, (double)(i % 2000) - 1000, (b->o.inplace ? b->recv : b->send) + i * es);
        break;
    case C_SENDRECV:
        for (size_t i = 0; i < count; i++)
            store(b->o.dtype, (double)b->rank * 1000 + (double)(i % 1000), b->send + i * es);
        break;
    default: more_fill(b, count); break;
    }
}

static gs_status call(bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype);
    uint8_t *send = b->send;
    switch (b->o.coll) {
    case C_ALLREDUCE:
        return gs_allreduce(b->comm, b->o.inplace ? b->recv : send, b->recv, count, b->o.dtype, b->o.op);
    case C_REDUCE_SCATTER:
        return gs_reduce_scatter(b->comm, send, b->o.inplace ? send + (size_t)b->rank * count * es : b->recv,
                                 count, b->o.dtype, b->o.op);
    case C_ALLGATHER:
        return gs_allgather(b->comm, b->o.inplace ? b->recv + (size_t)b->rank * count * es : send, b->recv,
                            count, b->o.dtype);
    case C_BROADCAST:
        return gs_broadcast(b->comm, b->o.inplace ? b->recv : send, b->recv, count, b->o.dtype, b->o.root);
    case C_SENDRECV: {
        gs_status st = GS_OK;
        if (b->rank == 0 && (st = gs_send(b->comm, send, count, b->o.dtype, 1, 7)) == GS_OK)
            st = gs_recv(b->comm, b->recv, count, b->o.dtype, 1, 7, NULL);
        if (b->rank == 1 && (st = gs_recv(b->comm, b->recv, count, b->o.dtype, 0, 7, NULL)) == GS_OK)
            st = gs_send(b->comm, send, count, b->o.dtype, 0, 7);
        return st;
    }
    default: return more_call(b, count);
    }
}

/* Wrong elements of this rank's result of the last call. */
static uint64_t count_wrong(bench *b, size_t count)
{
    size_t es = gs_dtype_size(b->o.dtype), n = (size_t)b->n;
    uint8_t want[8];
    uint64_t wrong = 0;
    switch (b->o.coll) {
    case C_ALLREDUCE:
        for (size_t i = 0; i < count; i++) {
            expected(b, i, want);
            wrong += memcmp(b->recv + i * es, want, es) != 0;
        }
        break;
    case C_REDUCE_SCATTER: {
        const uint8_t *got = b->o.inplace ? b->send + (size_t)b->rank * count * es : b->recv;
        for (size_t i = 0; i < count; i++) {
            expected(b, (size_t)b->rank * count + i, want);
            wrong += memcmp(got + i * es, want, es) != 0;
        }
        break;
    }
    case C_ALLGATHER:
        for (size_t q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++) {
                store(b->o.dtype, (double)q * 1000 + (double)(i % 1000), want);
                wrong += memcmp(b->recv + (q * count + i) * es, want, es) != 0;
            }
        break;
    case C_BROADCAST:
        for (size_t i = 0; i < count; i++) {
            store(b->o.dtype, (double)(i % 2000) - 1000, want);
            wrong += memcmp(b->recv + i * es, want, es) != 0;
        }
        break;
    case C_SENDRECV:
        for (size_t i = 0; b->rank < 2 && i < count; i++) {
            store(b->o.dtype, (double)(1 - b->rank) * 1000 + (double)(i % 1000), want);
            wrong += memcmp(b->recv + i * es, want, es) != 0;
        }
        break;
    default: wrong = more_wrong(b, count); break;
    }
    return wrong;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

static void fail(const char *what, gs_status st)
{
    fprintf(stderr, "gsbench: %s failed: %s (%s)\n", what, gs_status_name(st), gs_last_error());
    exit(1);
}

static long iterations(const bench *b, size_t bytes)
{
    long it = (long)((double)(1L << 28) / (double)bytes * b->o.scale);
    long cap = (long)(1000 * b->o.scale);
    if (b->o.iters > 0)
        return b->o.iters;
    if (it > cap)
        it = cap;
    return it < 20 ? 20 : it;
}

static void measure(bench *b, size_t bytes, bench_row *row)
{
    size_t count = block_count(b, bytes);
    long iters = iterations(b, bytes);
    long warm = b->o.warmup > 0 ? b->o.warmup : (iters / 10 < 5 ? 5 : iters / 10);
    size_t total = count == bytes / gs_dtype_size(b->o.dtype) ? count : count * (size_t)b->n;
    gs_status st;
    fill_inputs(b, count);
    for (long i = 0; i < warm; i++)
        if ((st = call(b, count)) != GS_OK)
            fail(coll_names[b->o.coll], st);
    long batch = b->o.batch > 0 ? b->o.batch : 1;
    for (long i = 0; i < iters; i++) {
        if ((st = gs_barrier(b->comm)) != GS_OK)
            fail("barrier", st);
        uint64_t t0 = gs_clock_ns();
        for (long k = 0; k < batch && st == GS_OK; k++)
            st = call(b, count);
        b->times[i] = (double)(gs_clock_ns() - t0) / 1e3 / (double)batch;
        if (b->o.coll == C_SENDRECV)
            b->times[i] /= 2; /* a round trip: two messages */
        if (st != GS_OK)
            fail(coll_names[b->o.coll], st);
    }
    /* in place overwrote the input: one more call on fresh inputs to check */
    if (b->o.inplace) {
        fill_inputs(b, count);
        if ((st = call(b, count)) != GS_OK)
            fail(coll_names[b->o.coll], st);
    }
    uint64_t wrong = count_wrong(b, count), wrong_all = 0;
    if ((st = gs_allreduce(b->comm, b->times, b->tmax, (size_t)iters, GS_F64, GS_MAX)) != GS_OK ||
        (st = gs_allreduce(b->comm, &wrong, &wrong_all, 1, GS_I64, GS_SUM)) != GS_OK)
        fail("gathering the times", st);
    qsort(b->tmax, (size_t)iters, sizeof(double), cmp_double);
    /* nccl-tests' factors: allreduce 2(n-1)/n; broadcast, reduce and sendrecv 1; the rest (n-1)/n */
    double factor = b->o.coll == C_ALLREDUCE ? 2.0 * (b->n - 1) / b->n
                    : b->o.coll == C_BROADCAST || b->o.coll == C_REDUCE || b->o.coll == C_SENDRECV
                        ? 1.0
                        : (double)(b->n - 1) / b->n;
    size_t real_bytes = total * gs_dtype_size(b->o.dtype);
    *row = (bench_row){
        .bytes = real_bytes,
        .count = total,
        .med_us = b->tmax[iters / 2],
        .min_us = b->tmax[0],
        .max_us = b->tmax[iters - 1],
        .wrong = wrong_all,
        .iters = iters,
    };
    row->algbw = row->med_us > 0 ? (double)real_bytes / row->med_us / 1e3 : 0;
    row->busbw = row->algbw * factor;
}

/* ---- output -------------------------------------------------------------------- */

/* A parameter in force, as text ("?" if the library does not know it). */
static const char *param(const bench *b, const char *name, char *buf, size_t cap)
{
    return gs_ctx_param(b->ctx, name, buf, cap) == GS_OK ? buf : "?";
}

static void print_header(const bench *b)
{
    char algo[32], chunk[32];
    printf("# gsbench %s: %d ranks, transport %s, GS_ALGO=%s, chunk %s B, %s, buffers at page + %zu, %s\n",
           coll_names[b->o.coll], b->n, gs_tp_name(b->tp), param(b, "GS_ALGO", algo, sizeof(algo)),
           param(b, "GS_CHUNK_BYTES", chunk, sizeof(chunk)), b->o.inplace ? "in place" : "out of place",
           b->o.offset, b->o.pin ? "pinned" : "not pinned");
    if (b->o.groups > 1)
        printf(
            "# %d groups (rank mod %d) run at once, each its own communicator; these are group 0's figures\n",
            b->o.groups, b->o.groups);
    printf("# time: median over iterations of the max over ranks (min, max alongside)\n");
    printf("%12s %12s %6s %6s %11s %11s %11s %10s %10s %8s %6s\n", "size(B)", "count", "type", "redop",
           "time(us)", "min(us)", "max(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters");
    fflush(stdout); /* the ranks are connected: a watcher may know it before the first row */
}

static void print_row(const bench *b, const bench_row *r)
{
    bool red = b->o.coll == C_ALLREDUCE || b->o.coll == C_REDUCE_SCATTER || b->o.coll == C_REDUCE ||
               b->o.coll == C_REDUCE_SCATTER_V;
    const char *op = red ? gs_redop_name(b->o.op) : "-";
    printf("%12zu %12zu %6s %6s %11.2f %11.2f %11.2f %10.3f %10.3f %8llu %6ld\n", r->bytes, r->count,
           gs_dtype_name(b->o.dtype), op, r->med_us, r->min_us, r->max_us, r->algbw, r->busbw,
           (unsigned long long)r->wrong, r->iters);
    fflush(stdout);
}

static void print_json(const bench *b, const bench_row *rows, int nrows)
{
    char algo[32], chunk[32];
    printf("{\"tool\": \"gsbench\", \"collective\": \"%s\", \"ranks\": %d, \"transport\": \"%s\", \"algo\": "
           "\"%s\", "
           "\"chunk_bytes\": %s, \"dtype\": \"%s\", \"op\": \"%s\", \"inplace\": %s, \"offset\": %zu, "
           "\"pinned\": %s, \"groups\": %d, \"rows\": [",
           coll_names[b->o.coll], b->n, gs_tp_name(b->tp), param(b, "GS_ALGO", algo, sizeof(algo)),
           param(b, "GS_CHUNK_BYTES", chunk, sizeof(chunk)), gs_dtype_name(b->o.dtype),
           gs_redop_name(b->o.op), b->o.inplace ? "true" : "false", b->o.offset, b->o.pin ? "true" : "false",
           b->o.groups ? b->o.groups : 1);
    for (int i = 0; i < nrows; i++) {
        const bench_row *r = &rows[i];
        printf(
            "%s\n  {\"bytes\": %zu, \"count\": %zu, \"time_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, "
            "\"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %llu, \"iters\": %ld}",
            i ? "," : "", r->bytes, r->count, r->med_us, r->min_us, r->max_us, r->algbw, r->busbw,
            (unsigned long long)r->wrong, r->iters);
    }
    printf("\n]}\n");
}

/* ---- the reduction kernels alone ---------------------------------------------- */

/* Whether the header defines op on t: bitwise operators on the integers
 * and bool only, avg on everything but bool. */
static bool op_defined(gs_dtype t, gs_redop op)
{
    return op >= GS_BAND ? is_integer(t) : !(t == GS_BOOL && op == GS_AVG);
}

/* dst = dst op src (gs_reduce_local), in place as the ring does it, for
 * every type at 64 KiB (L2), 1 MiB and 64 MiB (memory); GB/s of one operand.
 * avg runs the sum, the kernel of its every step. */
static int bench_kernels(const bench_opts *o)
{
    static const size_t sizes[] = {64u << 10, 1u << 20, 64u << 20};
    gs_redop op = o->op == GS_AVG ? GS_SUM : o->op;
    void *a, *b;
    if (!(a = pages_alloc(64u << 20)) || !(b = pages_alloc(64u << 20)))
        fail("allocating buffers", GS_ERR_NOMEM);
    printf("# reduction kernels: dst = dst %s src, GB/s of one operand (median of 5 runs)\n",
           gs_redop_name(op));
    printf("%6s %12s %12s %12s\n", "type", "64KiB", "1MiB", "64MiB");
    for (int t = 0; t < GS_DTYPE_COUNT; t++) {
        if (!op_defined((gs_dtype)t, o->op))
            continue;
        printf("%6s", gs_dtype_name((gs_dtype)t));
        for (size_t i = 0; i < 3; i++) {
            size_t n = sizes[i] / gs_dtype_size((gs_dtype)t);
            long reps = (long)((1u << 28) / sizes[i]) + 2;
            double runs[5];
            memset(a, 0, sizes[i]);
            memset(b, 0, sizes[i]);
            for (int r = 0; r < 5; r++) {
                uint64_t t0 = gs_clock_ns();
                for (long k = 0; k < reps; k++) {
                    gs_status st = gs_reduce_local(a, b, n, (gs_dtype)t, op);
                    if (st != GS_OK)
                        fail("gs_reduce_local", st);
                }
                runs[r] = (double)sizes[i] * (double)reps / (double)(gs_clock_ns() - t0);
            }
            qsort(runs, 5, sizeof(double), cmp_double);
            printf(" %12.2f", runs[2]);
        }
        printf("\n");
    }
    free(a);
    free(b);
    return 0;
}

/* ---- main ---------------------------------------------------------------------- */

/* Pins local rank i to the i-th usable core when the ranks fit the cores
 * (Open MPI's default binding for the baseline); returns whether it did. */
static bool pin(const gs_ctx *ctx)
{
    cpu_set_t usable, set;
    int local = gs_ctx_local_rank(ctx) >= 0 ? gs_ctx_local_rank(ctx) : gs_ctx_rank(ctx), seen = 0;
    if (sched_getaffinity(0, sizeof(usable), &usable) != 0 || gs_ctx_size(ctx) > CPU_COUNT(&usable))
        return false;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &usable) || seen++ != local)
            continue;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            perror("gsbench: sched_setaffinity");
            return false;
        }
        return true;
    }
    return false;
}

static void setup(bench *b)
{
    gs_status st;
    size_t maxb = 0;
    long maxit = 0;
    if ((st = gs_ctx_create(&b->ctx)) != GS_OK)
        fail("gs_ctx_create", st);
    b->rank = gs_ctx_rank(b->ctx);
    b->n = gs_ctx_size(b->ctx);
    b->printer = b->rank == 0;
    if (b->o.coll == C_SENDRECV && b->n < 2) {
        fprintf(stderr, "gsbench: sendrecv needs at least 2 ranks (gsrun -n 2)\n");
        exit(2);
    }
    if ((st = gs_tp_open(b->ctx, b->o.transport, &b->tp)) != GS_OK)
        fail("gs_tp_open", st);
    if ((st = gs_comm_create(b->ctx, b->tp, &b->comm)) != GS_OK)
        fail("gs_comm_create", st);
    if (b->o.groups > 1) { /* the benchmark runs on this rank's group; groups run at once */
        if (b->o.groups > b->n) {
            fprintf(stderr, "gsbench: --comm-split %d: more groups than the %d ranks\n", b->o.groups, b->n);
            exit(2);
        }
        b->world = b->comm;
        if ((st = gs_comm_split(b->world, b->rank % b->o.groups, b->rank, &b->comm)) != GS_OK)
            fail("gs_comm_split", st);
        b->rank = gs_comm_rank(b->comm);
        b->n = gs_comm_size(b->comm);
    }
    if (!b->o.no_pin)
        b->o.pin = pin(b->ctx);
    for (int i = 0; i < b->o.nsizes; i++) {
        maxb = b->o.sizes[i] > maxb ? b->o.sizes[i] : maxb;
        maxit = iterations(b, b->o.sizes[i]) > maxit ? iterations(b, b->o.sizes[i]) : maxit;
    }
    b->cap = b->o.offset + maxb + 64;
    if (!(b->send_at = pages_alloc(b->cap)) || !(b->recv_at = pages_alloc(b->cap)))
        fail("allocating buffers", GS_ERR_NOMEM);
    b->send = b->send_at + b->o.offset;
    b->recv = b->recv_at + b->o.offset;
    b->counts = calloc((size_t)b->n, sizeof(size_t));
    b->displs = calloc((size_t)b->n, sizeof(size_t));
    b->times = calloc((size_t)maxit, sizeof(double));
    b->tmax = calloc((size_t)maxit, sizeof(double));
    if (!b->times || !b->tmax || !b->counts || !b->displs)
        fail("allocating buffers", GS_ERR_NOMEM);
}

int main(int argc, char **argv)
{
    bench b = {0};
    bench_row rows[64];
    int nrows = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--ps") == 0)
            return gs_bench_ps_main(argc, argv);
    parse_opts(argc, argv, &b.o);
    if (b.o.kernels)
        return bench_kernels(&b.o);
    setup(&b);
    if (b.o.root < 0 || b.o.root >= b.n) {
        fprintf(stderr, "gsbench: --root %d is not a rank\n", b.o.root);
        return 2;
    }
    if (b.printer && !b.o.json)
        print_header(&b);
    for (int i = 0; i < b.o.nsizes; i++) {
        if (block_count(&b, b.o.sizes[i]) == 0)
            continue;
        measure(&b, b.o.sizes[i], &rows[nrows]);
        if (b.printer && !b.o.json)
            print_row(&b, &rows[nrows]);
        nrows++;
    }
    if (b.printer && b.o.json)
        print_json(&b, rows, nrows);
    uint64_t wrong = 0;
    for (int i = 0; i < nrows; i++)
        wrong += rows[i].wrong;
    free(b.send_at);
    free(b.recv_at);
    free(b.times);
    free(b.tmax);
    free(b.counts);
    free(b.displs);
    if ((b.world && gs_comm_destroy(b.world) != GS_OK) || gs_comm_destroy(b.comm) != GS_OK ||
        gs_tp_close(b.tp) != GS_OK || gs_ctx_destroy(b.ctx) != GS_OK)
        fprintf(stderr, "gsbench: teardown: %s\n", gs_last_error());
    return wrong ? 1 : 0;
}
