/*
 * The store's tables: keys and their values, ranks waiting for a key, and
 * the allgathers and barriers in progress. A round completes when every rank
 * has arrived; it fails for everyone in it when its deadline passes (naming
 * the ranks that never arrived), when the ranks disagree on the blob size,
 * or when a rank that has not arrived leaves the job.
 */
#include "bootstrap/store_server.h"

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- keys --------------------------------------------------------------- */

static gs_store_entry *entry_find(gs_store_server *s, const char *key)
{
    for (size_t i = 0; i < s->nentries; i++)
        if (strcmp(s->entries[i].key, key) == 0)
            return &s->entries[i];
    return NULL;
}

static gs_store_entry *entry_add(gs_store_server *s, const char *key)
{
    gs_store_entry *e;
    if (s->nentries == s->entries_cap) {
        size_t cap = s->entries_cap ? 2 * s->entries_cap : 32;
        gs_store_entry *entries = realloc(s->entries, cap * sizeof(*entries));
        if (!entries)
            return NULL;
        s->entries = entries;
        s->entries_cap = cap;
    }
    e = &s->entries[s->nentries];
    e->key = strdup(key);
    e->value = NULL;
    e->len = 0;
    if (!e->key)
        return NULL;
    s->nentries++;
    return e;
}

void gs_boot_table_put(gs_store_server *s, gs_store_conn *conn, const char *key, const uint8_t *value,
                       size_t len)
{
    gs_store_entry *e = entry_find(s, key);
    uint8_t *copy = malloc(len ? len : 1);

    if (!e)
        e = entry_add(s, key);
    if (!e || !copy) {
        free(copy);
        gs_boot_server_reply_error(conn, GS_ERR_NOMEM, "the store ran out of memory for key '%s' (%zu bytes)",
                                   key, len);
        return;
    }
    memcpy(copy, value, len);
    free(e->value);
    e->value = copy;
    e->len = len;
    gs_boot_server_reply(conn, GS_OK, NULL, 0);
    /* Wake the ranks waiting for this key. */
    for (int r = 0; r < s->size; r++) {
        gs_store_conn *waiter = s->by_rank[r];
        if (waiter && waiter->wait == GS_STORE_WAIT_GET && strcmp(waiter->wait_key, key) == 0)
            gs_boot_server_reply(waiter, GS_OK, e->value, e->len);
    }
}

void gs_boot_table_get(gs_store_server *s, gs_store_conn *conn, const char *key, uint32_t timeout_ms)
{
    gs_store_entry *e = entry_find(s, key);
    if (e) {
        gs_boot_server_reply(conn, GS_OK, e->value, e->len);
        return;
    }
    conn->wait = GS_STORE_WAIT_GET;
    snprintf(conn->wait_key, sizeof(conn->wait_key), "%s", key);
    conn->wait_timeout_ms = timeout_ms;
    conn->wait_deadline_ns = gs_deadline_after_ms(timeout_ms);
}

/* ---- rounds ------------------------------------------------------------- */

static const char *round_name(int type)
{
    return type == GS_STORE_BARRIER ? "barrier" : "allgather";
}

int gs_boot_format_ranks(const uint8_t *flags, int size, char *buf, size_t cap)
{
    size_t n = 0;
    int count = 0;
    buf[0] = '\0';
    for (int r = 0; r < size; r++) {
        int end = r;
        if (flags[r])
            continue;
        while (end + 1 < size && !flags[end + 1])
            end++;
        count += end - r + 1;
        if (n + 32 < cap) {
            if (end - r >= 2)
                n += (size_t)snprintf(buf + n, cap - n, "%s%d-%d", n ? "," : "", r, end);
            else
                for (int k = r; k <= end; k++)
                    n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? "," : "", k);
        }
        r = end;
    }
    return count;
}

