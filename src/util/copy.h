/* Copies of buffers too large for the cache. */
#ifndef GS_UTIL_COPY_H
#define GS_UTIL_COPY_H

#include <stddef.h>

/* memcpy with non-temporal (streaming) stores where the CPU has them (AVX),
 * else memcpy; dst and src must not overlap. Writing a large buffer the
 * usual way first reads every destination line in (a read for ownership)
 * and evicts what the cache held; streaming skips both. Ends with a store
 * fence: every byte is visible to other CPUs before anything stored after
 * the call (a flag, a ring message). */
void gs_copy_nt(void *dst, const void *src, size_t len);
/* The same without the closing fence, for a run of copies that ends with
 * one gs_copy_nt_fence (blocks streamed out one after the other). */
void gs_copy_nt_unfenced(void *dst, const void *src, size_t len);
void gs_copy_nt_fence(void);

#endif
