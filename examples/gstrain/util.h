/* gstrain's small helpers: error reporting, clock, the counter-based random
 * numbers (reproduced exactly by examples/pytorch/train_ddp.py) and the
 * weight hash. */
#ifndef GT_UTIL_H
#define GT_UTIL_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

/* A contiguous part [offset, offset + count) of the parameter / gradient
 * vector, exchanged as one (a bucket). */
typedef struct gt_segment {
    size_t offset, count;
} gt_segment;

/* This process's rank, printed with every error (-1 before it is known). */
extern int gt_rank;

/* --elastic: a lost rank is recovered from, so gt_fail reports
 * GS_ERR_PEER_LOST as such rather than as an error. */
extern int gt_elastic;

/* Prints "gstrain: rank R: error: <message>" to stderr and returns status
 * (with gt_elastic and GS_ERR_PEER_LOST: "rank lost, recovering: "). */
gs_status gt_fail(gs_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* gs_last_error() without its leading "rank R: " when R is gt_rank, so a
 * message of gt_fail names the rank once. */
const char *gt_lib_error(void);
/* Monotonic seconds. */
double gt_now_s(void);

/* splitmix64's finalizer: a bijective 64-bit mixer. */
static inline uint64_t gt_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The key of random stream `stream` under `seed`. */
static inline uint64_t gt_rand_key(uint64_t seed, uint64_t stream)
{
    return gt_mix64(gt_mix64(seed) ^ (stream * 0xd1b54a32d192ed03ull));
}

/* Draw i of the stream with this key: counter-based, so any draw can be
 * computed on its own (and vectorized in numpy). */
static inline uint64_t gt_rand_at(uint64_t key, uint64_t i)
{
    return gt_mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
}

/* A uniform float in [0, 1) with 24 random bits (exact in float). */
static inline float gt_rand_unit(uint64_t key, uint64_t i)
{
    return (float)(gt_rand_at(key, i) >> 40) * 0x1p-24f;
}

/* Random streams. */
enum { GT_STREAM_INIT = 1, GT_STREAM_SHUFFLE = 2 };

/* FNV-1a over the bytes of a buffer, 64-bit. */
uint64_t gt_hash64(const void *data, size_t len);

#endif
