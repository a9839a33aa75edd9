/* CRC-32C (Castagnoli), as used by iSCSI, ext4 and RocksDB: the SSE4.2
 * instruction where the CPU has it, a table otherwise (same results). */
#ifndef GS_UTIL_CRC32C_H
#define GS_UTIL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues crc (0 to start) over len bytes. */
uint32_t gs_crc32c(uint32_t crc, const void *data, size_t len);
/* The table version alone (for tests comparing the two). */
uint32_t gs_crc32c_table(uint32_t crc, const void *data, size_t len);

#endif
