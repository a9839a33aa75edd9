/* The tcp progress engine between two transports in one process: every op,
 * ordering, flow control, errors, the progress thread and the wait modes. */
#include "tcp_pair.h"

#include <pthread.h>
#include <stdlib.h>

static void fill(void *buf, size_t len, unsigned seed)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed + i * 131 + (i >> 8));
}

GS_TEST(tcp_write_lands_and_signaled_write_completes)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    fill(src->addr, 4096, 7);
    GS_ASSERT_OK(gs_tcp_write(tcp_pair_ep(&p, 0), src->addr, src, 1000, &rdst, 96, 42, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 42);
    GS_ASSERT_EQ(wc.peer, 1);
    GS_ASSERT(memcmp((uint8_t *)dst->addr + 96, src->addr, 1000) == 0);
    GS_ASSERT_EQ(((uint8_t *)dst->addr)[95], 0);
    GS_ASSERT_EQ(((uint8_t *)dst->addr)[1096], 0);
    GS_ASSERT_EQ(p.ngot[1], 0); /* a plain WRITE is silent at the target */
    tcp_pair_close(&p);
}

GS_TEST(tcp_write_imm_arrives_after_every_earlier_write)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 1 << 20, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 1 << 20, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    fill(src->addr, 1 << 20, 3);
    for (int i = 0; i < 15; i++)
        GS_ASSERT_OK(gs_tcp_write(tcp_pair_ep(&p, 0), (uint8_t *)src->addr + i * 65536, src, 65536, &rdst,
                                  (uint64_t)i * 65536, 0, 0));
    GS_ASSERT_OK(gs_tcp_write_imm(tcp_pair_ep(&p, 0), (uint8_t *)src->addr + 15 * 65536, src, 65536, &rdst,
                                  15 * 65536, 0xfeedu, 9, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 1, wc, GS_WC_RECV_IMM, GS_OK);
    GS_ASSERT_EQ(wc.imm, 0xfeed);
    GS_ASSERT_EQ(wc.len, 65536);
    GS_ASSERT_EQ(wc.peer, 0);
    GS_ASSERT(memcmp(dst->addr, src->addr, 1 << 20) == 0);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE_IMM, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 9);
    tcp_pair_close(&p);
}

GS_TEST(tcp_zcopy_writes_go_by_reference_and_land_exactly)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    const size_t len = 8 << 20, big = (3 << 20) + 7;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, len, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, len, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    gs_tcp_ep *ep = (gs_tcp_ep *)tcp_pair_ep(&p, 0);
    uint8_t *s = src->addr, *d = dst->addr;
    fill(s, len, 5);
    /* unaligned and larger than the pipe and the socket buffers: resumed many times */
    GS_ASSERT_OK(gs_tcp_write(&ep->base, s + 5, src, big, &rdst, 1, 0, GS_OP_ZCOPY));
    /* below GS_TCP_ZCOPY_MIN: copied, between two that are not */
    GS_ASSERT_OK(gs_tcp_write(&ep->base, s + (4 << 20), src, 1000, &rdst, 4 << 20, 0, GS_OP_ZCOPY));
    GS_ASSERT_OK(gs_tcp_write_imm(&ep->base, s + (5 << 20), src, 2 << 20, &rdst, 5 << 20, 0x2cu, 7,
                                  GS_OP_SIGNALED | GS_OP_ZCOPY));
    TCP_EXPECT_WC(&p, 1, wc, GS_WC_RECV_IMM, GS_OK);
    GS_ASSERT_EQ(wc.imm, 0x2c);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE_IMM, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 7);
    GS_ASSERT(ep->pipe[0] >= 0 && !ep->zcopy_off); /* the payloads went through the pipe */
    GS_ASSERT_U64_EQ(ep->pipe_bytes, 0);
    GS_ASSERT(memcmp(d + 1, s + 5, big) == 0);
    GS_ASSERT(memcmp(d + (4 << 20), s + (4 << 20), 1000) == 0);
    GS_ASSERT(memcmp(d + (5 << 20), s + (5 << 20), 2 << 20) == 0);
    GS_ASSERT_EQ(d[0], 0);
    GS_ASSERT_EQ(d[1 + big], 0);
    GS_ASSERT_EQ(d[(4 << 20) + 1000], 0);
    GS_ASSERT_EQ(d[7 << 20], 0);
    /* the completion says the peer has the bytes: the source may change, and
     * the next write carries the new ones */
    fill(s, len, 9);
    GS_ASSERT_OK(gs_tcp_write_imm(&ep->base, s, src, len, &rdst, 0, 0x2du, 8, GS_OP_SIGNALED | GS_OP_ZCOPY));
    TCP_EXPECT_WC(&p, 1, wc, GS_WC_RECV_IMM, GS_OK);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE_IMM, GS_OK);
    GS_ASSERT(memcmp(d, s, len) == 0);
    tcp_pair_close(&p);
}

