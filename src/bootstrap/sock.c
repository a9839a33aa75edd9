/* TCP helpers of the bootstrap: address parsing, listen, connect, exact
 * send/receive with deadlines. They return a status and leave the report to
 * the caller, which knows the operation and the peer. */
#include "bootstrap/boot.h"

#include "util/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

gs_status gs_boot_parse_hostport(const char *text, char *host, size_t host_cap, int *port_p)
{
    const char *host_start = text, *host_end, *port_text;
    char *end;
    long port;

    if (!text || !*text)
        return GS_ERR_CONFIG;
    if (text[0] == '[') {
        host_start = text + 1;
        host_end = strchr(host_start, ']');
        if (!host_end || host_end[1] != ':')
            return GS_ERR_CONFIG;
        port_text = host_end + 2;
    } else {
        host_end = strchr(text, ':');
        if (!host_end || strchr(host_end + 1, ':')) /* none, or an IPv6 address without [] */
            return GS_ERR_CONFIG;
        port_text = host_end + 1;
    }
    if (host_end == host_start || (size_t)(host_end - host_start) >= host_cap)
        return GS_ERR_CONFIG;
    errno = 0;
    port = strtol(port_text, &end, 10);
    if (errno || end == port_text || *end || port < 1 || port > 65535)
        return GS_ERR_CONFIG;
    snprintf(host, host_cap, "%.*s", (int)(host_end - host_start), host_start);
    *port_p = (int)port;
    return GS_OK;
}

static bool addr_is_loopback(const struct addrinfo *ai)
{
    if (ai->ai_family == AF_INET) {
        const struct sockaddr_in *sin = (const void *)ai->ai_addr;
        return (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    }
    if (ai->ai_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const void *)ai->ai_addr;
        return IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
    }
    return false;
}

static gs_status resolve(const char *host, int port, struct addrinfo **list_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    if (getaddrinfo(host, service, &hints, list_p) != 0)
        return GS_ERR_CONFIG;
    return GS_OK;
}

/* The address to bind for host: loopback stays loopback, else the wildcard. */
static void bind_address(const struct addrinfo *ai, int port, struct sockaddr_storage *ss, socklen_t *len_p)
{
    memset(ss, 0, sizeof(*ss));
    if (addr_is_loopback(ai)) {
        memcpy(ss, ai->ai_addr, ai->ai_addrlen);
        *len_p = ai->ai_addrlen;
    } else if (ai->ai_family == AF_INET6) {
        struct sockaddr_in6 *sin6 = (void *)ss;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_addr = in6addr_any;
        *len_p = sizeof(*sin6);
    } else {
        struct sockaddr_in *sin = (void *)ss;
        sin->sin_family = AF_INET;
        sin->sin_addr.s_addr = htonl(INADDR_ANY);
        *len_p = sizeof(*sin);
    }
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)(void *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)(void *)ss)->sin_port = htons((uint16_t)port);
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
}

gs_status gs_boot_sock_listen(const char *host, int port, int *fd_p, int *port_p)
{
    struct addrinfo *list = NULL;
    struct sockaddr_storage ss;
    socklen_t len;
    int fd = -1, one = 1;
    gs_status status = resolve(host, port, &list);

    if (status != GS_OK)
        goto out;
    bind_address(list, port, &ss, &len);
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 1024) != 0) {
        status = GS_ERR_SYSTEM;
        goto close_fd;
    }
    *fd_p = fd;
    *port_p = bound_port(fd);
    goto out;
close_fd:
    if (fd >= 0) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
out:
    if (list)
        freeaddrinfo(list);
    return status;
}

/* One non-blocking connect attempt to ai, finished by the deadline. */
static gs_status connect_once(const struct addrinfo *ai, uint64_t deadline_ns, int *fd_p)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), err = 0, one = 1;
    socklen_t len = sizeof(err);
    struct pollfd pfd;

    if (fd < 0)
        return GS_ERR_SYSTEM;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            err = errno;
            goto fail;
        }
        pfd = (struct pollfd){.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, gs_deadline_left_ms(deadline_ns)) <= 0) {
            err = ETIMEDOUT;
            goto fail;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
            goto fail;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return GS_OK;
fail:
    close(fd);
    errno = err;
    return err == ETIMEDOUT ? GS_ERR_TIMEOUT : GS_ERR_SYSTEM;
}

gs_status gs_boot_sock_connect(const char *host, int port, uint64_t deadline_ns, int *fd_p)
{
    struct addrinfo *list = NULL;
    gs_status status = GS_ERR_TIMEOUT;
    int backoff_ms = 10;

    while (!gs_deadline_passed(deadline_ns)) {
        if (!list && resolve(host, port, &list) != GS_OK) {
            errno = EHOSTUNREACH; /* the name may appear later (DNS); retry */
            status = GS_ERR_CONFIG;
        }
        for (const struct addrinfo *ai = list; ai; ai = ai->ai_next) {
            status = connect_once(ai, deadline_ns, fd_p);
            if (status == GS_OK)
                goto out;
        }
        /* Refused or unreachable: the store may not be up yet. */
        int left = gs_deadline_left_ms(deadline_ns);
        usleep((useconds_t)(backoff_ms < left ? backoff_ms : left) * 1000u);
        backoff_ms = backoff_ms < 200 ? backoff_ms * 2 : 200;
    }
out:
    if (list)
        freeaddrinfo(list);
    return status;
}

static gs_status wait_ready(int fd, short events, uint64_t deadline_ns)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int rc = poll(&pfd, 1, gs_deadline_left_ms(deadline_ns));
    if (rc < 0 && errno == EINTR)
        return GS_OK;
    if (rc < 0)
        return GS_ERR_SYSTEM;
    if (rc == 0)
        return GS_ERR_TIMEOUT;
    return GS_OK;
}

gs_status gs_boot_sock_send(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            gs_status st = wait_ready(fd, POLLOUT, deadline_ns);
            if (st != GS_OK)
                return st;
        } else {
            return errno == EPIPE || errno == ECONNRESET ? GS_ERR_PEER_LOST : GS_ERR_SYSTEM;
        }
    }
    return GS_OK;
}

gs_status gs_boot_sock_recv(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return GS_ERR_PEER_LOST;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            gs_status st = wait_ready(fd, POLLIN, deadline_ns);
            if (st != GS_OK)
                return st;
        } else {
            return errno == ECONNRESET ? GS_ERR_PEER_LOST : GS_ERR_SYSTEM;
        }
    }
    return GS_OK;
}

void gs_boot_sock_peer_name(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char addr[INET6_ADDRSTRLEN] = "?";
    int port = 0;

    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *sin6 = (const void *)&ss;
            inet_ntop(AF_INET6, &sin6->sin6_addr, addr, sizeof(addr));
            port = ntohs(sin6->sin6_port);
            snprintf(buf, cap, "[%s]:%d", addr, port);
            return;
        }
        const struct sockaddr_in *sin = (const void *)&ss;
        inet_ntop(AF_INET, &sin->sin_addr, addr, sizeof(addr));
        port = ntohs(sin->sin_port);
    }
    snprintf(buf, cap, "%s:%d", addr, port);
}
