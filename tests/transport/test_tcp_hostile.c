/* Hostile input to the tcp transport: a raw socket speaks bad frames to a
 * transport's endpoint, and strangers knock during connection setup. Every
 * time the connection is dropped with a logged reason, the process goes on,
 * and no byte outside the registered region changes. */
#include "tcp_pair.h"

#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>

#define PAGE   4096
#define FILLER 0x5c

/* A transport (rank 0 of 2) whose peer 1 is a raw socket, with one region:
 * the middle page of three, the other two its guards. */
typedef struct hostile {
    gs_config cfg;
    gs_tcp_tp *tp;
    int raw;
    uint8_t *pages;
    gs_mr *mr;
} hostile;

static void hostile_open(hostile *h, unsigned access)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", NULL};
    int fds[2];
    tcp_config(&h->cfg, env);
    tcp_loopback_pair(fds);
    GS_ASSERT_OK(gs_tcp_tp_create(&h->cfg, 0, 2, &h->tp));
    GS_ASSERT_OK(gs_tcp_ep_attach(h->tp, 1, fds[0]));
    h->raw = fds[1];
    h->pages = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    GS_ASSERT(h->pages != MAP_FAILED);
    memset(h->pages, FILLER, 3 * PAGE);
    GS_ASSERT_OK(gs_tcp_mr_reg(&h->tp->base, h->pages + PAGE, PAGE, access, &h->mr));
}

static uint64_t hostile_key(const hostile *h)
{
    return ((const gs_tcp_mr *)h->mr)->key;
}

static void raw_send(hostile *h, const void *buf, size_t len)
{
    GS_ASSERT_EQ(send(h->raw, buf, len, MSG_NOSIGNAL), (long long)len);
}

static gs_tcp_hdr request(int op, uint64_t key, uint64_t off, uint64_t len)
{
    return (gs_tcp_hdr){
        .version = GS_TCP_PROTO_VERSION, .op = (uint8_t)op, .key = key, .off = off, .len = len};
}

/* Polls the transport until it drops the raw peer; returns its reason. */
static const char *dropped_because(hostile *h)
{
    uint64_t deadline = gs_deadline_after_ms(3000);
    gs_tcp_ep *ep = gs_tcp_ep_at(h->tp, 1);
    gs_wc wc[4];
    int n;
    while (!ep->dead && !gs_deadline_passed(deadline))
        gs_tcp_poll(&h->tp->base, wc, 4, &n);
    GS_ASSERT(ep->dead);
    GS_ASSERT(ep->lost);
    /* the caller hears of it: empty polls say why rank 1 is gone, in the
     * words it was logged with (dropped or truncated) */
    GS_ASSERT_STATUS(gs_tcp_poll(&h->tp->base, wc, 4, &n), GS_ERR_PEER_LOST);
    GS_ASSERT_STR_EQ(gs_last_error(), ep->why);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 0: ");
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 1");
    return ep->why;
}