/* Two connections: the higher rank moves to its own connection for a large
 * frame and back after small ones with nothing queued, each time once the
 * peer has served its earlier requests; the lower rank reads wherever the
 * SWITCH frames say, so order and bytes hold throughout. */
GS_TEST(tcp_two_connections_switch_and_keep_order)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    const size_t big = 1 << 20;
    tcp_pair_open_two(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 2 * big, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 2 * big, GS_ACCESS_ALL, &dst));
    gs_mr *back;
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, big, GS_ACCESS_ALL, &back));
    gs_rmr_head rdst = tcp_rmr(dst), rback = tcp_rmr(back);
    gs_tcp_ep *hi = gs_tcp_ep_at(p.tp[1], 0), *lo = gs_tcp_ep_at(p.tp[0], 1);
    uint8_t *s = src->addr, *d = dst->addr;
    GS_ASSERT(hi->switcher && !lo->switcher);
    for (int round = 0; round < 3; round++) {
        fill(s, 2 * big, (unsigned)round + 1);
        /* small: the shared connection; served before the large one is posted (a SWITCH waits
         * until the peer has served every earlier request) */
        GS_ASSERT_OK(gs_tcp_write(&hi->base, s, src, 8, &rdst, 0, 0, GS_OP_SIGNALED));
        GS_ASSERT(hi->tx_fd == hi->fd);
        TCP_EXPECT_WC(&p, 1, wc, GS_WC_WRITE, GS_OK);
        /* large: a SWITCH, then the rest on rank 1's own connection (by copy and by reference) */
        GS_ASSERT_OK(gs_tcp_write(&hi->base, s + 8, src, big, &rdst, 8, 0, round == 1 ? GS_OP_ZCOPY : 0));
        GS_ASSERT_OK(gs_tcp_write_imm(&hi->base, s + 8 + big, src, 100, &rdst, 8 + big,
                                      0x50u + (unsigned)round, 1, GS_OP_SIGNALED));
        TCP_EXPECT_WC(&p, 0, wc, GS_WC_RECV_IMM, GS_OK);
        GS_ASSERT_EQ(wc.imm, 0x50u + (unsigned)round);
        GS_ASSERT(memcmp(d, s, 8 + big + 100) == 0);
        GS_ASSERT(hi->tx_fd == hi->side_fd && lo->rx_fd == lo->side_fd);
        TCP_EXPECT_WC(&p, 1, wc, GS_WC_WRITE_IMM, GS_OK);
        /* small after small, nothing queued: back to the shared connection */
        GS_ASSERT_OK(gs_tcp_write_imm(&hi->base, s, src, 8, &rdst, 0, 0x60u, 2, GS_OP_SIGNALED));
        TCP_EXPECT_WC(&p, 0, wc, GS_WC_RECV_IMM, GS_OK);
        TCP_EXPECT_WC(&p, 1, wc, GS_WC_WRITE_IMM, GS_OK);
        GS_ASSERT(hi->tx_fd == hi->fd && lo->rx_fd == lo->fd);
        /* the lower rank always writes on the shared connection, large or not */
        GS_ASSERT_OK(gs_tcp_write_imm(&lo->base, d, dst, big, &rback, 0, 0x70u, 3, GS_OP_SIGNALED));
        TCP_EXPECT_WC(&p, 1, wc, GS_WC_RECV_IMM, GS_OK);
        TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE_IMM, GS_OK);
        GS_ASSERT(lo->tx_fd == lo->fd && hi->rx_fd == hi->fd);
        GS_ASSERT(memcmp(back->addr, d, big) == 0);
    }
    tcp_pair_close(&p);
}

