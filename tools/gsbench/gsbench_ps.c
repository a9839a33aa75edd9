/*
 * gsbench --ps: parameter-server push, pull and push_pull time and
 * throughput per size, for W workers and S servers (the last S ranks).
 *
 *   gsrun -n W+S gsbench --ps [--servers S] [--mode sync|async] [--agg write|atomic]
 *                             [--optim sgd|momentum|adam] [--shard-bytes B]
 *                             [-b MIN] [-e MAX] [-f FACTOR] [--sizes LIST]
 *                             [--iters N] [--warmup N] [--scale S] [--transport T] [--json]
 *
 * Per size, a fresh gs_ps with one key of that many bytes (f32); servers
 * serve in a thread. Each worker, after a warm-up of push_pulls, times
 *   push_pull  gs_ps_push_pull (sync: one whole BSP step: every worker's
 *              gradient delivered, summed, optimizer applied, pulled back);
 *   push       gs_ps_push alone (delivery into the server's slot or, atomic,
 *              every FETCH_ADD), each followed by an untimed pull;
 *   pull       gs_ps_pull of parameters already applied (the fenced READs).
 * An iteration's time is the max over workers; the table shows the median
 * (iterations per size as gsbench: 2^28 / bytes x scale, 20..1000 x scale).
 * algbw = bytes / time, per worker.
 *
 * #wrong (SGD only): every worker pushes the same small-integer gradient
 * every step, SGD with lr 2^-12 on the sum, so the final parameters are
 * exact; each worker pulls them at the end and counts the elements that
 * differ.
 *
 * A W-rank allreduce of the same sizes for comparison: ps_vs_allreduce.sh
 * (beside this file) runs both in one session and prints them side by side.
 */
#include "gradsync.h"
#include "gsbench.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_PUSH, OP_PULL, OP_PUSH_PULL, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"push", "pull", "push_pull"};

#define LR (1.0f / 4096.0f)

typedef struct ps_opts {
    int servers;
    int mode, agg, optim; /* -1: from the environment */
    size_t shard_bytes;
    size_t sizes[64];
    int nsizes;
    size_t min_bytes, max_bytes;
    double factor, scale;
    long iters, warmup;
    const char *transport;
    bool json;
} ps_opts;

typedef struct ps_row {
    size_t bytes;
    long iters;
    double us[OP_COUNT], bw[OP_COUNT];
    uint64_t wrong;
} ps_row;

typedef struct ps_bench {
    ps_opts o;
    gs_ctx *ctx;
    int rank, n;
    double *times; /* [OP_COUNT][maxit] this rank's */
    double *all;   /* [n][OP_COUNT][maxit] */
    long maxit;
} ps_bench;

static void die(const char *what, gs_status st)
{
    fprintf(stderr, "gsbench --ps: %s failed: %s (%s)\n", what, gs_status_name(st), gs_last_error());
    exit(1);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gsrun -n W+S gsbench --ps [options]\n"
               "      --servers S     servers, the last S ranks (default: GS_PS_SERVERS)\n"
               "      --mode M        sync or async (default: GS_PS_MODE)\n"
               "      --agg A         write or atomic (default: GS_PS_AGG)\n"
               "      --optim O       sgd (default), momentum or adam\n"
               "      --shard-bytes B largest shard (default: GS_PS_SHARD_BYTES)\n"
               "  -b, --min B / -e, --max B / -f, --factor F / --sizes LIST   sizes as gsbench (8 .. 64M)\n"
               "      --iters N / --warmup N / --scale S   iterations as gsbench\n"
               "      --transport T   shm, tcp, verbs or auto (default: GS_TRANSPORT)\n"
               "      --json          one JSON object instead of the table\n");
}

static size_t bytes_arg(const char *arg, const char *what)
{
    uint64_t v;
    if (gs_size_parse(arg, &v) != GS_OK || v == 0) {
        fprintf(stderr, "gsbench --ps: bad %s '%s'\n", what, arg);
        exit(2);
    }
    return (size_t)v;
}

static int name_arg(const char *arg, const char *const *names, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (strcmp(arg, names[i]) == 0)
            return i;
    fprintf(stderr, "gsbench --ps: unknown %s '%s'\n", what, arg);
    exit(2);
}

