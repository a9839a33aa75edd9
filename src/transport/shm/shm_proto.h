/*
 * The shm transport's shared-memory formats, all in one place.
 *
 * Every rank owns one control segment (a memfd, mode 0600, never linked in
 * any file system, so nothing outlives the processes that map it). Peers map
 * it through /proc/<owner pid>/fd/<fd>. It holds, at fixed offsets:
 *
 *   line 0   gs_shm_ctrl_head    identity; written once before it is shared
 *   line 1   gs_shm_wake         the owner's waiter flag and futex doorbell
 *   line 2   gs_shm_state        closed flag (set by a clean gs_tp_close)
 *   rings    one gs_shm_ring per source rank: notifications INTO the owner
 *   regions  gs_shm_region[GS_SHM_MAX_REGIONS]: the owner's registrations
 *
 * Fields are fixed width, the version byte comes first, positions are
 * offsets from the start of the segment (never pointers), and every word
 * that two processes touch concurrently is accessed with __atomic builtins.
 */
#ifndef GS_SHM_PROTO_H
#define GS_SHM_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define GS_SHM_PROTO_VERSION 2
#define GS_SHM_MAGIC         0x6773686d63746c31ull /* "gshmctl1" */
#define GS_SHM_LINE          64

/* ------------------------------------------------------------------------ */
/* Control segment head                                                      */
/* ------------------------------------------------------------------------ */

typedef struct gs_shm_ctrl_head {
    uint8_t version; /* GS_SHM_PROTO_VERSION */
    uint8_t pad0[3];
    uint32_t rank;
    uint32_t size; /* ranks in the job = number of rings */
    int32_t pid;
    uint64_t magic;    /* GS_SHM_MAGIC: checked on map and by the cross-memory probe */
    uint64_t ring_off; /* offset of ring 0 */
    uint64_t ring_stride;
    uint64_t region_off; /* offset of the region table */
    uint64_t total_len;  /* bytes of the whole segment */
    uint8_t pad1[8];
} gs_shm_ctrl_head;

/* The owner sleeps on doorbell (FUTEX_WAIT, shared) only after setting
 * waiting = 1; a writer that publishes a notification then finds waiting
 * set bumps doorbell and calls FUTEX_WAKE. Both sides order their store
 * before their load with seq_cst, so one of them always sees the other. */
typedef struct gs_shm_wake {
    uint32_t waiting;
    uint32_t doorbell;
    uint8_t pad[GS_SHM_LINE - 8];
} gs_shm_wake;

typedef struct gs_shm_state {
    uint32_t closed; /* 1 after a clean close: not a lost peer */
    uint8_t pad[GS_SHM_LINE - 4];
} gs_shm_state;

_Static_assert(sizeof(gs_shm_ctrl_head) == GS_SHM_LINE, "head is one cache line");
_Static_assert(offsetof(gs_shm_ctrl_head, version) == 0, "version byte first");
_Static_assert(sizeof(gs_shm_wake) == GS_SHM_LINE, "wake is one cache line");
_Static_assert(sizeof(gs_shm_state) == GS_SHM_LINE, "state is one cache line");

#define GS_SHM_WAKE_OFF  ((uint64_t)GS_SHM_LINE)
#define GS_SHM_STATE_OFF ((uint64_t)(2 * GS_SHM_LINE))
#define GS_SHM_RING_OFF  ((uint64_t)(4 * GS_SHM_LINE))

/* ------------------------------------------------------------------------ */
/* Notification rings: one writer (the source rank), one reader (the owner)  */
/* ------------------------------------------------------------------------ */

/* Slots per ring (a power of two). A message takes 1 head slot plus
 * continuation slots for SEND payload beyond the inline bytes. */
#define GS_SHM_RING_SLOTS  2048u
#define GS_SHM_HEAD_INLINE 44u
#define GS_SHM_CONT_INLINE 60u

enum {
    GS_SHM_MSG_WRITE_IMM = 1, /* imm + length of the WRITE that preceded it */
    GS_SHM_MSG_SEND = 2,      /* payload inline in this slot and the continuation slots */
};

enum {
    GS_SHM_SLOT_WRAP = 1, /* the next message starts at the next lap's slot 0 */
};

/* Every slot, head or continuation, starts with seq = its absolute position
 * + 1 (mod 2^32). The reader expects seq == head + 1 at position head, so a
 * slot left over from an earlier lap never looks valid. The head slot's seq
 * is stored last (release), after its continuation slots.
 *
 * WRAP: the positions up to the next multiple of GS_SHM_RING_SLOTS are
 * skipped (never written), so the next message is in slot 0. The writer
 * sets it when the reader is close behind, so that a ping-pong cycles
 * through a few lines that stay in L1 instead of the whole ring; it never
 * sets it in one lap of every GS_SHM_FULL_LAP_EVERY (shm.h), so a skipped
 * slot is rewritten before the position counter (mod 2^32) could come back
 * to its stale seq.
 * ack: how far the writer has read the ring in the other direction (its
 * rx head when it wrote this slot): the reader of this slot learns from it
 * that its own ring has room, without reading the other process's head. */
