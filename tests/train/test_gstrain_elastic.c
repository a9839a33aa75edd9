/*
 * gstrain --elastic under gsrun --elastic, 4 ranks: a rank SIGKILLs itself
 * (gstrain --die, a real SIGKILL) at a random step, the 3 survivors shrink,
 * go back to the last step every one of them completed and finish. Every
 * run must finish (exit 0), the survivors end with bitwise the same weights
 * (gstrain compares their hashes: "weights_identical") and the final test
 * accuracy is within 1 point of an unbroken run under the same BLAS kernel.
 * Also: a second rank killed during the shrink, rank 0 killed (the store is
 * gsrun's, so the survivors go on), a killed rank restarted by gsrun
 * --restarts joining at the next epoch, and without --elastic the job still
 * stops with a clear error.
 *
 * GS_ELASTIC_RUNS (default 3) sets the number of random runs, GS_ELASTIC_SEED
 * their seed (default: the time; printed). The runs rotate through the
 * machine's own OpenBLAS kernel, Haswell's and Sandybridge's (x86_64), and
 * print the recovery's figures (kill to the first completed step, with its
 * parts) and their medians: docs/elastic.md's figures come from here.
 */
#include "gs_test.h"
#include "gstrain_run.h"

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#define RANKS      4
#define STEPS      32 /* 2 epochs of 4096 images in global batches of 256 */
#define ACC_POINTS 0.01
#define RUNS_MAX   64

static const char *const train_args[] = {"--elastic", "--limit", "4096",   "--test-limit", "2000",
                                         "--epochs",  "2",       "--json", "--progress",   "none"};
#define TRAIN_ARGC (int)(sizeof(train_args) / sizeof(train_args[0]))

/* The kernels the runs rotate through (NULL: the machine's own). */
static const char *const kernels[] = {NULL,
#if defined(__x86_64__)
                                      "Haswell", "Sandybridge"
#endif
};
#define KERNELS (int)(sizeof(kernels) / sizeof(kernels[0]))

