/*
 * The public transport API: chooses a backend, checks what can be checked
 * without the peer, and dispatches through the backend's ops table.
 *
 * Checks here (GS_ERR_INVALID unless said otherwise): a NULL endpoint (the
 * caller's own rank has none), the local buffer inside its region and that
 * region from the same transport, LOCAL_WRITE for buffers an op writes into,
 * the descriptor's version, transport and owner (= the endpoint's peer),
 * 8-byte alignment for atomics, SEND size; and against what the descriptor
 * says: bounds and permission (GS_ERR_REMOTE_ACCESS, nothing touched). The
 * backend checks the same again against the owner's truth.
 */
#include "transport/tp.h"

#include "bootstrap/boot.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GS_COLD __attribute__((cold, noinline))

/* ---- the backends built in, in preference order for auto ------------------ */

static const gs_tp_ops *const builtins[] = {
#ifdef GS_TP_BUILT_SHM
    &gs_shm_ops,
#endif
#ifdef GS_TP_BUILT_VERBS
    &gs_verbs_ops,
#endif
#ifdef GS_TP_BUILT_TCP
    &gs_tcp_ops,
#endif
    NULL,
};

const gs_tp_ops *gs_tp_builtin(int i)
{
    if (i < 0 || i >= (int)(sizeof(builtins) / sizeof(builtins[0])))
        return NULL;
    return builtins[i];
}

static const gs_tp_ops *builtin_named(const char *name)
{
    for (int i = 0; gs_tp_builtin(i); i++)
        if (strcmp(gs_tp_builtin(i)->name, name) == 0)
            return gs_tp_builtin(i);
    return NULL;
}

const char *gs_tp_builtin_name(int i)
{
    const gs_tp_ops *ops = gs_tp_builtin(i);
    return ops ? ops->name : NULL;
}

int gs_tp_usable(const gs_config *cfg, const char *name)
{
    const gs_tp_ops *ops = cfg && name ? builtin_named(name) : NULL;
    return ops && (!ops->available || ops->available(cfg));
}

int gs_tp_devices(const gs_config *cfg, const char *name, char *buf, size_t cap)
{
    const gs_tp_ops *ops = cfg && name ? builtin_named(name) : NULL;
    if (!buf || cap == 0 || !ops || !ops->devices)
        return 0;
    ops->devices(cfg, buf, cap);
    return 1;
}

static void builtin_list(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; gs_tp_builtin(i) && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", gs_tp_builtin(i)->name);
}

/* ---- selection ---------------------------------------------------------------- */

/* What every rank tells the others for GS_TRANSPORT=auto. */
typedef struct auto_info {
    char host_id[128];
    uint32_t usable; /* bit i: gs_tp_builtin(i) may be used from this rank */
    uint32_t pad;
} auto_info;

static uint32_t usable_here(const gs_config *cfg)
{
    uint32_t mask = 0;
    for (int i = 0; gs_tp_builtin(i); i++)
        if (!gs_tp_builtin(i)->available || gs_tp_builtin(i)->available(cfg))
            mask |= 1u << i;
    return mask;
}

/* What the ranks agreed for auto: the backends every rank may use (bit i:
 * gs_tp_builtin(i)), how many hosts they run on and whether one of them
 * runs several ranks. */
typedef struct auto_view {
    uint32_t usable;
    int hosts;
    bool shared;
} auto_view;

static gs_status agree_usable(gs_ctx *ctx, auto_view *view)
{
    gs_status st;
    auto_info mine = {.usable = usable_here(&ctx->cfg)}, *all = gs_calloc((size_t)ctx->size, sizeof(*all));
    char tag[48];

    if (!all)
        return GS_ERR_NOMEM;
    *view = (auto_view){.usable = ~0u};
    snprintf(mine.host_id, sizeof(mine.host_id), "%s", ctx->host_id);
    snprintf(tag, sizeof(tag), "gs.tp.auto.%u", ctx->tp_open);
    st = gs_store_allgather(ctx, tag, &mine, sizeof(mine), all);
    for (int r = 0; st == GS_OK && r < ctx->size; r++) {
        int q = 0; /* a host counts at its first rank */
        view->usable &= all[r].usable;
        while (strncmp(all[q].host_id, all[r].host_id, sizeof(all[r].host_id)) != 0)
            q++;
        view->hosts += q == r;
        view->shared = view->shared || q != r;
    }
    free(all);
    return st;
}

