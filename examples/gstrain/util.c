/* gstrain's small helpers. */
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

int gt_rank = -1;
int gt_elastic = 0;

gs_status gt_fail(gs_status status, const char *fmt, ...)
{
    va_list ap;
    const char *what = gt_elastic && status == GS_ERR_PEER_LOST ? "rank lost, recovering" : "error";
    if (gt_rank >= 0)
        fprintf(stderr, "gstrain: rank %d: %s: ", gt_rank, what);
    else
        fprintf(stderr, "gstrain: %s: ", what);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    return status;
}

const char *gt_lib_error(void)
{
    const char *text = gs_last_error();
    int rank = -1, used = 0;
    if (gt_rank >= 0 && sscanf(text, "rank %d: %n", &rank, &used) == 1 && used > 0 && rank == gt_rank)
        return text + used;
    return text;
}

double gt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t gt_hash64(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
