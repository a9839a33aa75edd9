/*
 * shm memory regions.
 *
 * gs_mr_alloc memory is a memfd (mode 0600, never linked anywhere) mapped
 * shared: a peer maps the same pages and writes straight into them (zero
 * copy). Caller memory (gs_mr_reg) cannot be mapped by peers; they reach it
 * with process_vm_writev/readv when the kernel permits cross-memory attach.
 *
 * Every registration takes a record in the owner's region table (in its
 * control segment). The record, not the descriptor a peer holds, is the
 * truth: key, length, permission, and how to reach the memory. Peers map a
 * memfd region on first use and cache the mapping by key.
 */
#include "transport/shm/shm.h"

#include "util/alloc.h"
#include "util/list.h"
#include "util/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- region table slots and keys ------------------------------------------ */

static gs_status slot_take(gs_shm_tp *tp, uint32_t *slot_p)
{
    if (tp->free_count > 0) {
        *slot_p = tp->free_slots[--tp->free_count];
        return GS_OK;
    }
    if (tp->next_slot < GS_SHM_MAX_REGIONS) {
        *slot_p = tp->next_slot++;
        return GS_OK;
    }
    return gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM,
                   "rank %d: more than %u regions registered at once; deregister regions no longer used",
                   tp->base.rank, GS_SHM_MAX_REGIONS);
}

/* A fresh non-zero key: a per-process random seed mixed with a counter. */
static uint64_t key_next(gs_shm_tp *tp)
{
    uint64_t z = tp->key_seed + 0x9e3779b97f4a7c15ull * ++tp->key_count;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 1;
}

/* Fills the record and publishes it: key last. */
static void region_publish(gs_shm_tp *tp, gs_shm_mr *mr, uint64_t ino)
{
    gs_shm_region *rec = &gs_shm_regions_of(tp->ctrl)[mr->slot];
    rec->addr = (uint64_t)(uintptr_t)mr->base.addr;
    rec->len = mr->base.len;
    rec->ino = ino;
    rec->fd = mr->fd;
    rec->access = mr->base.access;
    rec->kind = (uint32_t)mr->kind;
    __atomic_store_n(&rec->key, mr->key, __ATOMIC_RELEASE);
}

static void mr_link(gs_shm_tp *tp, gs_shm_mr *mr)
{
    GS_LIST_PUSH(tp->mrs, mr);
}

/* ---- registration ---------------------------------------------------------- */

/* A shared, pre-touched memfd mapping of map_len bytes. */
static gs_status memfd_map(int rank, size_t map_len, int *fd_p, void **addr_p, uint64_t *ino_p)
{
    gs_status st = GS_OK;
    struct stat sb;
    void *addr;
    int fd = memfd_create("gradsync-shm-buf", MFD_CLOEXEC);

    if (fd < 0)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_SYSTEM, "rank %d: memfd_create for a %zu-byte buffer failed: %s",
                       rank, map_len, strerror(errno));
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)map_len) != 0 || fstat(fd, &sb) != 0) {
        st = gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM, "rank %d: sizing a %zu-byte buffer failed: %s", rank,
                     map_len, strerror(errno));
        goto close_fd;
    }
    addr = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        st = gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM, "rank %d: mapping a %zu-byte buffer failed: %s", rank,
                     map_len, strerror(errno));
        goto close_fd;
    }
    gs_pages_touch(addr, map_len);
    *fd_p = fd;
    *addr_p = addr;
    *ino_p = (uint64_t)sb.st_ino;
    return GS_OK;
close_fd:
    close(fd);
    return st;
}

gs_status gs_shm_buf_alloc(gs_tp *base, size_t len, unsigned access, gs_mr **mr_p)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);
    gs_status st = GS_ERR_NOMEM;
    uint64_t ino = 0;
    gs_shm_mr *mr = gs_calloc(1, sizeof(*mr));

    if (!mr)
        goto out;
    mr->map_len = gs_round_up(len ? len : 1, gs_page_size());
    st = memfd_map(base->rank, mr->map_len, &mr->fd, &mr->base.addr, &ino);
    if (st != GS_OK)
        goto free_mr;
    st = slot_take(tp, &mr->slot);
    if (st != GS_OK)
        goto unmap;
    mr->base = (gs_mr){.tp = base, .addr = mr->base.addr, .len = len, .access = access, .owned = true};
    mr->kind = GS_SHM_REGION_MEMFD;
    mr->key = key_next(tp);
    region_publish(tp, mr, ino);
    mr_link(tp, mr);
    *mr_p = &mr->base;
    goto out;
unmap:
    munmap(mr->base.addr, mr->map_len);
    close(mr->fd);
free_mr:
    free(mr);