/*
 * GS_TRANSPORT=auto: shm when every rank shares this host; else, when some
 * host runs several ranks and every rank can use shm, mixed (shm among a
 * host's ranks, the far backend between hosts: a transport per peer);
 * else the far backend for every peer. The far backend is the first other
 * than shm every rank can use; one whose open fails with the ranks' common
 * verdict (open_agrees, GS_ERR_UNSUPPORTED: verbs whose data-path probe
 * failed on some rank) hands over to the next one, with the reason logged;
 * every rank got the same verdict, so every rank moves on together.
 */
static gs_status open_auto(gs_ctx *ctx, const gs_tp_ops **ops_p, gs_tp **tp_p)
{
    auto_view v;
    bool shm_ok = false;
    char built[64];
    gs_status st = agree_usable(ctx, &v);

    for (int i = 0; st == GS_OK && gs_tp_builtin(i); i++) {
        const gs_tp_ops *ops = gs_tp_builtin(i);
        bool mixed;
        if (!(v.usable & (1u << i)))
            continue;
        if (ops->id == GS_TRANSPORT_SHM) {
            shm_ok = true;
            if (v.hosts > 1)
                continue;
        }
        mixed = ops->id != GS_TRANSPORT_SHM && shm_ok && v.shared;
        *ops_p = mixed ? &gs_mixed_ops : ops;
        st = mixed ? gs_mixed_open(ctx, ops, tp_p) : ops->open(ctx, &ctx->cfg, tp_p);
        if (st != GS_ERR_UNSUPPORTED || !ops->open_agrees) {
            if (st != GS_OK)
                *ops_p = ops; /* the backend that failed speaks for the error */
            return st;
        }
        gs_log_warn(TP, "rank %d: GS_TRANSPORT=auto: not using %s, trying the next transport: %s", ctx->rank,
                    ops->name, gs_last_error());
        st = GS_OK;
    }
    if (st != GS_OK)
        return st;
    builtin_list(built, sizeof(built));
    return gs_fail(
        GS_SUBSYS_TP, GS_ERR_UNSUPPORTED,
        "rank %d: GS_TRANSPORT=auto found no transport every rank can use (built: %s; ranks on %d host%s); "
        "build tcp or run all ranks on one host",
        ctx->rank, built, v.hosts, v.hosts == 1 ? "" : "s");
}

/* The backend GS_TRANSPORT or the caller names; NULL in *ops_p for auto. */
static gs_status choose(gs_ctx *ctx, const char *name, const gs_tp_ops **ops_p)
{
    static const char *const names[] = {"auto", "shm", "tcp", "verbs"};
    const gs_tp_ops *ops;
    char built[64];

    *ops_p = NULL;
    if (!name || strcmp(name, "auto") == 0)
        name = names[ctx->cfg.transport];
    if (strcmp(name, "auto") == 0 || strcmp(name, "mixed") == 0) /* mixed: per peer, as auto chooses it */
        return GS_OK;
    ops = builtin_named(name);
    if (ops) {
        *ops_p = ops;
        return GS_OK;
    }
    builtin_list(built, sizeof(built));
    for (size_t i = 1; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i]) == 0)
            return gs_fail(GS_SUBSYS_TP, GS_ERR_UNSUPPORTED,
                           "rank %d: transport '%s' is not built into this library (built: %s)", ctx->rank,
                           name, built);
    return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                   "rank %d: unknown transport '%s' (use auto, shm, tcp or verbs)", ctx->rank, name);
}

/* ---- instance ------------------------------------------------------------------ */

