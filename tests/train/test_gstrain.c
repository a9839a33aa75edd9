/*
 * gstrain as a user runs it, one process: the data errors a person meets
 * first, the command line, determinism from --seed, and that a short run
 * learns. Multi-rank runs are in test_gstrain_ranks.c.
 */
#include "gs_test.h"
#include "gstrain_run.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

GS_TEST(missing_data_dir_says_how_to_install)
{
    gt_run r;
    gt_run_gstrain(&r, 0, (const char *[]){"--data", "/nonexistent/fashion", "--progress", "none", NULL});
    GS_ASSERT_EQ(r.exit_code, 1);
    GS_ASSERT_CONTAINS(r.err, "/nonexistent/fashion/train-labels-idx1-ubyte.gz");
    GS_ASSERT_CONTAINS(r.err, "No such file or directory");
    GS_ASSERT_CONTAINS(r.err, "apt-get install dataset-fashion-mnist");
    GS_ASSERT_EQ(strlen(r.out), 0);
}

/* A directory holding the real labels but a file of the wrong kind as images. */
GS_TEST(wrong_file_is_reported_as_corrupt)
{
    char dir[] = "/tmp/gstrain-test-XXXXXX", path[256];
    gt_run r;
    gt_require_dataset();
    GS_ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/train-labels-idx1-ubyte.gz", dir);
    GS_ASSERT_EQ(gt_copy_file(GT_DATASET "/train-labels-idx1-ubyte.gz", path, 0), 0);
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", dir);
    GS_ASSERT_EQ(gt_copy_file(GT_DATASET "/t10k-labels-idx1-ubyte.gz", path, 0), 0); /* labels, not images */
    gt_run_gstrain(&r, 0, (const char *[]){"--data", dir, NULL});
    gt_remove_dir(dir);
    GS_ASSERT_EQ(r.exit_code, 1);
    GS_ASSERT_CONTAINS(r.err, "train-images-idx3-ubyte.gz: bad IDX magic 0x00000801 (expected 0x00000803)");
    GS_ASSERT_CONTAINS(r.err, "apt-get install --reinstall dataset-fashion-mnist");
}

/* The first 4 KiB of the gzip stream of the real images: the file ends early. */
GS_TEST(truncated_file_is_reported_as_corrupt)
{
    char dir[] = "/tmp/gstrain-test-XXXXXX", path[256];
    gt_run r;
    gt_require_dataset();
    GS_ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/train-labels-idx1-ubyte.gz", dir);
    GS_ASSERT_EQ(gt_copy_file(GT_DATASET "/train-labels-idx1-ubyte.gz", path, 0), 0);
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", dir);
    GS_ASSERT_EQ(gt_copy_file(GT_DATASET "/train-images-idx3-ubyte.gz", path, 4096), 0);
    gt_run_gstrain(&r, 0, (const char *[]){"--data", dir, NULL});
    gt_remove_dir(dir);
    GS_ASSERT_EQ(r.exit_code, 1);
    GS_ASSERT_CONTAINS(r.err, "train-images-idx3-ubyte.gz: cannot read the images");
    GS_ASSERT_CONTAINS(r.err, "dataset-fashion-mnist");
}

GS_TEST(bad_options_are_usage_errors)
{
    gt_run r;
    gt_run_gstrain(&r, 0, (const char *[]){"--epochs", "0", NULL});
    GS_ASSERT_EQ(r.exit_code, 2);
    GS_ASSERT_CONTAINS(r.err, "--epochs wants an integer in [1, 10000], got '0'");
    gt_run_gstrain(&r, 0, (const char *[]){"--lr", "fast", NULL});
    GS_ASSERT_EQ(r.exit_code, 2);
    GS_ASSERT_CONTAINS(r.err, "--lr wants a number");
    gt_run_gstrain(&r, 0, (const char *[]){"--sync", "gossip", NULL});
    GS_ASSERT_EQ(r.exit_code, 2);
    GS_ASSERT_CONTAINS(r.err, "--sync 'gossip' is not one of: allreduce ps");
    gt_run_gstrain(&r, 0, (const char *[]){"--help", NULL});
    GS_ASSERT_EQ(r.exit_code, 0);
    GS_ASSERT_CONTAINS(r.out, "--limit N");
}

