/* The store client's request interface, used by the public gs_store_* calls
 * (store_api.c) and the context (ctx.c). */
#ifndef GS_BOOTSTRAP_STORE_CLIENT_H
#define GS_BOOTSTRAP_STORE_CLIENT_H

#include "bootstrap/boot.h"
#include "bootstrap/store_proto.h"

typedef struct gs_store_request {
    int type;        /* gs_store_msg */
    const char *key; /* key or tag; NULL for HELLO and BYE */
    const void *value;
    size_t len;
    uint32_t arg;  /* HELLO: world size; waits: timeout ms */
    int32_t flags; /* HELLO: GS_STORE_HELLO_* */
    bool quiet;    /* a GET that polls: its timeout answer is not logged as an error */
} gs_store_request;

typedef struct gs_store_reply {
    void *buf; /* the value's first cap bytes land here */
    size_t cap;
    size_t len; /* out: the value's full length */
} gs_store_reply;

/* Sends req and waits for its answer (the server's own timeout plus a
 * grace). An error answer is reported with the server's text; a lost or
 * desynchronized connection makes every later request fail too. */
gs_status gs_boot_client_request(gs_store_client *c, const gs_store_request *req, gs_store_reply *reply_p);
int gs_boot_client_rank(const gs_store_client *c);

#endif