gs_status gs_tp_open(gs_ctx *ctx, const char *name, gs_tp **tp_p)
{
    const gs_tp_ops *ops = NULL;
    gs_tp *tp = NULL;
    bool named;
    gs_status st;

    if (!ctx || !tp_p)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "gs_tp_open: ctx and tp_p must not be NULL");
    ctx->tp_open = ctx->tp_next++; /* names this open's store exchanges on every rank */
    st = choose(ctx, name, &ops);
    named = ops != NULL;
    if (st == GS_OK && named)
        st = ops->open(ctx, &ctx->cfg, &tp);
    else if (st == GS_OK)
        st = open_auto(ctx, &ops, &tp);
    if (st != GS_OK) {
        /* A verdict the ranks agreed on was recorded, not logged: unless auto moved on, it is the error. */
        if (ops && ops->open_agrees && (st == GS_ERR_CONFIG || (named && st == GS_ERR_UNSUPPORTED)))
            gs_fail(GS_SUBSYS_TP, st, "%s", gs_last_error());
        return st;
    }
    gs_log_info(TP, "rank %d: transport %s open to %d peers", ctx->rank, ops->name, ctx->size - 1);
    *tp_p = tp;
    return GS_OK;
}

gs_status gs_tp_close(gs_tp *tp)
{
    return tp ? tp->ops->close(tp) : GS_OK;
}

const char *gs_tp_name(const gs_tp *tp)
{
    return tp ? tp->ops->name : "none";
}

gs_ep *gs_tp_ep(gs_tp *tp, int peer)
{
    if (!tp || peer < 0 || peer >= tp->size)
        return NULL;
    return tp->eps[peer];
}

unsigned gs_tp_caps(const gs_tp *tp)
{
    return tp->ops->caps(tp);
}

gs_tp_reach gs_tp_reach_of(const gs_tp *tp, int peer)
{
    return tp->ops->peer_reach ? tp->ops->peer_reach(tp, peer) : tp->ops->reach;
}

gs_tp_zcopy_mode gs_tp_zcopy_mode_of(const gs_tp *tp, size_t bytes)
{
    return tp->ops->zcopy_mode ? tp->ops->zcopy_mode(tp, bytes) : GS_TP_ZCOPY_NEVER;
}

void gs_tp_describe(const gs_tp *tp, char *buf, size_t cap)
{
    if (tp->ops->describe)
        tp->ops->describe(tp, buf, cap);
    else
        snprintf(buf, cap, "%s", tp->ops->name);
}

gs_status gs_tp_ep_error(gs_ep *ep, char *buf, size_t cap)
{
    if (cap)
        buf[0] = '\0';
    return ep ? ep->tp->ops->ep_error(ep, buf, cap) : GS_OK;
}

/* ---- memory ---------------------------------------------------------------------- */

static gs_status check_access(const gs_tp *tp, unsigned access, const char *fn)
{
    if (!tp)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "%s: transport is NULL", fn);
    if (access & ~(unsigned)GS_ACCESS_ALL)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "rank %d: %s: unknown access bits 0x%x", tp->rank, fn,
                       access);
    return GS_OK;
}

gs_status gs_mr_alloc(gs_tp *tp, size_t len, gs_access access, gs_mr **mr_p)
{
    gs_status st = check_access(tp, access, "gs_mr_alloc");
    if (st == GS_OK && !mr_p)
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "gs_mr_alloc: mr_p is NULL");
    return st == GS_OK ? tp->ops->buf_alloc(tp, len, access, mr_p) : st;
}

gs_status gs_mr_reg(gs_tp *tp, void *addr, size_t len, gs_access access, gs_mr **mr_p)
{
    gs_status st = check_access(tp, access, "gs_mr_reg");
    if (st == GS_OK && (!mr_p || (!addr && len > 0)))
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "rank %d: gs_mr_reg: NULL %s", tp->rank,
                     mr_p ? "address with a non-zero length" : "mr_p");
    return st == GS_OK ? tp->ops->mr_reg(tp, addr, len, access, mr_p) : st;
}

