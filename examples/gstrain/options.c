/* gstrain's command line: defaults, parsing, help. */
#include "options.h"
#include "data.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Defaults: chosen so `gsrun -n 4 gstrain` passes 85% test accuracy in a
 * few epochs on a 2-core machine (docs/gstrain.md has the measurements). */
#define DEFAULT_EPOCHS    5
#define DEFAULT_BATCH     256
#define DEFAULT_LR        0.05f
#define DEFAULT_MOMENTUM  0.9f
#define DEFAULT_SEED      1
#define DEFAULT_BUCKET_KB 512

static void usage(FILE *out)
{
    fprintf(out,
            "usage: gstrain [options]   (data parallel under gsrun, mpirun, srun or torchrun)\n"
            "Trains a 784-512-256-10 MLP on Fashion-MNIST; every rank takes its share of each\n"
            "global batch and the gradients are summed over the ranks by gradsync.\n"
            "  --data DIR          Fashion-MNIST .gz files (default %s)\n"
            "  --epochs N          passes over the training set (default %d)\n"
            "  --batch N           global batch, split over the ranks (default %d)\n"
            "  --lr X              learning rate (default %g)\n"
            "  --momentum X        SGD momentum (default %g)\n"
            "  --weight-decay X    L2 weight decay (default 0)\n"
            "  --seed N            initialization and shuffling seed (default %d)\n"
            "  --limit N           use only the first N training images (default all)\n"
            "  --test-limit N      use only the first N test images (default all)\n"
            "  --threads N         OpenBLAS threads per rank (default 1)\n"
            "  --sync METHOD       allreduce (default) or ps (parameter server: GS_PS_SERVERS of\n"
            "                      the ranks serve, the others train)\n"
            "  --no-overlap        reduce the whole gradient after the backward pass instead of\n"
            "                      each layer's gradient as soon as it is computed\n"
            "  --bucket-kb N       exchange the gradient in buckets of at most N KiB (whole panels of\n"
            "                      16 rows of a layer's weights; 0: one bucket per layer; default %d)\n"
            "  --split-wait        time the wait for the slowest rank apart from the exchange\n"
            "                      (a barrier before each step's synchronization)\n"
            "  --progress MODE     auto (bar on a terminal, else a line every 10%%), bar, lines, none\n"
            "  --json              print one JSON object with every figure instead of text\n"
            "  --save FILE         write the final weights (float32, layer by layer: W then b)\n"
            "  --plot FILE         draw loss, accuracy and the compute/sync split per epoch into a PNG\n"
            "                      (needs gnuplot: apt-get install gnuplot-nox)\n"
            "  --elastic           survive a lost rank (run under gsrun --elastic): the survivors shrink\n"
            "                      the communicator, go back to the last step every rank completed and\n"
            "                      go on with the same global batch split over the ranks left (--sync\n"
            "                      ps: the servers go on with the live trainers' mean, no rollback)\n"
            "  --join              join a running --elastic job in a lost rank's place (gsrun --restarts\n"
            "                      starts it so, with GS_REJOIN=1): at the next epoch's start (or the\n"
            "                      final check) the running ranks admit it and broadcast the weights and\n"
            "                      the momentum; implies --elastic\n"
            "  --die R:S[:WHEN]    (tests) rank R SIGKILLs itself in global step S; WHEN: compute (before\n"
            "                      the step's forward pass, default), sync (its exchange under way) or\n"
            "                      recovery (100 ms into the first recovery at or after step S)\n"
            "  -h, --help          this text\n",
            GT_DATA_DIR_DEFAULT, DEFAULT_EPOCHS, DEFAULT_BATCH, (double)DEFAULT_LR, (double)DEFAULT_MOMENTUM,
            DEFAULT_SEED, DEFAULT_BUCKET_KB);
}

