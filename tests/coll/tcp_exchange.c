/*
 * The floor under a 2-rank allreduce over tcp on one host: two processes
 * exchange the same bytes as the allreduce moves (N bytes each way for N
 * bytes reduced: half in the reduce-scatter, half in the all-gather) through
 * plain send/recv on loopback, with nothing else to do: no reduction, no
 * framing, no completion. A connection per direction, non-blocking sockets
 * with TCP_NODELAY, the send buffer set to the kernel's autotuning ceiling
 * (tcp_wmem's maximum) when wmem_max allows it, as gradsync's tcp transport
 * does, 256 KiB chunks, and a sender at most two chunks ahead of what it has
 * received (the ring's credit window), both sides polling with recv like
 * gradsync's spin wait.
 *
 *   tcp_exchange SIZES [ITERS]    e.g. tcp_exchange 1M,16M,64M 20
 *
 * The buffers are page-aligned, as gsbench's: from a buffer 16 bytes past a
 * page boundary the same exchange took 1.6-2.5x as long here (the kernel's
 * copies into a misaligned destination), while gradsync, which receives
 * into its own aligned slots, measures the same at offsets 0, 16 and 64
 * (gsbench --offset).
 *
 * Method as gsbench and ../shared/bench: per size a warm-up, then ITERS
 * exchanges, each after a barrier; an exchange's time is the max over the
 * two processes; the median over iterations is printed:
 *   exchange BYTES median_us min_us max_us
 * Every wait has a 30 s deadline; every byte received is checked (a value
 * that tells its offset and its sender) after the last exchange of a size.
 * Used by tests/coll/bench_vs_mpi.sh (TRANSPORT=tcp); built by CMake with the tests,
 * and run small as the ctest entry coll/tcp_exchange (every byte checked).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK       (256u << 10)
#define WINDOW      2
#define DEADLINE_NS (30ull * 1000000000ull)
#define MAX_ITERS   1000

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "tcp_exchange (pid %d): %s: %s\n", (int)getpid(), what,
            errno ? strerror(errno) : "failed");
    exit(1);
}

static int listener(struct sockaddr_in *addr)
{
    socklen_t len = sizeof(*addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    *addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)addr, sizeof(*addr)) != 0 ||
        getsockname(fd, (struct sockaddr *)addr, &len) != 0 || listen(fd, 1) != 0)
        die("listen on loopback");
    return fd;
}

static int dial(const struct sockaddr_in *addr)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) != 0)
        die("connect on loopback");
    return fd;
}

/* Field `field` (from 0) of a /proc/sys file of numbers; 0 when unreadable. */
static long sysctl_field(const char *path, int field)
{
    long v[3] = {0, 0, 0};
    FILE *f = fopen(path, "r");
    int got = f ? fscanf(f, "%ld %ld %ld", &v[0], &v[1], &v[2]) : 0;
    if (f)
        fclose(f);
    return got > field ? v[field] : 0;
}

/* As the transport's gs_tcp_sock_tune: no Nagle, non-blocking, and the send
 * buffer at the autotuning ceiling when wmem_max allows it. */
static void tune(int fd)
{
    int one = 1;
    long ceiling = sysctl_field("/proc/sys/net/ipv4/tcp_wmem", 2);
    long allowed = sysctl_field("/proc/sys/net/core/wmem_max", 0);
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
        fcntl(fd, F_SETFL, O_NONBLOCK) != 0)
        die("socket options");
    if (ceiling > 0 && allowed >= ceiling && ceiling <= (1l << 30) &&
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &(int){(int)ceiling}, sizeof(int)) != 0)
        die("SO_SNDBUF");
}

/* Waits until fd is ready for events, or dies at the deadline. */
static void wait_ready(int fd, short events, uint64_t deadline)
{
    struct pollfd p = {.fd = fd, .events = events};
    while (poll(&p, 1, 100) == 0 || (p.revents & events) == 0) {
        if (p.revents & (POLLERR | POLLHUP))
            die("the other process closed its connection");
        if (now_ns() > deadline) {
            errno = ETIMEDOUT;
            die("waiting for the other process");
        }
    }
}

/* One byte each way: both sides start the exchange together. */
static void barrier(int tx, int rx)
{
    uint64_t deadline = now_ns() + DEADLINE_NS;
    char b = 1;
    while (send(tx, &b, 1, MSG_NOSIGNAL) != 1) {
        if (errno != EAGAIN)
            die("barrier send");
        wait_ready(tx, POLLOUT, deadline);
    }
    for (;;) {
        ssize_t k = recv(rx, &b, 1, 0);
        if (k == 1)
            break;
        if (k == 0) {
            errno = EPIPE;
            die("the other process closed its connection");
        }
        if (errno != EAGAIN && errno != EINTR)
            die("barrier recv");
        wait_ready(rx, POLLIN, deadline);
    }
}

/* bytes out on tx from src and in on rx into dst, the sender at most WINDOW
 * chunks ahead of the receiver. Returns the time in ns. */