/* The raw side sees a NAK with status (if nak) and then end of stream. */
static void raw_expect_close(hostile *h, gs_status nak_status)
{
    gs_tcp_hdr nak;
    uint8_t sink[256];
    struct timeval tv = {.tv_sec = 3};
    ssize_t got;
    setsockopt(h->raw, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (nak_status != GS_OK) {
        GS_ASSERT_EQ(recv(h->raw, &nak, sizeof(nak), MSG_WAITALL), (long long)sizeof(nak));
        GS_ASSERT_EQ(nak.op, GS_TCP_OP_NAK);
        GS_ASSERT_EQ(-(int)nak.status, nak_status);
    }
    got = recv(h->raw, sink, sizeof(sink), 0);
    GS_ASSERT(got == 0 || (got < 0 && errno == ECONNRESET));
}

/* Bytes [lo, hi) of the region may have changed; nothing else did. */
static void untouched_except(const hostile *h, size_t lo, size_t hi)
{
    for (size_t i = 0; i < 3 * PAGE; i++) {
        if (i >= PAGE + lo && i < PAGE + hi)
            continue;
        if (h->pages[i] != FILLER)
            gs_test_fail_here(__FILE__, __LINE__, "byte %zu changed (region is [%d, %d))", i, PAGE, 2 * PAGE);
    }
}

static void hostile_close(hostile *h)
{
    GS_ASSERT_OK(gs_tcp_mr_dereg(h->mr));
    gs_tcp_tp_destroy(h->tp);
    close(h->raw);
    munmap(h->pages, 3 * PAGE);
}

/* Sends one bad header (and payload bytes), expects the drop and its reason. */
static void expect_dropped(gs_tcp_hdr hdr, size_t payload, const char *reason, gs_status nak)
{
    hostile h;
    static uint8_t junk[2 * PAGE];
    memset(junk, 0xee, sizeof(junk));
    hostile_open(&h, GS_ACCESS_ALL);
    if (hdr.key == 1)
        hdr.key = hostile_key(&h);
    raw_send(&h, &hdr, sizeof(hdr));
    if (payload)
        raw_send(&h, junk, payload);
    GS_ASSERT_CONTAINS(dropped_because(&h), reason);
    raw_expect_close(&h, nak);
    untouched_except(&h, 0, 0);
    hostile_close(&h);
}

GS_TEST(tcp_bad_version_is_dropped)
{
    gs_tcp_hdr hdr = request(GS_TCP_OP_WRITE, 1, 0, 8);
    hdr.version = 9;
    expect_dropped(hdr, 8, "unsupported protocol version", GS_ERR_PROTOCOL);
}

GS_TEST(tcp_unknown_op_is_dropped)
{
    expect_dropped(request(77, 1, 0, 8), 8, "unknown op", GS_OK);
}

GS_TEST(tcp_switch_on_one_connection_is_dropped)
{
    expect_dropped(request(GS_TCP_OP_SWITCH, 0, 0, 0), 0, "SWITCH on an endpoint with one connection", GS_OK);
}

GS_TEST(tcp_write_past_the_region_is_dropped_untouched)
{
    expect_dropped(request(GS_TCP_OP_WRITE, 1, PAGE - 100, 200), 200, "beyond the end of the region",
                   GS_ERR_REMOTE_ACCESS);
}

GS_TEST(tcp_write_with_wrapping_offset_is_dropped_untouched)
{
    expect_dropped(request(GS_TCP_OP_WRITE_IMM, 1, UINT64_MAX - 50, 100), 100, "beyond the end of the region",
                   GS_ERR_REMOTE_ACCESS);
}

GS_TEST(tcp_write_with_huge_length_is_dropped)
{
    expect_dropped(request(GS_TCP_OP_WRITE, 1, 0, 1ull << 62), 64, "protocol's bound", GS_ERR_PROTOCOL);
}

GS_TEST(tcp_write_with_unknown_key_is_dropped)
{
    expect_dropped(request(GS_TCP_OP_WRITE, 0xdead00000000ull, 0, 8), 8, "no region has this key",
                   GS_ERR_REMOTE_ACCESS);
}

GS_TEST(tcp_read_past_the_region_is_dropped)
{
    gs_tcp_hdr hdr = request(GS_TCP_OP_READ_REQ, 1, 8, 0);
    hdr.arg0 = PAGE; /* 8 bytes too many: the guard page must not leak */
    expect_dropped(hdr, 0, "beyond the end of the region", GS_ERR_REMOTE_ACCESS);
}

GS_TEST(tcp_atomic_on_the_guard_is_dropped)
{
    expect_dropped(request(GS_TCP_OP_FETCH_ADD, 1, PAGE, 0), 0, "beyond the end of the region",
                   GS_ERR_REMOTE_ACCESS);
}

GS_TEST(tcp_request_out_of_sequence_is_dropped)
{
    gs_tcp_hdr hdr = request(GS_TCP_OP_WRITE, 1, 0, 8);
    hdr.seq = 5;
    expect_dropped(hdr, 8, "out of sequence", GS_ERR_PROTOCOL);
}

GS_TEST(tcp_unused_field_set_is_dropped)
{
    gs_tcp_hdr hdr = request(GS_TCP_OP_WRITE, 1, 0, 8);
    hdr.arg1 = 1;
    expect_dropped(hdr, 8, "second argument", GS_ERR_PROTOCOL);
}

GS_TEST(tcp_oversized_send_is_dropped)
{
    expect_dropped(request(GS_TCP_OP_SEND, 0, 0, GS_SEND_MAX + 1), 64, "longer than GS_SEND_MAX",
                   GS_ERR_PROTOCOL);
}

GS_TEST(tcp_reply_to_nothing_is_dropped)
{
    expect_dropped(request(GS_TCP_OP_READ_RESP, 0, 0, 8), 8, "reply to a request never sent", GS_OK);
}

GS_TEST(tcp_ack_of_nothing_is_dropped)
{
    gs_tcp_hdr hdr = request(GS_TCP_OP_ACK, 0, 0, 0);
    hdr.ack = 3;
    expect_dropped(hdr, 0, "acknowledgement of requests never sent", GS_OK);
}

GS_TEST(tcp_frame_after_goodbye_is_dropped)
{
    hostile h;
    gs_tcp_hdr bye = request(GS_TCP_OP_BYE, 0, 0, 0), hdr = request(GS_TCP_OP_WRITE, 0, 0, 8);
    hostile_open(&h, GS_ACCESS_ALL);
    hdr.key = hostile_key(&h);
    raw_send(&h, &bye, sizeof(bye));
    raw_send(&h, &hdr, sizeof(hdr));
    raw_send(&h, "12345678", 8);
    GS_ASSERT_CONTAINS(dropped_because(&h), "after its goodbye");
    untouched_except(&h, 0, 0);
    hostile_close(&h);
}

GS_TEST(tcp_truncated_header_is_dropped)
{
    hostile h;
    gs_tcp_hdr hdr = request(GS_TCP_OP_WRITE, 0, 0, 8);
    hostile_open(&h, GS_ACCESS_ALL);
    hdr.key = hostile_key(&h);
    raw_send(&h, &hdr, 30);
    shutdown(h.raw, SHUT_WR);
    GS_ASSERT_CONTAINS(dropped_because(&h), "partial header");
    untouched_except(&h, 0, 0);
    hostile_close(&h);
}

GS_TEST(tcp_truncated_payload_changes_only_the_region)
{
    hostile h;
    static uint8_t payload[600];
    gs_tcp_hdr hdr = request(GS_TCP_OP_WRITE_IMM, 0, 100, 1000);
    hostile_open(&h, GS_ACCESS_ALL);
    hdr.key = hostile_key(&h);
    memset(payload, 0x77, sizeof(payload));
    raw_send(&h, &hdr, sizeof(hdr));
    raw_send(&h, payload, sizeof(payload));
    shutdown(h.raw, SHUT_WR);
    GS_ASSERT_CONTAINS(dropped_because(&h), "truncated");
    untouched_except(&h, 100, 700);
    GS_ASSERT_EQ(h.pages[PAGE + 100], 0x77);
    GS_ASSERT_EQ(h.pages[PAGE + 699], 0x77);
    GS_ASSERT_EQ(h.tp->cq_reserved, 0); /* the WRITE_IMM's completion slot came back */
    hostile_close(&h);
}

GS_TEST(tcp_good_frames_then_garbage)
{
    hostile h;
    gs_tcp_hdr w = request(GS_TCP_OP_WRITE_IMM, 0, 8, 4), garbage;
    gs_wc wc;
    int n = 0;
    hostile_open(&h, GS_ACCESS_ALL);
    w.key = hostile_key(&h);
    w.imm = 99;
    memset(&garbage, 0xa7, sizeof(garbage));
    raw_send(&h, &w, sizeof(w));
    raw_send(&h, "abcd", 4);
    raw_send(&h, &garbage, sizeof(garbage));
    /* the good frame landed and completed before the garbage dropped the peer */
    for (uint64_t deadline = gs_deadline_after_ms(3000); n == 0 && !gs_deadline_passed(deadline);)
        GS_ASSERT_OK(gs_tcp_poll(&h.tp->base, &wc, 1, &n));
    GS_ASSERT_EQ(n, 1);
    GS_ASSERT_EQ(wc.opcode, GS_WC_RECV_IMM);
    GS_ASSERT_EQ(wc.imm, 99);
    GS_ASSERT(memcmp(h.pages + PAGE + 8, "abcd", 4) == 0);
    GS_ASSERT_CONTAINS(dropped_because(&h), "unsupported protocol version");
    untouched_except(&h, 8, 12);
    hostile_close(&h);
}

GS_TEST(tcp_write_to_a_read_only_region_is_dropped_untouched)
{
    hostile h;
    gs_tcp_hdr hdr = request(GS_TCP_OP_WRITE, 0, 0, 16);
    hostile_open(&h, GS_ACCESS_REMOTE_READ);
    hdr.key = hostile_key(&h);
    raw_send(&h, &hdr, sizeof(hdr));
    raw_send(&h, "0123456789abcdef", 16);
    GS_ASSERT_CONTAINS(dropped_because(&h), "not registered for remote write");
    raw_expect_close(&h, GS_ERR_REMOTE_ACCESS);
    untouched_except(&h, 0, 0);
    hostile_close(&h);
}

/* ---- connection setup: strangers knock while rank 0 waits for rank 1 ---- */

typedef struct acceptor {
    gs_config cfg;
    gs_tcp_addr_blob blobs[2];
    gs_tcp_setup setup;
    int lfd;
    int fds[2], tx_fds[2];
    gs_status status;
} acceptor;

static void *acceptor_main(void *arg)
{
    acceptor *a = arg;
    a->status = gs_tcp_connect_all(&a->setup, a->lfd, a->fds, a->tx_fds);
    return NULL;
}

static int knock(const gs_tcp_addr *addr, const void *bytes, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    GS_ASSERT_EQ(connect(fd, (const struct sockaddr *)&addr->sa, addr->len), 0);
    if (len)
        GS_ASSERT_EQ(send(fd, bytes, len, MSG_NOSIGNAL), (long long)len);
    return fd;
}

/* The acceptor closes fd without a word. */
static void expect_refused(int fd)
{
    uint8_t b[sizeof(gs_tcp_hello)];
    struct timeval tv = {.tv_sec = 3};
    ssize_t got;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    got = recv(fd, b, sizeof(b), 0);
    GS_ASSERT(got == 0 || (got < 0 && errno == ECONNRESET));
    close(fd);
}

GS_TEST(tcp_setup_drops_strangers_and_accepts_the_real_peer)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", "GS_JOB_TOKEN", "s3cret-token", NULL};
    static acceptor a;
    gs_tcp_addr addr, bound, bound1;
    gs_tcp_hello hello, answer;
    pthread_t th;
    uint8_t garbage[sizeof(gs_tcp_hello)];
    int silent, fd, lfd1, dialled = -1;

    tcp_config(&a.cfg, env);
    GS_ASSERT_OK(gs_tcp_addr_choose(&a.cfg, "127.0.0.1", 9, 0, &addr));
    GS_ASSERT_OK(gs_tcp_listen(&addr, 8, 0, &a.lfd, &bound));
    GS_ASSERT_OK(gs_tcp_listen(&addr, 8, 1, &lfd1, &bound1)); /* the real rank 1's (this test's) */
    gs_tcp_blob_pack(&bound, (const uint8_t *)"nonce-of-rank-0!", &a.blobs[0]);
    gs_tcp_blob_pack(&bound1, (const uint8_t *)"nonce-of-rank-1!", &a.blobs[1]);
    a.setup = (gs_tcp_setup){.cfg = &a.cfg,
                             .rank = 0,
                             .size = 2,
                             .instance = 3,
                             .blobs = a.blobs,
                             .deadline_ns = gs_deadline_after_ms(5000)};
    GS_ASSERT_EQ(pthread_create(&th, NULL, acceptor_main, &a), 0);

    /* silent, and a hello cut short: neither holds up the rest */
    silent = knock(&bound, NULL, 0);
    gs_tcp_hello_fill(&hello, GS_TCP_HELLO, 1, 2, 3, a.blobs[0].nonce, "s3cret-token");
    close(knock(&bound, &hello, 10));
    /* wrong token, wrong nonce, another job's instance, rank 0 itself, garbage */
    gs_tcp_hello_fill(&hello, GS_TCP_HELLO, 1, 2, 3, a.blobs[0].nonce, "guess");
    expect_refused(knock(&bound, &hello, sizeof(hello)));
    gs_tcp_hello_fill(&hello, GS_TCP_HELLO, 1, 2, 3, (const uint8_t *)"0000000000000000", "s3cret-token");
    expect_refused(knock(&bound, &hello, sizeof(hello)));
    gs_tcp_hello_fill(&hello, GS_TCP_HELLO, 1, 2, 4, a.blobs[0].nonce, "s3cret-token");
    expect_refused(knock(&bound, &hello, sizeof(hello)));
    gs_tcp_hello_fill(&hello, GS_TCP_HELLO, 0, 2, 3, a.blobs[0].nonce, "s3cret-token");
    expect_refused(knock(&bound, &hello, sizeof(hello)));
    memset(garbage, 'G', sizeof(garbage));
    expect_refused(knock(&bound, garbage, sizeof(garbage)));

    /* the real rank 1: answered with rank 0's proof of our own nonce */
    gs_tcp_hello_fill(&hello, GS_TCP_HELLO, 1, 2, 3, a.blobs[0].nonce, "s3cret-token");
    fd = knock(&bound, &hello, sizeof(hello));
    GS_ASSERT_EQ(recv(fd, &answer, sizeof(answer), MSG_WAITALL), (long long)sizeof(answer));
    {
        const char *why = "";
        GS_ASSERT_OK(
            gs_tcp_hello_check(&answer, GS_TCP_HELLO_ACK, 2, 3, a.blobs[1].nonce, "s3cret-token", &why));
        GS_ASSERT_EQ(answer.rank, 0);
    }
    /* rank 0 dials the real rank 1 too (a connection per direction): it
     * proves the token and rank 1's nonce, and takes rank 1's answer */
    for (uint64_t deadline = gs_deadline_after_ms(3000); dialled < 0 && !gs_deadline_passed(deadline);)
        dialled = accept(lfd1, NULL, NULL);
    GS_ASSERT(dialled >= 0);
    GS_ASSERT_EQ(recv(dialled, &hello, sizeof(hello), MSG_WAITALL), (long long)sizeof(hello));
    {
        const char *why = "";
        GS_ASSERT_OK(gs_tcp_hello_check(&hello, GS_TCP_HELLO, 2, 3, a.blobs[1].nonce, "s3cret-token", &why));
        GS_ASSERT_EQ(hello.rank, 0);
    }
    gs_tcp_hello_fill(&answer, GS_TCP_HELLO_ACK, 1, 2, 3, a.blobs[0].nonce, "s3cret-token");
    GS_ASSERT_EQ(send(dialled, &answer, sizeof(answer), MSG_NOSIGNAL), (long long)sizeof(answer));
    pthread_join(th, NULL);
    GS_ASSERT_OK(a.status);
    GS_ASSERT(a.fds[1] >= 0 && a.tx_fds[1] >= 0);
    close(a.fds[1]);
    close(a.tx_fds[1]);
    close(dialled);
    close(lfd1);
    close(fd);
    close(silent);
    close(a.lfd);
}

