/* Names and sizes of the data types and reduction operators. */
#include "util/dtype.h"

size_t gs_dtype_size(gs_dtype dtype)
{
    return gs_dtype_bytes(dtype);
}

const char *gs_dtype_name(gs_dtype dtype)
{
    static const char *const names[GS_DTYPE_COUNT] = {
        [GS_F32] = "f32", [GS_F64] = "f64", [GS_F16] = "f16", [GS_BF16] = "bf16", [GS_I32] = "i32",
        [GS_I64] = "i64", [GS_U8] = "u8",   [GS_I8] = "i8",   [GS_I16] = "i16",   [GS_BOOL] = "bool",
    };
    return (unsigned)dtype < GS_DTYPE_COUNT ? names[dtype] : "?";
}

const char *gs_redop_name(gs_redop op)
{
    static const char *const names[GS_REDOP_COUNT] = {
        [GS_SUM] = "sum",   [GS_AVG] = "avg",   [GS_MIN] = "min", [GS_MAX] = "max",
        [GS_PROD] = "prod", [GS_BAND] = "band", [GS_BOR] = "bor", [GS_BXOR] = "bxor",
    };
    return (unsigned)op < GS_REDOP_COUNT ? names[op] : "?";
}
