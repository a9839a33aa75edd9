/*
 * Memory registration: gs_mr_alloc pages registered once, and a cache of
 * registrations of user memory shared by handles of the same memory.
 *
 * A registration with remote access is shared only by handles of exactly the
 * same range and access, so its rkey covers exactly the region a peer was
 * given (the HCA then refuses out-of-bounds and unpermitted accesses and the
 * memory is untouched). Local-only handles may share any local-only
 * registration that contains them. The cache never outlives its handles:
 * the last gs_mr_dereg of a registration deregisters it (no memory hooks, so
 * memory must be deregistered before it is freed).
 */
#include "transport/verbs/verbs.h"

#include "util/alloc.h"
#include "util/list.h"
#include "util/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GS_VERBS_REMOTE_BITS (GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_ATOMIC)

int gs_verbs_access_flags(unsigned access)
{
    int flags = 0;
    /* Verbs refuses remote write or atomic access without local write. */
    if (access & (GS_ACCESS_LOCAL_WRITE | GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_ATOMIC))
        flags |= IBV_ACCESS_LOCAL_WRITE;
    if (access & GS_ACCESS_REMOTE_WRITE)
        flags |= IBV_ACCESS_REMOTE_WRITE;
    if (access & GS_ACCESS_REMOTE_READ)
        flags |= IBV_ACCESS_REMOTE_READ;
    if (access & GS_ACCESS_REMOTE_ATOMIC)
        flags |= IBV_ACCESS_REMOTE_ATOMIC;
    return flags;
}

static void format_limit(rlim_t v, char *buf, size_t cap)
{
    if (v == RLIM_INFINITY)
        snprintf(buf, cap, "unlimited");
    else
        snprintf(buf, cap, "%llu KiB", (unsigned long long)(v / 1024));
}

void gs_verbs_memlock_describe(const struct rlimit *lim, char *buf, size_t cap)
{
    char soft[32], hard[32];
    format_limit(lim->rlim_cur, soft, sizeof(soft));
    format_limit(lim->rlim_max, hard, sizeof(hard));
    snprintf(buf, cap, "RLIMIT_MEMLOCK (ulimit -l) is %s (hard %s)", soft, hard);
}

/* Registers with protection domain pd (of device dev_name). */
static gs_status reg_on(gs_verbs_tp *vt, struct ibv_pd *pd, const char *dev_name, void *addr, size_t len,
                        int ibv_access, const char *what, struct ibv_mr **mr_p)
{
    char limit[128];
    struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, ibv_access);
    int err = errno;

    if (mr) {
        *mr_p = mr;
        return GS_OK;
    }
    gs_verbs_memlock_describe(&vt->memlock, limit, sizeof(limit));
    if (err == ENOMEM || err == EAGAIN || err == EPERM)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_NOMEM,
                       "rank %d: registering %zu bytes at %p (%s) with %s failed: %s; %s: pinned memory "
                       "counts against it, raise it (ulimit -l unlimited, or memlock in "
                       "/etc/security/limits.conf; in containers --ulimit memlock=-1)",
                       vt->base.rank, len, addr, what, dev_name, strerror(err), limit);
    return gs_fail(GS_SUBSYS_VERBS, err == EFAULT ? GS_ERR_INVALID : GS_ERR_SYSTEM,
                   "rank %d: registering %zu bytes at %p (%s, access %#x) with %s failed: %s", vt->base.rank,
                   len, addr, what, (unsigned)ibv_access, dev_name, strerror(err));
}

gs_status gs_verbs_reg_raw(gs_verbs_tp *vt, void *addr, size_t len, int ibv_access, const char *what,
                           struct ibv_mr **mr_p)
{
    return reg_on(vt, vt->pd, vt->dev.name, addr, len, ibv_access, what, mr_p);
}

/* Deregisters a registration from every rail; the first failure is returned. */
static gs_status reg_dereg(gs_verbs_tp *vt, gs_verbs_reg *reg)
{
    gs_status status = GS_OK;
    for (uint32_t r = 0; r < GS_VERBS_RAILS_MAX; r++) {
        struct ibv_mr *mr = r ? reg->rail_mr[r - 1] : reg->mr;
        int rc = mr ? ibv_dereg_mr(mr) : 0;
        if (rc != 0 && status == GS_OK)
            status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM,
                             "rank %d: ibv_dereg_mr of %zu bytes at %p (rail %u) failed: %s", vt->base.rank,
                             reg->len, reg->addr, r, strerror(rc));
    }
    return status;
}

static gs_status reg_create(gs_verbs_tp *vt, void *addr, size_t len, unsigned access, const char *what,
                            gs_verbs_reg **reg_p)
{
    gs_verbs_reg *reg = gs_calloc(1, sizeof(*reg));
    gs_status status;

    if (!reg)
        return GS_ERR_NOMEM;
    reg->addr = addr;
    reg->len = len;
    reg->access = access;
    reg->ibv_access = gs_verbs_access_flags(access);
    reg->refs = 1;
    status = gs_verbs_reg_raw(vt, addr, len, reg->ibv_access, what, &reg->mr);
    for (uint32_t r = 1; status == GS_OK && r < vt->rails; r++) /* the same memory on every rail */
        status = reg_on(vt, vt->extra[r - 1].pd, vt->extra[r - 1].dev.name, addr, len, reg->ibv_access, what,
                        &reg->rail_mr[r - 1]);
    if (status != GS_OK) {
        reg_dereg(vt, reg);
        free(reg);
        return status;
    }
    *reg_p = reg;
    return GS_OK;
}

