/* Runs gstrain (alone or under gsrun) and picks figures out of its output. */
#ifndef GSTRAIN_RUN_H
#define GSTRAIN_RUN_H

#include "gs_test.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GT_DATASET "/usr/share/datasets/fashion-mnist"
#define GT_PARAMS  535818 /* 784*512+512 + 512*256+256 + 256*10+10 */
#define GT_OUT_MAX (1 << 18)

typedef struct gt_run {
    int exit_code; /* 128 + signal when killed */
    char out[GT_OUT_MAX];
    char err[GT_OUT_MAX];
} gt_run;

/* build/<rel> from GS_TOOLS_DIR (build/tools); skips when not built. */
static inline void gt_build_path(const char *rel, char *buf, size_t cap)
{
    const char *tools = getenv("GS_TOOLS_DIR");
    if (!tools)
        GS_SKIP("GS_TOOLS_DIR is not set: run the tests through ctest");
    snprintf(buf, cap, "%s/../%s", tools, rel);
    if (access(buf, X_OK) != 0) {
        fprintf(stderr, "  %s is missing\n", buf);
        GS_SKIP("not built (configure with -DGS_BUILD_EXAMPLES=ON)");
    }
}

static inline void gt_require_dataset(void)
{
    if (access(GT_DATASET "/train-images-idx3-ubyte.gz", R_OK) != 0)
        GS_SKIP("Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist");
}

static inline void gt_read_all(int fd, char *buf, size_t cap)
{
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
}

/* Runs gstrain args (NULL-terminated); ranks > 0: under gsrun -n ranks with
 * the options gsrun_opts (NULL-terminated, or NULL). */
static inline void gt_run_gstrain_launch(gt_run *r, int ranks, const char *const *gsrun_opts,
                                         const char *const *args)
{
    char gstrain[4096], gsrun[4096], nranks[16];
    const char *argv[64];
    int argc = 0, status = 0;
    gt_build_path("examples/gstrain", gstrain, sizeof(gstrain));
    if (ranks > 0) {
        gt_build_path("tools/gsrun", gsrun, sizeof(gsrun));
        snprintf(nranks, sizeof(nranks), "%d", ranks);
        argv[argc++] = gsrun;
        argv[argc++] = "-n";
        argv[argc++] = nranks;
        for (int i = 0; gsrun_opts && gsrun_opts[i] && argc < 24; i++)
            argv[argc++] = gsrun_opts[i];
        argv[argc++] = "--";
    }
    argv[argc++] = gstrain;
    for (int i = 0; args[i] && argc < 63; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    int out = memfd_create("gstrain-out", 0), err = memfd_create("gstrain-err", 0);
    GS_ASSERT(out >= 0 && err >= 0);
    fflush(NULL);
    pid_t pid = fork();
    GS_ASSERT(pid >= 0);
    if (pid == 0) {
        dup2(out, 1);
        dup2(err, 2);
        execv(argv[0], (char *const *)argv);
        perror("execv");
        _exit(127);
    }
    GS_ASSERT_EQ(waitpid(pid, &status, 0), pid);
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    gt_read_all(out, r->out, sizeof(r->out));
    gt_read_all(err, r->err, sizeof(r->err));
    if (r->exit_code != 0)
        fprintf(stderr, "  gstrain exited with %d; its stderr:\n%s\n", r->exit_code, r->err);
}

/* Runs gstrain args (NULL-terminated); ranks > 0: under gsrun -n ranks
 * (--transport transport unless NULL). */
static inline void gt_run_gstrain_over(gt_run *r, int ranks, const char *transport, const char *const *args)
{
    const char *opts[] = {"--transport", transport, NULL};
    gt_run_gstrain_launch(r, ranks, transport ? opts : NULL, args);
}

static inline void gt_run_gstrain(gt_run *r, int ranks, const char *const *args)
{
    gt_run_gstrain_over(r, ranks, NULL, args);
}

/* The number after the first "key": in text (NULL: fails). */
static inline double gt_json_number(const char *text, const char *key)
{
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "\"%s\": ", key);
    const char *at = text ? strstr(text, pattern) : NULL;
    if (!at)
        gs_test_fail_here(__FILE__, __LINE__, "no %s in the output: %s", pattern, text);
    return strtod(at + strlen(pattern), NULL);
}

/* The string after the first "key": in text. */
static inline void gt_json_string(const char *text, const char *key, char *buf, size_t cap)
{
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "\"%s\": \"", key);
    const char *at = strstr(text, pattern);
    if (!at)
        gs_test_fail_here(__FILE__, __LINE__, "no %s in the output: %s", pattern, text);
    at += strlen(pattern);
    size_t n = strcspn(at, "\"");
    snprintf(buf, cap, "%.*s", (int)n, at);
}

/* Copies src to dst (keep > 0: only the first keep bytes). 0 on success. */
/* The BLAS kernel a run reports (its --json "blas_core") is the one the
 * test's environment forces with OPENBLAS_CORETYPE (any case), if it forces one: a
 * ctest entry meant for another kernel must not pass on the default one. */
static inline void gt_assert_blas_core(const char *json)
{
    const char *forced = getenv("OPENBLAS_CORETYPE");
    char got[64], want[64];
    if (!forced || !*forced)
        return;
    snprintf(want, sizeof(want), "%s", forced);
    gt_json_string(json, "blas_core", got, sizeof(got));
    for (char *c = want; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    for (char *c = got; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    GS_ASSERT_STR_EQ(got, want);
}

static inline int gt_copy_file(const char *src, const char *dst, size_t keep)
{
    char buf[65536];
    size_t total = 0;
    ssize_t n;
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600), rc = 0;
    if (in < 0 || out < 0)
        rc = -1;
    while (rc == 0 && (keep == 0 || total < keep) && (n = read(in, buf, sizeof(buf))) > 0) {
        size_t len = keep && total + (size_t)n > keep ? keep - total : (size_t)n;
        rc = write(out, buf, len) == (ssize_t)len ? 0 : -1;
        total += len;
    }
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

/* Removes a flat directory made by a test. */
static inline void gt_remove_dir(const char *dir)
{
    char path[512];
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Reads a --save file of GT_PARAMS floats. */
static inline void gt_load_weights(const char *path, float *w)
{
    FILE *f = fopen(path, "rb");
    GS_ASSERT(f != NULL);
    GS_ASSERT_EQ(fread(w, sizeof(float), GT_PARAMS, f), GT_PARAMS);
    fclose(f);
}

#endif