gs_status gs_mr_dereg(gs_mr *mr)
{
    return mr ? mr->tp->ops->mr_dereg(mr)
              : gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "gs_mr_dereg: region is NULL");
}

void *gs_mr_addr(const gs_mr *mr)
{
    return mr ? mr->addr : NULL;
}

size_t gs_mr_len(const gs_mr *mr)
{
    return mr ? mr->len : 0;
}

void gs_mr_pack(const gs_mr *mr, gs_rmr *rmr_p)
{
    gs_rmr_head head;
    memset(&head, 0, sizeof(head));
    head.version = GS_RMR_VERSION;
    head.transport = (uint8_t)mr->tp->ops->id;
    head.access = (uint8_t)mr->access;
    head.owner = (uint32_t)mr->tp->rank;
    head.addr = (uint64_t)(uintptr_t)mr->addr;
    head.len = mr->len;
    mr->tp->ops->mr_pack(mr, &head);
    memcpy(rmr_p->bytes, &head, sizeof(head));
}

/* ---- argument checks of the operations ----------------------------------------------- */

/* Each check is an inline test on the fast path; the cold function beside
 * it works out and reports what is wrong. */
static GS_COLD gs_status ep_error(const char *op)
{
    return gs_fail(
        GS_SUBSYS_TP, GS_ERR_INVALID,
        "%s: endpoint is NULL (gs_tp_ep gives none for the caller's own rank or a rank out of range)", op);
}

static inline gs_status check_ep(const gs_ep *ep, const char *op)
{
    return __builtin_expect(ep != NULL, 1) ? GS_OK : ep_error(op);
}

static GS_COLD gs_status local_error(const gs_ep *ep, const void *buf, const gs_mr *lmr, size_t len,
                                     bool writable, const char *op)
{
    uintptr_t b = (uintptr_t)buf, a;
    if (len == 0)
        return GS_OK;
    if (!lmr || !buf)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "rank %d: %s to rank %d: NULL %s for %zu bytes",
                       ep->tp->rank, op, ep->peer, buf ? "local region" : "local buffer", len);
    if (lmr->tp != ep->tp)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                       "rank %d: %s to rank %d: the local region belongs to another transport instance",
                       ep->tp->rank, op, ep->peer);
    a = (uintptr_t)lmr->addr;
    if (b < a || len > lmr->len || b - a > lmr->len - len)
        return gs_fail(
            GS_SUBSYS_TP, GS_ERR_INVALID,
            "rank %d: %s to rank %d: local buffer %p + %zu bytes is not inside its region %p + %zu bytes",
            ep->tp->rank, op, ep->peer, buf, len, lmr->addr, lmr->len);
    if (writable && !(lmr->access & GS_ACCESS_LOCAL_WRITE))
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                       "rank %d: %s from rank %d: the local region lacks GS_ACCESS_LOCAL_WRITE", ep->tp->rank,
                       op, ep->peer);
    return GS_OK;
}

/* The local buffer [buf, buf+len) lies inside lmr, of the same transport
 * instance; writable: the op stores into it (needs LOCAL_WRITE). */
static inline gs_status check_local(const gs_ep *ep, const void *buf, const gs_mr *lmr, size_t len,
                                    bool writable, const char *op)
{
    uintptr_t b = (uintptr_t)buf, a;
    if (len == 0)
        return GS_OK;
    if (__builtin_expect(lmr && buf && lmr->tp == ep->tp, 1)) {
        a = (uintptr_t)lmr->addr;
        if (__builtin_expect(b >= a && len <= lmr->len && b - a <= lmr->len - len &&
                                 (!writable || (lmr->access & GS_ACCESS_LOCAL_WRITE)),
                             1))
            return GS_OK;
    }
    return local_error(ep, buf, lmr, len, writable, op);
}

static const char *transport_name(int id)
{
    static const char *const names[] = {"auto", "shm", "tcp", "verbs", "mixed"};
    return id >= 0 && id < 5 ? names[id] : "unknown";
}

