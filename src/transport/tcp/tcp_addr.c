/* Addresses and sockets of the tcp transport: which address to listen on,
 * the address blob each rank publishes, socket options and network
 * namespaces. Dialling and accepting the peers is tcp_connect.c's. */
#include "transport/tcp/tcp.h"

#include "util/clock.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gs_tcp_addr_format(const gs_tcp_addr *addr, char *buf, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (addr->sa.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)&addr->sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(buf, cap, "%s:%u", host, ntohs(in->sin_port));
    } else if (addr->sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const void *)&addr->sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(buf, cap, "[%s]:%u", host, ntohs(in6->sin6_port));
    } else {
        snprintf(buf, cap, "(address family %d)", addr->sa.ss_family);
    }
}

static void addr_set(gs_tcp_addr *addr, const struct sockaddr *sa)
{
    memset(addr, 0, sizeof(*addr));
    addr->len = sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memcpy(&addr->sa, sa, addr->len);
}

/* Rank of an IPv6 address for choosing among several: global before
 * unique-local before link-local. */
static int v6_preference(const struct sockaddr_in6 *in6)
{
    if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr))
        return 1;
    return 2;
}

/* The first IPv4 address of ifname (or IPv6 if it has none, or if the store
 * is reached over IPv6 and the interface has one). */
static gs_status addr_of_interface(const char *ifname, int prefer_family, int rank, gs_tcp_addr *addr_p)
{
    struct ifaddrs *list, *it;
    const struct sockaddr *v4 = NULL, *v6 = NULL;
    int v6_pref = 0;
    gs_status status = GS_OK;

    if (getifaddrs(&list) != 0)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM, "rank %d: getifaddrs failed: %s", rank, strerror(errno));
    for (it = list; it; it = it->ifa_next) {
        if (!it->ifa_addr || strcmp(it->ifa_name, ifname) != 0)
            continue;
        if (it->ifa_addr->sa_family == AF_INET && !v4)
            v4 = it->ifa_addr;
        if (it->ifa_addr->sa_family == AF_INET6 && v6_preference((const void *)it->ifa_addr) > v6_pref) {
            v6 = it->ifa_addr;
            v6_pref = v6_preference((const void *)it->ifa_addr);
        }
    }
    if (v4 && (prefer_family != AF_INET6 || !v6))
        addr_set(addr_p, v4);
    else if (v6)
        addr_set(addr_p, v6);
    else
        status = gs_fail(GS_SUBSYS_TCP, GS_ERR_CONFIG,
                         "rank %d: GS_TCP_IFNAME=%s: no such interface with an IPv4 or IPv6 address "
                         "(see `ip addr`)",
                         rank, ifname);
    freeifaddrs(list);
    return status;
}

/* The local address the kernel would use to reach host:port (a UDP
 * connect sends nothing). */
static gs_status addr_routing_to(const char *host, int port, int rank, gs_tcp_addr *addr_p)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    char port_text[16];
    gs_tcp_addr local;
    int fd = -1, rc;
    gs_status status = GS_OK;

    snprintf(port_text, sizeof(port_text), "%d", port > 0 ? port : 9);
    rc = getaddrinfo(host, port_text, &hints, &res);
    if (rc != 0)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_CONFIG,
                       "rank %d: cannot resolve the store host '%s': %s; set GS_TCP_IFNAME", rank, host,
                       gai_strerror(rc));
    fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    local.len = sizeof(local.sa);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&local.sa, &local.len) != 0) {
        status = gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM,
                         "rank %d: no route to the store host '%s': %s; set GS_TCP_IFNAME", rank, host,
                         strerror(errno));
        goto out;
    }
    addr_set(addr_p, (const struct sockaddr *)&local.sa);
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return status;
}

static int family_of_host(const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int family = AF_UNSPEC;
    if (host && *host && getaddrinfo(host, NULL, &hints, &res) == 0) {
        family = res->ai_family;
        freeaddrinfo(res);
    }
    return family;
}

