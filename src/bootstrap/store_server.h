/* The store server's state, shared by its connection engine
 * (store_server.c) and its tables of keys and waits (store_table.c).
 * Everything here is touched only by the server thread. */
#ifndef GS_BOOTSTRAP_STORE_SERVER_H
#define GS_BOOTSTRAP_STORE_SERVER_H

#include "bootstrap/boot.h"
#include "bootstrap/store_proto.h"

#include <pthread.h>
#include <stdatomic.h>

typedef enum gs_store_wait { GS_STORE_WAIT_NONE, GS_STORE_WAIT_GET, GS_STORE_WAIT_ROUND } gs_store_wait;

typedef struct gs_store_conn {
    int fd;
    int rank;      /* -1 until its HELLO is accepted */
    char peer[64]; /* address:port, for logs */
    uint64_t hello_deadline_ns;
    bool bye;     /* announced a clean departure */
    bool closing; /* close once tx is sent */
    bool dead;    /* closed; removed at the end of the loop turn */
    bool joining; /* rejoined (HELLO_REJOIN) and in no gs_comm_grow agreement yet: a process waiting to
                     join, which shrink agreements do not wait for (it is not the member they lost) */
    /* receive: header, then key + value */
    gs_store_hdr hdr;
    size_t hdr_got;
    uint8_t *body;
    size_t body_len, body_got;
    /* send queue: one reply at a time */
    uint8_t *tx;
    size_t tx_len, tx_off;
    /* what this rank waits for */
    gs_store_wait wait;
    char wait_key[GS_STORE_KEY_MAX + 1];
    uint64_t wait_deadline_ns;
    uint32_t wait_timeout_ms;
} gs_store_conn;

typedef struct gs_store_entry {
    char *key;
    uint8_t *value;
    size_t len;
} gs_store_entry;

/* One allgather or barrier in progress: its tag, who arrived, their blobs. */
typedef struct gs_store_round {
    struct gs_store_round *next;
    int type; /* GS_STORE_ALLGATHER or GS_STORE_BARRIER */
    char tag[GS_STORE_KEY_MAX + 1];
    size_t len; /* bytes per rank */
    int arrived;
    int first_rank;  /* the first to arrive (sets len and the deadline) */
    uint8_t *joined; /* [size] */
    uint8_t *data;   /* [size * len] */
    uint64_t deadline_ns;
    uint32_t timeout_ms;
    char mismatch[GS_STORE_ERROR_MAX / 2]; /* set when a rank disagreed on len */
} gs_store_round;

/* A SURVIVORS agreement (store_agree.c): kept after its decision so that a
 * late asker gets the same answer. */
typedef struct gs_store_agree {
    struct gs_store_agree *next;
    char tag[GS_STORE_KEY_MAX + 1];
    uint32_t n;
    uint32_t *members; /* [n] ranks of the store */
    uint8_t *asked;    /* [n] */
    uint8_t *in;       /* [n] the decision, once decided */
    bool decided;
    bool grow; /* GS_STORE_SURVIVORS_GROW: the members include joiners */
    uint64_t deadline_ns;
} gs_store_agree;

typedef enum gs_store_rank_state {
    GS_STORE_RANK_NEVER = 0, /* not connected yet */
    GS_STORE_RANK_CONNECTED,
    GS_STORE_RANK_DEPARTED, /* said BYE */
    GS_STORE_RANK_LOST,     /* connection closed without BYE */
} gs_store_rank_state;

struct gs_store_server {
    int size;
    char token[GS_STORE_TOKEN_MAX + 1];
    int hello_timeout_ms;
    int listen_fd;
    int port;
    int wake_fd[2];
    pthread_t thread;
    bool started;
    atomic_bool stop;
    atomic_uint_fast64_t drain_deadline_ns;

    gs_store_conn **conns;
    size_t nconns, conns_cap;
    gs_store_conn **by_rank; /* [size] */
    uint8_t *rank_state;     /* [size] gs_store_rank_state */
    gs_store_entry *entries;
    size_t nentries, entries_cap;
    gs_store_round *rounds;
    gs_store_agree *agrees;
};

/* store_server.c: queue a reply on conn (error text when status < 0). */
void gs_boot_server_reply(gs_store_conn *conn, gs_status status, const void *value, size_t len);
void gs_boot_server_reply_error(gs_store_conn *conn, gs_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* store_table.c: requests of an accepted rank, rank departures, deadlines. */
void gs_boot_table_put(gs_store_server *s, gs_store_conn *conn, const char *key, const uint8_t *value,
                       size_t len);
void gs_boot_table_get(gs_store_server *s, gs_store_conn *conn, const char *key, uint32_t timeout_ms);
void gs_boot_table_join(gs_store_server *s, gs_store_conn *conn, int type, const char *tag,
                        const uint8_t *blob, size_t len, uint32_t timeout_ms);
/* rank left (departed or lost): fail every round still missing it. */
void gs_boot_table_rank_gone(gs_store_server *s, int rank);
/* Answers waits whose deadline passed; returns the nearest deadline left. */
uint64_t gs_boot_table_expire(gs_store_server *s, uint64_t now_ns);
void gs_boot_table_free(gs_store_server *s);

/* store_agree.c: a SURVIVORS request (value: the member list), a rank
 * gone, deadlines (the nearest left returned), freeing. */
void gs_boot_agree_ask(gs_store_server *s, gs_store_conn *conn, const char *tag, const uint8_t *value,
                       size_t len, uint32_t timeout_ms, int32_t flags);
void gs_boot_agree_rank_gone(gs_store_server *s);
uint64_t gs_boot_agree_expire(gs_store_server *s, uint64_t now_ns);
void gs_boot_agree_free(gs_store_server *s);
void gs_boot_agree_free_one(gs_store_agree *a);
/* Writes the ranks whose flag is 0 as "2,3" or "1-5,7" (runs of three or
 * more as ranges) into buf; returns how many there are. */
int gs_boot_format_ranks(const uint8_t *flags, int size, char *buf, size_t cap);

#endif