static void round_unlink(gs_store_server *s, gs_store_round *round)
{
    for (gs_store_round **p = &s->rounds; *p; p = &(*p)->next) {
        if (*p == round) {
            *p = round->next;
            break;
        }
    }
    free(round->joined);
    free(round->data);
    free(round);
}

/* Every rank in the round gets the same error; the round ends. */
static void round_fail(gs_store_server *s, gs_store_round *round, gs_status status, const char *text)
{
    gs_log_warn(BOOT, "store: %s", text);
    for (int r = 0; r < s->size; r++) {
        gs_store_conn *conn = s->by_rank[r];
        if (round->joined[r] && conn && conn->wait == GS_STORE_WAIT_ROUND)
            gs_boot_server_reply(conn, status, text, strlen(text));
    }
    round_unlink(s, round);
}

static void round_complete(gs_store_server *s, gs_store_round *round)
{
    for (int r = 0; r < s->size; r++) {
        gs_store_conn *conn = s->by_rank[r];
        if (round->joined[r] && conn && conn->wait == GS_STORE_WAIT_ROUND)
            gs_boot_server_reply(conn, GS_OK, round->data, (size_t)s->size * round->len);
    }
    round_unlink(s, round);
}

/* Fails the round if ranks that have not arrived have left the job, naming
 * the lost ones (the likely cause) before those that left cleanly. */
static bool round_check_gone(gs_store_server *s, gs_store_round *round)
{
    char text[GS_STORE_ERROR_MAX], lost[400], departed[400];
    uint8_t *not_lost = malloc((size_t)s->size), *not_departed = malloc((size_t)s->size);
    int nlost, ndeparted;
    size_t n;

    if (!not_lost || !not_departed) {
        free(not_lost);
        free(not_departed);
        return false;
    }
    for (int r = 0; r < s->size; r++) {
        not_lost[r] = round->joined[r] || s->rank_state[r] != GS_STORE_RANK_LOST;
        not_departed[r] = round->joined[r] || s->rank_state[r] != GS_STORE_RANK_DEPARTED;
    }
    nlost = gs_boot_format_ranks(not_lost, s->size, lost, sizeof(lost));
    ndeparted = gs_boot_format_ranks(not_departed, s->size, departed, sizeof(departed));
    free(not_lost);
    free(not_departed);
    if (nlost + ndeparted == 0)
        return false;
    n = (size_t)snprintf(text, sizeof(text), "%s '%s': ", round_name(round->type), round->tag);
    if (nlost)
        n += (size_t)snprintf(
            text + n, sizeof(text) - n, "%s %s of %d %s lost (store connection closed before arriving)%s",
            nlost == 1 ? "rank" : "ranks", lost, s->size, nlost == 1 ? "was" : "were", ndeparted ? "; " : "");
    if (ndeparted && n < sizeof(text))
        snprintf(text + n, sizeof(text) - n, "%s %s of %d left the job (gs_ctx_destroy) without arriving",
                 ndeparted == 1 ? "rank" : "ranks", departed, s->size);
    round_fail(s, round, GS_ERR_PEER_LOST, text);
    return true;
}

static gs_store_round *round_find_or_add(gs_store_server *s, int type, const char *tag, size_t len, int rank,
                                         uint32_t timeout_ms)
{
    gs_store_round *round;
    for (round = s->rounds; round; round = round->next)
        if (round->type == type && strcmp(round->tag, tag) == 0)
            return round;
    round = gs_calloc(1, sizeof(*round));
    if (!round)
        return NULL;
    round->joined = gs_calloc((size_t)s->size, 1);
    round->data = malloc((size_t)s->size * len + 1);
    if (!round->joined || !round->data) {
        free(round->joined);
        free(round->data);
        free(round);
        return NULL;
    }
    round->type = type;
    snprintf(round->tag, sizeof(round->tag), "%s", tag);
    round->len = len;
    round->first_rank = rank;
    round->timeout_ms = timeout_ms;
    round->deadline_ns = gs_deadline_after_ms(timeout_ms);
    round->next = s->rounds;
    s->rounds = round;
    return round;
}