static GS_COLD gs_status remote_error(const gs_ep *ep, const gs_rmr *rmr, uint64_t off, uint64_t len,
                                      unsigned need, const char *op, gs_rmr_head *head)
{
    int rank = ep->tp->rank, peer = ep->peer;
    const char *dir = need == GS_ACCESS_REMOTE_READ ? "from" : "to";
    if (!rmr)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "rank %d: %s %s rank %d: descriptor is NULL", rank, op,
                       dir, peer);
    memcpy(head, rmr->bytes, sizeof(*head));
    if (head->version != GS_RMR_VERSION)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                       "rank %d: %s %s rank %d: descriptor version %u, expected %u (not made by gs_mr_pack?)",
                       rank, op, dir, peer, head->version, GS_RMR_VERSION);
    if (head->transport != ep->tp->ops->id)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                       "rank %d: %s %s rank %d: a %s descriptor used on the %s transport", rank, op, dir,
                       peer, transport_name(head->transport), ep->tp->ops->name);
    if (head->owner != (uint32_t)peer)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                       "rank %d: %s %s rank %d: the descriptor is of a region of rank %u", rank, op, dir,
                       peer, head->owner);
    if (!gs_tp_in_bounds(off, len, head->len))
        return gs_fail(GS_SUBSYS_TP, GS_ERR_REMOTE_ACCESS,
                       "rank %d: %s %s rank %d: bytes [%llu, +%llu) out of bounds of a %llu-byte region",
                       rank, op, dir, peer, (unsigned long long)off, (unsigned long long)len,
                       (unsigned long long)head->len);
    if ((head->access & need) != need)
        return gs_fail(GS_SUBSYS_TP, GS_ERR_REMOTE_ACCESS,
                       "rank %d: %s %s rank %d: the region was registered without %s access", rank, op, dir,
                       peer,
                       need == GS_ACCESS_REMOTE_READ     ? "remote read"
                       : need == GS_ACCESS_REMOTE_ATOMIC ? "remote atomic"
                                                         : "remote write");
    return GS_OK;
}

/* Copies the descriptor out (it may sit at any alignment) and checks it. */
static inline gs_status check_remote(const gs_ep *ep, const gs_rmr *rmr, uint64_t off, uint64_t len,
                                     unsigned need, const char *op, gs_rmr_head *head)
{
    if (__builtin_expect(rmr != NULL, 1)) {
        memcpy(head, rmr->bytes, sizeof(*head));
        if (__builtin_expect(head->version == GS_RMR_VERSION && head->transport == ep->tp->ops->id &&
                                 head->owner == (uint32_t)ep->peer && gs_tp_in_bounds(off, len, head->len) &&
                                 (head->access & need) == need,
                             1))
            return GS_OK;
    }
    return remote_error(ep, rmr, off, len, need, op, head);
}

/* Atomics: an 8-byte aligned result inside lmr and an 8-byte aligned remote word. */
static gs_status check_atomic(const gs_ep *ep, const uint64_t *result, const gs_mr *lmr, const gs_rmr *rmr,
                              uint64_t off, const char *op, gs_rmr_head *head)
{
    gs_status st = check_ep(ep, op);
    if (st == GS_OK && (!result || ((uintptr_t)result & 7u)))
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "rank %d: %s to rank %d: result %p is not 8-byte aligned",
                     ep->tp->rank, op, ep->peer, (const void *)result);
    if (st == GS_OK)
        st = check_local(ep, result, lmr, 8, true, op);
    if (st == GS_OK)
        st = check_remote(ep, rmr, off, 8, GS_ACCESS_REMOTE_ATOMIC, op, head);
    if (st == GS_OK && ((head->addr + off) & 7u))
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                     "rank %d: %s to rank %d: remote offset %llu is not 8-byte aligned", ep->tp->rank, op,
                     ep->peer, (unsigned long long)off);
    return st;
}

