/*
 * shm one-sided operations, initiator side. Each completes before it
 * returns: WRITE and READ are copies between the caller's buffer and the
 * peer's mapping (or process_vm_writev/readv for caller memory of the
 * peer), atomics are __atomic operations on the mapping, and WRITE_IMM and
 * SEND add a message to the peer's notification ring. A signaled op queues
 * its completion locally.
 *
 * WRITE and READ with GS_OP_STREAM copy with streaming stores: the bytes
 * go to memory without first reading every destination line in and without
 * evicting the cache (the caller says the stream is too large for it, as
 * the parameter server's large keys: docs/ps.md). A copy that would
 * fit stays in the cache for its reader: only the caller knows which.
 *
 * RC ordering: a WRITE's bytes are in the peer's memory when it returns
 * (a copy with non-temporal stores is fenced), and a ring message is
 * published with a release store, so the peer that sees a WRITE_IMM or SEND
 * sees every earlier WRITE.
 */
#include "transport/shm/shm.h"

#include "util/copy.h"
#include "util/log.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>

/* Copies at or above this size may use non-temporal stores (glibc). */
#define NT_FENCE_BYTES (64u * 1024u)

static inline void copy_fenced(void *dst, const void *src, size_t len, unsigned flags)
{
    if (flags & GS_OP_STREAM) {
        gs_copy_nt(dst, src, len); /* fenced */
        return;
    }
    memcpy(dst, src, len);
    if (len >= NT_FENCE_BYTES) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_sfence();
#else
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
    }
}

/* One process_vm_writev/readv, repeated until every byte moved. */
static gs_status cma_copy(gs_shm_ep *ep, bool to_peer, void *local, uint64_t remote, size_t len,
                          const char *op)
{
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(uint8_t *)local + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(remote + done), len - done};
        ssize_t n = to_peer ? process_vm_writev(ep->pid, &l, 1, &r, 1, 0)
                            : process_vm_readv(ep->pid, &l, 1, &r, 1, 0);
        if (n <= 0) {
            int err = n < 0 ? errno : EFAULT;
            if (err == ESRCH)
                return gs_fail_peer_lost(GS_SUBSYS_SHM, ep->tp->base.rank, ep->base.peer,
                                         "its process %d is gone, found by a %s", (int)ep->pid, op);
            return gs_fail(GS_SUBSYS_SHM, err == EFAULT ? GS_ERR_REMOTE_ACCESS : GS_ERR_SYSTEM,
                           "rank %d: %s of %zu bytes to rank %d through %s failed: %s", ep->tp->base.rank, op,
                           len, ep->base.peer, to_peer ? "process_vm_writev" : "process_vm_readv",
                           strerror(err));
        }
        done += (size_t)n;
    }
    return GS_OK;
}

/* Up to 16 bytes without a call: two overlapping fixed-size moves. */
static inline void copy_small(uint8_t *dst, const uint8_t *src, size_t len)
{
    if (len >= 8) {
        uint64_t a, b;
        memcpy(&a, src, 8);
        memcpy(&b, src + len - 8, 8);
        memcpy(dst, &a, 8);
        memcpy(dst + len - 8, &b, 8);
    } else if (len >= 4) {
        uint32_t a, b;
        memcpy(&a, src, 4);
        memcpy(&b, src + len - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + len - 4, &b, 4);
    } else {
        for (size_t i = 0; i < len; i++)
            dst[i] = src[i];
    }
}

static gs_status put_bytes(gs_shm_ep *ep, const gs_shm_target *t, const void *src, size_t len, unsigned flags,
                           const char *op)
{
    if (t->kind == GS_SHM_REGION_USER)
        return len ? cma_copy(ep, true, (void *)src, t->remote_addr, len, op) : GS_OK;
    if (len <= 16)
        copy_small(t->ptr, src, len);
    else
        copy_fenced(t->ptr, src, len, flags);
    return GS_OK;
}

/* Room for the completion first, so that a done op always gets it. */
static gs_status reserve(gs_shm_ep *ep, unsigned flags)
{
    return (flags & GS_OP_SIGNALED) ? gs_shm_cq_reserve(ep->tp) : GS_OK;
}

static void complete(gs_shm_ep *ep, uint64_t wr_id, unsigned flags, gs_wc_opcode opcode)
{
    if (flags & GS_OP_SIGNALED)
        gs_shm_cq_push(ep->tp,
                       &(gs_wc){.wr_id = wr_id, .status = GS_OK, .opcode = opcode, .peer = ep->base.peer});
}

/* What every post to a region does first: finds the target (checked
 * against the owner's record) and makes room for its completion. */
static gs_status begin(gs_shm_ep *ep, const gs_rmr_head *d, uint64_t off, uint64_t len, unsigned need,
                       const char *op, unsigned flags, gs_shm_target *t)
{
    gs_status st = gs_shm_target_get(ep, d, off, len, need, op, t);
    return st == GS_OK ? reserve(ep, flags) : st;
}