static void use_kernel(const char *kernel)
{
    if (kernel)
        setenv("OPENBLAS_CORETYPE", kernel, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
}

static double absolute(double x)
{
    return x < 0 ? -x : x;
}

/* gstrain under gsrun --elastic -n RANKS over transport, with the --die
 * options dies (NULL-terminated, or NULL). */
static void run_elastic_restarts(gt_run *r, const char *transport, const char *const *dies,
                                 const char *restarts)
{
    const char *gsrun_opts[] = {"--elastic",    "--transport", transport,
                                "--timeout-ms", "20000",       restarts ? "--restarts" : NULL,
                                restarts,       NULL};
    const char *args[32];
    int argc = 0;
    for (int i = 0; i < TRAIN_ARGC; i++)
        args[argc++] = train_args[i];
    for (int i = 0; dies && dies[i]; i++) {
        args[argc++] = "--die";
        args[argc++] = dies[i];
    }
    args[argc] = NULL;
    gt_run_gstrain_launch(r, RANKS, gsrun_opts, args);
}

static void run_elastic(gt_run *r, const char *transport, const char *const *dies)
{
    run_elastic_restarts(r, transport, dies, NULL);
}

/* The final test accuracy of an unbroken 4-rank run under the current kernel. */
static double unbroken_accuracy(gt_run *r, const char *transport)
{
    run_elastic(r, transport, NULL);
    GS_ASSERT_EQ(r->exit_code, 0);
    GS_ASSERT_CONTAINS(r->out, "\"weights_identical\": true");
    GS_ASSERT_CONTAINS(r->out, "\"recoveries\": []");
    gt_assert_blas_core(r->out);
    return gt_json_number(r->out, "final_test_acc");
}

/* A run that lost ranks: it finished, the survivors agree bitwise, it
 * learned as the unbroken run did. */
static void check_recovered(const gt_run *r, int survivors, double reference)
{
    double acc;
    GS_ASSERT_EQ(r->exit_code, 0);
    GS_ASSERT_CONTAINS(r->out, "\"weights_identical\": true");
    GS_ASSERT_EQ((int)gt_json_number(r->out, "ranks_final"), survivors);
    GS_ASSERT(gt_json_number(r->out, "kill_to_step_s") > 0);
    GS_ASSERT(strstr(r->err, "the others go on (--elastic)") || strstr(r->err, "restarting it as a joiner"));
    gt_assert_blas_core(r->out);
    acc = gt_json_number(r->out, "final_test_acc");
    fprintf(stderr, "  final test accuracy %.4f (unbroken %.4f)\n", acc, reference);
    GS_ASSERT(absolute(acc - reference) <= ACC_POINTS);
}

typedef struct figures {
    double detect, agree, rebuild, resync, rollback, first, total;
} figures;

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(const figures *f, int n, size_t offset)
{
    double v[RUNS_MAX];
    for (int i = 0; i < n; i++)
        v[i] = *(const double *)((const char *)&f[i] + offset);
    qsort(v, (size_t)n, sizeof(v[0]), by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

GS_TEST_TP(random_rank_killed_at_random_step_survivors_finish)
{
    const char *env_runs = getenv("GS_ELASTIC_RUNS"), *env_seed = getenv("GS_ELASTIC_SEED");
    int runs = env_runs ? atoi(env_runs) : 3, ahead = 0;
    unsigned seed = env_seed ? (unsigned)strtoul(env_seed, NULL, 10) : (unsigned)time(NULL);
    double reference[KERNELS];
    int have_reference[KERNELS] = {0};
    bool rotate = !getenv("OPENBLAS_CORETYPE");
    static figures f[RUNS_MAX];
    static gt_run r;
    gt_require_dataset();
    runs = runs < 1 ? 1 : runs > RUNS_MAX ? RUNS_MAX : runs;
    fprintf(stderr, "  %d runs, GS_ELASTIC_SEED=%u\n", runs, seed);
    srand(seed);
    for (int i = 0; i < runs; i++) {
        int k = rotate ? i % KERNELS : 0, victim = rand() % RANKS, step = 2 + rand() % (STEPS - 2);
        const char *when = rand() % 2 ? "sync" : "compute";
        char die[64], lost[32];
        if (rotate)
            use_kernel(kernels[k]);
        if (!have_reference[k]) {
            reference[k] = unbroken_accuracy(&r, transport);
            have_reference[k] = 1;
        }
        snprintf(die, sizeof(die), "%d:%d:%s", victim, step, when);
        fprintf(stderr, "  run %d: kernel %s, --die %s\n", i, kernels[k] ? kernels[k] : "(own)", die);
        run_elastic(&r, transport, (const char *[]){die, NULL});
        check_recovered(&r, RANKS - 1, reference[k]);
        snprintf(lost, sizeof(lost), "\"lost\": [%d]", victim);
        GS_ASSERT_CONTAINS(r.out, lost);
        GS_ASSERT_EQ((int)gt_json_number(r.out, "at_step"), step);
        f[i] = (figures){gt_json_number(r.out, "detect_s"),      gt_json_number(r.out, "agree_s"),
                         gt_json_number(r.out, "rebuild_s"),     gt_json_number(r.out, "resync_s"),
                         gt_json_number(r.out, "rollback_s"),    gt_json_number(r.out, "first_step_s"),
                         gt_json_number(r.out, "kill_to_step_s")};
        int undid = (int)gt_json_number(r.out, "ahead");
        ahead += undid > 0;
        fprintf(stderr,
                "  run %d: kill to first step %.1f ms: detection %.1f, agreement %.1f, rebuild %.1f, resync "
                "%.1f, "
                "rollback %.1f, first step %.1f; survivors that undid a step: %d\n",
                i, 1e3 * f[i].total, 1e3 * f[i].detect, 1e3 * f[i].agree, 1e3 * f[i].rebuild,
                1e3 * f[i].resync, 1e3 * f[i].rollback, 1e3 * f[i].first, undid);
    }
    fprintf(stderr,
            "  %s, %d runs, medians (ms): kill to first step %.1f | detection %.1f, agreement %.1f, rebuild "
            "%.1f, "
            "resync %.1f, rollback %.1f, first step %.1f; runs where a survivor undid a step: %d\n",
            transport, runs, 1e3 * median_of(f, runs, offsetof(figures, total)),
            1e3 * median_of(f, runs, offsetof(figures, detect)),
            1e3 * median_of(f, runs, offsetof(figures, agree)),
            1e3 * median_of(f, runs, offsetof(figures, rebuild)),
            1e3 * median_of(f, runs, offsetof(figures, resync)),
            1e3 * median_of(f, runs, offsetof(figures, rollback)),
            1e3 * median_of(f, runs, offsetof(figures, first)), ahead);
}

/* Rank 1 dies in step 10's exchange; rank 3 dies 100 ms into the recovery,
 * while the others agree on who is alive: the two left finish. */
GS_TEST_TP(second_rank_killed_during_the_shrink_two_finish)
{
    static gt_run r;
    double reference;
    gt_require_dataset();
    reference = unbroken_accuracy(&r, transport);
    run_elastic(&r, transport, (const char *[]){"1:10:sync", "3:10:recovery", NULL});
    check_recovered(&r, 2, reference);
    GS_ASSERT_CONTAINS(r.out, "\"lost\": [1, 3]");
}

/* Rank 0 is killed. Under gsrun the store is gsrun's, not rank 0's: the
 * survivors shrink and go on, old rank 1 reporting as the new rank 0. */
GS_TEST_TP(rank_0_killed_the_store_is_gsruns_survivors_go_on)
{
    static gt_run r;
    double reference;
    gt_require_dataset();
    reference = unbroken_accuracy(&r, transport);
    run_elastic(&r, transport, (const char *[]){"0:12:sync", NULL});
    check_recovered(&r, RANKS - 1, reference);
    GS_ASSERT_CONTAINS(r.out, "\"lost\": [0]");
    GS_ASSERT_CONTAINS(r.out, "[1] {\"ranks\": 4");
}

/* gsrun --restarts 1: rank 2, killed in step 5, is started again as a
 * joiner (GS_REJOIN=1); the 3 survivors admit it at the start of epoch 2
 * (after step 16) and broadcast the weights and the momentum; the 4 end
 * bitwise identical and learn as the unbroken run. */
GS_TEST_TP(killed_rank_restarted_joins_at_the_next_epoch)
{
    static gt_run r;
    double reference;
    gt_require_dataset();
    reference = unbroken_accuracy(&r, transport);
    run_elastic_restarts(&r, transport, (const char *[]){"2:5:sync", NULL}, "1");
    check_recovered(&r, RANKS, reference);
    GS_ASSERT_CONTAINS(r.out, "\"lost\": [2]");
    GS_ASSERT_CONTAINS(r.out, "\"joins\": [{\"joined\": [2], \"ranks\": 4, \"at_step\": 16");
    GS_ASSERT_CONTAINS(r.err, "restarting it as a joiner (restart 1 of 1)");
    GS_ASSERT_CONTAINS(r.err, "rank 2 joined after step 16; 4 ranks continue");
}

/* Without gstrain's --elastic a lost rank still ends the job, with the
 * error naming the lost rank, under gsrun --elastic too. */
GS_TEST_TP(without_elastic_a_lost_rank_ends_the_run)
{
    const char *gsrun_opts[] = {"--elastic", "--transport", transport, NULL};
    const char *args[] = {"--limit", "2048",   "--test-limit", "500",      "--epochs",
                          "1",       "--json", "--die",        "2:3:sync", NULL};
    static gt_run r;
    gt_require_dataset();
    gt_run_gstrain_launch(&r, RANKS, gsrun_opts, args);
    GS_ASSERT_NE(r.exit_code, 0);
    GS_ASSERT_CONTAINS(r.err, "error: gradient allreduce failed");
    GS_ASSERT_CONTAINS(r.err, "rank 2 lost");
}

/* The ps cases' unbroken run: args without their "--die" (args[12] on),
 * which must end with no recovery; its final test accuracy. */
static double ps_unbroken_accuracy(gt_run *r, const char **gsrun_opts, const char **args)
{
    const char *die = args[12];
    args[12] = NULL;
    gt_run_gstrain_launch(r, RANKS + 1, gsrun_opts, args);
    args[12] = die;
    GS_ASSERT_EQ(r->exit_code, 0);
    GS_ASSERT_CONTAINS(r->out, "\"recoveries\": []");
    return gt_json_number(r->out, "final_test_acc");
}

/* --sync ps: 4 trainers + 1 server under gsrun --elastic; trainer 1 is
 * SIGKILLed before its step 12 (compute). The server completes that round
 * with the mean over the 3 live trainers' gradients (the victim's rows of
 * it are lost), the 3 see the round counted 3, shrink their communicator
 * before the next step and split the batch over 3; they finish bitwise
 * identical, within 1 point of the unbroken run (its own figure: with
 * --elastic the unbroken run is the plain --sync ps one). The server is not
 * in the trainers' communicator; it serves until they leave. */
GS_TEST_TP(ps_trainer_killed_servers_go_on_with_the_live_ones)
{
    const char *gsrun_opts[] = {"--elastic", "--transport", transport, "--timeout-ms", "20000", NULL};
    const char *args[] = {"--elastic", "--sync",       "ps", "--limit", "4096",       "--test-limit",
                          "2000",      "--epochs",     "2",  "--json",  "--progress", "none",
                          "--die",     "1:12:compute", NULL};
    static gt_run r;
    double reference;
    gt_require_dataset();
    reference = ps_unbroken_accuracy(&r, gsrun_opts, args);
    gt_run_gstrain_launch(&r, RANKS + 1, gsrun_opts, args);
    GS_ASSERT_EQ(r.exit_code, 0);
    GS_ASSERT_CONTAINS(r.out, "\"weights_identical\": true");
    GS_ASSERT_CONTAINS(r.out, "\"lost\": [1]");
    GS_ASSERT_EQ((int)gt_json_number(r.out, "ranks_final"), RANKS - 1);
    GS_ASSERT_EQ((int)gt_json_number(r.out, "at_step"),
                 13); /* step 12 went on without it: they shrink before 13 */
    GS_ASSERT_CONTAINS(r.err, "elastic: its pushes count no more");
    fprintf(stderr, "  final test accuracy %.4f (unbroken %.4f)\n", gt_json_number(r.out, "final_test_acc"),
            reference);
    GS_ASSERT(absolute(gt_json_number(r.out, "final_test_acc") - reference) <= ACC_POINTS);
}

/* gsrun --restarts 1 with --sync ps: trainer 3, killed before step 12, is
 * started again (GS_REJOIN=1); the 3 survivors admit it to their
 * communicator at the start of epoch 2 and send it their state, the servers
 * readmit it (a recovery the survivors join from their next step, repeating
 * it), and the 4 finish bitwise identical. The accuracy bound is 2 points
 * here: the rounds the rejoined trainer missed (its rows of steps 12-16,
 * and of any step completed between the grow point and the servers'
 * readmission, which varies from run to run) are not computed by anyone. */
GS_TEST_TP(ps_restarted_trainer_rejoins)
{
    const char *gsrun_opts[] = {"--elastic", "--transport", transport, "--timeout-ms",
                                "20000",     "--restarts",  "1",       NULL};
    const char *args[] = {"--elastic", "--sync",       "ps", "--limit", "4096",       "--test-limit",
                          "2000",      "--epochs",     "2",  "--json",  "--progress", "none",
                          "--die",     "3:12:compute", NULL};
    static gt_run r;
    double reference;
    gt_require_dataset();
    reference = ps_unbroken_accuracy(&r, gsrun_opts, args);
    gt_run_gstrain_launch(&r, RANKS + 1, gsrun_opts, args);
    GS_ASSERT_EQ(r.exit_code, 0);
    GS_ASSERT_CONTAINS(r.out, "\"weights_identical\": true");
    GS_ASSERT_EQ((int)gt_json_number(r.out, "ranks_final"), RANKS);
    GS_ASSERT_CONTAINS(r.out, "\"joins\": [{\"joined\": [3], \"ranks\": 4, \"at_step\": 16");
    GS_ASSERT_CONTAINS(r.err, "restarting it as a joiner (restart 1 of 1)");
    GS_ASSERT_CONTAINS(r.err, "worker 3 (rank 3) rejoins at recovery 1");
    fprintf(stderr, "  final test accuracy %.4f (unbroken %.4f)\n", gt_json_number(r.out, "final_test_acc"),
            reference);
    GS_ASSERT(absolute(gt_json_number(r.out, "final_test_acc") - reference) <= 2 * ACC_POINTS);
}