GS_TEST(tcp_read_returns_the_remote_bytes)
{
    tcp_pair p;
    gs_mr *local, *remote;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 3 << 20, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 3 << 20, GS_ACCESS_ALL, &remote));
    gs_rmr_head rrem = tcp_rmr(remote);
    fill(remote->addr, 3 << 20, 11);
    GS_ASSERT_OK(
        gs_tcp_read(tcp_pair_ep(&p, 0), (uint8_t *)local->addr + 8, local, 5, &rrem, 100, 1, GS_OP_SIGNALED));
    GS_ASSERT_OK(gs_tcp_read(tcp_pair_ep(&p, 0), (uint8_t *)local->addr + 4096, local, (3 << 20) - 4096,
                             &rrem, 0, 2, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_READ, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 1);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_READ, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 2);
    GS_ASSERT(memcmp((uint8_t *)local->addr + 8, (uint8_t *)remote->addr + 100, 5) == 0);
    GS_ASSERT(memcmp((uint8_t *)local->addr + 4096, remote->addr, (3 << 20) - 4096) == 0);
    GS_ASSERT_EQ(((uint8_t *)local->addr)[13], 0);
    tcp_pair_close(&p);
}

GS_TEST(tcp_atomics_return_the_old_value)
{
    tcp_pair p;
    gs_mr *local, *remote;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 64, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 64, GS_ACCESS_ALL, &remote));
    gs_rmr_head rrem = tcp_rmr(remote);
    uint64_t *word = (uint64_t *)remote->addr + 2, *res = local->addr;
    *word = 40;
    GS_ASSERT_OK(gs_tcp_fetch_add(tcp_pair_ep(&p, 0), &res[0], local, &rrem, 16, 2, 1, GS_OP_SIGNALED));
    GS_ASSERT_OK(gs_tcp_cmp_swap(tcp_pair_ep(&p, 0), &res[1], local, &rrem, 16, 42, 7, 2, GS_OP_SIGNALED));
    GS_ASSERT_OK(gs_tcp_cmp_swap(tcp_pair_ep(&p, 0), &res[2], local, &rrem, 16, 42, 9, 3, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_FETCH_ADD, GS_OK);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_CMP_SWAP, GS_OK);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_CMP_SWAP, GS_OK);
    GS_ASSERT_U64_EQ(res[0], 40);
    GS_ASSERT_U64_EQ(res[1], 42);
    GS_ASSERT_U64_EQ(res[2], 7); /* compare failed: old value, no swap */
    GS_ASSERT_U64_EQ(*word, 7);
    tcp_pair_close(&p);
}

GS_TEST(tcp_send_meets_receives_posted_before_and_after)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 8192, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 8192, GS_ACCESS_ALL, &dst));
    fill(src->addr, 8192, 5);
    /* posted first: straight into the buffer */
    GS_ASSERT_OK(gs_tcp_recv(tcp_pair_ep(&p, 1), dst->addr, dst, 4096, 77));
    GS_ASSERT_OK(gs_tcp_send(tcp_pair_ep(&p, 0), src->addr, src, 100, 1, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 1, wc, GS_WC_RECV, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 77);
    GS_ASSERT_EQ(wc.len, 100);
    GS_ASSERT(memcmp(dst->addr, src->addr, 100) == 0);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_SEND, GS_OK);
    /* sent first: waits for the receive */
    GS_ASSERT_OK(
        gs_tcp_send(tcp_pair_ep(&p, 0), (uint8_t *)src->addr + 100, src, GS_SEND_MAX, 2, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_SEND, GS_OK);
    GS_ASSERT_OK(gs_tcp_recv(tcp_pair_ep(&p, 1), (uint8_t *)dst->addr + 4096, dst, 4096, 78));
    TCP_EXPECT_WC(&p, 1, wc, GS_WC_RECV, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 78);
    GS_ASSERT_EQ(wc.len, GS_SEND_MAX);
    GS_ASSERT(memcmp((uint8_t *)dst->addr + 4096, (uint8_t *)src->addr + 100, GS_SEND_MAX) == 0);
    GS_ASSERT_STATUS(gs_tcp_send(tcp_pair_ep(&p, 0), src->addr, src, GS_SEND_MAX + 1, 3, 0), GS_ERR_INVALID);
    tcp_pair_close(&p);
}