out:
    return st;
}

gs_status gs_shm_mr_reg(gs_tp *base, void *addr, size_t len, unsigned access, gs_mr **mr_p)
{
    gs_shm_tp *tp = gs_shm_tp_of(base);
    gs_status st;
    gs_shm_mr *mr;

    if (access & GS_ACCESS_REMOTE_ATOMIC)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_UNSUPPORTED,
                       "rank %d: shm cannot give remote atomic access to caller memory (%zu bytes at %p): "
                       "allocate it with gs_mr_alloc",
                       base->rank, len, addr);
    if ((access & (GS_ACCESS_REMOTE_WRITE | GS_ACCESS_REMOTE_READ)) && !tp->cma_ok)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_UNSUPPORTED,
                       "rank %d: shm cannot give peers access to caller memory here (%s); allocate it with "
                       "gs_mr_alloc, or permit cross-memory attach (kernel.yama.ptrace_scope=0)",
                       base->rank, tp->cma_why);
    mr = gs_calloc(1, sizeof(*mr));
    if (!mr)
        return GS_ERR_NOMEM;
    st = slot_take(tp, &mr->slot);
    if (st != GS_OK) {
        free(mr);
        return st;
    }
    mr->base = (gs_mr){.tp = base, .addr = addr, .len = len, .access = access, .owned = false};
    mr->kind = GS_SHM_REGION_USER;
    mr->fd = -1;
    mr->key = key_next(tp);
    region_publish(tp, mr, 0);
    mr_link(tp, mr);
    *mr_p = &mr->base;
    return GS_OK;
}

gs_status gs_shm_mr_dereg(gs_mr *base)
{
    gs_shm_mr *mr = (gs_shm_mr *)base;
    gs_shm_tp *tp = gs_shm_tp_of(base->tp);
    gs_status st = GS_OK;

    /* Revoke first: from here on peers' checks fail and touch nothing. */
    __atomic_store_n(&gs_shm_regions_of(tp->ctrl)[mr->slot].key, 0, __ATOMIC_RELEASE);
    tp->free_slots[tp->free_count++] = mr->slot;
    if (mr->kind == GS_SHM_REGION_MEMFD) {
        if (munmap(base->addr, mr->map_len) != 0)
            st = gs_fail(GS_SUBSYS_SHM, GS_ERR_SYSTEM, "rank %d: unmapping a %zu-byte buffer failed: %s",
                         base->tp->rank, base->len, strerror(errno));
        close(mr->fd);
    }
    GS_LIST_UNLINK(tp->mrs, mr);
    free(mr);
    return st;
}

void gs_shm_mr_pack(const gs_mr *base, gs_rmr_head *head)
{
    const gs_shm_mr *mr = (const gs_shm_mr *)base;
    gs_shm_rmr_tail tail = {.slot = mr->slot, .kind = (uint32_t)mr->kind};
    head->key = mr->key;
    memcpy(head->tail, &tail, sizeof(tail));
}

/* ---- the per-peer cache of mapped regions ---------------------------------- */

static size_t bucket_of(const gs_shm_map_cache *c, uint64_t key)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (c->cap - 1);
}

static gs_shm_map *cache_find(gs_shm_map_cache *c, uint64_t key)
{
    if (c->last && c->last->key == key)
        return c->last;
    if (!c->cap)
        return NULL;
    for (size_t i = bucket_of(c, key);; i = (i + 1) & (c->cap - 1)) {
        if (c->buckets[i].key == key)
            return c->last = &c->buckets[i];
        if (c->buckets[i].key == 0)
            return NULL;
    }
}

static void cache_place(gs_shm_map_cache *c, const gs_shm_map *m)
{
    size_t i = bucket_of(c, m->key);
    while (c->buckets[i].key != 0)
        i = (i + 1) & (c->cap - 1);
    c->buckets[i] = *m;
    c->count++;
}

/* Rebuilds the table with cap buckets, dropping (unmapping) every mapping
 * whose region the owner no longer has under that key. */
static gs_status cache_rebuild(gs_shm_ep *ep, size_t cap)
{
    gs_shm_map_cache *c = &ep->maps;
    gs_shm_region *recs = ep->regions;
    gs_shm_map *old = c->buckets, *fresh = gs_calloc(cap, sizeof(*fresh));
    size_t old_cap = c->cap;

    if (!fresh)
        return GS_ERR_NOMEM;
    *c = (gs_shm_map_cache){.buckets = fresh, .cap = cap};
    for (size_t i = 0; i < old_cap; i++) {
        gs_shm_map *m = &old[i];
        if (m->key == 0)
            continue;
        if (__atomic_load_n(&recs[m->slot].key, __ATOMIC_ACQUIRE) == m->key)
            cache_place(c, m);
        else
            munmap(m->base, m->len);
    }
    free(old);
    return GS_OK;
}

