/*
 * The point-to-point mailboxes: between ranks that share the boxes (one
 * host, shm), a message of at most GS_MAIL_MAX bytes goes straight into a
 * ring in its sender's box segment, where the receiver reads it: one cache
 * line a message, no transport SEND, no receive buffer to post again.
 *
 *   area      in every rank's segment, after the box slots (gs_box.mail_off):
 *               closed line   nonzero while the owner blocks in the transport
 *               taken[src]    a line per source: how many of src's messages
 *                             to the owner the owner has taken
 *               ring[dst]     GS_MAIL_SLOTS lines per destination: the
 *                             owner's messages to dst
 *   slot      seq (its ring position + 1, stored last, release) | msg | tag
 *             | bytes | dtype | data
 *
 * The owner writes only its own segment, and peers only read it, so a
 * peer's slot is copied out and checked before it is believed. This file
 * knows the layout; the message numbers that order mailbox messages against
 * the transport's, matching, and waking a closed receiver are p2p.c's.
 */
#include "coll/box.h"
#include "coll/coll.h"
#include "util/alloc.h"

#include <stdlib.h>
#include <string.h>

typedef struct gs_mail_slot {
    uint64_t seq;
    uint64_t msg;
    int32_t tag;
    uint32_t bytes;
    uint8_t dtype;
    uint8_t pad[7];
    uint8_t data[GS_MAIL_MAX];
} gs_mail_slot;

_Static_assert(sizeof(gs_mail_slot) == GS_COLL_LINE, "a mail slot is one cache line");

size_t gs_mail_area_bytes(int size)
{
    return (size_t)GS_COLL_LINE * (1u + (size_t)size + (size_t)size * GS_MAIL_SLOTS);
}

static uint8_t *area(const gs_comm *comm, int rank)
{
    return comm->box->seg[rank] + comm->box->mail_off;
}

static uint32_t *closed_of(const gs_comm *comm, int rank)
{
    return (uint32_t *)(void *)area(comm, rank);
}

/* In rank's segment: how many of src's messages rank took. */
static uint64_t *taken_of(const gs_comm *comm, int rank, int src)
{
    return (uint64_t *)(void *)(area(comm, rank) + GS_COLL_LINE * (1u + (size_t)src));
}

/* In from's segment: position pos of its ring to dst. */
static gs_mail_slot *slot_of(const gs_comm *comm, int from, int dst, uint64_t pos)
{
    size_t line = 1u + (size_t)comm->size + (size_t)dst * GS_MAIL_SLOTS + (size_t)(pos % GS_MAIL_SLOTS);
    return (gs_mail_slot *)(void *)(area(comm, from) + GS_COLL_LINE * line);
}

gs_status gs_mail_open(gs_mail *m, int size)
{
    m->head = gs_calloc((size_t)size, sizeof(uint64_t));
    m->acked = gs_calloc((size_t)size, sizeof(uint64_t));
    m->tail = gs_calloc((size_t)size, sizeof(uint64_t));
    return m->head && m->acked && m->tail ? GS_OK : GS_ERR_NOMEM;
}

void gs_mail_close(gs_mail *m)
{
    free(m->head);
    free(m->acked);
    free(m->tail);
}

bool gs_mail_post(gs_comm *comm, gs_mail *m, int peer, uint64_t msg, int tag, gs_dtype dtype, const void *buf,
                  size_t bytes)
{
    uint64_t pos = m->head[peer];
    if (pos - m->acked[peer] >= GS_MAIL_SLOTS) {
        m->acked[peer] = __atomic_load_n(taken_of(comm, peer, comm->rank), __ATOMIC_ACQUIRE);
        if (pos - m->acked[peer] >= GS_MAIL_SLOTS)
            return false; /* the peer has not taken them: the transport carries this one */
    }
    gs_mail_slot *s = slot_of(comm, comm->rank, peer, pos);
    s->msg = msg;
    s->tag = tag;
    s->bytes = (uint32_t)bytes;
    s->dtype = (uint8_t)dtype;
    if (bytes)
        memcpy(s->data, buf, bytes);
    __atomic_store_n(&s->seq, pos + 1, __ATOMIC_RELEASE);
    m->head[peer] = pos + 1;
    return true;
}

bool gs_mail_peek(const gs_comm *comm, const gs_mail *m, int src, gs_mail_msg *out)
{
    uint64_t pos = m->tail[src];
    const gs_mail_slot *s = slot_of(comm, src, comm->rank, pos);
    if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != pos + 1)
        return false;
    uint32_t bytes = s->bytes; /* read once: the peer's memory */
    out->msg = s->msg;
    out->tag = s->tag;
    out->dtype = s->dtype;
    out->bytes = bytes;
    if (bytes <= GS_MAIL_MAX) /* else the caller refuses it */
        memcpy(out->data, s->data, bytes);
    return true;
}

void gs_mail_take(const gs_comm *comm, gs_mail *m, int src)
{
    m->tail[src]++;
    __atomic_store_n(taken_of(comm, comm->rank, src), m->tail[src], __ATOMIC_RELEASE);
}

void gs_mail_set_closed(const gs_comm *comm, bool closed)
{
    __atomic_add_fetch(closed_of(comm, comm->rank), closed ? 1u : (uint32_t)-1, __ATOMIC_SEQ_CST);
}

bool gs_mail_peer_closed(const gs_comm *comm, int peer)
{
    /* the slot's store before this load: a receiver that closes after it
     * has looked sees the slot, one that closed before is seen closed here */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(closed_of(comm, peer), __ATOMIC_RELAXED) != 0;
}