GS_TEST(tcp_full_queue_says_again_and_drains)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    int posted = 0;
    gs_status st = GS_OK;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 1 << 20, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 1 << 20, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    /* the target does not poll: the socket buffers fill, then the queue */
    while (st == GS_OK && posted < 100000) {
        st = gs_tcp_write(tcp_pair_ep(&p, 0), src->addr, src, 1 << 20, &rdst, 0, (uint64_t)posted,
                          GS_OP_SIGNALED);
        posted += st == GS_OK;
    }
    GS_ASSERT_STATUS(st, GS_ERR_AGAIN);
    GS_ASSERT_GT(posted, 0);
    for (int i = 0; i < posted; i++) {
        TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE, GS_OK);
        GS_ASSERT_U64_EQ(wc.wr_id, (uint64_t)i);
    }
    tcp_pair_close(&p);
}

GS_TEST(tcp_unsignaled_ops_complete_silently_in_order)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    for (int i = 0; i < 1000; i++) {
        ((uint32_t *)src->addr)[i] = (uint32_t)i * 3;
        GS_ASSERT_OK(gs_tcp_write(tcp_pair_ep(&p, 0), (uint32_t *)src->addr + i, src, 4, &rdst,
                                  (uint64_t)i * 4, 0, 0));
    }
    GS_ASSERT_OK(gs_tcp_write(tcp_pair_ep(&p, 0), src->addr, src, 0, &rdst, 0, 5, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE, GS_OK);
    GS_ASSERT_U64_EQ(wc.wr_id, 5);
    GS_ASSERT(memcmp(dst->addr, src->addr, 4000) == 0);
    GS_ASSERT_EQ(p.ngot[0], 0);
    tcp_pair_close(&p);
}

/* Refused accesses: the initiator's op completes with REMOTE_ACCESS, the
 * target memory is untouched, the endpoint is in error afterwards. */