static int parse_ulong(const char *name, const char *text, unsigned long long min, unsigned long long max,
                       unsigned long long *value)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "gstrain: %s wants an integer in [%llu, %llu], got '%s'\n", name, min, max, text);
        return -1;
    }
    *value = v;
    return 0;
}

static int parse_float(const char *name, const char *text, float min, float max, float *value)
{
    char *end;
    errno = 0;
    float v = strtof(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "gstrain: %s wants a number in [%g, %g], got '%s'\n", name, (double)min, (double)max,
                text);
        return -1;
    }
    *value = v;
    return 0;
}

static int parse_choice(const char *name, const char *text, const char *const *choices, int *value)
{
    for (int i = 0; choices[i]; i++)
        if (strcmp(text, choices[i]) == 0) {
            *value = i;
            return 0;
        }
    fprintf(stderr, "gstrain: %s '%s' is not one of:", name, text);
    for (int i = 0; choices[i]; i++)
        fprintf(stderr, " %s", choices[i]);
    fputc('\n', stderr);
    return -1;
}

enum {
    OPT_DATA = 256,
    OPT_EPOCHS,
    OPT_BATCH,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_WD,
    OPT_SEED,
    OPT_LIMIT,
    OPT_TEST_LIMIT,
    OPT_THREADS,
    OPT_SYNC,
    OPT_NO_OVERLAP,
    OPT_SPLIT_WAIT,
    OPT_BUCKET_KB,
    OPT_PROGRESS,
    OPT_JSON,
    OPT_SAVE,
    OPT_PLOT,
    OPT_ELASTIC,
    OPT_DIE,
    OPT_JOIN,
};

static const struct option long_options[] = {
    {"data", required_argument, NULL, OPT_DATA},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"lr", required_argument, NULL, OPT_LR},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"weight-decay", required_argument, NULL, OPT_WD},
    {"seed", required_argument, NULL, OPT_SEED},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"test-limit", required_argument, NULL, OPT_TEST_LIMIT},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"sync", required_argument, NULL, OPT_SYNC},
    {"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
    {"split-wait", no_argument, NULL, OPT_SPLIT_WAIT},
    {"bucket-kb", required_argument, NULL, OPT_BUCKET_KB},
    {"progress", required_argument, NULL, OPT_PROGRESS},
    {"json", no_argument, NULL, OPT_JSON},
    {"save", required_argument, NULL, OPT_SAVE},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"elastic", no_argument, NULL, OPT_ELASTIC},
    {"die", required_argument, NULL, OPT_DIE},
    {"join", no_argument, NULL, OPT_JOIN},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* --die R:S[:WHEN]. */
static int parse_die(const char *text, gt_options *opt)
{
    static const char *const whens[] = {"compute", "sync", "recovery", NULL};
    char rank[32], step[32], when[32] = "compute";
    unsigned long long r, st;
    int choice = 0;
    if (opt->ndie == GT_DIE_MAX) {
        fprintf(stderr, "gstrain: at most %d --die options\n", GT_DIE_MAX);
        return -1;
    }
    if (sscanf(text, "%31[0-9]:%31[0-9]:%31s", rank, step, when) < 2) {
        fprintf(stderr, "gstrain: --die wants RANK:STEP[:compute|sync|recovery], got '%s'\n", text);
        return -1;
    }
    if (parse_ulong("--die's rank", rank, 0, 1u << 20, &r) ||
        parse_ulong("--die's step", step, 1, UINT64_MAX, &st) ||
        parse_choice("--die's WHEN", when, whens, &choice))
        return -1;
    opt->die[opt->ndie++] = (gt_die){.rank = (int)r, .step = st, .when = (gt_die_when)choice};
    return 0;
}

