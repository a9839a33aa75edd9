/*
 * shm transport instance: the control segment, connecting to every peer
 * through the bootstrap store, close, and the ops table.
 *
 * Open, on every rank:
 *   1. create my control segment (memfd, 0600) and pre-touch my inbound rings;
 *   2. allgather address blobs (pid, memfd number and inode, host id);
 *   3. map every peer's control segment through /proc/<pid>/fd/<fd>, open a
 *      pidfd on it, and probe cross-memory attach (process_vm_readv);
 *   4. allgather the outcome, so that every rank fails together, naming the
 *      rank that could not connect.
 * Opened for one host's ranks (gs_shm_open_host, under the mixed
 * transport), step 3 skips the ranks of other hosts: they have no endpoint.
 */
#include "transport/shm/shm.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define PRETOUCH_MAX_RANKS 16

size_t gs_shm_ctrl_bytes(int size)
{
    size_t rings = GS_SHM_RING_OFF + (size_t)size * sizeof(gs_shm_ring);
    return gs_round_up(rings, 4096) + (size_t)GS_SHM_MAX_REGIONS * sizeof(gs_shm_region);
}

static uint64_t key_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&seed;
    return seed;
}

/* Creates the memfd control segment, mapped, with its head filled in. */
static gs_status ctrl_create(gs_shm_tp *tp, int rank, int size)
{
    gs_status st = GS_OK;
    size_t len = gs_shm_ctrl_bytes(size);
    int fd = memfd_create("gradsync-shm-ctrl", MFD_CLOEXEC);
    void *ctrl = MAP_FAILED;

    if (fd < 0) {
        st = gs_fail(GS_SUBSYS_SHM, GS_ERR_SYSTEM, "rank %d: memfd_create of the control segment failed: %s",
                     rank, strerror(errno));
        goto out;
    }
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)len) != 0) {
        st = gs_fail(GS_SUBSYS_SHM, GS_ERR_SYSTEM, "rank %d: sizing the %zu-byte control segment failed: %s",
                     rank, len, strerror(errno));
        goto close_fd;
    }
    ctrl = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ctrl == MAP_FAILED) {
        st = gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM, "rank %d: mapping the %zu-byte control segment failed: %s",
                     rank, len, strerror(errno));
        goto close_fd;
    }
    *gs_shm_head(ctrl) = (gs_shm_ctrl_head){
        .version = GS_SHM_PROTO_VERSION,
        .rank = (uint32_t)rank,
        .size = (uint32_t)size,
        .pid = (int32_t)getpid(),
        .magic = GS_SHM_MAGIC,
        .ring_off = GS_SHM_RING_OFF,
        .ring_stride = sizeof(gs_shm_ring),
        .region_off = gs_round_up(GS_SHM_RING_OFF + (size_t)size * sizeof(gs_shm_ring), 4096),
        .total_len = len,
    };
    /* Small jobs take the rings' first-touch faults now, not on the first
     * lap; large ones leave the rings of peers that never talk untouched. */
    for (int src = 0; src < size && size <= PRETOUCH_MAX_RANKS; src++)
        if (src != rank)
            gs_pages_touch(gs_shm_ring_of(ctrl, src), sizeof(gs_shm_ring));
    tp->ctrl_fd = fd;
    tp->ctrl = ctrl;
    tp->ctrl_len = len;
    goto out;
close_fd:
    close(fd);
out:
    return st;
}

gs_status gs_shm_tp_create(const gs_config *cfg, int rank, int size, gs_shm_tp **tp_p)
{
    gs_status st = GS_ERR_NOMEM;
    gs_shm_tp *tp = gs_calloc(1, sizeof(*tp));

    if (!tp)
        goto out;
    tp->ctrl_fd = -1;
    tp->base.ops = &gs_shm_ops;
    tp->base.cfg = cfg;
    tp->base.rank = rank;
    tp->base.size = size;
    tp->peers = gs_calloc((size_t)size, sizeof(*tp->peers));
    tp->base.eps = gs_calloc((size_t)size, sizeof(*tp->base.eps));
    tp->free_slots = gs_calloc(GS_SHM_MAX_REGIONS, sizeof(*tp->free_slots));
    if (!tp->peers || !tp->base.eps || !tp->free_slots)
        goto free_tp;
    for (int p = 0; p < size; p++)
        tp->peers[p].pidfd = -1;
    tp->key_seed = key_seed();
    st = ctrl_create(tp, rank, size);
    if (st != GS_OK)
        goto free_tp;
    *tp_p = tp;
    goto out;
free_tp:
    free(tp->free_slots);
    free(tp->base.eps);
    free(tp->peers);
    free(tp);
out:
    return st;
}

