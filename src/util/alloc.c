/* Page-aligned, pre-touched allocation and its rounding helpers (alloc.h).
 * Knows nothing of the layers above. */
#include "util/alloc.h"

#include "util/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

size_t gs_page_size(void)
{
    static size_t page;
    if (!page)
        page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

size_t gs_round_up(size_t value, size_t align)
{
    return (value + align - 1) / align * align;
}

void gs_pages_touch(void *ptr, size_t len)
{
    size_t page = gs_page_size();
    volatile char *p = ptr;
    for (size_t off = 0; off < len; off += page)
        p[off] = 0;
}

gs_status gs_pages_alloc(size_t len, void **ptr_p)
{
    size_t rounded = gs_round_up(len ? len : 1, gs_page_size());
    void *ptr = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED)
        return gs_fail(GS_SUBSYS_UTIL, GS_ERR_NOMEM, "mmap of %zu bytes failed: %s", rounded,
                       strerror(errno));
    gs_pages_touch(ptr, rounded);
    *ptr_p = ptr;
    return GS_OK;
}

void gs_pages_free(void *ptr, size_t len)
{
    if (ptr && munmap(ptr, gs_round_up(len ? len : 1, gs_page_size())) != 0)
        gs_log_warn(UTIL, "munmap of %zu bytes failed: %s", len, strerror(errno));
}

void *gs_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        gs_fail(GS_SUBSYS_UTIL, GS_ERR_NOMEM, "allocation of %zu x %zu bytes failed", count, size);
    return p;
}
