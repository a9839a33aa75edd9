/*
 * The tcp transport's wire format: everything that crosses a socket, and
 * nothing else. Fixed-width fields, version byte first, little-endian host
 * order (every supported host is little-endian), offsets never pointers.
 *
 * A connection carries, in order:
 *   1. the connector's gs_tcp_hello (kind HELLO), answered by the acceptor's
 *      gs_tcp_hello (kind HELLO_ACK); each proves the job token and echoes the
 *      other side's listener nonce, which only members of the job can read
 *      from the bootstrap store;
 *   2. then frames in both directions: a 64-byte gs_tcp_hdr followed by len
 *      payload bytes.
 *
 * Requests (WRITE, WRITE_IMM, READ_REQ, FETCH_ADD, CMP_SWAP, SEND) are
 * numbered 0, 1, 2, ... per direction in seq; the target serves them strictly
 * in order. Every frame carries in ack the number of the sender's received
 * requests it has fully served (placed, executed or queued a reply for): a
 * cumulative acknowledgement, piggybacked on any traffic and sent alone as
 * ACK only when a request asked for it (GS_TCP_F_ACK_REQ) and nothing else is
 * going out. Replies (READ_RESP, ATOMIC_RESP, NAK) carry the request's seq.
 * A NAK reports the first request the target refused; the target then drops
 * the connection (like an RC queue pair entering the error state).
 */
#ifndef GS_TRANSPORT_TCP_PROTO_H
#define GS_TRANSPORT_TCP_PROTO_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the tcp wire format is little-endian host order");

#define GS_TCP_PROTO_VERSION 2
#define GS_TCP_HELLO_MAGIC   0x43545347u /* "GSTC" */
#define GS_TCP_NONCE_BYTES   16
#define GS_TCP_TOKEN_BYTES   256
/* Largest payload of one WRITE / WRITE_IMM / READ (a sanity bound: the
 * target's region bounds are checked separately). */
#define GS_TCP_MAX_PAYLOAD (1ull << 40)

/* ------------------------------------------------------------------------ */
/* Address blob: what each rank publishes through gs_store_allgather         */
/* ------------------------------------------------------------------------ */

enum { GS_TCP_FAMILY_IPV4 = 4, GS_TCP_FAMILY_IPV6 = 6 };

typedef struct gs_tcp_addr_blob {
    uint8_t version; /* GS_TCP_PROTO_VERSION */
    uint8_t family;  /* GS_TCP_FAMILY_IPV4 / _IPV6 */
    uint16_t port;   /* host order */
    uint32_t scope_id;
    uint8_t addr[16]; /* IPv4: the first 4 bytes */
    uint8_t nonce[GS_TCP_NONCE_BYTES];
} gs_tcp_addr_blob;
_Static_assert(sizeof(gs_tcp_addr_blob) == 40, "address blob layout");
_Static_assert(offsetof(gs_tcp_addr_blob, nonce) == 24, "address blob layout");

/* ------------------------------------------------------------------------ */
/* Hello: the first bytes each way on a new connection                      */
/* ------------------------------------------------------------------------ */

enum { GS_TCP_HELLO = 1, GS_TCP_HELLO_ACK = 2 };

typedef struct gs_tcp_hello {
    uint8_t version;                   /* GS_TCP_PROTO_VERSION */
    uint8_t kind;                      /* GS_TCP_HELLO (connector) / GS_TCP_HELLO_ACK (acceptor) */
    uint16_t token_len;                /* bytes of token used; the rest is zero */
    uint32_t magic;                    /* GS_TCP_HELLO_MAGIC */
    uint32_t rank;                     /* sender's rank */
    uint32_t size;                     /* world size as the sender sees it */
    uint32_t instance;                 /* which tcp transport of the job (open order) */
    uint32_t reserved;                 /* zero */
    uint8_t nonce[GS_TCP_NONCE_BYTES]; /* the receiver's listener nonce, from the store */
    uint8_t token[GS_TCP_TOKEN_BYTES]; /* GS_JOB_TOKEN, zero padded */
} gs_tcp_hello;
_Static_assert(sizeof(gs_tcp_hello) == 296, "hello layout");
_Static_assert(offsetof(gs_tcp_hello, nonce) == 24, "hello layout");

