/*
 * The test harness: each GS_TEST runs in its own forked process with a
 * timeout (GS_TEST_TIMEOUT_S, default 120 s), its process group killed if it
 * overruns. Assertions print both sides. A test may skip with GS_SKIP(why):
 * skips are counted and shown, never passes.
 *
 *   GS_TEST(config_rejects_bad_size) { ... GS_ASSERT_EQ(st, GS_ERR_CONFIG); }
 *
 * A case written once for every transport takes the transport's name:
 *
 *   GS_TEST_TP(write_lands_exactly) { ct_run(2, write_body, transport, 0, NULL); }
 *
 * registers "<transport>.write_lands_exactly" once per built transport
 * (gs_tp_builtin), or only for the one GS_TEST_TRANSPORT names. On a
 * transport this machine cannot use (verbs without an active port) the case
 * skips, counted; tests/rxe-vm runs verbs where a device exists.
 *
 * Run: test_binary [--transport NAME] [substring...]
 *      only the cases whose name contains one of the substrings (all without
 *      any); --transport NAME: only the cases over that transport,
 *      --transport none: only the cases that take no transport.
 * The last line is "N passed, N failed, N skipped".
 * List: test_binary --list [--transport NAME] [substring...]
 *      the names it would run, one a line, none run.
 * Groups: test_binary --transports
 *      "none" if it has cases that take no transport, then each transport
 *      it has cases over that this machine can use, one a line: ctest makes
 *      one entry of each (tests/harness/ctest_entries.cmake).
 */
#ifndef GS_TEST_H
#define GS_TEST_H

#include "gradsync.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*gs_test_fn)(void);
typedef void (*gs_test_tp_fn)(const char *transport);
void gs_test_register(const char *name, gs_test_fn fn, const char *file);
void gs_test_register_tp(const char *name, gs_test_tp_fn fn, const char *file);
void gs_test_fail_here(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void gs_test_skip_here(const char *why) __attribute__((noreturn));

#define GS_TEST(name)                                                                                        \
    static void name(void);                                                                                  \
    __attribute__((constructor)) static void gs_test_reg_##name(void)                                        \
    {                                                                                                        \
        gs_test_register(#name, name, __FILE__);                                                             \
    }                                                                                                        \
    static void name(void)

#define GS_TEST_TP(name)                                                                                     \
    static void name(const char *transport);                                                                 \
    __attribute__((constructor)) static void gs_test_reg_##name(void)                                        \
    {                                                                                                        \
        gs_test_register_tp(#name, name, __FILE__);                                                          \
    }                                                                                                        \
    static void name(const char *transport)

#define GS_SKIP(why) gs_test_skip_here(why)

#define GS_ASSERT(cond)                                                                                      \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            gs_test_fail_here(__FILE__, __LINE__, "assertion failed: %s", #cond);                            \
    } while (0)

#define GS_ASSERT_INT_OP(a, op, b)                                                                           \
    do {                                                                                                     \
        long long gs_a_ = (long long)(a), gs_b_ = (long long)(b);                                            \
        if (!(gs_a_ op gs_b_))                                                                               \
            gs_test_fail_here(__FILE__, __LINE__, "expected %s %s %s: %lld vs %lld", #a, #op, #b, gs_a_,     \
                              gs_b_);                                                                        \
    } while (0)
#define GS_ASSERT_EQ(a, b) GS_ASSERT_INT_OP(a, ==, b)
#define GS_ASSERT_NE(a, b) GS_ASSERT_INT_OP(a, !=, b)
#define GS_ASSERT_LT(a, b) GS_ASSERT_INT_OP(a, <, b)
#define GS_ASSERT_LE(a, b) GS_ASSERT_INT_OP(a, <=, b)
#define GS_ASSERT_GT(a, b) GS_ASSERT_INT_OP(a, >, b)
#define GS_ASSERT_GE(a, b) GS_ASSERT_INT_OP(a, >=, b)

#define GS_ASSERT_U64_EQ(a, b)                                                                               \
    do {                                                                                                     \
        uint64_t gs_a_ = (uint64_t)(a), gs_b_ = (uint64_t)(b);                                               \
        if (gs_a_ != gs_b_)                                                                                  \
            gs_test_fail_here(__FILE__, __LINE__, "expected %s == %s: %" PRIu64 " vs %" PRIu64, #a, #b,      \
                              gs_a_, gs_b_);                                                                 \
    } while (0)

/* A gs_status call that must return the expected status; prints names and
 * gs_last_error() otherwise. */
#define GS_ASSERT_STATUS(expr, expected)                                                                     \
    do {                                                                                                     \
        gs_status gs_s_ = (expr), gs_e_ = (expected);                                                        \
        if (gs_s_ != gs_e_)                                                                                  \
            gs_test_fail_here(__FILE__, __LINE__, "%s returned %s, expected %s (last error: %s)", #expr,     \
                              gs_status_name(gs_s_), gs_status_name(gs_e_), gs_last_error());                \
    } while (0)
#define GS_ASSERT_OK(expr) GS_ASSERT_STATUS(expr, GS_OK)

#define GS_ASSERT_STR_EQ(a, b)                                                                               \
    do {                                                                                                     \
        const char *gs_a_ = (a), *gs_b_ = (b);                                                               \
        if (!gs_a_ || !gs_b_ || strcmp(gs_a_, gs_b_) != 0)                                                   \
            gs_test_fail_here(__FILE__, __LINE__, "expected %s == %s: \"%s\" vs \"%s\"", #a, #b,             \
                              gs_a_ ? gs_a_ : "(null)", gs_b_ ? gs_b_ : "(null)");                           \
    } while (0)

#define GS_ASSERT_CONTAINS(haystack, needle)                                                                 \
    do {                                                                                                     \
        const char *gs_h_ = (haystack), *gs_n_ = (needle);                                                   \
        if (!gs_h_ || !strstr(gs_h_, gs_n_))                                                                 \
            gs_test_fail_here(__FILE__, __LINE__, "expected %s to contain \"%s\": \"%s\"", #haystack, gs_n_, \
                              gs_h_ ? gs_h_ : "(null)");                                                     \
    } while (0)

#endif