static gs_status cache_insert(gs_shm_ep *ep, const gs_shm_map *m, gs_shm_map **m_p)
{
    gs_shm_map_cache *c = &ep->maps;
    gs_status st;
    if ((c->count + 1) * 2 > c->cap) {
        /* Drop stale mappings first; grow only if still half full. */
        st = cache_rebuild(ep, c->cap ? c->cap : 16);
        if (st == GS_OK && (c->count + 1) * 2 > c->cap)
            st = cache_rebuild(ep, c->cap * 2);
        if (st != GS_OK)
            return st;
    }
    cache_place(c, m);
    *m_p = cache_find(c, m->key);
    return GS_OK;
}

void gs_shm_maps_clear(gs_shm_map_cache *c)
{
    for (size_t i = 0; i < c->cap; i++)
        if (c->buckets[i].key)
            munmap(c->buckets[i].base, c->buckets[i].len);
    free(c->buckets);
    *c = (gs_shm_map_cache){0};
}

/* Maps the peer's memfd region seen as snap in record rec on first use; the
 * key must still be there once mapped, or the mapping is dropped. */
static gs_status region_map(gs_shm_ep *ep, const gs_shm_region *snap, const gs_shm_region *rec, uint32_t slot,
                            const char *op, gs_shm_map **m_p)
{
    int rank = ep->tp->base.rank, fd = -1;
    gs_shm_map m = {.key = snap->key,
                    .slot = slot,
                    .access = snap->access,
                    .region_len = snap->len,
                    .len = gs_round_up(snap->len ? snap->len : 1, gs_page_size())};
    gs_status st = gs_shm_open_peer_fd(rank, ep->base.peer, ep->pid, snap->fd, snap->ino, "buffer", &fd);

    if (st != GS_OK)
        return st;
    m.base = mmap(NULL, m.len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (m.base == MAP_FAILED)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM,
                       "rank %d: mapping a %zu-byte buffer of rank %d failed: %s", rank, m.len, ep->base.peer,
                       strerror(errno));
    if (__atomic_load_n(&rec->key, __ATOMIC_ACQUIRE) != snap->key) {
        munmap(m.base, m.len);
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
                       "rank %d: %s to rank %d: the region was deregistered", rank, op, ep->base.peer);
    }
    st = cache_insert(ep, &m, m_p);
    if (st != GS_OK)
        munmap(m.base, m.len);
    return st;
}

/* ---- the target check ------------------------------------------------------ */

static const char *access_name(unsigned need)
{
    return need & GS_ACCESS_REMOTE_ATOMIC ? "remote atomic"
           : need & GS_ACCESS_REMOTE_READ ? "remote read"
                                          : "remote write";
}

/* Reads record slot of the owner's table as one consistent snapshot: the
 * key before and after the fields must agree (and match want). */
static bool record_snapshot(gs_shm_ep *ep, uint32_t slot, uint64_t want, gs_shm_region *snap)
{
    gs_shm_region *rec = &ep->regions[slot];
    snap->key = __atomic_load_n(&rec->key, __ATOMIC_ACQUIRE);
    snap->len = rec->len;
    snap->access = rec->access;
    snap->kind = rec->kind;
    snap->addr = rec->addr;
    snap->fd = rec->fd;
    snap->ino = rec->ino;
    return snap->key != 0 && snap->key == want && __atomic_load_n(&rec->key, __ATOMIC_ACQUIRE) == snap->key;
}

/* The checks against the owner's record, for a region not mapped yet (or a failing access). */
static gs_status target_slow(gs_shm_ep *ep, const gs_rmr_head *d, uint32_t slot, uint64_t off, uint64_t len,
                             unsigned need, const char *op, gs_shm_target *t_p)
{
    int rank = ep->tp->base.rank, peer = ep->base.peer;
    gs_shm_region snap;
    gs_shm_map *m;
    gs_status st;

    if (slot >= GS_SHM_MAX_REGIONS)
        return gs_fail(
            GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
            "rank %d: %s to rank %d: the descriptor names region %u, beyond the table (corrupt descriptor)",
            rank, op, peer, slot);
    if (!record_snapshot(ep, slot, d->key, &snap)) {
        if (ep->maps.cap && cache_find(&ep->maps, d->key))
            cache_rebuild(ep, ep->maps.cap); /* the owner dropped it: unmap our view */
        return gs_fail(
            GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
            "rank %d: %s to rank %d: bad key 0x%llx (the region was deregistered, or the descriptor is "
            "not one rank %d packed)",
            rank, op, peer, (unsigned long long)d->key, peer);
    }
    if (!gs_tp_in_bounds(off, len, snap.len))
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
                       "rank %d: %s to rank %d: bytes [%llu, +%llu) out of bounds of a %llu-byte region",
                       rank, op, peer, (unsigned long long)off, (unsigned long long)len,
                       (unsigned long long)snap.len);
    if ((snap.access & need) != need)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
                       "rank %d: %s to rank %d: the region was registered without %s access", rank, op, peer,
                       access_name(need));
    if (snap.kind == GS_SHM_REGION_USER) {
        *t_p = (gs_shm_target){.kind = GS_SHM_REGION_USER, .remote_addr = snap.addr + off};
        return GS_OK;
    }
    m = cache_find(&ep->maps, snap.key);
    if (!m) {
        st = region_map(ep, &snap, &ep->regions[slot], slot, op, &m);
        if (st != GS_OK)
            return st;
    }
    *t_p = (gs_shm_target){.kind = GS_SHM_REGION_MEMFD, .ptr = (uint8_t *)m->base + off};
    return GS_OK;
}