static void expect_refused(int op)
{
    tcp_pair p;
    gs_mr *src, *dst, *ro;
    gs_wc wc;
    uint64_t res = 0;
    gs_ep *ep;
    tcp_pair_open(&p);
    ep = tcp_pair_ep(&p, 0);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &dst));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_LOCAL_WRITE, &ro));
    gs_rmr_head rdst = tcp_rmr(dst), rro = tcp_rmr(ro), rbad = rdst;
    rbad.key ^= 1ull << 40;
    memset(src->addr, 0xab, 4096);
    memset(dst->addr, 0x11, 4096);
    memset(ro->addr, 0x22, 4096);
    switch (op) {
    case 0: GS_ASSERT_OK(gs_tcp_write(ep, src->addr, src, 100, &rdst, 4000, 1, GS_OP_SIGNALED)); break;
    case 1: GS_ASSERT_OK(gs_tcp_write(ep, src->addr, src, 8, &rbad, 0, 1, GS_OP_SIGNALED)); break;
    case 2: GS_ASSERT_OK(gs_tcp_write(ep, src->addr, src, 8, &rro, 0, 1, GS_OP_SIGNALED)); break;
    case 3: GS_ASSERT_OK(gs_tcp_read(ep, src->addr, src, 8, &rro, 0, 1, GS_OP_SIGNALED)); break;
    case 4: GS_ASSERT_OK(gs_tcp_fetch_add(ep, &res, src, &rro, 0, 1, 1, GS_OP_SIGNALED)); break;
    case 5: GS_ASSERT_OK(gs_tcp_fetch_add(ep, &res, src, &rdst, 4, 1, 1, GS_OP_SIGNALED)); break;
    default: GS_ASSERT_OK(gs_tcp_read(ep, src->addr, src, 4097, &rdst, 0, 1, GS_OP_SIGNALED)); break;
    }
    GS_ASSERT_OK(gs_tcp_write(ep, src->addr, src, 8, &rdst, 0, 2, GS_OP_SIGNALED));
    TCP_EXPECT_WC(&p, 0, wc,
                  op == 3 || op == 6 ? GS_WC_READ
                  : op >= 4          ? GS_WC_FETCH_ADD
                                     : GS_WC_WRITE,
                  GS_ERR_REMOTE_ACCESS);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE, GS_ERR_FLUSHED);
    GS_ASSERT_U64_EQ(wc.wr_id, 2);
    for (int i = 0; i < 4096; i++) {
        GS_ASSERT_EQ(((uint8_t *)dst->addr)[i], 0x11);
        GS_ASSERT_EQ(((uint8_t *)ro->addr)[i], 0x22);
    }
    GS_ASSERT_STATUS(gs_tcp_write(ep, src->addr, src, 8, &rdst, 0, 3, 0), GS_ERR_FLUSHED);
    /* the target dropped the connection and says why; the peer is gone for it */
    GS_ASSERT_STATUS(tcp_pair_poll_until(&p, 1, GS_ERR_PEER_LOST), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(gs_last_error(), "was refused");
    GS_ASSERT_EQ(p.ngot[1], 0);
    /* the initiator was refused, not abandoned: its polls stay quiet */
    GS_ASSERT_EQ(p.last[0], GS_OK);
    tcp_pair_close(&p);
}

GS_TEST(tcp_write_past_the_region_is_refused)
{
    expect_refused(0);
}
GS_TEST(tcp_write_with_a_bad_key_is_refused)
{
    expect_refused(1);
}
GS_TEST(tcp_write_without_permission_is_refused)
{
    expect_refused(2);
}
GS_TEST(tcp_read_without_permission_is_refused)
{
    expect_refused(3);
}
GS_TEST(tcp_atomic_without_permission_is_refused)
{
    expect_refused(4);
}
GS_TEST(tcp_misaligned_atomic_is_refused)
{
    expect_refused(5);
}
GS_TEST(tcp_read_past_the_region_is_refused)
{
    expect_refused(6);
}

/* Side dies without a goodbye: its socket closes, and it never polls again. */
static void kill_side(tcp_pair *p, int side)
{
    gs_tcp_ep *ep = gs_tcp_ep_at(p->tp[side], 1 - side);
    close(ep->fd);
    ep->fd = -1;
    ep->dead = true;
    ep->err_reported = true;
}

GS_TEST(tcp_peer_lost_fails_outstanding_ops)
{
    tcp_pair p;
    gs_mr *local, *remote;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &remote));
    gs_rmr_head rrem = tcp_rmr(remote);
    GS_ASSERT_OK(gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, 64, &rrem, 0, 1, GS_OP_SIGNALED));
    GS_ASSERT_OK(gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, 64, &rrem, 0, 2, GS_OP_SIGNALED));
    /* the peer dies without a goodbye: its socket is simply closed */
    kill_side(&p, 1);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_READ, GS_ERR_PEER_LOST);
    GS_ASSERT_U64_EQ(wc.wr_id, 1);
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_READ, GS_ERR_FLUSHED);
    GS_ASSERT_CONTAINS(gs_tcp_ep_at(p.tp[0], 1)->why, "rank 1");
    GS_ASSERT_STATUS(gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, 64, &rrem, 0, 3, 0),
                     GS_ERR_PEER_LOST);
    GS_ASSERT_STATUS(tcp_pair_poll_until(&p, 0, GS_ERR_PEER_LOST), GS_ERR_PEER_LOST);
    tcp_pair_close(&p);
}