void gs_shm_tp_addr(const gs_shm_tp *tp, const char *host_id, gs_shm_addr *addr_p)
{
    struct stat sb;
    gs_shm_addr addr = {
        .version = GS_SHM_PROTO_VERSION,
        .pid = (int32_t)getpid(),
        .ctrl_fd = tp->ctrl_fd,
        .rank = (uint32_t)tp->base.rank,
        .ctrl_ino = fstat(tp->ctrl_fd, &sb) == 0 ? (uint64_t)sb.st_ino : 0,
        .ctrl_len = tp->ctrl_len,
        .ctrl_addr = (uint64_t)(uintptr_t)tp->ctrl,
    };
    snprintf(addr.host_id, sizeof(addr.host_id), "%s", host_id ? host_id : "");
    *addr_p = addr;
}

/* Opens another process's memfd through /proc and checks it is the one meant. */
gs_status gs_shm_open_peer_fd(int rank, int peer, pid_t pid, int fd, uint64_t ino, const char *what,
                              int *fd_p)
{
    char path[64];
    struct stat sb;
    int local;

    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
    local = open(path, O_RDWR | O_CLOEXEC);
    if (local < 0) {
        int err = errno;
        if (err == ENOENT && kill(pid, 0) != 0)
            return gs_fail_peer_lost(GS_SUBSYS_SHM, rank, peer,
                                     "its process %d is gone, found opening its %s", (int)pid, what);
        return gs_fail(GS_SUBSYS_SHM, err == ENOENT ? GS_ERR_REMOTE_ACCESS : GS_ERR_UNSUPPORTED,
                       "rank %d: cannot open %s of peer rank %d (%s): %s; ranks must run as the same user in "
                       "one pid namespace with /proc visible",
                       rank, what, peer, path, strerror(err));
    }
    if (fstat(local, &sb) != 0 || (uint64_t)sb.st_ino != ino) {
        close(local);
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
                       "rank %d: %s of peer rank %d (%s) is not the segment it announced (inode differs)",
                       rank, what, peer, path);
    }
    *fd_p = local;
    return GS_OK;
}

/* Whether process_vm_readv reaches the peer: reads the magic of its own mapping. */
static bool cma_probe(gs_shm_tp *tp, const gs_shm_addr *a)
{
    uint64_t magic = 0;
    struct iovec local = {&magic, sizeof(magic)};
    struct iovec remote = {(void *)(uintptr_t)(a->ctrl_addr + offsetof(gs_shm_ctrl_head, magic)),
                           sizeof(magic)};
    ssize_t n = process_vm_readv(a->pid, &local, 1, &remote, 1, 0);

    if (n == (ssize_t)sizeof(magic) && magic == GS_SHM_MAGIC)
        return true;
    if (!tp->cma_why[0])
        snprintf(tp->cma_why, sizeof(tp->cma_why),
                 "process_vm_readv from rank %d to rank %d: %s (see kernel.yama.ptrace_scope)", tp->base.rank,
                 (int)a->rank, n < 0 ? strerror(errno) : "wrong data");
    return false;
}

/* A pidfd on the peer's process, or (kernels before 5.3, valgrind) its start
 * time, to tell later whether it has exited. */
static gs_status watch_peer(gs_shm_ep *ep, int rank, int p, pid_t pid)
{
    bool zombie = false;
    int err;
    ep->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (ep->pidfd >= 0)
        return GS_OK;
    err = errno;
    if (err == ENOSYS && gs_shm_proc_stat(pid, &ep->start_time, &zombie) && !zombie)
        return GS_OK;
    return gs_fail_peer_lost(GS_SUBSYS_SHM, rank, p, "cannot watch its process %d: %s", (int)pid,
                             err == ENOSYS ? "it is gone" : strerror(err));
}

