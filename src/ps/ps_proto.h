/*
 * The parameter server's formats, alone in this header: the memory a server
 * exposes for each shard (read, written and atomically added to by workers),
 * the notices a server writes back into its workers, the 32-bit immediates
 * of WRITE_IMM, and the checkpoint file. Fixed-width fields, offsets not
 * pointers, little-endian host order (every supported host is).
 *
 * Per shard, on its server:
 *
 *   param region (REMOTE_READ)       slot region (REMOTE_WRITE)     acc region (REMOTE_ATOMIC)
 *   +--------------------------+     +----------------------+       +---------------------+
 *   | gs_ps_head (64 B)        |     | worker 0 gradient    |       | gs_ps_acc_head      |
 *   | gs_ps_wstate[W]          |     | worker 1 gradient    |       | arrived[W] (u64)    |
 *   | parameters (f32, count)  |     | ...  (slot_bytes)    |       | acc[count] (i64)    |
 *   +--------------------------+     +----------------------+       +---------------------+
 *
 * The whole param region is guarded by the seqlock in head.seq: the server
 * makes it odd before it rewrites anything in the region and even (two
 * more) afterwards. A worker reads head, then the region, then head again
 * (each READ fenced behind the previous) and keeps the copy only if both
 * heads carry the same even seq.
 */
#ifndef GS_PS_PROTO_H
#define GS_PS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define GS_PS_LAYOUT_VERSION 1
#define GS_PS_ALIGN          64

static inline uint64_t gs_ps_align_up(uint64_t bytes)
{
    return (bytes + GS_PS_ALIGN - 1) / GS_PS_ALIGN * GS_PS_ALIGN;
}

/* ---- param region ------------------------------------------------------- */

typedef struct gs_ps_head {
    uint64_t seq;      /* seqlock: odd while the server rewrites the region */
    uint64_t version;  /* updates applied to this shard since registration */
    uint64_t min_step; /* smallest `applied` among the live workers (SSP) */
    uint64_t epoch;    /* incarnation of the server that wrote it (1 at first start) */
    uint8_t layout;    /* GS_PS_LAYOUT_VERSION */
    uint8_t pad[3];
    uint32_t workers;
    uint64_t count;    /* f32 elements */
    uint64_t data_off; /* bytes from the region start to the parameters */
    uint32_t counted;  /* sync: the pushes the last applied round counted (elastic: fewer than workers
                          once one is lost); 0 before the first round and in async mode */
    uint32_t reserved;
} gs_ps_head;
_Static_assert(sizeof(gs_ps_head) == GS_PS_ALIGN, "the head is one cache line");
_Static_assert(offsetof(gs_ps_head, seq) == 0, "seq comes first");

/* One worker's progress on the shard. */
typedef struct gs_ps_wstate {
    uint64_t received; /* pushes whose gradient has arrived (sync: up to one ahead of applied) */
    uint64_t applied;  /* pushes applied to the parameters */
    uint64_t saved;    /* pushes applied and covered by the last checkpoint */
    uint64_t flags;    /* GS_PS_WSTATE_LOST */
} gs_ps_wstate;
_Static_assert(sizeof(gs_ps_wstate) == 32, "wstate is 32 bytes");

enum { GS_PS_WSTATE_LOST = 1u << 0 };

static inline uint64_t gs_ps_param_data_off(uint32_t workers)
{
    return gs_ps_align_up(sizeof(gs_ps_head) + (uint64_t)workers * sizeof(gs_ps_wstate));
}

static inline uint64_t gs_ps_param_region_bytes(uint32_t workers, uint64_t count)
{
    return gs_ps_param_data_off(workers) + gs_ps_align_up(count * sizeof(float));
}

/* ---- slot region -------------------------------------------------------- */

static inline uint64_t gs_ps_slot_bytes(uint64_t count)
{
    return gs_ps_align_up(count * sizeof(float));
}

/* ---- accumulator region (GS_PS_AGG=atomic) ------------------------------ */

