/*
 * The collectives' wire format, all in one place.
 *
 * Every rank registers one inbox region. For each peer it holds, at fixed
 * offsets from the peer block's start:
 *
 *   GS_COLL_SLOTS data slots   each: gs_coll_hdr + payload (GS_CHUNK_BYTES)
 *   credit word                the peer's count of messages it has released
 *   control slot               an abort notice (gs_coll_abort)
 *
 * A data message is one WRITE_IMM of header + payload into the next slot of
 * the receiver's block for the sender (message m goes to slot m mod
 * GS_COLL_SLOTS), or a WRITE of the payload followed by a WRITE_IMM of the
 * header alone (GS_COLL_HDR_APART: the payload comes from user memory). The sender may have at most
 * GS_COLL_SLOTS messages unreleased by the receiver. The immediate carries the message's chunk and step id
 * (low bits) and, piggy-backed, a credit: the sender's released count of the channel flowing the other way;
 * without traffic that way credits go as an 8-byte WRITE_IMM of the credit word (GS_COLL_IMM_CREDIT). The
 * header holds nothing specific to one channel, so one outbox copy can be written to every peer.
 *
 * Every header carries the full call descriptor (collective, count, type,
 * operator, root, algorithm, sequence number), so the receiver checks each
 * message against its own call: that is how mismatched calls are found.
 */
#ifndef GS_COLL_PROTO_H
#define GS_COLL_PROTO_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

#define GS_COLL_PROTO_VERSION                                                                                \
    6 /* 2: gs_coll_hdr.flags (a payload written apart); 3: box posts by reference; 4: hier; 5: hier for     \
       * uneven hosts, reduce_scatter and allgather; 6: box posts name a result buffer to write into */
#define GS_COLL_SLOTS      4    /* data slots per peer (credits) */
#define GS_COLL_HDR_BYTES  48   /* payload starts here: up to 16 payload bytes share the header's line */
#define GS_COLL_CTRL_BYTES 1024 /* the control slot */
#define GS_COLL_LINE       64

/* The collectives, as carried in headers. */
typedef enum gs_coll_kind {
    GS_COLL_ALLREDUCE = 1,
    GS_COLL_REDUCE_SCATTER,
    GS_COLL_ALLGATHER,
    GS_COLL_BROADCAST,
    GS_COLL_BARRIER,
    GS_COLL_ALLREDUCE_MULTI,
    GS_COLL_REDUCE,
    GS_COLL_GATHER,
    GS_COLL_SCATTER,
    GS_COLL_ALLTOALL,
    GS_COLL_ALLTOALLV,
    GS_COLL_ALLGATHERV,
    GS_COLL_REDUCE_SCATTER_V,
    GS_COLL_KIND_END /* one past the last */
} gs_coll_kind;

/* The algorithms, as carried in headers (0 = none: one rank, no messages). */
typedef enum gs_coll_algo_id {
    GS_COLL_ALGO_LOCAL = 0,
    GS_COLL_ALGO_RING,
    GS_COLL_ALGO_RD,
    GS_COLL_ALGO_DIRECT,
    GS_COLL_ALGO_PAIRWISE,
    GS_COLL_ALGO_HIER,
} gs_coll_algo_id;

typedef struct gs_coll_hdr {
    uint8_t version; /* GS_COLL_PROTO_VERSION */
    uint8_t kind;    /* gs_coll_kind */
    uint8_t dtype;   /* gs_dtype */
    uint8_t op;      /* gs_redop */
    uint8_t algo;    /* gs_coll_algo_id */
    uint8_t flags;   /* GS_COLL_HDR_* */
    uint8_t pad[2];
    int32_t root;    /* broadcast, reduce, gather, scatter: the root; allreduce_multi: hash of the
                      * tensor list; allgatherv, reduce_scatter_v: hash of the counts; else -1 */
    uint32_t sender; /* rank */
    uint64_t seq;    /* the call's number on the communicator, from 1 */
    uint64_t count;  /* the call's count argument (allreduce_multi, allgatherv, reduce_scatter_v: total
                      * elements; alltoallv: the elements the sender sends the receiver) */
    uint32_t unit;   /* the algorithm's step id, checked by the receiver */
    uint32_t bytes;  /* payload bytes that follow */
    /* 0; in a box post by parts of 2 ranks, when it was posted (CLOCK_MONOTONIC ns, box.c); alltoallv:
     * the elements the sender expects from the receiver */
    uint64_t reserved;
} gs_coll_hdr;

/* Header flags. APART: the payload was written into the slot by a WRITE of
 * its own, posted just before the WRITE_IMM of this header (which then
 * carries the header alone), so that it can go straight from the caller's
 * memory; RC ordering puts it in place before the header's notification. */
#define GS_COLL_HDR_APART 0x1u
/* REF: a box post whose payload is a gs_coll_box_ref naming the poster's
 * registered input, not the data: readers copy straight from it. INTO: the
 * payload names the poster's result buffer, which its peers write their
 * share into (box_ref.c). */
#define GS_COLL_HDR_REF   0x2u
#define GS_COLL_HDR_INTO  0x4u
#define GS_COLL_HDR_FLAGS (GS_COLL_HDR_APART | GS_COLL_HDR_REF | GS_COLL_HDR_INTO)

/* A post by reference: where the poster's data of this column lies, and
 * where its peers may write. */
