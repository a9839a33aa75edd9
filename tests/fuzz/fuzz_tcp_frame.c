/*
 * libFuzzer target for the tcp transport's frame parser.
 *
 * Each input is the byte stream a peer sends after the hello. It goes
 * through the pure checks (every 64-byte window as a header, the start as a
 * hello) and then, through a socket pair, into a real transport endpoint
 * whose progress engine parses it, lands payloads, serves READs and atomics
 * and answers; the stream ends with end of file. An input that starts with
 * "GS2C" is sent over the two connections of a pair instead (the peer is
 * the higher rank, the one that may SWITCH): after the magic, segments of
 * [connection byte (low bit: 0 shared, 1 side), length (2 bytes, little
 * endian), bytes], each written to its connection in turn, so frames can
 * wait on the connection not being read, or arrive before or after their
 * SWITCH; both streams end with end of file. The registered region sits
 * between two PROT_NONE guard pages, so a byte placed outside it crashes;
 * ASan and UBSan catch the rest. Region keys are fixed (slot | 1 << 32) so
 * the seed corpus can name them.
 *
 * Build and run: tests/fuzz/ci.sh BUILD_DIR (clang -fsanitize=fuzzer,address).
 */
#include "transport/tcp/tcp.h"
#include "util/config.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define PAGE   4096
#define ROUNDS 2000

static const char *fuzz_getenv(const char *name, void *arg)
{
    (void)arg;
    if (strcmp(name, "GS_TIMEOUT_MS") == 0)
        return "50";
    if (strcmp(name, "GS_LOG_LEVEL") == 0)
        return "none";
    return NULL;
}

static gs_config cfg;
static uint8_t *pages; /* guard | region | guard | receive buffers */

static void setup_once(void)
{
    if (pages)
        return;
    if (gs_config_parse(&cfg, fuzz_getenv, NULL) != GS_OK)
        abort();
    gs_log_configure(GS_LOG_NONE, "all", "/dev/null"); /* gs_fail logs errors whatever the level */
    pages = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED || mprotect(pages, PAGE, PROT_NONE) ||
        mprotect(pages + 2 * PAGE, PAGE, PROT_NONE))
        abort();
}

/* Registers a region and gives it the key the corpus uses. */
static gs_mr *region(gs_tcp_tp *tp, void *addr, size_t len, unsigned access)
{
    gs_mr *mr;
    if (gs_tcp_mr_reg(&tp->base, addr, len, access, &mr) != GS_OK)
        abort();
    ((gs_tcp_mr *)mr)->key = (1ull << 32) | (uint32_t)((gs_tcp_mr *)mr)->key;
    return mr;
}

/* The pure checks, on every header-sized window and on the start as a hello. */
static void check_windows(const uint8_t *data, size_t size)
{
    gs_tcp_rx_expect expect = {.next_seq = 0, .sent_reqs = 4, .acked = 0};
    const char *why;
    for (size_t at = 0; at + sizeof(gs_tcp_hdr) <= size; at += 8) {
        gs_tcp_hdr hdr;
        memcpy(&hdr, data + at, sizeof(hdr));
        (void)gs_tcp_hdr_check(&hdr, &expect, &why);
    }
    if (size >= sizeof(gs_tcp_hello)) {
        gs_tcp_hello hello;
        memcpy(&hello, data, sizeof(hello));
        (void)gs_tcp_hello_check(&hello, GS_TCP_HELLO, 4, 0, hello.nonce, "token", &why);
    }
}

/* Reads and drops what the transport answers, so it never blocks. */
static void drain(int fd)
{
    uint8_t sink[65536];
    while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
        ;
}

/* The next piece of the input to write: all of it on one connection, or
 * the next segment of a two-connection input. Returns false at the end. */
static bool next_piece(const uint8_t *data, size_t size, bool two, size_t *at_p, size_t *off_p, size_t *len_p,
                       int *conn_p)
{
    size_t at = *at_p;
    if (!two) {
        *off_p = 0, *len_p = size, *conn_p = 0;
        *at_p = size;
        return at < size;
    }
    if (at + 3 > size)
        return false;
    size_t len = (size_t)data[at + 1] | (size_t)data[at + 2] << 8;
    *conn_p = data[at] & 1;
    *off_p = at + 3;
    *len_p = len < size - (at + 3) ? len : size - (at + 3); /* the last one may be cut short */
    *at_p = *off_p + *len_p;
    return true;
}

/* Streams the input into the endpoint, then end of file on every
 * connection, driving progress. */
static void run_stream(gs_tcp_tp *tp, gs_mr *bufs, const int feed[2], const uint8_t *data, size_t size,
                       bool two)
{
    gs_tcp_ep *ep = gs_tcp_ep_at(tp, 1);
    size_t at = two ? 4 : 0, off = 0, len = 0, sent = 0;
    int conn = 0;
    bool more = next_piece(data, size, two, &at, &off, &len, &conn), closed = false;
    for (int round = 0; round < ROUNDS && !ep->dead; round++) {
        gs_wc wc[16];
        int n;
        while (more && sent == len) {
            sent = 0;
            more = next_piece(data, size, two, &at, &off, &len, &conn);
        }
        if (more) {
            ssize_t w = send(feed[conn], data + off + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            sent += w > 0 ? (size_t)w : 0;
        } else if (!closed) {
            shutdown(feed[0], SHUT_WR);
            if (feed[1] != feed[0])
                shutdown(feed[1], SHUT_WR);
            closed = true;
        }
        (void)gs_tcp_poll(&tp->base, wc, 16, &n);
        if (ep->recv_count < 4)
            (void)gs_tcp_recv(&ep->base, bufs->addr, bufs, PAGE, (uint64_t)round);
        drain(feed[0]);
        if (feed[1] != feed[0])
            drain(feed[1]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gs_tcp_tp *tp = NULL;
    gs_mr *mr, *ro, *bufs;
    bool two = size >= 4 && memcmp(data, "GS2C", 4) == 0;
    int shared[2], side[2] = {-1, -1}, feed[2];

    setup_once();
    check_windows(data, size);
    memset(pages + PAGE, 0x5c, PAGE);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, shared) != 0 ||
        (two && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, side) != 0) ||
        gs_tcp_tp_create(&cfg, 0, 2, &tp) != GS_OK ||
        gs_tcp_ep_attach2(tp, 1, shared[0], two ? side[0] : shared[0]) != GS_OK)
        abort();
    feed[0] = shared[1];
    feed[1] = two ? side[1] : shared[1];
    mr = region(tp, pages + PAGE, PAGE, GS_ACCESS_ALL);               /* key 0x100000000 */
    ro = region(tp, pages + PAGE, PAGE / 2, GS_ACCESS_REMOTE_READ);   /* key 0x100000001 */
    bufs = region(tp, pages + 3 * PAGE, PAGE, GS_ACCESS_LOCAL_WRITE); /* key 0x100000002 */
    run_stream(tp, bufs, feed, data, size, two);
    (void)gs_tcp_mr_dereg(mr);
    (void)gs_tcp_mr_dereg(ro);
    (void)gs_tcp_mr_dereg(bufs);
    gs_tcp_tp_destroy(tp);
    close(shared[1]);
    if (two)
        close(side[1]);
    return 0;
}
