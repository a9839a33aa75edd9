/*
 * The shared-memory boxes' layout (box.c describes the protocol), shared by
 * box.c and the tiny path (tiny.c).
 *
 * Each rank owns one segment (a region of the transport) that every peer maps:
 *
 *   line 0                 wake: the owner's waiting flag and futex doorbell
 *   abort notice           a failure the owner announces (seq written last)
 *   GS_BOX_SLOTS slots     each: post number (u64) | call header | payload
 *   mail area              point-to-point mailboxes (p2p_mail.c)
 *
 * The first GS_BOX_LINE_BYTES of a slot's payload share the cache line of
 * its post number and header.
 */
#ifndef GS_COLL_BOX_H
#define GS_COLL_BOX_H

#include "coll/coll.h"

#define GS_BOX_SLOTS      2
#define GS_BOX_HEAD_BYTES 56 /* post number + header: payload starts here */
#define GS_BOX_LINE_BYTES (GS_COLL_LINE - GS_BOX_HEAD_BYTES)

typedef struct gs_box_wake {
    uint32_t waiting;
    uint32_t doorbell;
    uint8_t pad[GS_COLL_LINE - 8];
} gs_box_wake;

/* A failure this rank announces (it also tells peers through the transport,
 * but a peer waiting on boxes only polls that now and then). */
typedef struct gs_box_abort {
    uint64_t seq; /* the first failed call; stored last (release); 0: none */
    int32_t status;
    uint32_t len;
    char text[GS_COLL_CTRL_BYTES - 16];
} gs_box_abort;

typedef struct gs_box_head {
    uint64_t post; /* stored last (release) */
    gs_coll_hdr hdr;
} gs_box_head;

_Static_assert(sizeof(gs_box_wake) == GS_COLL_LINE, "wake is one cache line");
_Static_assert(sizeof(gs_box_abort) % GS_COLL_LINE == 0, "abort notice: whole lines");
_Static_assert(sizeof(gs_box_head) == GS_BOX_HEAD_BYTES, "post word and header, then the payload");
_Static_assert(GS_BOX_LINE_BYTES == 8, "8 payload bytes share the post word's line");

/* 2 ranks: where the tiny path looks, worked out once (tiny.c). */
typedef struct gs_box_pair {
    uint8_t *mine[GS_BOX_SLOTS];         /* my slots */
    const uint8_t *theirs[GS_BOX_SLOTS]; /* the peer's */
    const uint32_t *peer_waiting;        /* the peer's wake flag */
    const uint64_t *peer_abort;          /* the seq of the peer's abort notice */
} gs_box_pair;

struct gs_box {
    gs_mr *mr; /* this rank's segment, a region of the transport */
    size_t len;
    size_t slot_stride;
    uint8_t **seg;    /* [size]: every rank's segment as mapped here (seg[rank] is mine) */
    size_t *map_len;  /* [size]: the peers' mappings' lengths (gs_tp_unmap) */
    size_t mail_off;  /* where the p2p mail area starts in each segment (p2p_mail.c) */
    uint64_t posts;   /* posts made by this rank */
    gs_box_pair pair; /* 2 ranks */
};

#define GS_BOX_SLOTS_OFF (GS_COLL_LINE + sizeof(gs_box_abort))

static inline gs_box_wake *gs_box_wake_of(uint8_t *seg)
{
    return (gs_box_wake *)seg;
}

static inline gs_box_abort *gs_box_abort_of(uint8_t *seg)
{
    return (gs_box_abort *)(seg + GS_COLL_LINE);
}

/* Rank's slot for post number post. */
static inline gs_box_head *gs_box_slot(const gs_box *box, int rank, uint64_t post)
{
    return (gs_box_head *)(box->seg[rank] + GS_BOX_SLOTS_OFF +
                           (size_t)(post % GS_BOX_SLOTS) * box->slot_stride);
}

static inline uint8_t *gs_box_payload(gs_box_head *head)
{
    return (uint8_t *)head + GS_BOX_HEAD_BYTES;
}

/* Fills box->pair (2 ranks, every segment mapped). */
static inline void gs_box_pair_init(gs_box *box, int rank)
{
    int peer = rank ^ 1;
    for (uint64_t i = 0; i < GS_BOX_SLOTS; i++) {
        box->pair.mine[i] = (uint8_t *)gs_box_slot(box, rank, i);
        box->pair.theirs[i] = (const uint8_t *)gs_box_slot(box, peer, i);
    }
    box->pair.peer_waiting = &gs_box_wake_of(box->seg[peer])->waiting;
    box->pair.peer_abort = &gs_box_abort_of(box->seg[peer])->seq;
}

/* Wakes the peers that sleep on their doorbell (box.c). */
void gs_box_ring(gs_comm *comm);

/* ---- box_ref.c: posts by reference, the parts box.c calls */

/* Whether peer q's current post names its input (GS_COLL_HDR_REF). */
static inline bool gs_box_by_ref(const gs_coll_op *op, int q)
{
    const gs_comm *c = op->comm;
    return q != c->rank && (gs_box_slot(c->box, q, op->box_post)->hdr.flags & GS_COLL_HDR_REF);
}

/* Fills the payload of a post by reference; its header flags, 0 when the
 * post names nothing (then it is an ordinary empty post). */
uint8_t gs_box_ref_fill(gs_coll_op *op, const gs_prim *p, uint8_t *payload);
/* Bytes [at, at + len) of peer q's data for this rank into dst (in lmr). */
gs_status gs_box_ref_read(gs_coll_op *op, const gs_prim *p, int q, uint8_t *dst, gs_mr *lmr, size_t at,
                          size_t len);
/* What this rank reads of peer q's data (of p->bytes) into dst: all, the
 * part after what the peer writes into it, or nothing. */
gs_status gs_box_ref_take(gs_coll_op *op, const gs_prim *p, int q, uint8_t *dst);
/* What this rank writes into its peers' results in the receive step. */
gs_status gs_box_ref_push(gs_coll_op *op, const gs_prim *p);
/* The root's part of a reduce whose peers posted by reference. */
gs_status gs_box_ref_reduce(gs_coll_op *op, const gs_prim *p);

#endif
