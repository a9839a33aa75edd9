/*
 * Point-to-point sends and receives on a communicator (p2p.c): a plane of
 * their own over the transport's two-sided SEND/RECV, so a tagged message
 * never waits behind a collective's slot or holds one up. Wire format in
 * coll_proto.h (gs_p2p_env).
 */
#ifndef GS_COLL_P2P_H
#define GS_COLL_P2P_H

#include "gradsync.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gs_p2p gs_p2p;           /* a communicator's p2p state (p2p.c) */
typedef struct gs_coll_req gs_coll_req; /* coll.h */
typedef struct gs_p2p_msg gs_p2p_msg;

enum { GS_P2P_NONE = 0, GS_P2P_SEND, GS_P2P_RECV };

/* One send or receive; lives in its gs_coll_req (kind GS_P2P_NONE: a collective). */
typedef struct gs_p2p_op {
    int kind;
    int state; /* p2p.c's progress of it */
    int peer;  /* a rank; a receive's may be GS_ANY_SOURCE */
    int tag;
    gs_dtype dtype;
    const uint8_t *sbuf;
    uint8_t *rbuf;
    size_t bytes;          /* send: the message; receive: the buffer's capacity */
    size_t done;           /* send: bytes posted (FRAG); receive: bytes arrived or read */
    size_t posted;         /* receive: bytes of READs posted */
    unsigned reads;        /* receive: READs in flight */
    uint64_t msg;          /* send: its number to peer; receive: the matched message's */
    gs_p2p_msg *stream;    /* receive: the FRAG message it takes */
    gs_p2p_status result;  /* receive: source, tag, count */
    gs_p2p_status *status; /* where the result goes (NULL: nowhere) */
    gs_mr *mr;             /* the caller's buffer, registered for a rendezvous */
    gs_rmr remote;         /* receive: the sender's region (RTS) */
    uint64_t last_ns;      /* when it last moved (the deadline counts from there) */
    gs_coll_req *next;     /* in one of p2p.c's lists */
    char err[512];         /* the error's sentence, once failed */
} gs_p2p_op;

/* The mailboxes (p2p_mail.c): messages of at most GS_MAIL_MAX bytes between
 * ranks that share the boxes, one cache line each, in GS_MAIL_SLOTS-line
 * rings in the sender's box segment. */
#define GS_MAIL_SLOTS 16
#define GS_MAIL_MAX   32

typedef struct gs_mail {
    uint64_t *head;  /* [size]: messages posted to each peer's ring */
    uint64_t *acked; /* [size]: how many of them the peer had taken, when last read */
    uint64_t *tail;  /* [size]: messages taken from each peer's ring to this rank */
} gs_mail;

/* A mailbox message as copied out of its slot (unchecked: bytes may be
 * more than GS_MAIL_MAX, and then data holds nothing). */
typedef struct gs_mail_msg {
    uint64_t msg;
    int32_t tag;
    uint32_t bytes;
    uint8_t dtype;
    uint8_t data[GS_MAIL_MAX];
} gs_mail_msg;

/* Bytes of the mail area in each rank's box segment (box.c sizes it). */
size_t gs_mail_area_bytes(int size);
gs_status gs_mail_open(gs_mail *m, int size);
void gs_mail_close(gs_mail *m);
/* Posts a message to peer's ring in this rank's segment; false: the ring
 * is full (the peer has not taken GS_MAIL_SLOTS of them), nothing posted. */
bool gs_mail_post(gs_comm *comm, gs_mail *m, int peer, uint64_t msg, int tag, gs_dtype dtype, const void *buf,
                  size_t bytes);
/* Copies the oldest message from src not yet taken; false: none. */
bool gs_mail_peek(const gs_comm *comm, const gs_mail *m, int src, gs_mail_msg *out);
/* Takes that message (its slot goes back to src). */
void gs_mail_take(const gs_comm *comm, gs_mail *m, int src);
/* This rank blocks in the transport (true) or no longer (false): while it
 * does, senders also wake it through the transport. Nests. */
void gs_mail_set_closed(const gs_comm *comm, bool closed);
/* After a post: whether peer blocks in the transport (it must be woken). */
bool gs_mail_peer_closed(const gs_comm *comm, int peer);

/* Sets up a communicator's p2p plane (receives posted to every peer) before
 * the descriptor exchange; freed by gs_p2p_close before the transport goes. */
gs_status gs_p2p_open(gs_comm *comm);
void gs_p2p_close(gs_comm *comm);
/* A completion of a p2p operation (SEND, RECV, READ) of the transport. */
gs_status gs_p2p_complete(gs_comm *comm, const gs_wc *wc);
/* Whether posts wait for room (a full send queue completes nothing, so
 * waiters must poll rather than block), and posting them (the engine's
 * progress). */
bool gs_p2p_busy(const gs_comm *comm);
gs_status gs_p2p_progress(gs_comm *comm);
/* Tests: this rank sends large messages in fragments, as where the
 * transport cannot register user memory. */
void gs_p2p_force_fragments(gs_comm *comm);
/* gs_req_test / gs_req_wait of a p2p request (not releasing it). */
gs_status gs_p2p_test(gs_coll_req *req);
gs_status gs_p2p_wait(gs_coll_req *req);

#endif