typedef struct gs_ps_acc_head {
    uint64_t arrivals; /* +1 per worker per step once its adds are done; W: complete */
    uint64_t overflow; /* nonzero: a worker saw an accumulator wrap; the step is refused */
    uint64_t pad[6];
} gs_ps_acc_head;
_Static_assert(sizeof(gs_ps_acc_head) == GS_PS_ALIGN, "the accumulator head is one cache line");

static inline uint64_t gs_ps_acc_data_off(uint32_t workers)
{
    return sizeof(gs_ps_acc_head) + gs_ps_align_up((uint64_t)workers * sizeof(uint64_t));
}

static inline uint64_t gs_ps_acc_region_bytes(uint32_t workers, uint64_t count)
{
    return gs_ps_acc_data_off(workers) + gs_ps_align_up(count * sizeof(int64_t));
}

/* ---- notices: server -> worker, one record per shard of a key ----------- */

typedef struct gs_ps_notice {
    uint64_t version;  /* shard version after the event */
    uint64_t min_step; /* as in the head */
    uint64_t received; /* this worker's wstate */
    uint64_t applied;
    uint64_t saved;
    uint64_t epoch;
    int32_t status; /* GS_OK, or an error the server reports on this shard */
    int32_t worker; /* the worker an error is about, -1 if none */
    uint64_t pad;
} gs_ps_notice;
_Static_assert(sizeof(gs_ps_notice) == GS_PS_ALIGN, "a notice is one cache line");

/* ---- immediates --------------------------------------------------------- */

/* bits 31..30: kind. PUSH and ATOMIC (worker -> server): bits 29..12 the
 * shard's index on its server, 11..0 the push's step modulo 4096 (checked
 * against the server's count). NOTICE (server -> worker): bits 29..0 the
 * shard's index in the worker's table. CTRL (both ways): bits 29..24 the
 * command, 23..0 its argument. */
enum { GS_PS_IMM_PUSH = 0, GS_PS_IMM_ATOMIC = 1, GS_PS_IMM_CTRL = 2, GS_PS_IMM_NOTICE = 3 };
#define GS_PS_IMM_SHARD_BITS    18
#define GS_PS_IMM_STEP_BITS     12
#define GS_PS_IMM_STEP_MASK     ((1u << GS_PS_IMM_STEP_BITS) - 1)
#define GS_PS_MAX_SERVER_SHARDS (1u << GS_PS_IMM_SHARD_BITS)
#define GS_PS_MAX_WORKER_SHARDS (1u << 30)

enum {
    GS_PS_CTRL_BYE = 1,     /* worker -> server: this worker is done */
    GS_PS_CTRL_CKPT,        /* worker -> server: checkpoint now; arg = request number */
    GS_PS_CTRL_CKPT_DONE,   /* server -> worker: checkpoint written; arg = request number */
    GS_PS_CTRL_CKPT_FAILED, /* server -> worker: checkpoint failed; arg = request number */
    GS_PS_CTRL_RECOVER,     /* either way: join recovery; arg = server << 12 | incarnation */
    GS_PS_CTRL_INIT,        /* worker 0 -> server: initial values are in slot 0; arg = server shard index */
    GS_PS_CTRL_FIRST,       /* worker -> server: first to add to a step (atomic); arg = server shard index */
};