static bool reg_serves(const gs_verbs_reg *reg, const void *addr, size_t len, unsigned access)
{
    uintptr_t a = (uintptr_t)addr, r = (uintptr_t)reg->addr;
    if (reg->access != access)
        return false;
    if (access & GS_VERBS_REMOTE_BITS)
        return reg->addr == addr && reg->len == len;
    return a >= r && a - r <= reg->len && len <= reg->len - (a - r);
}

static gs_verbs_reg *cache_find(gs_verbs_tp *vt, const void *addr, size_t len, unsigned access)
{
    for (gs_verbs_reg *reg = vt->regs; reg; reg = reg->next)
        if (reg_serves(reg, addr, len, access))
            return reg;
    return NULL;
}

static void cache_remove(gs_verbs_tp *vt, gs_verbs_reg *reg)
{
    for (gs_verbs_reg **pp = &vt->regs; *pp; pp = &(*pp)->next) {
        if (*pp == reg) {
            *pp = reg->next;
            return;
        }
    }
}

/* Drops one reference; the last one deregisters. */
static gs_status reg_release(gs_verbs_tp *vt, gs_verbs_reg *reg)
{
    gs_status status;

    if (--reg->refs > 0)
        return GS_OK;
    if (reg->cached)
        cache_remove(vt, reg);
    status = reg_dereg(vt, reg);
    free(reg);
    return status;
}

static gs_status check_args(gs_verbs_tp *vt, size_t len, unsigned access, const char *what)
{
    if (len == 0)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_INVALID,
                       "rank %d: %s of 0 bytes: a region needs at least one byte", vt->base.rank, what);
    if (access == 0 || (access & ~(unsigned)GS_ACCESS_ALL))
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_INVALID,
                       "rank %d: %s with access %#x: expected GS_ACCESS_* bits", vt->base.rank, what, access);
    return GS_OK;
}

static gs_verbs_mr *handle_new(gs_verbs_tp *vt, void *addr, size_t len, unsigned access, bool owned)
{
    gs_verbs_mr *vmr = gs_calloc(1, sizeof(*vmr));
    if (vmr) {
        vmr->base = (gs_mr){.tp = &vt->base, .addr = addr, .len = len, .access = access, .owned = owned};
        GS_LIST_PUSH(vt->mrs, vmr);
    }
    return vmr;
}

static void handle_free(gs_verbs_tp *vt, gs_verbs_mr *vmr)
{
    GS_LIST_UNLINK(vt->mrs, vmr);
    free(vmr);
}

gs_status gs_verbs_buf_alloc(gs_tp *tp, size_t len, unsigned access, gs_mr **mr_p)
{
    gs_verbs_tp *vt = gs_verbs_tp_of(tp);
    gs_verbs_mr *vmr = NULL;
    void *mem = NULL;
    gs_status status = check_args(vt, len, access, "gs_mr_alloc");

    if (status != GS_OK)
        return status;
    status = gs_pages_alloc(len, &mem);
    if (status != GS_OK)
        return status;
    vmr = handle_new(vt, mem, len, access, true);
    if (!vmr) {
        status = GS_ERR_NOMEM;
        goto fail_pages;
    }
    vmr->alloc_len = gs_round_up(len, gs_page_size());
    /* Registered exactly len bytes: the rkey covers the region, not its page padding. */
    status = reg_create(vt, mem, len, access, "gs_mr_alloc", &vmr->reg);
    if (status != GS_OK)
        goto fail_handle;
    *mr_p = &vmr->base;
    return GS_OK;
fail_handle:
    handle_free(vt, vmr);
fail_pages:
    gs_pages_free(mem, len);
    return status;
}

gs_status gs_verbs_mr_reg(gs_tp *tp, void *addr, size_t len, unsigned access, gs_mr **mr_p)
{
    gs_verbs_tp *vt = gs_verbs_tp_of(tp);
    gs_verbs_mr *vmr;
    gs_verbs_reg *reg;
    gs_status status = check_args(vt, len, access, "gs_mr_reg");

    if (status != GS_OK)
        return status;
    vmr = handle_new(vt, addr, len, access, false);
    if (!vmr)
        return GS_ERR_NOMEM;
    reg = cache_find(vt, addr, len, access);
    if (reg) {
        reg->refs++;
    } else {
        status = reg_create(vt, addr, len, access, "gs_mr_reg", &reg);
        if (status != GS_OK) {
            handle_free(vt, vmr);
            return status;
        }
        reg->cached = true;
        reg->next = vt->regs;
        vt->regs = reg;
    }
    vmr->reg = reg;
    *mr_p = &vmr->base;
    return GS_OK;
}

gs_status gs_verbs_mr_dereg(gs_mr *mr)
{
    gs_verbs_mr *vmr = (gs_verbs_mr *)mr;
    gs_verbs_tp *vt = gs_verbs_tp_of(mr->tp);
    gs_status status = reg_release(vt, vmr->reg);

    if (mr->owned)
        gs_pages_free(mr->addr, vmr->alloc_len);
    handle_free(vt, vmr);
    return status;
}

void gs_verbs_mr_release_all(gs_verbs_tp *vt)
{
    size_t n = 0;
    while (vt->mrs) {
        gs_verbs_mr_dereg(&vt->mrs->base);
        n++;
    }
    if (n)
        gs_log_warn(VERBS, "rank %d: closing the verbs transport deregistered %zu region(s) still registered",
                    vt->base.rank, n);
}

void gs_verbs_mr_pack(const gs_mr *mr, gs_rmr_head *head)
{
    const gs_verbs_reg *reg = ((const gs_verbs_mr *)mr)->reg;
    head->key = reg->mr->rkey; /* covers exactly [addr, addr + len) */
    if (reg->rail_mr[0])       /* rail 1's, for the stripes on it */
        head->key |= (uint64_t)reg->rail_mr[0]->rkey << 32;
}
