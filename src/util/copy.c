/* memcpy with streaming (non-temporal) stores and a closing fence, for
 * buffers too large for the cache; plain memcpy where the CPU has no AVX
 * (copy.h). Knows nothing of the layers above. */
#include "util/copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* Head bytes up to 32-byte alignment of dst and the tail through memcpy,
 * the middle 128 bytes per turn with 32-byte streaming stores. */
__attribute__((target("avx"))) static void copy_nt_avx(uint8_t *d, const uint8_t *s, size_t n)
{
    size_t head = (32 - ((uintptr_t)d & 31)) & 31;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)s),
                x1 = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(s + 64)),
                x3 = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, x0);
        _mm256_stream_si256((__m256i *)(d + 32), x1);
        _mm256_stream_si256((__m256i *)(d + 64), x2);
        _mm256_stream_si256((__m256i *)(d + 96), x3);
    }
    for (; n >= 32; n -= 32, d += 32, s += 32)
        _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
    memcpy(d, s, n);
}

void gs_copy_nt_unfenced(void *dst, const void *src, size_t len)
{
    if (len >= 256 && __builtin_cpu_supports("avx"))
        copy_nt_avx(dst, src, len);
    else
        memcpy(dst, src, len);
}

void gs_copy_nt_fence(void)
{
    _mm_sfence();
}
#else
void gs_copy_nt_unfenced(void *dst, const void *src, size_t len)
{
    memcpy(dst, src, len);
}

void gs_copy_nt_fence(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
#endif

void gs_copy_nt(void *dst, const void *src, size_t len)
{
    gs_copy_nt_unfenced(dst, src, len);
    gs_copy_nt_fence();
}