void gs_boot_table_join(gs_store_server *s, gs_store_conn *conn, int type, const char *tag,
                        const uint8_t *blob, size_t len, uint32_t timeout_ms)
{
    int rank = conn->rank;
    gs_store_round *round = round_find_or_add(s, type, tag, len, rank, timeout_ms);

    if (!round) {
        gs_boot_server_reply_error(conn, GS_ERR_NOMEM, "the store ran out of memory for %s '%s'",
                                   round_name(type), tag);
        return;
    }
    if (round->joined[rank]) {
        gs_boot_server_reply_error(conn, GS_ERR_PROTOCOL, "rank %d entered %s '%s' twice", rank,
                                   round_name(type), tag);
        return;
    }
    round->joined[rank] = 1;
    round->arrived++;
    conn->wait = GS_STORE_WAIT_ROUND;
    if (len == round->len)
        memcpy(round->data + (size_t)rank * len, blob, len);
    else if (!round->mismatch[0])
        snprintf(round->mismatch, sizeof(round->mismatch),
                 "%s '%s': rank %d gave %zu bytes but rank %d gave %zu", round_name(type), tag, rank, len,
                 round->first_rank, round->len);
    if (round->arrived < s->size)
        round_check_gone(s, round);
    else if (round->mismatch[0]) /* every rank learns of the mismatch, none waits for a rank that gave up */
        round_fail(s, round, GS_ERR_MISMATCH, round->mismatch);
    else
        round_complete(s, round);
}

void gs_boot_table_rank_gone(gs_store_server *s, int rank)
{
    gs_store_round *round = s->rounds;
    (void)rank;
    while (round) {
        gs_store_round *next = round->next;
        round_check_gone(s, round);
        round = next;
    }
}

/* ---- deadlines ---------------------------------------------------------- */

static void round_timeout(gs_store_server *s, gs_store_round *round)
{
    char text[GS_STORE_ERROR_MAX], missing[600];
    int count = gs_boot_format_ranks(round->joined, s->size, missing, sizeof(missing));
    snprintf(text, sizeof(text), "%s '%s' timed out after %" PRIu32 " ms: %s %s of %d never arrived",
             round_name(round->type), round->tag, round->timeout_ms, count == 1 ? "rank" : "ranks", missing,
             s->size);
    round_fail(s, round, GS_ERR_TIMEOUT, text);
}

uint64_t gs_boot_table_expire(gs_store_server *s, uint64_t now_ns)
{
    uint64_t next = UINT64_MAX;
    gs_store_round *round = s->rounds;

    while (round) {
        gs_store_round *following = round->next;
        if (now_ns >= round->deadline_ns)
            round_timeout(s, round);
        else if (round->deadline_ns < next)
            next = round->deadline_ns;
        round = following;
    }
    for (int r = 0; r < s->size; r++) {
        gs_store_conn *conn = s->by_rank[r];
        if (!conn || conn->wait != GS_STORE_WAIT_GET)
            continue;
        if (now_ns >= conn->wait_deadline_ns)
            gs_boot_server_reply_error(conn, GS_ERR_TIMEOUT,
                                       "get '%s' timed out after %" PRIu32 " ms: no rank has put that key",
                                       conn->wait_key, conn->wait_timeout_ms);
        else if (conn->wait_deadline_ns < next)
            next = conn->wait_deadline_ns;
    }
    return next;
}

void gs_boot_table_free(gs_store_server *s)
{
    while (s->rounds)
        round_unlink(s, s->rounds);
    for (size_t i = 0; i < s->nentries; i++) {
        free(s->entries[i].key);
        free(s->entries[i].value);
    }
    free(s->entries);
    s->entries = NULL;
    s->nentries = s->entries_cap = 0;
}