/* splice has no MSG_NOSIGNAL: a zero-copy write into a connection the peer
 * has reset must end in PEER_LOST, not in a SIGPIPE that kills the process. */
GS_TEST(tcp_zcopy_write_to_a_dead_peer_is_peer_lost_not_sigpipe)
{
    tcp_pair p;
    gs_mr *src, *dst;
    gs_wc wc;
    const size_t len = 8 << 20;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, len, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, len, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    kill_side(&p, 1);
    /* several pipe loads in one frame: the reset comes back after the first */
    GS_ASSERT_OK(
        gs_tcp_write(tcp_pair_ep(&p, 0), src->addr, src, len, &rdst, 0, 5, GS_OP_SIGNALED | GS_OP_ZCOPY));
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_WRITE, GS_ERR_PEER_LOST);
    GS_ASSERT_U64_EQ(wc.wr_id, 5);
    /* the reset met the splice (the header before it always leaves), and the
     * pipe's page references were let go */
    GS_ASSERT_CONTAINS(gs_tcp_ep_at(p.tp[0], 1)->why, "by splice failed");
    GS_ASSERT_EQ(gs_tcp_ep_at(p.tp[0], 1)->pipe[0], -1);
    tcp_pair_close(&p);
}

GS_TEST(tcp_quiet_peer_loss_still_reaches_the_caller)
{
    tcp_pair p;
    gs_mr *mr;
    gs_wc wc;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &mr));
    GS_ASSERT_OK(gs_tcp_recv(tcp_pair_ep(&p, 0), mr->addr, mr, 64, 31));
    kill_side(&p, 1);
    /* the posted receive is flushed, then every empty poll says who is lost */
    TCP_EXPECT_WC(&p, 0, wc, GS_WC_RECV, GS_ERR_FLUSHED);
    GS_ASSERT_U64_EQ(wc.wr_id, 31);
    GS_ASSERT_STATUS(tcp_pair_poll_until(&p, 0, GS_ERR_PEER_LOST), GS_ERR_PEER_LOST);
    GS_ASSERT_STR_EQ(gs_last_error(),
                     "rank 0: rank 1 lost (connection closed by the peer): did it exit or crash?");
    GS_ASSERT_STATUS(tcp_pair_poll_until(&p, 0, GS_ERR_PEER_LOST), GS_ERR_PEER_LOST);
    tcp_pair_close(&p);
}

GS_TEST(tcp_orderly_close_is_not_an_error)
{
    tcp_pair p;
    gs_mr *src, *dst;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &dst));
    gs_rmr_head rdst = tcp_rmr(dst);
    memset(src->addr, 9, 4096);
    /* unsignaled data still queued at close must arrive before the goodbye */
    GS_ASSERT_OK(gs_tcp_write(tcp_pair_ep(&p, 0), src->addr, src, 4096, &rdst, 0, 1, 0));
    gs_tcp_tp_destroy(p.tp[0]);
    p.tp[0] = NULL;
    for (int i = 0; i < 50 && !gs_tcp_ep_at(p.tp[1], 0)->dead; i++) {
        tcp_pair_drive(&p);
        usleep(1000);
    }
    GS_ASSERT(gs_tcp_ep_at(p.tp[1], 0)->dead);
    GS_ASSERT(gs_tcp_ep_at(p.tp[1], 0)->bye_rcvd);
    GS_ASSERT_EQ(((uint8_t *)dst->addr)[4095], 9);
    for (int i = 0; i < 20; i++)
        tcp_pair_drive(&p);
    GS_ASSERT_EQ(p.ngot[1], 0);     /* nothing to report: no error completion */
    GS_ASSERT_EQ(p.last[1], GS_OK); /* a peer that closed in order is not lost */
    rdst.owner = 0;                 /* as if rank 0 had a region there */
    GS_ASSERT_STATUS(gs_tcp_write(tcp_pair_ep(&p, 1), dst->addr, dst, 8, &rdst, 0, 1, 0), GS_ERR_PEER_LOST);
    tcp_pair_close(&p);
}