/* A WRITE's, WRITE_IMM's or READ's checks: the endpoint, the local buffer
 * (written into when local_write) and the remote range with need. */
static gs_status check_rma(const gs_ep *ep, const void *local, const gs_mr *lmr, size_t len, bool local_write,
                           const gs_rmr *rmr, uint64_t off, unsigned need, const char *op, gs_rmr_head *head)
{
    gs_status st = check_ep(ep, op);
    if (st == GS_OK)
        st = check_local(ep, local, lmr, len, local_write, op);
    return st == GS_OK ? check_remote(ep, rmr, off, len, need, op, head) : st;
}

/* ---- operations ------------------------------------------------------------------------ */

gs_status gs_tp_map(gs_ep *ep, const gs_rmr *rmr, unsigned need, void **addr_p, size_t *len_p)
{
    gs_rmr_head head = {0};
    gs_status st = check_ep(ep, "map");
    if (rmr)
        memcpy(&head, rmr->bytes, sizeof(head));
    if (st == GS_OK && !ep->tp->ops->map)
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_UNSUPPORTED,
                     "rank %d: map of rank %d's region: the %s transport maps no peer memory", ep->tp->rank,
                     ep->peer, ep->tp->ops->name);
    if (st == GS_OK) /* the whole region, as its descriptor says */
        st = check_remote(ep, rmr, 0, head.len, need, "map", &head);
    return st == GS_OK ? ep->tp->ops->map(ep, &head, addr_p, len_p) : st;
}

void gs_tp_unmap(gs_tp *tp, void *addr, size_t len)
{
    if (addr && tp->ops->unmap)
        tp->ops->unmap(tp, addr, len);
}

gs_status gs_ep_write(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr *dst, uint64_t dst_off,
                      uint64_t wr_id, gs_op_flags flags)
{
    gs_rmr_head head;
    gs_status st = check_rma(ep, src, lmr, len, false, dst, dst_off, GS_ACCESS_REMOTE_WRITE, "write", &head);
    return st == GS_OK ? ep->tp->ops->write(ep, src, lmr, len, &head, dst_off, wr_id, flags) : st;
}

gs_status gs_ep_write_imm(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, const gs_rmr *dst,
                          uint64_t dst_off, uint32_t imm, uint64_t wr_id, gs_op_flags flags)
{
    gs_rmr_head head;
    gs_status st =
        check_rma(ep, src, lmr, len, false, dst, dst_off, GS_ACCESS_REMOTE_WRITE, "write_imm", &head);
    if (st == GS_OK && len > UINT32_MAX)
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                     "rank %d: write_imm to rank %d: %zu bytes is more than 4 GiB - 1", ep->tp->rank,
                     ep->peer, len);
    return st == GS_OK ? ep->tp->ops->write_imm(ep, src, lmr, len, &head, dst_off, imm, wr_id, flags) : st;
}

gs_status gs_ep_read(gs_ep *ep, void *dst, gs_mr *lmr, size_t len, const gs_rmr *src, uint64_t src_off,
                     uint64_t wr_id, gs_op_flags flags)
{
    gs_rmr_head head;
    gs_status st = check_rma(ep, dst, lmr, len, true, src, src_off, GS_ACCESS_REMOTE_READ, "read", &head);
    return st == GS_OK ? ep->tp->ops->read(ep, dst, lmr, len, &head, src_off, wr_id, flags) : st;
}

gs_status gs_ep_fetch_add(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr *dst, uint64_t dst_off,
                          uint64_t add, uint64_t wr_id, gs_op_flags flags)
{
    gs_rmr_head head;
    gs_status st = check_atomic(ep, result, lmr, dst, dst_off, "fetch_add", &head);
    return st == GS_OK ? ep->tp->ops->fetch_add(ep, result, lmr, &head, dst_off, add, wr_id, flags) : st;
}

