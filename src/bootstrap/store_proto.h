/*
 * The bootstrap store's wire format, alone in this header.
 *
 * Every message is one header followed by key_len bytes of key (no NUL) and
 * value_len bytes of value. Fixed-width fields in host byte order
 * (little-endian: every supported host is). The version byte comes first so
 * that a future format, or random bytes, are refused at the first byte.
 *
 * A connection starts with HELLO (rank, world size, job token as value; its
 * status field carries GS_STORE_HELLO_* flags); the server answers REPLY with
 * status GS_OK, or an error status with the reason as value text, and
 * closes. A rank may join once, except that a HELLO with
 * GS_STORE_HELLO_REJOIN takes the place of a rank that was lost (its
 * connection closed without BYE): a restarted process replacing it. Afterwards the client sends one request
 * at a time and waits for its REPLY; BYE announces a clean departure and gets no reply. Waiting requests
 * (GET, ALLGATHER, BARRIER) carry the client's timeout in arg: the server answers GS_ERR_TIMEOUT itself when
 * it expires, naming the ranks that never arrived.
 *
 * SURVIVORS is the agreement of gs_comm_shrink (store_agree.c): the server
 * alone decides, once per tag, which of the listed members are in: those
 * that asked while their connection is open, as soon as every other member
 * has asked or is gone (connection closed), or at the first asker's
 * deadline. Every asker, even a late one, gets the same answer. A rank that
 * rejoined (a replacement) counts as gone for it until it has asked an
 * agreement flagged GS_STORE_SURVIVORS_GROW (gs_comm_grow's).
 */
#ifndef GS_BOOTSTRAP_STORE_PROTO_H
#define GS_BOOTSTRAP_STORE_PROTO_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

#define GS_STORE_PROTO_VERSION 1

typedef enum gs_store_msg {
    GS_STORE_HELLO = 1, /* rank, arg = world size, value = job token */
    GS_STORE_PUT,       /* key, value */
    GS_STORE_GET,       /* key, arg = timeout ms; reply value = the value */
    GS_STORE_ALLGATHER, /* key = tag, value = this rank's blob, arg = timeout ms;
                           reply value = every rank's blob in rank order */
    GS_STORE_BARRIER,   /* key = tag, arg = timeout ms */
    GS_STORE_BYE,       /* no reply */
    GS_STORE_REPLY,     /* status; value = result, or error text when status < 0 */
    GS_STORE_TIME,      /* no key; reply value = the server's monotonic clock in ns (u64), then its
                           host id (no NUL): GS_TRACE's common clock */
    GS_STORE_SURVIVORS, /* key = tag, value = n (u32) then the n members' ranks (u32), arg = timeout
                           ms; reply value = n bytes, 1 for each member in the agreed set */
    GS_STORE_MSG_MAX = GS_STORE_SURVIVORS,
} gs_store_msg;

enum { GS_STORE_HELLO_REJOIN = 1 }; /* HELLO flags, in the status field */
/* SURVIVORS flags, in the status field: the agreement of gs_comm_grow,
 * whose members include processes that rejoined to join (without it a
 * rejoined rank that never was in such an agreement counts as gone: the
 * member a shrink lost is the process before it). */
enum { GS_STORE_SURVIVORS_GROW = 1 };

typedef struct gs_store_hdr {
    uint8_t version;    /* GS_STORE_PROTO_VERSION */
    uint8_t type;       /* gs_store_msg */
    uint16_t key_len;   /* <= GS_STORE_KEY_MAX */
    int32_t status;     /* REPLY: gs_status; HELLO: GS_STORE_HELLO_* flags; 0 in other requests */
    uint32_t rank;      /* HELLO: the sender's rank; 0 elsewhere */
    uint32_t arg;       /* HELLO: world size; GET/ALLGATHER/BARRIER: timeout ms */
    uint64_t value_len; /* see the limits below */
} gs_store_hdr;

_Static_assert(sizeof(gs_store_hdr) == 24, "store header is 24 bytes on the wire");
_Static_assert(offsetof(gs_store_hdr, version) == 0, "version byte comes first");
_Static_assert(offsetof(gs_store_hdr, key_len) == 2 && offsetof(gs_store_hdr, status) == 4 &&
                   offsetof(gs_store_hdr, rank) == 8 && offsetof(gs_store_hdr, arg) == 12 &&
                   offsetof(gs_store_hdr, value_len) == 16,
               "store header layout");
_Static_assert(GS_STORE_KEY_MAX <= UINT16_MAX, "key length fits key_len");

/* The largest job token a HELLO may carry (GS_JOB_TOKEN is a config string). */
#define GS_STORE_TOKEN_MAX 255
/* The largest error text a REPLY carries. */
#define GS_STORE_ERROR_MAX 1024
/* The most ranks one store serves. */
#define GS_STORE_RANKS_MAX 65536

#endif