/* 4096 images, 3 epochs: the loss falls every epoch and the test accuracy
 * passes 75% (chance: 10%; seeds 1-4 give 81-83%). */
GS_TEST(short_run_learns)
{
    gt_run r;
    gt_require_dataset();
    gt_run_gstrain(
        &r, 0, (const char *[]){"--limit", "4096", "--test-limit", "2000", "--epochs", "3", "--json", NULL});
    GS_ASSERT_EQ(r.exit_code, 0);
    double loss1 = gt_json_number(strstr(r.out, "\"epoch\": 1"), "train_loss");
    double loss2 = gt_json_number(strstr(r.out, "\"epoch\": 2"), "train_loss");
    double loss3 = gt_json_number(strstr(r.out, "\"epoch\": 3"), "train_loss");
    double acc = gt_json_number(r.out, "final_test_acc");
    gt_assert_blas_core(r.out);
    fprintf(stderr, "  train loss per epoch %.4f %.4f %.4f, final test accuracy %.4f\n", loss1, loss2, loss3,
            acc);
    GS_ASSERT(loss2 < loss1 && loss3 < loss2);
    GS_ASSERT(acc >= 0.75);
    GS_ASSERT_CONTAINS(r.out, "\"weights_identical\": true");
}

/* The same seed gives bitwise the same weights; another seed others. */
GS_TEST(seed_determines_the_weights)
{
    char a[32], b[32], c[32];
    gt_run r;
    gt_require_dataset();
    const char *args[] = {"--limit", "1000",   "--test-limit", "500", "--epochs",
                          "1",       "--json", "--seed",       "7",   NULL};
    gt_run_gstrain(&r, 0, args);
    GS_ASSERT_EQ(r.exit_code, 0);
    gt_json_string(r.out, "weights_hash", a, sizeof(a));
    gt_run_gstrain(&r, 0, args);
    GS_ASSERT_EQ(r.exit_code, 0);
    gt_json_string(r.out, "weights_hash", b, sizeof(b));
    args[8] = "8";
    gt_run_gstrain(&r, 0, args);
    GS_ASSERT_EQ(r.exit_code, 0);
    gt_json_string(r.out, "weights_hash", c, sizeof(c));
    GS_ASSERT_STR_EQ(a, b);
    GS_ASSERT(strcmp(a, c) != 0);
}

/* Not a terminal: the progress comes as lines at every tenth of the epoch. */
GS_TEST(progress_lines_and_summary)
{
    gt_run r;
    gt_require_dataset();
    gt_run_gstrain(&r, 0, (const char *[]){"--limit", "2560", "--test-limit", "500", "--epochs", "1", NULL});
    GS_ASSERT_EQ(r.exit_code, 0);
    GS_ASSERT_CONTAINS(r.out, "epoch 1/1 [###...........................]  10%");
    GS_ASSERT_CONTAINS(r.out, "epoch 1/1 [##############################] 100%");
    GS_ASSERT_CONTAINS(r.out, "test loss");
    GS_ASSERT_CONTAINS(r.out, "img/s");
    GS_ASSERT_CONTAINS(r.out, "weights: bitwise identical on all 1 rank");
    GS_ASSERT_CONTAINS(r.out, "final test accuracy");
}

/* --save writes every parameter, float32. */
GS_TEST(save_writes_the_weights)
{
    char path[] = "/tmp/gstrain-weights-XXXXXX";
    struct stat st;
    gt_run r;
    gt_require_dataset();
    int fd = mkstemp(path);
    GS_ASSERT(fd >= 0);
    close(fd);
    gt_run_gstrain(&r, 0,
                   (const char *[]){"--limit", "512", "--test-limit", "100", "--epochs", "1", "--progress",
                                    "none", "--save", path, NULL});
    GS_ASSERT_EQ(r.exit_code, 0);
    GS_ASSERT_EQ(stat(path, &st), 0);
    unlink(path);
    GS_ASSERT_EQ(st.st_size, GT_PARAMS * 4);
}