gs_status gs_tcp_addr_choose(const gs_config *cfg, const char *store_host, int store_port, int rank,
                             gs_tcp_addr *addr_p)
{
    gs_tcp_addr addr;
    gs_status status;
    if (cfg->tcp_ifname[0])
        status = addr_of_interface(cfg->tcp_ifname, family_of_host(store_host), rank, &addr);
    else
        status =
            addr_routing_to(store_host && *store_host ? store_host : "127.0.0.1", store_port, rank, &addr);
    if (status != GS_OK)
        return status;
    if (addr.sa.ss_family == AF_INET)
        ((struct sockaddr_in *)&addr.sa)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&addr.sa)->sin6_port = 0;
    *addr_p = addr;
    return GS_OK;
}

gs_status gs_tcp_listen(const gs_tcp_addr *addr, int backlog, int rank, int *fd_p, gs_tcp_addr *bound_p)
{
    char text[80];
    gs_tcp_addr bound;
    int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    gs_tcp_addr_format(addr, text, sizeof(text));
    bound.len = sizeof(bound.sa);
    if (fd < 0 || bind(fd, (const struct sockaddr *)&addr->sa, addr->len) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr *)&bound.sa, &bound.len) != 0) {
        gs_status status = gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM, "rank %d: cannot listen on %s: %s", rank,
                                   text, strerror(errno));
        if (fd >= 0)
            close(fd);
        return status;
    }
    *fd_p = fd;
    *bound_p = bound;
    return GS_OK;
}

void gs_tcp_blob_pack(const gs_tcp_addr *addr, const uint8_t nonce[GS_TCP_NONCE_BYTES],
                      gs_tcp_addr_blob *blob)
{
    memset(blob, 0, sizeof(*blob));
    blob->version = GS_TCP_PROTO_VERSION;
    if (addr->sa.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const void *)&addr->sa;
        blob->family = GS_TCP_FAMILY_IPV4;
        blob->port = ntohs(in->sin_port);
        memcpy(blob->addr, &in->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *in6 = (const void *)&addr->sa;
        blob->family = GS_TCP_FAMILY_IPV6;
        blob->port = ntohs(in6->sin6_port);
        blob->scope_id = in6->sin6_scope_id;
        memcpy(blob->addr, &in6->sin6_addr, 16);
    }
    memcpy(blob->nonce, nonce, GS_TCP_NONCE_BYTES);
}

gs_status gs_tcp_blob_unpack(const gs_tcp_addr_blob *blob, int peer, gs_tcp_addr *addr_p)
{
    gs_tcp_addr addr;
    memset(&addr, 0, sizeof(addr));
    if (blob->version != GS_TCP_PROTO_VERSION || blob->port == 0 ||
        (blob->family != GS_TCP_FAMILY_IPV4 && blob->family != GS_TCP_FAMILY_IPV6))
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_PROTOCOL,
                       "rank %d published a tcp address this build cannot read (version %u, family %u): "
                       "are all ranks running the same gradsync?",
                       peer, blob->version, blob->family);
    if (blob->family == GS_TCP_FAMILY_IPV4) {
        struct sockaddr_in *in = (void *)&addr.sa;
        in->sin_family = AF_INET;
        in->sin_port = htons(blob->port);
        memcpy(&in->sin_addr, blob->addr, 4);
        addr.len = sizeof(*in);
    } else {
        struct sockaddr_in6 *in6 = (void *)&addr.sa;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(blob->port);
        in6->sin6_scope_id = blob->scope_id;
        memcpy(&in6->sin6_addr, blob->addr, 16);
        addr.len = sizeof(*in6);
    }
    *addr_p = addr;
    return GS_OK;
}

/* The last number in a /proc/sys file (0 if unreadable). */
static long proc_sys_last(const char *path)
{
    long value = 0, v;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    while (fscanf(f, "%ld", &v) == 1)
        value = v;
    fclose(f);
    return value;
}

/* The send buffer a connection starts with: the kernel's autotuning ceiling
 * (tcp_wmem's maximum) when wmem_max allows it, so that posted frames reach
 * the kernel at once instead of waiting in our queue while a new
 * connection's buffer grows (and are still delivered if this process dies
 * right after posting). 0: leave the kernel's autotuning alone. */