/* ------------------------------------------------------------------------ */
/* Frames                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum gs_tcp_op {
    /* requests: numbered, served in order by the target */
    GS_TCP_OP_WRITE = 1, /* len payload bytes into region key at off */
    GS_TCP_OP_WRITE_IMM, /* same, then a GS_WC_RECV_IMM carrying imm at the target */
    GS_TCP_OP_READ_REQ,  /* reply READ_RESP with arg0 bytes of region key at off */
    GS_TCP_OP_FETCH_ADD, /* *(u64 *)(key+off) += arg0; reply ATOMIC_RESP(old) */
    GS_TCP_OP_CMP_SWAP,  /* if *(key+off) == arg0 then = arg1; reply ATOMIC_RESP(old) */
    GS_TCP_OP_SEND,      /* len <= GS_SEND_MAX bytes into the peer's next posted receive */
    /* replies and control: not numbered */
    GS_TCP_OP_READ_RESP = 16, /* seq: the READ_REQ; payload: the bytes read */
    GS_TCP_OP_ATOMIC_RESP,    /* seq: the atomic request; arg0: the old value */
    GS_TCP_OP_ACK,            /* only the ack field */
    GS_TCP_OP_NAK,            /* seq: the refused request; status: -gs_status */
    GS_TCP_OP_BYE,            /* orderly close: nothing follows but end of stream */
    GS_TCP_OP_SWITCH,         /* the sender's next frames come on its other connection (tcp.h) */
} gs_tcp_op;

enum {
    GS_TCP_F_ACK_REQ = 1u << 0, /* the initiator waits for this request's acknowledgement */
    GS_TCP_F_ALL = GS_TCP_F_ACK_REQ,
};

typedef struct gs_tcp_hdr {
    uint8_t version; /* GS_TCP_PROTO_VERSION */
    uint8_t op;      /* gs_tcp_op */
    uint8_t flags;   /* GS_TCP_F_* (requests only) */
    uint8_t status;  /* NAK: -gs_status of the refusal; else 0 */
    uint32_t imm;    /* WRITE_IMM: the immediate; else 0 */
    uint64_t len;    /* payload bytes following this header */
    uint64_t key;    /* target region key (WRITE .. CMP_SWAP) */
    uint64_t off;    /* byte offset into the target region */
    uint64_t arg0;   /* READ_REQ: length; FETCH_ADD: addend; CMP_SWAP: compare; ATOMIC_RESP: old value */
    uint64_t arg1;   /* CMP_SWAP: swap value */
    uint64_t seq;    /* requests: their number; replies: the request's number */
    uint64_t ack;    /* requests of the receiver this sender has fully served */
} gs_tcp_hdr;
_Static_assert(sizeof(gs_tcp_hdr) == 64, "frame header layout");
_Static_assert(offsetof(gs_tcp_hdr, len) == 8 && offsetof(gs_tcp_hdr, ack) == 56, "frame header layout");

static inline int gs_tcp_op_is_request(unsigned op)
{
    return op >= GS_TCP_OP_WRITE && op <= GS_TCP_OP_SEND;
}

/* ------------------------------------------------------------------------ */
/* Checks of what arrives (tcp_frame.c): pure functions, fuzzed              */
/* ------------------------------------------------------------------------ */

/* What a receiver expects next from this connection. */
typedef struct gs_tcp_rx_expect {
    uint64_t next_seq;  /* number of the next request from the peer */
    uint64_t sent_reqs; /* requests this side has sent (an ack cannot exceed it) */
    uint64_t acked;     /* the highest ack seen so far (acks never go back) */
} gs_tcp_rx_expect;

/* GS_OK if the header is well formed for its op (version, known op and
 * flags, unused fields zero, payload length allowed for the op, request
 * numbering, ack within what was sent); else GS_ERR_PROTOCOL with *why_p a
 * static reason. Region checks (key, bounds, permission) come later. */
gs_status gs_tcp_hdr_check(const gs_tcp_hdr *hdr, const gs_tcp_rx_expect *expect, const char **why_p);
/* GS_OK if hello is a well-formed message of kind from a rank of this job
 * (size, instance) carrying our nonce and token; else GS_ERR_PROTOCOL (not a
 * hello of this version) or GS_ERR_AUTH (wrong job, token or nonce), with
 * *why_p a static reason. Token and nonce compare in constant time. */
gs_status gs_tcp_hello_check(const gs_tcp_hello *hello, int kind, int size, uint32_t instance,
                             const uint8_t nonce[GS_TCP_NONCE_BYTES], const char *token, const char **why_p);
/* Fills a hello of kind from rank to the owner of nonce. */
void gs_tcp_hello_fill(gs_tcp_hello *hello, int kind, int rank, int size, uint32_t instance,
                       const uint8_t nonce[GS_TCP_NONCE_BYTES], const char *token);
const char *gs_tcp_op_name(unsigned op);

#endif
