/*
 * Two tcp transports in one process (rank 0 and rank 1 of a 2-rank job),
 * joined by a loopback TCP connection without the bootstrap store, or one
 * transport whose peer is a raw socket the test speaks the wire format on.
 * A single thread drives both sides: pair_next_wc() polls both until the
 * wanted side has a completion.
 */
#ifndef GS_TESTS_TCP_PAIR_H
#define GS_TESTS_TCP_PAIR_H

#include "gs_test.h"
#include "transport/tcp/tcp.h"
#include "util/clock.h"
#include "util/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct tcp_env {
    const char *const *pairs; /* name, value, ..., NULL */
} tcp_env;

static inline const char *tcp_env_get(const char *name, void *arg)
{
    const tcp_env *env = arg;
    for (const char *const *p = env->pairs; p && *p; p += 2)
        if (strcmp(*p, name) == 0)
            return p[1];
    return NULL;
}

/* A configuration from defaults and the given GS_* pairs. */
static inline void tcp_config(gs_config *cfg, const char *const *pairs)
{
    tcp_env env = {pairs};
    GS_ASSERT_OK(gs_config_parse(cfg, tcp_env_get, &env));
}

/* A connected pair of loopback TCP sockets. */
static inline void tcp_loopback_pair(int fds[2])
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    GS_ASSERT(lfd >= 0);
    GS_ASSERT_EQ(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    GS_ASSERT_EQ(listen(lfd, 1), 0);
    GS_ASSERT_EQ(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    GS_ASSERT_EQ(connect(fds[0], (struct sockaddr *)&sa, sizeof(sa)), 0);
    fds[1] = accept(lfd, NULL, NULL);
    GS_ASSERT(fds[1] >= 0);
    close(lfd);
}

typedef struct tcp_pair {
    gs_config cfg[2];
    gs_tcp_tp *tp[2];
    gs_wc got[2][256]; /* completions polled but not yet taken */
    int ngot[2];
    gs_status last[2]; /* what the last poll of each side returned */
} tcp_pair;

static inline void tcp_pair_open_with(tcp_pair *p, const char *const *env0, const char *const *env1)
{
    int fds[2];
    memset(p, 0, sizeof(*p));
    tcp_config(&p->cfg[0], env0);
    tcp_config(&p->cfg[1], env1);
    tcp_loopback_pair(fds);
    for (int r = 0; r < 2; r++) {
        GS_ASSERT_OK(gs_tcp_tp_create(&p->cfg[r], r, 2, &p->tp[r]));
        GS_ASSERT_OK(gs_tcp_ep_attach(p->tp[r], 1 - r, fds[r]));
        if (p->cfg[r].progress_thread)
            GS_ASSERT_OK(gs_tcp_thread_start(p->tp[r]));
    }
}

/* Two connections per pair, as the transport's own setup makes them: main
 * (dialled by rank 0, the lower) and side (rank 1's). */
static inline void tcp_pair_open_two(tcp_pair *p)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", NULL};
    int main_fds[2], side_fds[2];
    memset(p, 0, sizeof(*p));
    tcp_loopback_pair(main_fds);
    tcp_loopback_pair(side_fds);
    for (int r = 0; r < 2; r++) {
        tcp_config(&p->cfg[r], env);
        GS_ASSERT_OK(gs_tcp_tp_create(&p->cfg[r], r, 2, &p->tp[r]));
        GS_ASSERT_OK(gs_tcp_ep_attach2(p->tp[r], 1 - r, main_fds[r], side_fds[r]));
    }
}

static inline void tcp_pair_open(tcp_pair *p)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", NULL};
    tcp_pair_open_with(p, env, env);
}

static inline void tcp_pair_close(tcp_pair *p)
{
    for (int r = 0; r < 2; r++)
        gs_tcp_tp_destroy(p->tp[r]);
}

static inline gs_ep *tcp_pair_ep(tcp_pair *p, int side)
{
    return p->tp[side]->base.eps[1 - side];
}

/* Polls both sides once, keeping what each gets (and the poll's status:
 * GS_ERR_PEER_LOST once a side has lost its peer and has nothing else). */
static inline void tcp_pair_drive(tcp_pair *p)
{
    for (int r = 0; r < 2; r++) {
        int n = 0, room = 256 - p->ngot[r];
        if (!p->tp[r] || room == 0)
            continue;
        p->last[r] = gs_tcp_poll(&p->tp[r]->base, p->got[r] + p->ngot[r], room, &n);
        if (p->last[r] == GS_OK)
            p->ngot[r] += n;
    }
}

/* Drives both sides until side's poll returns status (up to 5 s). */
static inline gs_status tcp_pair_poll_until(tcp_pair *p, int side, gs_status status)
{
    uint64_t deadline = gs_deadline_after_ms(5000);
    p->last[side] = GS_OK;
    while (p->last[side] != status && !gs_deadline_passed(deadline))
        tcp_pair_drive(p);
    return p->last[side];
}

/* The next completion of side, driving both sides for up to 5 s;
 * returns 0 if none came. */
static inline int tcp_pair_next_wc(tcp_pair *p, int side, gs_wc *wc_p)
{
    uint64_t deadline = gs_deadline_after_ms(5000);
    while (p->ngot[side] == 0 && !gs_deadline_passed(deadline))
        tcp_pair_drive(p);
    if (p->ngot[side] == 0)
        return 0;
    *wc_p = p->got[side][0];
    memmove(p->got[side], p->got[side] + 1, (size_t)(--p->ngot[side]) * sizeof(gs_wc));
    return 1;
}

/* The next completion of side, which must exist and have this opcode and status. */
#define TCP_EXPECT_WC(p, side, wc, op, st)                                                                   \
    do {                                                                                                     \
        GS_ASSERT(tcp_pair_next_wc((p), (side), &(wc)));                                                     \
        GS_ASSERT_STR_EQ(gs_status_name((wc).status), gs_status_name(st));                                   \
        GS_ASSERT_EQ((wc).opcode, (op));                                                                     \
    } while (0)

static inline gs_rmr_head tcp_rmr(gs_mr *mr)
{
    gs_rmr_head head;
    gs_tcp_mr_pack(mr, &head);
    return head;
}

#endif