static uint64_t exchange(int tx, int rx, const char *src, char *dst, size_t bytes)
{
    uint64_t t0 = now_ns(), deadline = t0 + DEADLINE_NS;
    size_t sent = 0, got = 0;
    unsigned idle = 0;
    while (sent < bytes || got < bytes) {
        size_t allow = (got / CHUNK + WINDOW) * CHUNK;
        bool moved = false;
        if (allow > bytes)
            allow = bytes;
        if (sent < allow) {
            ssize_t k = send(tx, src + sent, allow - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0)
                sent += (size_t)k, moved = true;
            else if (k < 0 && errno != EAGAIN)
                die("send");
        }
        if (got < bytes) {
            ssize_t k = recv(rx, dst + got, bytes - got, MSG_DONTWAIT);
            if (k > 0)
                got += (size_t)k, moved = true;
            else if (k == 0) {
                errno = EPIPE;
                die("the other process closed its connection");
            } else if (errno != EAGAIN && errno != EINTR)
                die("recv");
        }
        if (!moved && ++idle % 4096 == 0 && now_ns() > deadline) {
            errno = ETIMEDOUT;
            die("exchange");
        }
    }
    return now_ns() - t0;
}

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    return *end == '\0' || *end == ',' ? (size_t)v : 0;
}

/* The byte at offset i of the child's (from_child) or the parent's data. */
static char pattern(size_t i, bool from_child)
{
    return (char)(i * 31 + i / 4096 + (from_child ? 1 : 2));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t sizes[16], nsizes = 0, max = 0;
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    if (argc < 2 || argc > 3 || iters < 1 || iters > MAX_ITERS) {
        fprintf(stderr, "usage: tcp_exchange SIZES [ITERS 1..%d]   e.g. tcp_exchange 1M,16M,64M 20\n",
                MAX_ITERS);
        return 2;
    }
    for (const char *s = argv[1]; s && *s && nsizes < 16; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
        size_t v = parse_size(s);
        if (v == 0 || v > (1ull << 30)) {
            fprintf(stderr, "tcp_exchange: bad size in '%s' (1 B .. 1 GiB, K and M suffixes)\n", argv[1]);
            return 2;
        }
        sizes[nsizes++] = v;
        max = v > max ? v : max;
    }

    struct sockaddr_in a_up, a_down;
    int l_up = listener(&a_up), l_down = listener(&a_down);
    /* the child's times come back to the parent through this region */
    uint64_t *child_ns =
        mmap(NULL, sizeof(uint64_t) * MAX_ITERS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (child_ns == MAP_FAILED)
        die("mmap");
    alarm(600); /* the whole run, as a last resort */
    pid_t child = fork();
    if (child < 0)
        die("fork");
    int tx, rx;
    if (child == 0) {
        tx = dial(&a_up);
        rx = dial(&a_down);
    } else {
        rx = accept(l_up, NULL, NULL);
        tx = accept(l_down, NULL, NULL);
        if (rx < 0 || tx < 0)
            die("accept");
    }
    close(l_up);
    close(l_down);
    tune(tx);
    tune(rx);
    char *src = aligned_alloc(4096, (max + 4095) / 4096 * 4096),
         *dst = aligned_alloc(4096, (max + 4095) / 4096 * 4096);
    uint64_t *ns = malloc(sizeof(uint64_t) * (size_t)iters);
    if (!src || !dst || !ns)
        die("malloc");
    for (size_t i = 0; i < max; i++) /* each byte's value tells its place and its sender */
        src[i] = pattern(i, child == 0);

    for (size_t s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        int warm = iters / 10 < 5 ? 5 : iters / 10; /* as gsbench: a fresh connection starts slowly */
        memset(dst, 0, bytes);
        for (int i = -warm; i < iters; i++) {
            barrier(tx, rx);
            uint64_t t = exchange(tx, rx, src, dst, bytes);
            if (i >= 0)
                ns[i] = t;
        }
        for (size_t i = 0; i < bytes; i++)
            if (dst[i] != pattern(i, child != 0)) {
                fprintf(stderr, "tcp_exchange: byte %zu of %zu received is %d, not %d\n", i, bytes, dst[i],
                        pattern(i, child != 0));
                exit(1);
            }
        if (child == 0)
            memcpy(child_ns, ns, sizeof(uint64_t) * (size_t)iters);
        barrier(tx, rx); /* the child's times are in place */
        if (child != 0) {
            for (int i = 0; i < iters; i++)
                ns[i] = ns[i] > child_ns[i] ? ns[i] : child_ns[i];
            qsort(ns, (size_t)iters, sizeof(uint64_t), cmp_u64);
            printf("exchange %zu %.2f %.2f %.2f\n", bytes, ns[iters / 2] / 1e3, ns[0] / 1e3,
                   ns[iters - 1] / 1e3);
            fflush(stdout);
        }
        barrier(tx, rx); /* the parent has read them */
    }
    close(tx);
    close(rx);
    free(src);
    free(dst);
    free(ns);
    if (child == 0)
        return 0;
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "tcp_exchange: the child process failed\n");
        return 1;
    }
    return 0;
}