typedef struct dialer {
    gs_config cfg;
    gs_tcp_addr_blob blobs[2];
    gs_tcp_setup setup;
    int lfd;
    int fds[2], tx_fds[2];
    gs_status status;
    char error[1024]; /* gs_last_error() of the dialling thread */
} dialer;

static void *dialer_main(void *arg)
{
    dialer *d = arg;
    d->status = gs_tcp_connect_all(&d->setup, d->lfd, d->fds, d->tx_fds);
    snprintf(d->error, sizeof(d->error), "%s", gs_last_error());
    return NULL;
}

/* Rank 1 dials "rank 0", which answers with the wrong token: rank 1 gives
 * up with GS_ERR_AUTH naming the peer. */
GS_TEST(tcp_setup_refuses_an_impostor_peer)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", "GS_JOB_TOKEN", "right", NULL};
    static dialer d;
    gs_tcp_addr addr, fake, mine;
    gs_tcp_hello hello, answer;
    pthread_t th;
    int fake_lfd, fd;
    const char *why = "";

    tcp_config(&d.cfg, env);
    GS_ASSERT_OK(gs_tcp_addr_choose(&d.cfg, "127.0.0.1", 9, 1, &addr));
    GS_ASSERT_OK(gs_tcp_listen(&addr, 8, 1, &fake_lfd, &fake));
    GS_ASSERT_OK(gs_tcp_listen(&addr, 8, 1, &d.lfd, &mine));
    gs_tcp_blob_pack(&fake, (const uint8_t *)"nonce-of-rank-0!", &d.blobs[0]);
    gs_tcp_blob_pack(&mine, (const uint8_t *)"nonce-of-rank-1!", &d.blobs[1]);
    d.setup = (gs_tcp_setup){.cfg = &d.cfg,
                             .rank = 1,
                             .size = 2,
                             .instance = 0,
                             .blobs = d.blobs,
                             .deadline_ns = gs_deadline_after_ms(5000)};
    GS_ASSERT_EQ(pthread_create(&th, NULL, dialer_main, &d), 0);
    fd = -1;
    for (uint64_t deadline = gs_deadline_after_ms(3000); fd < 0 && !gs_deadline_passed(deadline);)
        fd = accept(fake_lfd, NULL, NULL);
    GS_ASSERT(fd >= 0);
    GS_ASSERT_EQ(recv(fd, &hello, sizeof(hello), MSG_WAITALL), (long long)sizeof(hello));
    /* the dialler proved the token and our nonce */
    GS_ASSERT_OK(gs_tcp_hello_check(&hello, GS_TCP_HELLO, 2, 0, d.blobs[0].nonce, "right", &why));
    gs_tcp_hello_fill(&answer, GS_TCP_HELLO_ACK, 0, 2, 0, d.blobs[1].nonce, "wrong");
    GS_ASSERT_EQ(send(fd, &answer, sizeof(answer), MSG_NOSIGNAL), (long long)sizeof(answer));
    pthread_join(th, NULL);
    GS_ASSERT_STATUS(d.status, GS_ERR_AUTH);
    GS_ASSERT_CONTAINS(d.error, "wrong job token");
    GS_ASSERT_CONTAINS(d.error, "from rank 0");
    close(fd);
    close(fake_lfd);
    close(d.lfd);
}

