/* Element sizes inline, for hot paths that cannot afford a call
 * (gs_dtype_size is the public form of the same). */
#ifndef GS_UTIL_DTYPE_H
#define GS_UTIL_DTYPE_H

#include "gradsync.h"

/* Bytes of one element of dtype, 0 for an unknown type. */
static inline size_t gs_dtype_bytes(gs_dtype dtype)
{
    static const unsigned char sizes[GS_DTYPE_COUNT] = {
        [GS_F32] = 4, [GS_F64] = 8, [GS_F16] = 2, [GS_BF16] = 2, [GS_I32] = 4,
        [GS_I64] = 8, [GS_U8] = 1,  [GS_I8] = 1,  [GS_I16] = 2,  [GS_BOOL] = 1,
    };
    return (unsigned)dtype < GS_DTYPE_COUNT ? sizes[dtype] : 0;
}

#endif
