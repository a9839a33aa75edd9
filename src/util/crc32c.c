/* CRC-32C: the SSE4.2 instruction where the CPU has it, a table built once
 * otherwise, the same results (crc32c.h). The parameter server checks its
 * checkpoint files with it; this file knows nothing of them. */
#include "util/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY_REFLECTED 0x82f63b78u

static uint32_t table[256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY_REFLECTED : c >> 1;
        table[i] = c;
    }
}

uint32_t gs_crc32c_table(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    pthread_once(&table_once, table_init);
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, sizeof(word));
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

uint32_t gs_crc32c(uint32_t crc, const void *data, size_t len)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_sse42(crc, data, len);
#endif
    return gs_crc32c_table(crc, data, len);
}
