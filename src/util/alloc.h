/* Page-aligned, pre-touched allocation. */
#ifndef GS_UTIL_ALLOC_H
#define GS_UTIL_ALLOC_H

#include "gradsync.h"

#include <stddef.h>

size_t gs_page_size(void);
size_t gs_round_up(size_t value, size_t align);
/* len bytes (rounded up to pages), page-aligned, every page touched so the
 * first use on the hot path takes no fault. Free with gs_pages_free. */
gs_status gs_pages_alloc(size_t len, void **ptr_p);
void gs_pages_free(void *ptr, size_t len);
/* Touches every page of [ptr, ptr+len) with a write of zero. */
void gs_pages_touch(void *ptr, size_t len);
/* Zeroed malloc that logs what ran out. */
void *gs_calloc(size_t count, size_t size);

#endif