typedef struct gs_coll_box_ref {
    gs_rmr region;   /* REF: the poster's send buffer, registered for remote reads */
    uint64_t offset; /* of the post's data (its piece 0) in the region */
    uint64_t stride; /* pieces: bytes between one rank's piece and the next */
    gs_rmr into;     /* INTO: the poster's whole result buffer, registered for remote writes */
    uint64_t pushed; /* REF, a broadcast's root: bytes it writes into each poster of INTO (0 or 1/n) */
} gs_coll_box_ref;
_Static_assert(sizeof(gs_coll_box_ref) == 2 * GS_RMR_BYTES + 24, "box reference layout");

_Static_assert(offsetof(gs_coll_hdr, version) == 0, "version byte first");
_Static_assert(offsetof(gs_coll_hdr, flags) == 5 && offsetof(gs_coll_hdr, root) == 8, "header layout");
_Static_assert(sizeof(gs_coll_hdr) == GS_COLL_HDR_BYTES, "header layout");

/* Immediates: the kind in the top 2 bits. Data: bits 16..29 the low 14 bits
 * of the message's step id (checked against its header), bits 0..15 the
 * low 16 bits of the sender's released count of the opposite channel (a
 * credit: at most GS_COLL_SLOTS apart from what the receiver knows). Credit
 * and abort: 0 (the word or notice written carries the rest). */
enum { GS_COLL_IMM_DATA = 0, GS_COLL_IMM_CREDIT = 1, GS_COLL_IMM_ABORT = 2 };
#define GS_COLL_IMM(kind, unit, ack)                                                                         \
    (((uint32_t)(kind) << 30) | (((uint32_t)(unit)&0x3fffu) << 16) | ((uint32_t)(ack)&0xffffu))
#define GS_COLL_IMM_KIND(imm) ((uint32_t)(imm) >> 30)
#define GS_COLL_IMM_UNIT(imm) (((uint32_t)(imm) >> 16) & 0x3fffu)
#define GS_COLL_IMM_ACK(imm)  ((uint32_t)(imm)&0xffffu)

/* The abort notice: a rank found a mismatch or failed; every peer fails its
 * current call (and the communicator) with status and this text. */
typedef struct gs_coll_abort {
    uint8_t version;
    uint8_t pad[3];
    int32_t status; /* gs_status */
    uint32_t rank;  /* who detected it */
    uint32_t len;   /* bytes of text, not counting a terminating zero */
    uint64_t seq;   /* the call it concerns */
    char text[GS_COLL_CTRL_BYTES - 24];
} gs_coll_abort;

_Static_assert(sizeof(gs_coll_abort) == GS_COLL_CTRL_BYTES, "abort notice fills the control slot");

/* ---- point-to-point (p2p.c) ------------------------------------------------
 *
 * Sends and receives travel apart from the collectives, as the transport's
 * two-sided SEND/RECV (at most GS_P2P_FRAME_MAX = GS_SEND_MAX bytes each):
 * every frame is an envelope, optionally followed by payload.
 *
 *   EAGER  a whole message of at most GS_P2P_EAGER_MAX bytes, inline after
 *          the envelope's first GS_P2P_EAGER_HDR_BYTES (it has no offset):
 *          an 8-byte message is a 40-byte frame, one slot of the shm ring
 *   RTS    a larger one: the payload is the sender's gs_rmr of the message,
 *          registered for remote read; the receiver READs it into its
 *          buffer once a receive matches, then answers FIN
 *   FIN    the receiver is done with an RTS message (msg names it; status
 *          GS_OK, or its error: the sender's send fails with it too)
 *   FRAG   a larger message where user memory cannot be registered: piece
 *          by piece inline, offset says where; the first (offset 0) is the
 *          one matched
 *
 *   WAKE   no message: the receiver blocks in the transport while one
 *          waits for it in the sender's mailbox (p2p_mail.c)
 *
 * msg numbers the sender's messages to one peer from 1 (FIFO order, the
 * FIN's reference), whether they travel as frames or, between ranks that
 * share the boxes, as mailbox messages: the receiver takes them in that
 * order. Layouts of the collectives are untouched, so their
 * version byte stays.
 */
#define GS_P2P_PROTO_VERSION   3
#define GS_P2P_FRAME_MAX       4096 /* == GS_SEND_MAX (checked in p2p.c) */
#define GS_P2P_ENV_BYTES       40
#define GS_P2P_EAGER_HDR_BYTES 32 /* an EAGER frame's envelope: up to offset */
#define GS_P2P_EAGER_MAX       (GS_P2P_FRAME_MAX - GS_P2P_ENV_BYTES)

enum { GS_P2P_EAGER = 1, GS_P2P_RTS, GS_P2P_FIN, GS_P2P_FRAG, GS_P2P_WAKE };

typedef struct gs_p2p_env {
    uint8_t version; /* GS_P2P_PROTO_VERSION */
    uint8_t type;    /* GS_P2P_EAGER ... */
    uint8_t dtype;   /* gs_dtype of the send */
    uint8_t pad;
    int32_t tag;
    uint32_t sender; /* rank */
    int32_t status;  /* FIN: gs_status of the receive; else 0 */
    uint64_t msg;    /* the sender's message number to this receiver, from 1 */
    uint64_t bytes;  /* the whole message's bytes */
    uint64_t offset; /* FRAG: where this piece goes; FIN: the receiver's capacity in bytes */
} gs_p2p_env;

_Static_assert(offsetof(gs_p2p_env, version) == 0, "version byte first");
_Static_assert(offsetof(gs_p2p_env, msg) == 16, "envelope layout");
_Static_assert(sizeof(gs_p2p_env) == GS_P2P_ENV_BYTES, "envelope layout");
_Static_assert(offsetof(gs_p2p_env, offset) == GS_P2P_EAGER_HDR_BYTES,
               "an EAGER frame ends its envelope there");

#endif