static inline uint32_t gs_ps_imm_push(int kind, uint32_t shard, uint64_t step)
{
    return (uint32_t)kind << 30 | shard << GS_PS_IMM_STEP_BITS | (uint32_t)(step & GS_PS_IMM_STEP_MASK);
}
static inline uint32_t gs_ps_imm_notice(uint32_t shard)
{
    return (uint32_t)GS_PS_IMM_NOTICE << 30 | shard;
}
static inline uint32_t gs_ps_imm_ctrl(uint32_t cmd, uint32_t arg)
{
    return (uint32_t)GS_PS_IMM_CTRL << 30 | (cmd & 0x3fu) << 24 | (arg & 0xffffffu);
}
static inline int gs_ps_imm_kind(uint32_t imm)
{
    return (int)(imm >> 30);
}
static inline uint32_t gs_ps_imm_shard(uint32_t imm)
{
    return (imm >> GS_PS_IMM_STEP_BITS) & (GS_PS_MAX_SERVER_SHARDS - 1);
}
static inline uint32_t gs_ps_imm_step(uint32_t imm)
{
    return imm & GS_PS_IMM_STEP_MASK;
}
static inline uint32_t gs_ps_imm_notice_shard(uint32_t imm)
{
    return imm & (GS_PS_MAX_WORKER_SHARDS - 1);
}
static inline uint32_t gs_ps_imm_ctrl_cmd(uint32_t imm)
{
    return (imm >> 24) & 0x3fu;
}
static inline uint32_t gs_ps_imm_ctrl_arg(uint32_t imm)
{
    return imm & 0xffffffu;
}

/* ---- checkpoint file ---------------------------------------------------- */

/*
 * <prefix>.server<i>.ckpt, one per server, replaced atomically (written to a
 * temporary file in the same directory, fsync'ed, renamed over, directory
 * fsync'ed). Layout:
 *
 *   gs_ps_ckpt_header                                  (128 B)
 *   nkeys x gs_ps_ckpt_key                             every registered key, in order
 *   nshards x { gs_ps_ckpt_shard, uint64 applied[workers],
 *               f32 params[count], f32 state[nstate][count] }
 *
 * Each f32 array is padded with zeros to a multiple of 8 bytes, so every
 * record stays 8-byte aligned. payload_crc is CRC-32C over everything after the header; header_crc over
 * the header with header_crc itself zero.
 */
#define GS_PS_CKPT_MAGIC   "GSPSCKPT"
#define GS_PS_CKPT_VERSION 1

typedef struct gs_ps_ckpt_header {
    char magic[8];         /* GS_PS_CKPT_MAGIC, no NUL */
    uint8_t version;       /* GS_PS_CKPT_VERSION */
    uint8_t optimizer;     /* gs_ps_optimizer */
    uint8_t mode;          /* gs_ps_mode */
    uint8_t nstate;        /* optimizer state vectors per shard */
    uint32_t header_bytes; /* sizeof(gs_ps_ckpt_header) */
    uint32_t server;       /* index of the server among the servers */
    uint32_t servers;
    uint32_t workers;
    uint32_t nkeys;
    uint32_t nshards;     /* shards of this server in the file */
    uint32_t epoch;       /* incarnation of the server that wrote it */
    uint64_t step;        /* smallest shard version in the file */
    uint64_t shard_bytes; /* GS_PS_SHARD_BYTES of the plan */
    uint64_t payload_bytes;
    float lr, momentum, beta1, beta2, eps, weight_decay;
    uint32_t payload_crc;
    uint32_t header_crc;
    uint8_t reserved[32];
} gs_ps_ckpt_header;
_Static_assert(sizeof(gs_ps_ckpt_header) == 128, "checkpoint header is 128 bytes");
_Static_assert(offsetof(gs_ps_ckpt_header, version) == 8, "version byte right after the magic");

typedef struct gs_ps_ckpt_key {
    uint64_t key;
    uint64_t count;
} gs_ps_ckpt_key;
_Static_assert(sizeof(gs_ps_ckpt_key) == 16, "key record is 16 bytes");

typedef struct gs_ps_ckpt_shard {
    uint64_t key;
    uint32_t index; /* shard index within the key */
    uint32_t pad;
    uint64_t offset; /* first element within the key */
    uint64_t count;
    uint64_t version;
    uint64_t opt_steps; /* optimizer steps taken (Adam's t) */
} gs_ps_ckpt_shard;
_Static_assert(sizeof(gs_ps_ckpt_shard) == 48, "shard record is 48 bytes");

#endif