static void parse(int argc, char **argv, ps_opts *o)
{
    static const struct option longs[] = {{"ps", no_argument, NULL, 'P'},
                                          {"servers", required_argument, NULL, 'S'},
                                          {"mode", required_argument, NULL, 'm'},
                                          {"agg", required_argument, NULL, 'a'},
                                          {"optim", required_argument, NULL, 'O'},
                                          {"shard-bytes", required_argument, NULL, 'B'},
                                          {"min", required_argument, NULL, 'b'},
                                          {"max", required_argument, NULL, 'e'},
                                          {"factor", required_argument, NULL, 'f'},
                                          {"sizes", required_argument, NULL, 'z'},
                                          {"iters", required_argument, NULL, 'n'},
                                          {"warmup", required_argument, NULL, 'w'},
                                          {"scale", required_argument, NULL, 's'},
                                          {"transport", required_argument, NULL, 'T'},
                                          {"json", no_argument, NULL, 'j'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    static const char *const modes[] = {"sync", "async"}, *const aggs[] = {"write", "atomic"},
                             *const optims[] = {"sgd", "momentum", "adam"};
    int c;
    *o = (ps_opts){.servers = -1,
                   .mode = -1,
                   .agg = -1,
                   .optim = 0,
                   .min_bytes = 8,
                   .max_bytes = 64u << 20,
                   .factor = 2,
                   .scale = 1};
    optind = 1;
    while ((c = getopt_long(argc, argv, "b:e:f:h", longs, NULL)) != -1) {
        switch (c) {
        case 'P': break;
        case 'S': o->servers = atoi(optarg); break;
        case 'm': o->mode = name_arg(optarg, modes, 2, "mode"); break;
        case 'a': o->agg = name_arg(optarg, aggs, 2, "aggregation"); break;
        case 'O': o->optim = name_arg(optarg, optims, 3, "optimizer"); break;
        case 'B': o->shard_bytes = bytes_arg(optarg, "--shard-bytes"); break;
        case 'b': o->min_bytes = bytes_arg(optarg, "--min"); break;
        case 'e': o->max_bytes = bytes_arg(optarg, "--max"); break;
        case 'f': o->factor = atof(optarg); break;
        case 'z':
            for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t && o->nsizes < 64;
                 t = strtok_r(NULL, ",", &save))
                o->sizes[o->nsizes++] = bytes_arg(t, "--sizes entry");
            break;
        case 'n': o->iters = atol(optarg); break;
        case 'w': o->warmup = atol(optarg); break;
        case 's': o->scale = atof(optarg); break;
        case 'T': o->transport = optarg; break;
        case 'j': o->json = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (o->factor <= 1.0 || o->scale <= 0 || o->min_bytes > o->max_bytes) {
        fprintf(stderr, "gsbench --ps: need --factor > 1, --scale > 0 and --min <= --max\n");
        exit(2);
    }
    if (!o->nsizes)
        for (double s = (double)o->min_bytes; s <= (double)o->max_bytes && o->nsizes < 64; s *= o->factor)
            o->sizes[o->nsizes++] = (size_t)s;
}

static long iterations(const ps_opts *o, size_t bytes)
{
    long it = (long)((double)(1L << 28) / (double)bytes * o->scale), cap = (long)(1000 * o->scale);
    if (o->iters > 0)
        return o->iters;
    if (it > cap)
        it = cap;
    return it < 20 ? 20 : it;
}

/* The gradient every worker pushes every step: small integers, so the sum is exact. */
static float grad_value(int w, size_t i)
{
    return (float)((int)((w * 7 + (int)(i % 1021) * 13) % 17) - 8);
}

static void params_for(const ps_bench *b, gs_ctx *ctx, gs_ps_params *p)
{
    gs_ps_params_init(ctx, p);
    p->transport = b->o.transport;
    if (b->o.servers > 0)
        p->servers = b->o.servers;
    if (b->o.mode >= 0)
        p->mode = (gs_ps_mode)b->o.mode;
    if (b->o.agg >= 0)
        p->agg = (gs_ps_agg)b->o.agg;
    if (b->o.shard_bytes)
        p->shard_bytes = b->o.shard_bytes;
    p->optim = (gs_ps_optim){.kind = (gs_ps_optimizer)b->o.optim,
                             .lr = LR,
                             .momentum = 0.0f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .eps = 1e-8f};
    p->average = 0; /* the sum: exact for the integer gradients */
    p->checkpoint = "";
}

/* ---- one size -------------------------------------------------------------------- */

static void time_ops(ps_bench *b, gs_ps *ps, size_t count, long iters, long warm, uint64_t *steps_p)
{
    float *g = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
    gs_status st;
    if (!g || !out)
        die("allocating buffers", GS_ERR_NOMEM);
    for (size_t i = 0; i < count; i++)
        g[i] = grad_value(gs_ps_index(ps), i);
    for (long i = 0; i < warm; i++)
        if ((st = gs_ps_push_pull(ps, 1, g, out)) != GS_OK)
            die("push_pull", st);
    for (long i = 0; i < iters; i++) {
        uint64_t t0 = gs_clock_ns();
        if ((st = gs_ps_push_pull(ps, 1, g, out)) != GS_OK)
            die("push_pull", st);
        b->times[OP_PUSH_PULL * b->maxit + i] = (double)(gs_clock_ns() - t0) / 1e3;
    }
    for (long i = 0; i < iters; i++) {
        uint64_t t0 = gs_clock_ns();
        if ((st = gs_ps_push(ps, 1, g)) != GS_OK)
            die("push", st);
        b->times[OP_PUSH * b->maxit + i] = (double)(gs_clock_ns() - t0) / 1e3;
        if ((st = gs_ps_pull(ps, 1, out)) != GS_OK)
            die("pull", st);
    }
    for (long i = 0; i < iters; i++) {
        uint64_t t0 = gs_clock_ns();
        if ((st = gs_ps_pull(ps, 1, out)) != GS_OK)
            die("pull", st);
        b->times[OP_PULL * b->maxit + i] = (double)(gs_clock_ns() - t0) / 1e3;
    }
    *steps_p = (uint64_t)(warm + 2 * iters);
    free(g);
    free(out);
}

/* After every worker's last push: the parameters must be -lr * steps * sum. */
static uint64_t count_wrong(gs_ps *ps, size_t count, uint64_t steps)
{
    float *out = malloc(count * sizeof(float));
    uint64_t wrong = 0;
    gs_status st = gs_ps_pull(ps, 1, out);
    if (st != GS_OK)
        die("final pull", st);
    for (size_t i = 0; i < count; i++) {
        double sum = 0;
        for (int w = 0; w < gs_ps_num_workers(ps); w++)
            sum += grad_value(w, i);
        wrong += out[i] != (float)(-(double)LR * (double)steps * sum);
    }
    free(out);
    return wrong;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

/* Per iteration the max over workers, then the median. */
static double median_of_max(ps_bench *b, int op, long iters)
{
    double *tmax = calloc((size_t)iters, sizeof(double)), med;
    for (long i = 0; i < iters; i++)
        for (int r = 0; r < b->n; r++) {
            double t = b->all[((size_t)r * OP_COUNT + (size_t)op) * (size_t)b->maxit + (size_t)i];
            tmax[i] = t > tmax[i] ? t : tmax[i];
        }
    qsort(tmax, (size_t)iters, sizeof(double), cmp_double);
    med = tmax[iters / 2];
    free(tmax);
    return med;
}

static void measure(ps_bench *b, size_t bytes, ps_row *row)
{
    size_t count = bytes / sizeof(float);
    long iters = iterations(&b->o, bytes),
         warm = b->o.warmup > 0 ? b->o.warmup : (iters / 10 < 3 ? 3 : iters / 10);
    gs_ps_params p;
    gs_ps *ps = NULL;
    uint64_t steps = 0, wrong = 0, *wrongs = calloc((size_t)b->n, sizeof(uint64_t));
    char tag[64];
    gs_status st;
    params_for(b, b->ctx, &p);
    if ((st = gs_ps_create(b->ctx, &p, &ps)) != GS_OK)
        die("gs_ps_create", st);
    if ((st = gs_ps_register(ps, 1, count, NULL)) != GS_OK)
        die("gs_ps_register", st);
    memset(b->times, 0, sizeof(double) * OP_COUNT * (size_t)b->maxit);
    if (gs_ps_is_server(ps) && (st = gs_ps_serve_start(ps)) != GS_OK)
        die("gs_ps_serve_start", st);
    if (!gs_ps_is_server(ps))
        time_ops(b, ps, count, iters, warm, &steps);
    snprintf(tag, sizeof(tag), "gsbench.ps.%zu.pushed", bytes);
    if ((st = gs_store_barrier(b->ctx, tag)) != GS_OK)
        die("store barrier", st);
    if (!gs_ps_is_server(ps))
        wrong = p.optim.kind == GS_PS_SGD ? count_wrong(ps, count, steps) : 0;
    snprintf(tag, sizeof(tag), "gsbench.ps.%zu.times", bytes);
    if ((st = gs_store_allgather(b->ctx, tag, b->times, sizeof(double) * OP_COUNT * (size_t)b->maxit,
                                 b->all)) != GS_OK)
        die("gathering the times", st);
    snprintf(tag, sizeof(tag), "gsbench.ps.%zu.wrong", bytes);
    if ((st = gs_store_allgather(b->ctx, tag, &wrong, sizeof(wrong), wrongs)) != GS_OK)
        die("gathering #wrong", st);
    if ((st = gs_ps_destroy(ps)) != GS_OK)
        die("gs_ps_destroy", st);
    *row = (ps_row){.bytes = bytes, .iters = iters};
    for (int r = 0; r < b->n; r++)
        row->wrong += wrongs[r];
    for (int op = 0; op < OP_COUNT; op++) {
        row->us[op] = median_of_max(b, op, iters);
        row->bw[op] = row->us[op] > 0 ? (double)bytes / row->us[op] / 1e3 : 0;
    }
    free(wrongs);
}

/* ---- output ------------------------------------------------------------------------ */

static void header(const ps_bench *b, const gs_ps_params *p)
{
    static const char *const optims[] = {"sgd", "momentum", "adam"};
    printf("# gsbench --ps: %d workers, %d servers, transport %s, %s, %s aggregation, %s, shards <= %zu B\n",
           b->n - p->servers, p->servers, p->transport ? p->transport : "auto",
           p->mode == GS_PS_MODE_SYNC ? "sync" : "async", p->agg == GS_PS_AGG_FETCH_ADD ? "atomic" : "write",
           optims[p->optim.kind], p->shard_bytes);
    printf("# time: median over iterations of the max over workers; algbw = size / time, per worker\n");
    printf("%12s %12s %11s %10s %11s %10s %11s %10s %8s %6s\n", "size(B)", "count", "push(us)", "GB/s",
           "pull(us)", "GB/s", "pushpull(us)", "GB/s", "#wrong", "iters");
}

static void print_row(const ps_row *r)
{
    printf("%12zu %12zu %11.2f %10.3f %11.2f %10.3f %11.2f %10.3f %8llu %6ld\n", r->bytes, r->bytes / 4,
           r->us[OP_PUSH], r->bw[OP_PUSH], r->us[OP_PULL], r->bw[OP_PULL], r->us[OP_PUSH_PULL],
           r->bw[OP_PUSH_PULL], (unsigned long long)r->wrong, r->iters);
    fflush(stdout);
}

static void print_json(const ps_bench *b, const gs_ps_params *p, const ps_row *rows, int n)
{
    printf(
        "{\"tool\": \"gsbench\", \"mode\": \"ps\", \"workers\": %d, \"servers\": %d, \"transport\": \"%s\", "
        "\"ps_mode\": \"%s\", \"agg\": \"%s\", \"shard_bytes\": %zu, \"rows\": [",
        b->n - p->servers, p->servers, p->transport ? p->transport : "auto",
        p->mode == GS_PS_MODE_SYNC ? "sync" : "async", p->agg == GS_PS_AGG_FETCH_ADD ? "atomic" : "write",
        p->shard_bytes);
    for (int i = 0; i < n; i++) {
        printf("%s\n  {\"bytes\": %zu, \"iters\": %ld, \"wrong\": %llu", i ? "," : "", rows[i].bytes,
               rows[i].iters, (unsigned long long)rows[i].wrong);
        for (int op = 0; op < OP_COUNT; op++)
            printf(", \"%s_us\": %.3f, \"%s_GBps\": %.4f", op_names[op], rows[i].us[op], op_names[op],
                   rows[i].bw[op]);
        printf("}");
    }
    printf("\n]}\n");
}

int gs_bench_ps_main(int argc, char **argv)
{
    ps_bench b = {0};
    ps_row rows[64];
    gs_ps_params p;
    gs_status st;
    int nrows = 0;
    uint64_t wrong = 0;
    parse(argc, argv, &b.o);
    if ((st = gs_ctx_create(&b.ctx)) != GS_OK)
        die("gs_ctx_create", st);
    b.rank = gs_ctx_rank(b.ctx);
    b.n = gs_ctx_size(b.ctx);
    for (int i = 0; i < b.o.nsizes; i++)
        b.maxit = iterations(&b.o, b.o.sizes[i]) > b.maxit ? iterations(&b.o, b.o.sizes[i]) : b.maxit;
    b.times = calloc((size_t)OP_COUNT * (size_t)b.maxit, sizeof(double));
    b.all = calloc((size_t)b.n * OP_COUNT * (size_t)b.maxit, sizeof(double));
    if (!b.times || !b.all)
        die("allocating", GS_ERR_NOMEM);
    params_for(&b, b.ctx, &p);
    if (b.rank == 0 && !b.o.json)
        header(&b, &p);
    for (int i = 0; i < b.o.nsizes; i++) {
        if (b.o.sizes[i] < sizeof(float))
            continue;
        measure(&b, b.o.sizes[i] / sizeof(float) * sizeof(float), &rows[nrows]);
        wrong += rows[nrows].wrong;
        if (b.rank == 0 && !b.o.json)
            print_row(&rows[nrows]);
        nrows++;
    }
    if (b.rank == 0 && b.o.json)
        print_json(&b, &p, rows, nrows);
    free(b.times);
    free(b.all);
    if (gs_ctx_destroy(b.ctx) != GS_OK)
        fprintf(stderr, "gsbench --ps: teardown: %s\n", gs_last_error());
    return wrong ? 1 : 0;
}
