/*
 * The survivors' agreement of gs_comm_shrink, decided by the store server.
 *
 * The server is the one place that sees every rank's connection, so it
 * alone decides, once per tag, who is in; the ranks only ask. A member is
 * in when it asked and its connection is still open at the decision. The
 * decision is taken as soon as every member has asked or is gone (its
 * connection closed, with or without BYE: a rank killed during the
 * agreement is excluded the moment the kernel closes its socket, never
 * waited for), or at the first asker's deadline (a member alive but not
 * asking is excluded then). The decision is kept, so that a member that
 * asks later gets the same answer (and learns it is out).
 */
#include "bootstrap/store_server.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gs_store_agree *agree_find(gs_store_server *s, const char *tag)
{
    for (gs_store_agree *a = s->agrees; a; a = a->next)
        if (strcmp(a->tag, tag) == 0)
            return a;
    return NULL;
}

/* Connected, and (unless a grow's agreement) not a replacement waiting to
 * join: that process is not the member lost. */
static bool member_open(const gs_store_server *s, const gs_store_agree *a, uint32_t rank)
{
    const gs_store_conn *conn = s->by_rank[rank];
    return conn && !conn->dead && s->rank_state[rank] == GS_STORE_RANK_CONNECTED &&
           (a->grow || !conn->joining);
}

static void agree_reply(gs_store_server *s, const gs_store_agree *a, uint32_t i)
{
    gs_store_conn *conn = s->by_rank[a->members[i]];
    if (conn && conn->wait == GS_STORE_WAIT_ROUND && strcmp(conn->wait_key, a->tag) == 0)
        gs_boot_server_reply(conn, GS_OK, a->in, a->n);
}

static void agree_decide(gs_store_server *s, gs_store_agree *a, const char *why)
{
    uint32_t count = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        a->in[i] = a->asked[i] && member_open(s, a, a->members[i]);
        count += a->in[i];
    }
    a->decided = true;
    gs_log_info(BOOT, "store: survivors '%s': %" PRIu32 " of %" PRIu32 " members in (%s)", a->tag, count,
                a->n, why);
    for (uint32_t i = 0; i < a->n; i++)
        if (a->in[i])
            agree_reply(s, a, i);
}

/* Decides when no member is left to wait for. */
static void agree_check(gs_store_server *s, gs_store_agree *a)
{
    if (a->decided)
        return;
    for (uint32_t i = 0; i < a->n; i++)
        if (!a->asked[i] && member_open(s, a, a->members[i]))
            return;
    agree_decide(s, a, "every other member asked or is gone");
}

/* The member list of a request: n, then n distinct ranks of this store. */
static gs_store_agree *agree_parse(gs_store_server *s, const char *tag, const uint8_t *value, size_t len)
{
    uint32_t n;
    gs_store_agree *a;
    if (len < 4)
        return NULL;
    memcpy(&n, value, 4);
    if (n == 0 || n > (uint32_t)s->size || len != 4 + (size_t)n * 4)
        return NULL;
    a = gs_calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->members = gs_calloc(n, sizeof(uint32_t));
    a->asked = gs_calloc(n, 1);
    a->in = gs_calloc(n, 1);
    a->n = n;
    if (a->members)
        memcpy(a->members, value + 4, (size_t)n * 4);
    for (uint32_t i = 0; a->members && i < n; i++)
        if (a->members[i] >= (uint32_t)s->size)
            a->n = 0;
    if (!a->members || !a->asked || !a->in || a->n == 0) {
        free(a->members);
        free(a->asked);
        free(a->in);
        free(a);
        return NULL;
    }
    snprintf(a->tag, sizeof(a->tag), "%s", tag);
    return a;
}

static int member_index(const gs_store_agree *a, int rank)
{
    for (uint32_t i = 0; i < a->n; i++)
        if (a->members[i] == (uint32_t)rank)
            return (int)i;
    return -1;
}

void gs_boot_agree_ask(gs_store_server *s, gs_store_conn *conn, const char *tag, const uint8_t *value,
                       size_t len, uint32_t timeout_ms, int32_t flags)
{
    gs_store_agree *a = agree_find(s, tag), *mine = agree_parse(s, tag, value, len);
    int i;
    if (!mine) {
        gs_boot_server_reply_error(conn, GS_ERR_PROTOCOL, "survivors '%s': malformed member list (%zu bytes)",
                                   tag, len);
        return;
    }
    if (!a) {
        mine->deadline_ns = gs_deadline_after_ms(timeout_ms);
        mine->grow = (flags & GS_STORE_SURVIVORS_GROW) != 0;
        mine->next = s->agrees;
        s->agrees = a = mine;
    } else {
        bool same = a->n == mine->n && memcmp(a->members, mine->members, (size_t)a->n * 4) == 0;
        gs_boot_agree_free_one(mine);
        if (!same) {
            gs_boot_server_reply_error(conn, GS_ERR_MISMATCH,
                                       "survivors '%s': rank %d lists other members than the first asker",
                                       tag, conn->rank);
            return;
        }
    }
    i = member_index(a, conn->rank);
    if (i < 0) {
        gs_boot_server_reply_error(conn, GS_ERR_INVALID, "survivors '%s': rank %d is not a member", tag,
                                   conn->rank);
        return;
    }
    conn->wait = GS_STORE_WAIT_ROUND;
    snprintf(conn->wait_key, sizeof(conn->wait_key), "%s", tag);
    if (a->grow)
        conn->joining = false; /* a member from now on */
    if (a->decided) {          /* late: the same answer, which leaves it out */
        agree_reply(s, a, (uint32_t)i);
        return;
    }
    a->asked[i] = 1;
    agree_check(s, a);
}

void gs_boot_agree_rank_gone(gs_store_server *s)
{
    for (gs_store_agree *a = s->agrees; a; a = a->next)
        agree_check(s, a);
}

uint64_t gs_boot_agree_expire(gs_store_server *s, uint64_t now_ns)
{
    uint64_t next = UINT64_MAX;
    for (gs_store_agree *a = s->agrees; a; a = a->next) {
        if (a->decided)
            continue;
        if (now_ns >= a->deadline_ns)
            agree_decide(s, a, "deadline: members that did not ask are out");
        else if (a->deadline_ns < next)
            next = a->deadline_ns;
    }
    return next;
}

void gs_boot_agree_free_one(gs_store_agree *a)
{
    free(a->members);
    free(a->asked);
    free(a->in);
    free(a);
}

void gs_boot_agree_free(gs_store_server *s)
{
    while (s->agrees) {
        gs_store_agree *next = s->agrees->next;
        gs_boot_agree_free_one(s->agrees);
        s->agrees = next;
    }
}