static int sndbuf_bytes(void)
{
    static int bytes = -1;
    if (bytes < 0) {
        long ceiling = proc_sys_last("/proc/sys/net/ipv4/tcp_wmem");
        long allowed = proc_sys_last("/proc/sys/net/core/wmem_max");
        bytes = ceiling > 0 && allowed >= ceiling && ceiling <= (1l << 30) ? (int)ceiling : 0;
    }
    return bytes;
}

gs_status gs_tcp_sock_tune(int fd, const gs_config *cfg, int rank, int peer)
{
    int one = 1, flags = fcntl(fd, F_GETFL);
    unsigned user_timeout = cfg->timeout_ms > 0 ? (unsigned)cfg->timeout_ms : 0;
    int keep_s = cfg->timeout_ms >= 2000 ? (int)(cfg->timeout_ms / 2000) : 1;
    int keep_cnt = 3;

    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM,
                       "rank %d: cannot make the socket to rank %d non-blocking: %s", rank, peer,
                       strerror(errno));
    /* latency first; a socket that is not TCP (tests use socketpairs) keeps its defaults */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 && errno != EOPNOTSUPP)
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_SYSTEM,
                       "rank %d: TCP_NODELAY on the socket to rank %d failed: %s", rank, peer,
                       strerror(errno));
    if (sndbuf_bytes() > 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &(int){sndbuf_bytes()}, sizeof(int));
    /* a peer that stops acknowledging is declared lost after GS_TIMEOUT_MS */
    if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout)) == 0) {
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &keep_s, sizeof(keep_s));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &keep_s, sizeof(keep_s));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &keep_cnt, sizeof(keep_cnt));
    }
    return GS_OK;
}

/* The namespace GS_TCP_NETNS gives rank (entry rank mod n), as a path. */
static bool netns_path(const char *list, int rank, char *path, size_t cap)
{
    int n = 1, want;
    const char *p = list;
    for (const char *c = list; *c; c++)
        n += *c == ',';
    want = rank % n;
    for (int i = 0; i < want; i++)
        p = strchr(p, ',') + 1;
    size_t len = strcspn(p, ",");
    if (len == 0)
        return false;
    snprintf(path, cap, "%s%.*s", memchr(p, '/', len) ? "" : "/run/netns/", (int)len, p);
    return true;
}

gs_status gs_tcp_netns_enter(const gs_config *cfg, int rank, int *saved_p)
{
    char path[GS_CONFIG_STR_MAX + 16];
    int target, saved;
    *saved_p = -1;
    if (!cfg->tcp_netns[0])
        return GS_OK;
    if (!netns_path(cfg->tcp_netns, rank, path, sizeof(path)))
        return gs_fail(GS_SUBSYS_TCP, GS_ERR_CONFIG,
                       "rank %d: GS_TCP_NETNS='%s' has an empty entry for this rank", rank, cfg->tcp_netns);
    saved = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    target = open(path, O_RDONLY | O_CLOEXEC);
    if (saved < 0 || target < 0 || setns(target, CLONE_NEWNET) != 0) {
        gs_status status =
            gs_fail(GS_SUBSYS_TCP, GS_ERR_CONFIG,
                    "rank %d: GS_TCP_NETNS: cannot enter the network namespace %s: %s "
                    "(it must exist, e.g. `ip netns add`, and entering it needs CAP_SYS_ADMIN)",
                    rank, path, strerror(errno));
        if (saved >= 0)
            close(saved);
        if (target >= 0)
            close(target);
        return status;
    }
    close(target);
    gs_log_info(TCP, "rank %d: tcp sockets in the network namespace %s", rank, path);
    *saved_p = saved;
    return GS_OK;
}

void gs_tcp_netns_leave(int saved, int rank)
{
    if (saved < 0)
        return;
    if (setns(saved, CLONE_NEWNET) != 0)
        gs_log_error(TCP,
                     "rank %d: returning from GS_TCP_NETNS to the process's network namespace failed: %s",
                     rank, strerror(errno));
    close(saved);
}