GS_TEST(tcp_unanswered_op_times_out)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "300", NULL};
    tcp_pair p;
    gs_mr *local, *remote;
    gs_wc wc;
    int n = 0;
    uint64_t t0;
    tcp_pair_open_with(&p, env, env);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &remote));
    gs_rmr_head rrem = tcp_rmr(remote);
    GS_ASSERT_OK(gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, 64, &rrem, 0, 1, GS_OP_SIGNALED));
    t0 = gs_now_ns();
    /* only side 0 polls: side 1 never serves the READ */
    GS_ASSERT_OK(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(3000)));
    GS_ASSERT_EQ(n, 1);
    GS_ASSERT_STR_EQ(gs_status_name(wc.status), "GS_ERR_TIMEOUT");
    GS_ASSERT_GE(gs_now_ns() - t0, 250000000ull);
    GS_ASSERT_CONTAINS(gs_tcp_ep_at(p.tp[0], 1)->why, "no answer from rank 1");
    tcp_pair_close(&p);
}

GS_TEST(tcp_wait_reports_timeout_when_nothing_comes)
{
    tcp_pair p;
    gs_wc wc;
    int n = 0;
    tcp_pair_open(&p);
    GS_ASSERT_STATUS(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(50)), GS_ERR_TIMEOUT);
    tcp_pair_close(&p);
}

/* Side 1 has a progress thread and never polls: it still serves READs,
 * atomics and acknowledgements while "computing". Side 0 waits in each mode. */