static gs_status connect_peer(gs_shm_tp *tp, int p, const gs_shm_addr *a, const char *my_host)
{
    gs_shm_ep *ep = &tp->peers[p];
    int rank = tp->base.rank, fd = -1;
    gs_status st;
    void *ctrl;

    if (a->version != GS_SHM_PROTO_VERSION || a->rank != (uint32_t)p)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_PROTOCOL,
                       "rank %d: address of rank %d has version %u (want %u) or names rank %u", rank, p,
                       a->version, GS_SHM_PROTO_VERSION, a->rank);
    if (strncmp(a->host_id, my_host, GS_SHM_HOST_ID_MAX) != 0)
        return gs_fail(
            GS_SUBSYS_SHM, GS_ERR_UNSUPPORTED,
            "rank %d: the shm transport needs every rank on one host, but rank %d is on '%.60s' and "
            "rank %d on '%.60s'; use GS_TRANSPORT=tcp or verbs",
            rank, p, a->host_id, rank, my_host);
    st = gs_shm_open_peer_fd(rank, p, a->pid, a->ctrl_fd, a->ctrl_ino, "control segment", &fd);
    if (st != GS_OK)
        return st;
    ctrl = mmap(NULL, a->ctrl_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (ctrl == MAP_FAILED)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM,
                       "rank %d: mapping the control segment of rank %d failed: %s", rank, p,
                       strerror(errno));
    ep->ctrl = ctrl;
    ep->ctrl_len = a->ctrl_len;
    if (gs_shm_head(ctrl)->version != GS_SHM_PROTO_VERSION || gs_shm_head(ctrl)->magic != GS_SHM_MAGIC ||
        gs_shm_head(ctrl)->rank != (uint32_t)p || gs_shm_head(ctrl)->size != (uint32_t)tp->base.size ||
        gs_shm_head(ctrl)->total_len != a->ctrl_len ||
        gs_shm_head(ctrl)->region_off != gs_shm_head(tp->ctrl)->region_off)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_PROTOCOL,
                       "rank %d: control segment of rank %d has a different layout (version %u, size %u)",
                       rank, p, gs_shm_head(ctrl)->version, gs_shm_head(ctrl)->size);
    ep->pid = a->pid;
    ep->regions = gs_shm_regions_of(ctrl);
    ep->tx = gs_shm_ring_of(ctrl, rank);
    ep->rx = gs_shm_ring_of(tp->ctrl, p);
    return watch_peer(ep, rank, p, a->pid);
}

gs_status gs_shm_tp_connect(gs_shm_tp *tp, const gs_shm_addr *addrs, gs_shm_ready *ready_p)
{
    gs_status st = GS_OK;
    const char *my_host = addrs[tp->base.rank].host_id;
    gs_shm_ready ready = {.cma_ok = 1};

    for (int p = 0; p < tp->base.size && st == GS_OK; p++) {
        gs_shm_ep *ep = &tp->peers[p];
        if (p == tp->base.rank)
            continue;
        if (tp->host_only && strncmp(addrs[p].host_id, my_host, GS_SHM_HOST_ID_MAX) != 0) {
            ep->state = GS_SHM_EP_ABSENT;
            ep->rx = gs_shm_ring_of(tp->ctrl, p); /* nobody writes it: polls find it empty */
            continue;
        }
        ep->base.tp = &tp->base;
        ep->base.peer = p;
        ep->tp = tp;
        tp->base.eps[p] = &ep->base;
        st = connect_peer(tp, p, &addrs[p], my_host);
        if (st == GS_OK && !cma_probe(tp, &addrs[p]))
            ready.cma_ok = 0;
    }
    ready.status = st;
    if (st != GS_OK)
        snprintf(ready.why, sizeof(ready.why), "%s", gs_last_error());
    *ready_p = ready;
    return st;
}

gs_status gs_shm_tp_finish(gs_shm_tp *tp, const gs_shm_ready *readies)
{
    tp->cma_ok = true;
    for (int r = 0; r < tp->base.size; r++) {
        if (readies[r].status != GS_OK)
            return gs_fail(GS_SUBSYS_SHM, (gs_status)readies[r].status,
                           "rank %d: shm transport not opened because rank %d failed to connect: %.120s",
                           tp->base.rank, r, readies[r].why);
        if (!readies[r].cma_ok)
            tp->cma_ok = false;
    }
    if (!tp->cma_ok && !tp->cma_why[0])
        snprintf(tp->cma_why, sizeof(tp->cma_why),
                 "another rank cannot use process_vm_writev/readv towards its peers");
    if (!tp->cma_ok)
        gs_log_info(SHM, "rank %d: caller memory cannot be registered for remote access: %s", tp->base.rank,
                    tp->cma_why);
    return GS_OK;
}