gs_status gs_shm_write(gs_ep *base, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                       uint64_t off, uint64_t wr_id, unsigned flags)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    gs_shm_target t;
    gs_status st = begin(ep, dst, off, len, GS_ACCESS_REMOTE_WRITE, "write", flags, &t);
    (void)lmr;
    if (st == GS_OK)
        st = put_bytes(ep, &t, src, len, flags, "write");
    if (st == GS_OK)
        complete(ep, wr_id, flags, GS_WC_WRITE);
    return st;
}

gs_status gs_shm_write_imm(gs_ep *base, const void *src, gs_mr *lmr, size_t len, const gs_rmr_head *dst,
                           uint64_t off, uint32_t imm, uint64_t wr_id, unsigned flags)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    gs_shm_target t;
    gs_status st = begin(ep, dst, off, len, GS_ACCESS_REMOTE_WRITE, "write_imm", flags, &t);
    (void)lmr;
    if (st == GS_OK && !gs_shm_ring_room(ep, 1))
        st = gs_shm_ring_full(ep); /* checked before the copy: a failed call leaves no trace */
    if (st == GS_OK)
        st = put_bytes(ep, &t, src, len, flags, "write_imm");
    if (st == GS_OK) {
        gs_shm_ring_post_imm(ep, imm, (uint32_t)len); /* tp.c refused more than UINT32_MAX bytes */
        complete(ep, wr_id, flags, GS_WC_WRITE_IMM);
    }
    return st;
}

gs_status gs_shm_read(gs_ep *base, void *dst, gs_mr *lmr, size_t len, const gs_rmr_head *src, uint64_t off,
                      uint64_t wr_id, unsigned flags)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    gs_shm_target t;
    gs_status st = begin(ep, src, off, len, GS_ACCESS_REMOTE_READ, "read", flags, &t);
    (void)lmr;
    if (st == GS_OK && len > 0) {
        if (t.kind == GS_SHM_REGION_USER)
            st = cma_copy(ep, false, dst, t.remote_addr, len, "read");
        else if (flags & GS_OP_STREAM)
            gs_copy_nt(dst, t.ptr, len);
        else
            memcpy(dst, t.ptr, len);
    }
    if (st == GS_OK)
        complete(ep, wr_id, flags, GS_WC_READ);
    return st;
}

/* The 8-byte word an atomic acts on, in our mapping of the peer's buffer. */
static gs_status atomic_word(gs_shm_ep *ep, const gs_rmr_head *dst, uint64_t off, const char *op,
                             uint64_t **word_p)
{
    gs_shm_target t;
    gs_status st = gs_shm_target_get(ep, dst, off, 8, GS_ACCESS_REMOTE_ATOMIC, op, &t);
    if (st != GS_OK)
        return st;
    if (t.kind != GS_SHM_REGION_MEMFD || ((uintptr_t)t.ptr & 7u) != 0)
        return gs_fail(
            GS_SUBSYS_SHM, GS_ERR_REMOTE_ACCESS,
            "rank %d: %s to rank %d at offset %llu: needs an 8-byte aligned word of a gs_mr_alloc buffer",
            ep->tp->base.rank, op, ep->base.peer, (unsigned long long)off);
    *word_p = (uint64_t *)(void *)t.ptr;
    return GS_OK;
}

gs_status gs_shm_fetch_add(gs_ep *base, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                           uint64_t add, uint64_t wr_id, unsigned flags)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    uint64_t *word = NULL;
    gs_status st = atomic_word(ep, dst, off, "fetch_add", &word);
    (void)lmr;
    if (st == GS_OK)
        st = reserve(ep, flags);
    if (st == GS_OK) {
        *result = __atomic_fetch_add(word, add, __ATOMIC_SEQ_CST);
        complete(ep, wr_id, flags, GS_WC_FETCH_ADD);
    }
    return st;
}

gs_status gs_shm_cmp_swap(gs_ep *base, uint64_t *result, gs_mr *lmr, const gs_rmr_head *dst, uint64_t off,
                          uint64_t compare, uint64_t swap, uint64_t wr_id, unsigned flags)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    uint64_t *word = NULL, old = compare;
    gs_status st = atomic_word(ep, dst, off, "cmp_swap", &word);
    (void)lmr;
    if (st == GS_OK)
        st = reserve(ep, flags);
    if (st == GS_OK) {
        /* On failure old receives the current value; on success it stays compare = the old value. */
        __atomic_compare_exchange_n(word, &old, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        *result = old;
        complete(ep, wr_id, flags, GS_WC_CMP_SWAP);
    }
    return st;
}

gs_status gs_shm_send(gs_ep *base, const void *src, gs_mr *lmr, size_t len, uint64_t wr_id, unsigned flags)
{
    gs_shm_ep *ep = gs_shm_ep_of(base);
    gs_status st = gs_shm_ep_check(ep, "send");
    (void)lmr;
    if (st == GS_OK)
        st = reserve(ep, flags);
    if (st == GS_OK)
        st = gs_shm_ring_post(ep, GS_SHM_MSG_SEND, 0, (uint32_t)len, src);
    if (st == GS_OK)
        complete(ep, wr_id, flags, GS_WC_SEND);
    return st;
}
