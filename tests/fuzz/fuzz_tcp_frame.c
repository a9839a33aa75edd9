/*
 * libFuzzer target for the tcp transport's frame parser.
 *
 * Each input is the byte stream a peer sends after the hello. It goes
 * through the pure checks (every 64-byte window as a header, the start as a
 * hello) and then, through a socket pair, into a real transport endpoint
 * whose progress engine parses it, lands payloads, serves READs and atomics
 * and answers; the stream ends with end of file. The registered region sits
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

/* Streams the input into the endpoint, then end of file, driving progress. */
static void run_stream(gs_tcp_tp *tp, gs_mr *bufs, int fd, const uint8_t *data, size_t size)
{
    gs_tcp_ep *ep = gs_tcp_ep_at(tp, 1);
    size_t sent = 0;
    bool closed = false;
    for (int round = 0; round < ROUNDS && !ep->dead; round++) {
        gs_wc wc[16];
        int n;
        if (sent < size) {
            ssize_t w = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            sent += w > 0 ? (size_t)w : 0;
        } else if (!closed) {
            shutdown(fd, SHUT_WR);
            closed = true;
        }
        (void)gs_tcp_poll(&tp->base, wc, 16, &n);
        if (ep->recv_count < 4)
            (void)gs_tcp_recv(&ep->base, bufs->addr, bufs, PAGE, (uint64_t)round);
        drain(fd);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gs_tcp_tp *tp = NULL;
    gs_mr *mr, *ro, *bufs;
    int fds[2];

    setup_once();
    check_windows(data, size);
    memset(pages + PAGE, 0x5c, PAGE);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0 ||
        gs_tcp_tp_create(&cfg, 0, 2, &tp) != GS_OK || gs_tcp_ep_attach(tp, 1, fds[0]) != GS_OK)
        abort();
    mr = region(tp, pages + PAGE, PAGE, GS_ACCESS_ALL);               /* key 0x100000000 */
    ro = region(tp, pages + PAGE, PAGE / 2, GS_ACCESS_REMOTE_READ);   /* key 0x100000001 */
    bufs = region(tp, pages + 3 * PAGE, PAGE, GS_ACCESS_LOCAL_WRITE); /* key 0x100000002 */
    run_stream(tp, bufs, fds[1], data, size);
    (void)gs_tcp_mr_dereg(mr);
    (void)gs_tcp_mr_dereg(ro);
    (void)gs_tcp_mr_dereg(bufs);
    gs_tcp_tp_destroy(tp);
    close(fds[1]);
    return 0;
}
