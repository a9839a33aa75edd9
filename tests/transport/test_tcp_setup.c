/* tcp connection setup: which address a rank listens on (GS_TCP_IFNAME or
 * the route to the store, IPv4 and IPv6), the address blob, and a full
 * setup between two ranks over IPv6 loopback followed by traffic. */
#include "tcp_pair.h"

#include <pthread.h>

static const char *addr_text(const gs_tcp_addr *addr, char *buf, size_t cap)
{
    gs_tcp_addr_format(addr, buf, cap);
    return buf;
}

GS_TEST(tcp_interface_name_picks_its_address)
{
    static const char *const lo[] = {"GS_TCP_IFNAME", "lo", NULL};
    static const char *const bogus[] = {"GS_TCP_IFNAME", "nosuchif0", NULL};
    gs_config cfg;
    gs_tcp_addr addr;
    char text[80];
    tcp_config(&cfg, lo);
    GS_ASSERT_OK(gs_tcp_addr_choose(&cfg, "127.0.0.1", 1234, 0, &addr));
    GS_ASSERT_STR_EQ(addr_text(&addr, text, sizeof(text)), "127.0.0.1:0");
    /* a store reached over IPv6 makes the interface's IPv6 address preferred */
    GS_ASSERT_OK(gs_tcp_addr_choose(&cfg, "::1", 1234, 0, &addr));
    GS_ASSERT_STR_EQ(addr_text(&addr, text, sizeof(text)), "[::1]:0");
    tcp_config(&cfg, bogus);
    GS_ASSERT_STATUS(gs_tcp_addr_choose(&cfg, "127.0.0.1", 1234, 3, &addr), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_TCP_IFNAME=nosuchif0");
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 3");
}

GS_TEST(tcp_default_address_is_the_route_to_the_store)
{
    gs_config cfg;
    gs_tcp_addr addr;
    char text[80];
    tcp_config(&cfg, NULL);
    GS_ASSERT_OK(gs_tcp_addr_choose(&cfg, "127.0.0.1", 29500, 0, &addr));
    GS_ASSERT_STR_EQ(addr_text(&addr, text, sizeof(text)), "127.0.0.1:0");
    GS_ASSERT_OK(gs_tcp_addr_choose(&cfg, "::1", 29500, 0, &addr));
    GS_ASSERT_STR_EQ(addr_text(&addr, text, sizeof(text)), "[::1]:0");
    GS_ASSERT_OK(gs_tcp_addr_choose(&cfg, "", 0, 0, &addr)); /* no store: loopback */
    GS_ASSERT_STR_EQ(addr_text(&addr, text, sizeof(text)), "127.0.0.1:0");
    GS_ASSERT_STATUS(gs_tcp_addr_choose(&cfg, "no.such.host.invalid", 29500, 0, &addr), GS_ERR_CONFIG);
}

GS_TEST(tcp_address_blob_round_trips_and_rejects_garbage)
{
    gs_config cfg;
    gs_tcp_addr addr, bound, back;
    gs_tcp_addr_blob blob;
    char a[80], b[80];
    int fd;
    tcp_config(&cfg, NULL);
    GS_ASSERT_OK(gs_tcp_addr_choose(&cfg, "::1", 1, 0, &addr));
    GS_ASSERT_OK(gs_tcp_listen(&addr, 4, 0, &fd, &bound));
    gs_tcp_blob_pack(&bound, (const uint8_t *)"0123456789abcdef", &blob);
    GS_ASSERT_EQ(blob.family, GS_TCP_FAMILY_IPV6);
    GS_ASSERT_OK(gs_tcp_blob_unpack(&blob, 0, &back));
    GS_ASSERT_STR_EQ(addr_text(&back, a, sizeof(a)), addr_text(&bound, b, sizeof(b)));
    blob.version = 99;
    GS_ASSERT_STATUS(gs_tcp_blob_unpack(&blob, 5, &back), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "rank 5");
    close(fd);
}

GS_TEST(tcp_netns_that_does_not_exist_is_a_config_error)
{
    static const char *const env[] = {"GS_TCP_NETNS", "gs-no-such-netns-xyz", NULL};
    gs_config cfg;
    int saved = 7;
    tcp_config(&cfg, env);
    GS_ASSERT_STATUS(gs_tcp_netns_enter(&cfg, 0, &saved), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "/run/netns/gs-no-such-netns-xyz");
    GS_ASSERT_EQ(saved, -1);
}

/* Two ranks set up over IPv6 loopback, each in its own thread. */
typedef struct v6_rank {
    gs_config cfg;
    gs_tcp_addr_blob *blobs;
    int lfd;
    int fds[2], tx_fds[2];
    int rank;
    gs_status status;
} v6_rank;

/* A 64 KiB WRITE_IMM of fill bytes from `from`'s buffer into `to`'s: both
 * completions arrive (the write's and the immediate's) and the last byte
 * landed. */
static void write_across(gs_tcp_tp *from, gs_tcp_tp *to, gs_mr *src, gs_mr *dst, int fill, uint32_t imm)
{
    gs_rmr_head rdst = tcp_rmr(dst);
    gs_wc wc;
    int n = 0;
    memset(src->addr, fill, 1 << 16);
    GS_ASSERT_OK(gs_tcp_write_imm(from->base.eps[to->base.rank], src->addr, src, 1 << 16, &rdst, 0, imm, imm,
                                  GS_OP_SIGNALED));
    GS_ASSERT_OK(gs_tcp_wait(&from->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
    GS_ASSERT_EQ(wc.status, GS_OK);
    GS_ASSERT_EQ(wc.opcode, GS_WC_WRITE_IMM);
    GS_ASSERT_OK(gs_tcp_wait(&to->base, &wc, 1, &n, gs_deadline_after_ms(5000)));
    GS_ASSERT_EQ(wc.opcode, GS_WC_RECV_IMM);
    GS_ASSERT_EQ(wc.imm, imm);
    GS_ASSERT_EQ(((uint8_t *)dst->addr)[65535], fill);
}

static void *v6_main(void *arg)
{
    v6_rank *r = arg;
    gs_tcp_setup setup = {.cfg = &r->cfg,
                          .rank = r->rank,
                          .size = 2,
                          .instance = 0,
                          .blobs = r->blobs,
                          .deadline_ns = gs_deadline_after_ms(5000)};
    r->status = gs_tcp_connect_all(&setup, r->lfd, r->fds, r->tx_fds);
    return NULL;
}

GS_TEST(tcp_ranks_connect_over_ipv6_and_move_data)
{
    static const char *const env[] = {"GS_TIMEOUT_MS", "5000", "GS_JOB_TOKEN", "v6", NULL};
    static v6_rank ranks[2];
    static gs_tcp_addr_blob blobs[2];
    pthread_t th[2];
    gs_tcp_tp *tp[2];
    gs_mr *src, *dst;
    for (int r = 0; r < 2; r++) {
        gs_tcp_addr addr, bound;
        uint8_t nonce[GS_TCP_NONCE_BYTES];
        ranks[r] = (v6_rank){.blobs = blobs, .rank = r};
        tcp_config(&ranks[r].cfg, env);
        GS_ASSERT_OK(gs_tcp_addr_choose(&ranks[r].cfg, "::1", 1, r, &addr));
        GS_ASSERT_OK(gs_tcp_listen(&addr, 4, r, &ranks[r].lfd, &bound));
        memset(nonce, 'a' + r, sizeof(nonce));
        gs_tcp_blob_pack(&bound, nonce, &blobs[r]);
    }
    for (int r = 0; r < 2; r++)
        GS_ASSERT_EQ(pthread_create(&th[r], NULL, v6_main, &ranks[r]), 0);
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        GS_ASSERT_OK(ranks[r].status);
        close(ranks[r].lfd);
        GS_ASSERT_OK(gs_tcp_tp_create(&ranks[r].cfg, r, 2, &tp[r]));
        GS_ASSERT_OK(gs_tcp_ep_attach_both(tp[r], 1 - r, ranks[r].fds[1 - r], ranks[r].tx_fds[1 - r]));
        GS_ASSERT_OK(gs_tcp_thread_start(tp[r]));
    }
    GS_ASSERT_OK(gs_tcp_buf_alloc(&tp[0]->base, 1 << 16, GS_ACCESS_ALL, &src));
    GS_ASSERT_OK(gs_tcp_buf_alloc(&tp[1]->base, 1 << 16, GS_ACCESS_ALL, &dst));
    /* rank 1 never polls for the first: its progress thread serves the write
     * and the ack; then back: rank 1 (the higher) sends this size on the
     * connection it dialled */
    write_across(tp[0], tp[1], src, dst, 0x42, 5);
    write_across(tp[1], tp[0], dst, src, 0x24, 6);
    gs_tcp_ep *hi = gs_tcp_ep_at(tp[1], 0);
    GS_ASSERT(hi->side_fd != hi->fd && hi->tx_fd == hi->side_fd);
    gs_tcp_tp_destroy(tp[0]);
    gs_tcp_tp_destroy(tp[1]);
}