static gs_status open_on(gs_ctx *ctx, const gs_config *cfg, bool host_only, gs_tp **tp_p)
{
    gs_status st;
    gs_shm_tp *tp = NULL;
    gs_shm_addr addr, *addrs = NULL;
    gs_shm_ready ready, *readies = NULL;
    char tag[64];
    unsigned n = ctx->tp_open; /* the same on every rank for this open (see gs_ctx) */

    st = gs_shm_tp_create(cfg, ctx->rank, ctx->size, &tp);
    if (st != GS_OK)
        goto out;
    tp->base.ctx = ctx;
    tp->host_only = host_only;
    addrs = gs_calloc((size_t)ctx->size, sizeof(*addrs));
    readies = gs_calloc((size_t)ctx->size, sizeof(*readies));
    if (!addrs || !readies) {
        st = GS_ERR_NOMEM;
        goto close_tp;
    }
    gs_shm_tp_addr(tp, ctx->host_id, &addr);
    snprintf(tag, sizeof(tag), "gs.tp.shm.%u.addr", n);
    st = gs_store_allgather(ctx, tag, &addr, sizeof(addr), addrs);
    if (st != GS_OK)
        goto close_tp;
    gs_shm_tp_connect(tp, addrs, &ready);
    snprintf(tag, sizeof(tag), "gs.tp.shm.%u.ready", n);
    st = gs_store_allgather(ctx, tag, &ready, sizeof(ready), readies);
    if (st == GS_OK)
        st = gs_shm_tp_finish(tp, readies);
    if (st != GS_OK)
        goto close_tp;
    *tp_p = &tp->base;
    goto out;
close_tp:
    gs_shm_close(&tp->base);
out:
    free(readies);
    free(addrs);
    return st;
}

static gs_status shm_tp_open(gs_ctx *ctx, const gs_config *cfg, gs_tp **tp_p)
{
    return open_on(ctx, cfg, false, tp_p);
}

gs_status gs_shm_open_host(gs_ctx *ctx, const gs_config *cfg, gs_tp **tp_p)
{
    return open_on(ctx, cfg, true, tp_p);
}

gs_status gs_shm_close(gs_tp *base)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);

    if (tp->ctrl)
        __atomic_store_n(&gs_shm_state_of(tp->ctrl)->closed, 1, __ATOMIC_RELEASE);
    while (tp->mrs)
        gs_shm_mr_dereg(&tp->mrs->base);
    for (int p = 0; p < base->size; p++) {
        gs_shm_ep *ep = &tp->peers[p];
        gs_shm_maps_clear(&ep->maps);
        gs_shm_ep_queues_free(ep);
        if (ep->ctrl && munmap(ep->ctrl, ep->ctrl_len) != 0)
            gs_log_warn(SHM, "rank %d: unmapping the control segment of rank %d failed: %s", base->rank, p,
                        strerror(errno));
        if (ep->pidfd >= 0)
            close(ep->pidfd);
    }
    gs_shm_cq_free(&tp->cq);
    if (tp->ctrl && munmap(tp->ctrl, tp->ctrl_len) != 0)
        gs_log_warn(SHM, "rank %d: unmapping the control segment failed: %s", base->rank, strerror(errno));
    if (tp->ctrl_fd >= 0)
        close(tp->ctrl_fd);
    free(tp->free_slots);
    free(base->eps);
    free(tp->peers);
    free(tp);
    return GS_OK;
}

unsigned gs_shm_caps(const gs_tp *base)
{
    const gs_shm_tp *tp = (const gs_shm_tp *)base;
    return GS_TP_CAP_ATOMIC | GS_TP_CAP_SEND_COPY | (tp->host_only ? 0u : GS_TP_CAP_LOCAL_MAP) |
           (tp->cma_ok ? GS_TP_CAP_USER_MEM : 0u);
}

gs_status gs_shm_ep_error(gs_ep *base, char *buf, size_t cap)
{
    const gs_shm_ep *ep = (const gs_shm_ep *)base;
    if (ep->state == GS_SHM_EP_LOST) {
        gs_error_peer_lost_text(buf, cap, base->tp->rank, base->peer, ep->lost_why);
        return GS_ERR_PEER_LOST;
    }
    if (ep->state == GS_SHM_EP_CLOSED) {
        snprintf(buf, cap, "rank %d: rank %d closed its transport", base->tp->rank, base->peer);
        return GS_ERR_PEER_LOST;
    }
    return GS_OK;
}

void gs_shm_describe(const gs_tp *base, char *buf, size_t cap)
{
    const gs_shm_tp *tp = (const gs_shm_tp *)base;
    snprintf(buf, cap, "shm (memfd segments; caller memory by cross-memory attach: %s%s%s)",
             tp->cma_ok ? "yes" : "no", tp->cma_ok ? "" : ", ", tp->cma_ok ? "" : tp->cma_why);
}

const gs_tp_ops gs_shm_ops = {
    .name = "shm",
    .id = GS_TRANSPORT_SHM,
    .reach = {GS_TP_LAT_MEMORY, GS_TP_BW_MEMORY},
    .open = shm_tp_open,
    GS_TP_CONTROL_OPS(gs_shm),
    GS_TP_DATA_OPS(gs_shm),
    .map = gs_shm_map_region,
    .unmap = gs_shm_unmap_region,
};