gs_status gs_shm_target_lookup(gs_shm_ep *ep, const gs_rmr_head *d, uint64_t off, uint64_t len, unsigned need,
                               const char *op, gs_shm_target *t_p)
{
    gs_shm_rmr_tail tail;
    gs_shm_map *m;
    gs_status st = gs_shm_ep_check(ep, op);

    if (st != GS_OK)
        return st;
    memcpy(&tail, d->tail, sizeof(tail));
    /* Mapped before, and the owner still has it under this key. */
    m = cache_find(&ep->maps, d->key);
    if (m && m->slot == tail.slot && __atomic_load_n(&ep->regions[m->slot].key, __ATOMIC_ACQUIRE) == d->key &&
        gs_tp_in_bounds(off, len, m->region_len) && (m->access & need) == need) {
        *t_p = (gs_shm_target){.kind = GS_SHM_REGION_MEMFD, .ptr = (uint8_t *)m->base + off};
        return GS_OK;
    }
    return target_slow(ep, d, tail.slot, off, len, need, op, t_p);
}

/* ---- mappings for the caller ---------------------------------------------------- */

gs_status gs_shm_map_region(gs_ep *base, const gs_rmr_head *d, void **addr_p, size_t *len_p)
{
    gs_shm_ep *ep = (gs_shm_ep *)base;
    int rank = ep->tp->base.rank, peer = ep->base.peer, fd = -1;
    unsigned rw = GS_ACCESS_REMOTE_READ | GS_ACCESS_REMOTE_WRITE;
    gs_shm_rmr_tail tail;
    gs_shm_region snap;
    gs_status st = gs_shm_ep_check(ep, "map");

    if (st != GS_OK)
        return st;
    memcpy(&tail, d->tail, sizeof(tail));
    if (tail.slot >= GS_SHM_MAX_REGIONS || !record_snapshot(ep, tail.slot, d->key, &snap))
        return gs_fail(
            GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
            "rank %d: map of rank %d's region: bad key 0x%llx (the region was deregistered, or the "
            "descriptor is not one rank %d packed)",
            rank, peer, (unsigned long long)d->key, peer);
    if (snap.len != d->len)
        return gs_fail(
            GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
            "rank %d: map of rank %d's region: the descriptor says %llu bytes, the region has %llu", rank,
            peer, (unsigned long long)d->len, (unsigned long long)snap.len);
    if (snap.kind != GS_SHM_REGION_MEMFD || (snap.access & rw) != rw)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
                       "rank %d: map of rank %d's region: only a region it allocated with remote read and "
                       "write access maps",
                       rank, peer);
    st = gs_shm_open_peer_fd(rank, peer, ep->pid, snap.fd, snap.ino, "region", &fd);
    if (st != GS_OK)
        return st;
    size_t len = gs_round_up(snap.len ? snap.len : 1, gs_page_size());
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_NOMEM,
                       "rank %d: mapping a %zu-byte region of rank %d failed: %s", rank, len, peer,
                       strerror(errno));
    if (__atomic_load_n(&ep->regions[tail.slot].key, __ATOMIC_ACQUIRE) != snap.key) {
        munmap(p, len);
        return gs_fail(GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
                       "rank %d: map of rank %d's region: the region was deregistered", rank, peer);
    }
    *addr_p = p;
    *len_p = len;
    return GS_OK;
}

void gs_shm_unmap_region(gs_tp *tp, void *addr, size_t len)
{
    if (munmap(addr, len) != 0)
        gs_log_warn(SHM, "rank %d: unmapping a peer's region failed: %s", tp->rank, strerror(errno));
}
