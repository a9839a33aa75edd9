/*
 * The mixed transport: a transport per peer. A job whose ranks span hosts,
 * with more than one rank on some host, reaches the ranks of its own host
 * over shm and the others over tcp or verbs, behind one ops table, so the
 * layers above see one transport as before.
 *
 * It owns two instances opened on the same context (the same ranks):
 *   near  shm opened for this host's ranks only (gs_shm_open_host): the
 *         ranks of other hosts have no endpoint in it;
 *   far   tcp or verbs to every rank (the ranks of this host included,
 *         though the mixed endpoints use them for other hosts only).
 * An endpoint is the near one when the peer shares this host, else the far
 * one. A region is registered in both. Its descriptor carries the far key
 * in key, and in tail the near key and the first bytes of both backends'
 * tails (shm and tcp use 8, verbs none: see MIXED_TAIL_*), so every peer
 * finds its part. Completions come from both; ranks are the context's in
 * both instances, so they pass through unchanged.
 *
 * It knows nothing of either backend beyond the ops table, the descriptor
 * head and shm's host-only open.
 */
#ifndef GS_TRANSPORT_MIXED_H
#define GS_TRANSPORT_MIXED_H

#include "transport/tp.h"

typedef struct gs_mixed_ep {
    gs_ep base;
    gs_ep *sub; /* near->eps[peer] or far->eps[peer] */
    bool near;  /* the peer shares this host */
} gs_mixed_ep;

typedef struct gs_mixed_tp {
    gs_tp base;
    gs_tp *near;             /* shm to the ranks of this host */
    gs_tp *far;              /* tcp or verbs to the ranks of other hosts */
    gs_mixed_ep *peers;      /* [size]: the endpoints tp.eps points at */
    struct gs_mixed_mr *mrs; /* the regions, a list */
    int local;               /* ranks on this host, this one included */
    bool far_first;          /* which instance the next poll asks first: they take turns */
    bool sleep_far;          /* the last completion came from far: a wait sleeps there */
} gs_mixed_tp;

typedef struct gs_mixed_mr {
    gs_mr base;
    gs_mr *near;
    gs_mr *far;
    struct gs_mixed_mr *next, *prev; /* every region of the tp: close deregisters what is left */
} gs_mixed_mr;

/* Where the descriptor's tail keeps each part. */
enum {
    MIXED_TAIL_NEAR_KEY = 0,   /* 8 bytes: shm's key (0: no near part) */
    MIXED_TAIL_NEAR_TAIL = 8,  /* 8 bytes: shm's tail, first bytes */
    MIXED_TAIL_FAR_TAIL = 16,  /* 16 bytes: the far backend's tail, first bytes */
    MIXED_TAIL_NEAR_BYTES = 8, /* how much of shm's tail is kept */
    MIXED_TAIL_FAR_BYTES = 16, /* how much of the far tail is kept */
};

/* Memory and posts (mixed_rma.c): gs_mixed_buf_alloc ... gs_mixed_recv. */
GS_TP_DATA_OPS_DECLARE(gs_mixed);
/* Control (mixed_tp.c): gs_mixed_caps, _close, _poll, _wait, _ep_error, _describe. */
GS_TP_CONTROL_OPS_DECLARE(gs_mixed);

#endif