/* Applies one option; -1 on a bad value. */
static int apply(int c, const char *arg, gt_options *opt)
{
    static const char *const methods[] = {"allreduce", "ps", NULL};
    static const char *const progress[] = {"auto", "bar", "lines", "none", NULL};
    unsigned long long u = 0;
    int choice = 0, rc = 0;
    switch (c) {
    case OPT_DATA: opt->data_dir = arg; break;
    case OPT_EPOCHS: rc = parse_ulong("--epochs", arg, 1, 10000, &u), opt->epochs = (int)u; break;
    case OPT_BATCH: rc = parse_ulong("--batch", arg, 1, 1u << 20, &u), opt->batch = (size_t)u; break;
    case OPT_LR: rc = parse_float("--lr", arg, 0.0f, 100.0f, &opt->lr); break;
    case OPT_MOMENTUM: rc = parse_float("--momentum", arg, 0.0f, 0.9999f, &opt->momentum); break;
    case OPT_WD: rc = parse_float("--weight-decay", arg, 0.0f, 1.0f, &opt->weight_decay); break;
    case OPT_SEED: rc = parse_ulong("--seed", arg, 0, UINT64_MAX, &u), opt->seed = u; break;
    case OPT_LIMIT: rc = parse_ulong("--limit", arg, 1, SIZE_MAX, &u), opt->limit = (size_t)u; break;
    case OPT_TEST_LIMIT:
        rc = parse_ulong("--test-limit", arg, 1, SIZE_MAX, &u), opt->test_limit = (size_t)u;
        break;
    case OPT_THREADS: rc = parse_ulong("--threads", arg, 1, 1024, &u), opt->threads = (int)u; break;
    case OPT_SYNC:
        rc = parse_choice("--sync", arg, methods, &choice), opt->method = (gt_sync_method)choice;
        break;
    case OPT_NO_OVERLAP: opt->overlap = 0; break;
    case OPT_SPLIT_WAIT: opt->split_wait = 1; break;
    case OPT_BUCKET_KB:
        rc = parse_ulong("--bucket-kb", arg, 0, 1u << 20, &u), opt->bucket_kb = (size_t)u;
        break;
    case OPT_PROGRESS: rc = parse_choice("--progress", arg, progress, &choice), opt->progress = choice; break;
    case OPT_JSON: opt->json = 1; break;
    case OPT_SAVE: opt->save = arg; break;
    case OPT_PLOT: opt->plot = arg; break;
    case OPT_ELASTIC: opt->elastic = 1; break;
    case OPT_DIE: rc = parse_die(arg, opt); break;
    case OPT_JOIN: opt->join = opt->elastic = 1; break;
    default: rc = -1; break;
    }
    return rc;
}

int gt_options_parse(int argc, char **argv, gt_options *opt)
{
    int c, progress_given = 0;
    *opt = (gt_options){.data_dir = GT_DATA_DIR_DEFAULT,
                        .epochs = DEFAULT_EPOCHS,
                        .batch = DEFAULT_BATCH,
                        .lr = DEFAULT_LR,
                        .momentum = DEFAULT_MOMENTUM,
                        .seed = DEFAULT_SEED,
                        .threads = 1,
                        .method = GT_SYNC_ALLREDUCE,
                        .overlap = 1,
                        .bucket_kb = DEFAULT_BUCKET_KB,
                        .progress = GT_PROGRESS_AUTO};
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }
        if (c == '?' || apply(c, optarg, opt) != 0) {
            fprintf(stderr, "gstrain: see gstrain --help\n");
            return 2;
        }
        progress_given |= c == OPT_PROGRESS;
    }
    if (optind < argc) {
        fprintf(stderr, "gstrain: unexpected argument '%s'; see gstrain --help\n", argv[optind]);
        return 2;
    }
    if (opt->elastic && !opt->join) { /* a restarted rank (gsrun --restarts) joins */
        const char *rejoin = getenv("GS_REJOIN");
        opt->join = rejoin && strcmp(rejoin, "1") == 0;
    }
    if (opt->json && !progress_given)
        opt->progress = GT_PROGRESS_NONE;
    return 0;
}
