/*
 * The transport conformance suite: written once, run against every built
 * transport (GS_TEST_TP cases, "<transport>.<case>", so `test_conformance
 * shm.` or `--transport shm` runs one backend and skips are counted per
 * backend), one file per operation group:
 *   setup.c       open, an endpoint per peer, caller memory (gs_mr_reg)
 *   rma.c         WRITE, WRITE_IMM and READ at every size and alignment;
 *                 WRITE then WRITE_IMM ordering; a notification backlog
 *   send.c        SEND/RECV: every size, streams, sends before any receive
 *   atomic.c      FETCH_ADD and CMP_SWAP, alone and under contention
 *   completion.c  every rank to every rank in each completion mode, event
 *                 mode sleeping, a wait timing out
 *   errors.c      access violations, bad arguments, a peer killed mid-stream
 *   ct.c          the helpers below, shared by all of them
 *
 * Every case runs its ranks as forked processes of one job (multirank.h).
 * Access errors may surface either as the post's return value or as the
 * status of the op's completion (verbs reports them asynchronously); the
 * helpers accept both.
 */
#ifndef GS_TESTS_CONFORMANCE_CT_H
#define GS_TESTS_CONFORMANCE_CT_H

#include "gs_test.h"
#include "multirank.h"

#include "bootstrap/boot.h"
#include "transport/tp.h"
#include "util/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CT_TIMEOUT_MS 60000 /* the whole multirank run */
#define KIB           1024u
#define MIB           (1024u * 1024u)
#define CT_FILL       0xa5u /* what a buffer holds where nothing may land */

/* What a rank body gets. */
typedef struct ct_arg {
    const char *transport;
    int param; /* case-specific */
} ct_arg;

/* The environments of the completion modes. */
extern const char *const ct_env_spin[];
extern const char *const ct_env_event[];
extern const char *const ct_env_hybrid[];

/* The transport named, opened in this rank's job. */
gs_tp *ct_open(gs_ctx *ctx, const char *transport);
unsigned ct_caps(gs_tp *tp);

/* Every rank's descriptor of mr, in rank order (size entries; free them). */
gs_rmr *ct_exchange(gs_ctx *ctx, const char *tag, const gs_mr *mr);

/* A region of len bytes with every access in *mr_p; returns every rank's
 * descriptor of it (ct_exchange). */
gs_rmr *ct_region(gs_ctx *ctx, gs_tp *tp, size_t len, const char *tag, gs_mr **mr_p);

/* A byte pattern per seed: fill, and the first index that differs (or len). */
uint8_t ct_byte(uint32_t seed, size_t i);
void ct_fill(void *buf, size_t len, uint32_t seed);
size_t ct_check(const void *buf, size_t len, uint32_t seed);
size_t ct_check_const(const void *buf, size_t len, uint8_t value);

/* The next completion of opcode op (from peer, -1: any; with wr_id unless
 * any_id), whatever its status. Others are kept for later calls. */
gs_wc ct_next(gs_tp *tp, gs_wc_opcode op, int peer, uint64_t wr_id, bool any_id);

/* The next completion of op from peer, which must have succeeded. */
gs_wc ct_expect(gs_tp *tp, gs_wc_opcode op, int peer);

/* The outcome of a signaled post: its error, or its completion's status. */
gs_status ct_outcome(gs_tp *tp, gs_status posted, gs_wc_opcode op, int peer, uint64_t wr_id);

/* Polls once, keeping what comes for ct_next. */
void ct_poll_into_stash(gs_tp *tp);

/* Posts until the transport takes it (GS_ERR_AGAIN: poll, keeping what comes). */
#define CT_POST(tp, call)                                                                                    \
    do {                                                                                                     \
        gs_status ct_st_;                                                                                    \
        while ((ct_st_ = (call)) == GS_ERR_AGAIN)                                                            \
            ct_poll_into_stash(tp);                                                                          \
        GS_ASSERT_STATUS(ct_st_, GS_OK);                                                                     \
    } while (0)

/* The end of a rank body: a barrier (tag), then all freed, mr deregistered
 * and tp closed. */
void ct_finish(gs_ctx *ctx, const char *tag, gs_tp *tp, gs_mr *mr, gs_rmr *all);

/* Runs fn on n ranks (arg: transport and param, extra environment env);
 * skips when every rank skipped, fails unless every rank exited 0. */
void ct_run(int n, gs_test_rank_fn fn, const char *transport, int param, const char *const *env);

#endif