static void served_while_computing(const char *mode)
{
    const char *const env0[] = {"GS_TIMEOUT_MS", "5000", "GS_POLL", mode, NULL};
    static const char *const env1[] = {"GS_TIMEOUT_MS", "5000", "GS_PROGRESS_THREAD", "1", NULL};
    tcp_pair p;
    gs_mr *local, *remote;
    gs_wc wc;
    int n = 0;
    tcp_pair_open_with(&p, env0, env1);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 1 << 20, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 1 << 20, GS_ACCESS_ALL, &remote));
    gs_rmr_head rrem = tcp_rmr(remote);
    fill(remote->addr, 1 << 20, 1);
    for (int i = 0; i < 20; i++) {
        GS_ASSERT_OK(
            gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, 1 << 20, &rrem, 0, 1, GS_OP_SIGNALED));
        GS_ASSERT_OK(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
        GS_ASSERT_EQ(wc.status, GS_OK);
        GS_ASSERT_EQ(wc.opcode, GS_WC_READ);
        GS_ASSERT_OK(gs_tcp_fetch_add(tcp_pair_ep(&p, 0), (uint64_t *)local->addr, local, &rrem, 8, 1, 2,
                                      GS_OP_SIGNALED));
        GS_ASSERT_OK(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
        GS_ASSERT_EQ(wc.status, GS_OK);
        GS_ASSERT_OK(
            gs_tcp_write(tcp_pair_ep(&p, 0), local->addr, local, 4096, &rrem, 4096, 3, GS_OP_SIGNALED));
        GS_ASSERT_OK(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
        GS_ASSERT_EQ(wc.status, GS_OK);
        GS_ASSERT_EQ(wc.opcode, GS_WC_WRITE);
    }
    GS_ASSERT_U64_EQ(((uint64_t *)remote->addr)[1] - ((uint64_t *)local->addr)[0], 1);
    tcp_pair_close(&p);
}

GS_TEST(tcp_progress_thread_serves_while_computing_spin)
{
    served_while_computing("spin");
}
GS_TEST(tcp_progress_thread_serves_while_computing_event)
{
    served_while_computing("event");
}
GS_TEST(tcp_progress_thread_serves_while_computing_hybrid)
{
    served_while_computing("hybrid");
}

/* Many threads on both sides: fetch-adds from side 0's threads while side
 * 1's progress thread serves and side 1's caller polls too. */
typedef struct adder {
    tcp_pair *p;
    gs_mr *local;
    gs_rmr_head rrem;
    int index;
} adder;

static void *adder_main(void *arg)
{
    adder *a = arg;
    uint64_t *res = (uint64_t *)a->local->addr + a->index;
    for (int i = 0; i < 200; i++) {
        gs_status st;
        while ((st = gs_tcp_fetch_add(tcp_pair_ep(a->p, 0), res, a->local, &a->rrem, 0, 1, 0, 0)) ==
               GS_ERR_AGAIN)
            ;
        if (st != GS_OK)
            return (void *)1;
    }
    return NULL;
}

GS_TEST(tcp_concurrent_posters_and_progress_thread)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", "GS_PROGRESS_THREAD", "1", NULL};
    tcp_pair p;
    gs_mr *local, *remote;
    pthread_t th[4];
    adder args[4];
    gs_wc wc;
    int n;
    tcp_pair_open_with(&p, env, env);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, 4096, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, 4096, GS_ACCESS_ALL, &remote));
    for (int t = 0; t < 4; t++) {
        args[t] = (adder){.p = &p, .local = local, .rrem = tcp_rmr(remote), .index = t + 1};
        GS_ASSERT_EQ(pthread_create(&th[t], NULL, adder_main, &args[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        void *ret;
        pthread_join(th[t], &ret);
        GS_ASSERT(ret == NULL);
    }
    /* a final signaled read: in order after every add */
    GS_ASSERT_OK(gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, 8, &args[0].rrem, 0, 9, GS_OP_SIGNALED));
    GS_ASSERT_OK(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
    GS_ASSERT_EQ(wc.status, GS_OK);
    GS_ASSERT_U64_EQ(*(uint64_t *)local->addr, 800);
    GS_ASSERT_U64_EQ(*(uint64_t *)remote->addr, 800);
    tcp_pair_close(&p);
}

/* A region deregistered while a READ reply from it is still going out: the
 * reply finishes first (the reader gets the bytes), then the region goes. */
GS_TEST(tcp_dereg_lets_queued_read_replies_finish)
{
    const size_t len = 32u << 20;
    tcp_pair p;
    gs_mr *local, *remote;
    gs_wc wc;
    int n = 0;
    tcp_pair_open(&p);
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[0]->base, len, GS_ACCESS_ALL, &local));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&p.tp[1]->base, len, GS_ACCESS_ALL, &remote));
    gs_rmr_head rrem = tcp_rmr(remote);
    fill(remote->addr, len, 21);
    GS_ASSERT_OK(gs_tcp_read(tcp_pair_ep(&p, 0), local->addr, local, len, &rrem, 0, 1, GS_OP_SIGNALED));
    /* side 1 takes the request and queues the 32 MiB reply; side 0 does not
     * read yet, so more of it stays queued than the sockets hold */
    for (uint64_t deadline = gs_deadline_after_ms(3000); ((gs_tcp_mr *)remote)->tx_refs == 0;) {
        GS_ASSERT(!gs_deadline_passed(deadline));
        GS_ASSERT_OK(gs_tcp_poll(&p.tp[1]->base, &wc, 1, &n));
    }
    /* now side 0 reads (its progress thread), while side 1 deregisters */
    p.cfg[0].progress_thread = true;
    GS_ASSERT_OK(gs_tcp_thread_start(p.tp[0]));
    GS_ASSERT_OK(gs_tcp_mr_dereg(remote));
    GS_ASSERT(!gs_tcp_ep_at(p.tp[1], 0)->dead);
    GS_ASSERT_OK(gs_tcp_wait(&p.tp[0]->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
    GS_ASSERT_EQ(wc.status, GS_OK);
    GS_ASSERT_EQ(wc.opcode, GS_WC_READ);
    for (size_t i = 0; i < len; i += 4093)
        GS_ASSERT_EQ(((uint8_t *)local->addr)[i], (uint8_t)(21 + i * 131 + (i >> 8)));
    tcp_pair_close(&p);
}