GS_TEST(tcp_hello_check_names_what_is_wrong)
{
    gs_tcp_hello h;
    const uint8_t *nonce = (const uint8_t *)"0123456789abcdef";
    const char *why = "";
    gs_tcp_hello_fill(&h, GS_TCP_HELLO, 2, 4, 0, nonce, "tok");
    GS_ASSERT_OK(gs_tcp_hello_check(&h, GS_TCP_HELLO, 4, 0, nonce, "tok", &why));
    GS_ASSERT_STATUS(gs_tcp_hello_check(&h, GS_TCP_HELLO, 4, 0, nonce, "tok2", &why), GS_ERR_AUTH);
    GS_ASSERT_CONTAINS(why, "token");
    GS_ASSERT_STATUS(gs_tcp_hello_check(&h, GS_TCP_HELLO, 4, 0, nonce, "to", &why), GS_ERR_AUTH);
    GS_ASSERT_STATUS(gs_tcp_hello_check(&h, GS_TCP_HELLO_ACK, 4, 0, nonce, "tok", &why), GS_ERR_PROTOCOL);
    GS_ASSERT_STATUS(gs_tcp_hello_check(&h, GS_TCP_HELLO, 3, 0, nonce, "tok", &why), GS_ERR_AUTH);
    h.rank = 4;
    GS_ASSERT_STATUS(gs_tcp_hello_check(&h, GS_TCP_HELLO, 4, 0, nonce, "tok", &why), GS_ERR_AUTH);
    GS_ASSERT_CONTAINS(why, "outside the job");
    h.version = GS_TCP_PROTO_VERSION + 1;
    GS_ASSERT_STATUS(gs_tcp_hello_check(&h, GS_TCP_HELLO, 4, 0, nonce, "tok", &why), GS_ERR_PROTOCOL);
}