gs_status gs_ep_cmp_swap(gs_ep *ep, uint64_t *result, gs_mr *lmr, const gs_rmr *dst, uint64_t dst_off,
                         uint64_t compare, uint64_t swap, uint64_t wr_id, gs_op_flags flags)
{
    gs_rmr_head head;
    gs_status st = check_atomic(ep, result, lmr, dst, dst_off, "cmp_swap", &head);
    return st == GS_OK ? ep->tp->ops->cmp_swap(ep, result, lmr, &head, dst_off, compare, swap, wr_id, flags)
                       : st;
}

gs_status gs_ep_send(gs_ep *ep, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id, gs_op_flags flags)
{
    gs_status st = check_ep(ep, "send");
    if (st == GS_OK && len > GS_SEND_MAX)
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID,
                     "rank %d: send to rank %d: %zu bytes is more than GS_SEND_MAX (%d)", ep->tp->rank,
                     ep->peer, len, GS_SEND_MAX);
    if (st == GS_OK)
        st = check_local(ep, src, lmr, len, false, "send");
    return st == GS_OK ? ep->tp->ops->send(ep, src, lmr, len, wr_id, flags) : st;
}

gs_status gs_ep_recv(gs_ep *ep, void *dst, gs_mr *lmr, size_t cap, uint64_t wr_id)
{
    gs_status st = check_ep(ep, "recv");
    if (st == GS_OK)
        st = check_local(ep, dst, lmr, cap, true, "recv");
    return st == GS_OK ? ep->tp->ops->recv(ep, dst, lmr, cap, wr_id) : st;
}

/* ---- completions -------------------------------------------------------------------------- */

static GS_COLD gs_status poll_error(int max, const char *fn)
{
    return gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "%s: NULL transport, wcs or n_p, or max %d < 0", fn, max);
}

static inline gs_status check_poll(const gs_tp *tp, const gs_wc *wcs, int max, const int *n_p, const char *fn)
{
    return __builtin_expect(tp && n_p && max >= 0 && (max == 0 || wcs), 1) ? GS_OK : poll_error(max, fn);
}

gs_status gs_tp_poll(gs_tp *tp, gs_wc *wcs, int max, int *n_p)
{
    gs_status st = check_poll(tp, wcs, max, n_p, "gs_tp_poll");
    return st == GS_OK ? tp->ops->poll(tp, wcs, max, n_p) : st;
}

/* Slack of a coarse deadline: the coarse clock is the last tick's time, so
 * it trails the precise clock the waits compare with by up to a tick, and
 * by more when ticks come late (an emulated guest: 11 ms seen); two ticks
 * keep a wait from ending early, at the cost of ending a little late. */
static uint64_t coarse_slack_ns(void)
{
    static uint64_t cached; /* every thread computes the same value */
    uint64_t slack = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    struct timespec res;
    if (slack == 0) {
        slack = clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 && res.tv_sec == 0 && res.tv_nsec > 0
                    ? 2u * (uint64_t)res.tv_nsec
                    : 10000000u;
        __atomic_store_n(&cached, slack, __ATOMIC_RELAXED);
    }
    return slack;
}

/* A deadline from the coarse clock (a few ns instead of a precise read that
 * costs about one cache-line transfer), never before timeout_ms from now. */
static uint64_t coarse_deadline(int64_t timeout_ms)
{
    struct timespec ts;
    if (timeout_ms < 0)
        return UINT64_MAX;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull +
           coarse_slack_ns();
}

gs_status gs_tp_wait(gs_tp *tp, gs_wc *wcs, int max, int *n_p, int timeout_ms)
{
    gs_status st = check_poll(tp, wcs, max, n_p, "gs_tp_wait");
    if (st == GS_OK && max == 0)
        st = gs_fail(GS_SUBSYS_TP, GS_ERR_INVALID, "rank %d: gs_tp_wait: max must be at least 1", tp->rank);
    if (st != GS_OK)
        return st;
    return tp->ops->wait(tp, wcs, max, n_p,
                         coarse_deadline(timeout_ms < 0 ? tp->cfg->timeout_ms : timeout_ms));
}
