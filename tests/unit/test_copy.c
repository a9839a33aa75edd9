/* Streaming copies: every length and alignment lands byte for byte, and
 * nothing outside the destination range is touched. */
#include "gs_test.h"
#include "util/copy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 64

static void fill(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 131u + seed);
}

/* Copies len bytes from src + soff to dst + doff; checks the copy and the guards around it. */
static int copy_ok(size_t len, size_t soff, size_t doff)
{
    size_t cap = len + 2 * GUARD + 64;
    uint8_t *src = malloc(cap), *dst = malloc(cap), *want = malloc(cap);
    int ok = src && dst && want && len <= (64u << 20); /* bounded: the compiler sees no wrap */
    if (ok) {
        fill(src, cap, 7);
        memset(dst, 0xa5, cap);
        memcpy(want, dst, cap);
        memcpy(want + GUARD + doff, src + soff, len);
        gs_copy_nt(dst + GUARD + doff, src + soff, len);
        ok = memcmp(dst, want, cap) == 0;
    }
    free(src);
    free(dst);
    free(want);
    return ok;
}

GS_TEST(streaming_copy_is_exact_at_every_length_and_alignment)
{
    static const size_t lens[] = {0, 1, 31, 32, 33, 127, 128, 129, 255, 256, 257, 4095, 4096, 65537};
    for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
        for (size_t soff = 0; soff < 64; soff += 13)
            for (size_t doff = 0; doff < 64; doff += 7)
                GS_ASSERT(copy_ok(lens[l], soff, doff));
}

GS_TEST(streaming_copy_of_several_mebibytes_is_exact)
{
    GS_ASSERT(copy_ok((3u << 20) + 5, 3, 17));
    GS_ASSERT(copy_ok(1u << 20, 0, 0));
}