typedef struct gs_shm_slot {
    uint32_t seq;
    uint8_t type;    /* GS_SHM_MSG_* */
    uint8_t flags;   /* GS_SHM_SLOT_* */
    uint16_t nslots; /* slots of this message, head included */
    uint32_t imm;
    uint32_t len; /* WRITE_IMM: bytes written; SEND: payload bytes */
    uint32_t ack;
    uint8_t data[GS_SHM_HEAD_INLINE];
} gs_shm_slot;

typedef struct gs_shm_cont {
    uint32_t seq;
    uint8_t data[GS_SHM_CONT_INLINE];
} gs_shm_cont;

/* The first position of the next lap after pos (pos itself if it starts one). */
#define GS_SHM_NEXT_LAP(pos) (((pos) + GS_SHM_RING_SLOTS - 1u) & ~(GS_SHM_RING_SLOTS - 1u))

/* head: the position the reader has consumed up to, published as it
 * consumes each message; the writer keeps its tail privately and re-reads
 * head only when it thinks the ring is full (acks usually tell it first). */
typedef struct gs_shm_ring_ctl {
    uint32_t head;
    uint8_t pad[GS_SHM_LINE - 4];
} gs_shm_ring_ctl;

typedef struct gs_shm_ring {
    gs_shm_ring_ctl ctl;
    gs_shm_slot slots[GS_SHM_RING_SLOTS];
} gs_shm_ring;

_Static_assert(sizeof(gs_shm_slot) == GS_SHM_LINE, "a slot is one cache line");
_Static_assert(sizeof(gs_shm_cont) == GS_SHM_LINE, "a continuation slot is one cache line");
_Static_assert(sizeof(gs_shm_ring_ctl) == GS_SHM_LINE, "ring control is one cache line");
_Static_assert((GS_SHM_RING_SLOTS & (GS_SHM_RING_SLOTS - 1)) == 0, "ring slots: a power of two");
_Static_assert(sizeof(gs_shm_ring) % 4096 == GS_SHM_LINE, "ring = one line + whole pages of slots");

/* The most slots one message takes: a SEND of GS_SEND_MAX bytes. */
#define GS_SHM_MSG_SLOTS(len)                                                                                \
    (1u + ((len) > GS_SHM_HEAD_INLINE                                                                        \
               ? ((len)-GS_SHM_HEAD_INLINE + GS_SHM_CONT_INLINE - 1) / GS_SHM_CONT_INLINE                    \
               : 0u))

/* ------------------------------------------------------------------------ */
/* Region table: what the owner registered; the truth peers check against    */
/* ------------------------------------------------------------------------ */

#define GS_SHM_MAX_REGIONS 16384u

enum {
    GS_SHM_REGION_MEMFD = 1, /* gs_mr_alloc: a memfd peers map (zero copy) */
    GS_SHM_REGION_USER = 2,  /* gs_mr_reg: caller memory, reached by process_vm_writev/readv */
};

/* key is stored last on registration (release) and cleared first on
 * deregistration; a reader loads it (acquire) and rejects 0 or a mismatch. */
typedef struct gs_shm_region {
    uint64_t key;
    uint64_t addr; /* owner's virtual address of byte 0 */
    uint64_t len;
    uint64_t ino; /* MEMFD: inode of the memfd, checked after opening it */
    int32_t fd;   /* MEMFD: the owner's descriptor number */
    uint32_t access;
    uint32_t kind; /* GS_SHM_REGION_* */
    uint8_t pad[GS_SHM_LINE - 44];
} gs_shm_region;

_Static_assert(sizeof(gs_shm_region) == GS_SHM_LINE, "a region record is one cache line");

/* ------------------------------------------------------------------------ */
/* The descriptor's backend part (gs_rmr_head.tail)                          */
/* ------------------------------------------------------------------------ */

typedef struct gs_shm_rmr_tail {
    uint32_t slot; /* index into the owner's region table */
    uint32_t kind; /* GS_SHM_REGION_*, informative: the table is the truth */
    uint8_t pad[24];
} gs_shm_rmr_tail;

_Static_assert(sizeof(gs_shm_rmr_tail) == 32, "tail fills gs_rmr_head.tail");

/* ------------------------------------------------------------------------ */
/* Address blob exchanged through the bootstrap store at open                */
/* ------------------------------------------------------------------------ */

#define GS_SHM_HOST_ID_MAX 128

typedef struct gs_shm_addr {
    uint8_t version; /* GS_SHM_PROTO_VERSION */
    uint8_t pad[3];
    int32_t pid;
    int32_t ctrl_fd;
    uint32_t rank;
    uint64_t ctrl_ino;
    uint64_t ctrl_len;
    uint64_t ctrl_addr; /* the owner's own mapping: target of the cross-memory probe */
    char host_id[GS_SHM_HOST_ID_MAX];
} gs_shm_addr;

_Static_assert(offsetof(gs_shm_addr, version) == 0, "version byte first");
_Static_assert(sizeof(gs_shm_addr) == 40 + GS_SHM_HOST_ID_MAX, "address blob layout");

/* Per-rank result of connecting, exchanged so every rank fails together. */
typedef struct gs_shm_ready {
    int32_t status;  /* gs_status of this rank's connect */
    uint32_t cma_ok; /* process_vm_readv reached every peer */
    char why[120];   /* first failure, for the other ranks' messages */
} gs_shm_ready;

_Static_assert(sizeof(gs_shm_ready) == 128, "ready blob layout");

#endif
