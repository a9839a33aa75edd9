/*
 * Ranks on several emulated hosts (GS_HOST_ID per rank, the harness's
 * host_of): GS_TRANSPORT=auto picks the mixed transport (shm among a host's
 * ranks, tcp between hosts) exactly when the ranks span hosts and some
 * host runs several; the collectives and point-to-point over it, for
 * contiguous, interleaved and uneven placements, exact and bitwise the
 * same on every rank; the hierarchical allreduce (GS_ALGO=hier, and auto
 * above the small sizes), on even and uneven hosts; sub-communicators of one host run over shm; a
 * rank killed on one host is reported by every rank of every host. (The netns test runs the same with the tcp
 * sockets in separate network namespaces.)
 */
#include "coll_check.h"

#include "coll/coll.h"

#include <signal.h>

typedef struct placement {
    const char *name;
    int n;
    int host_of[8];
} placement;

static const placement two_by_two = {"2x2", 4, {0, 0, 1, 1}};
static const placement interleaved = {"3+2 interleaved", 5, {0, 1, 0, 1, 0}};
static const placement three_by_two = {"3x2 round robin", 6, {0, 1, 2, 0, 1, 2}};

typedef struct hosts_arg {
    const placement *pl;
    const char *want; /* the transport auto must pick */
} hosts_arg;

static int hosts_of(const placement *pl)
{
    int hosts = 0;
    for (int r = 0; r < pl->n; r++)
        hosts = pl->host_of[r] + 1 > hosts ? pl->host_of[r] + 1 : hosts;
    return hosts;
}

static void run_placed(const placement *pl, gs_test_rank_fn fn, hosts_arg *arg, const char *const *env)
{
    static const char *const auto_env[] = {"GS_TRANSPORT=auto", NULL};
    gs_test_ranks_opts opts = {.n = pl->n,
                               .timeout_ms = 110000,
                               .rank_timeout_ms = 20000,
                               .env = env ? env : auto_env,
                               .host_of = pl->host_of};
    int status[GS_TEST_RANKS_MAX];
    int ok = gs_test_run_ranks_opts(&opts, fn, arg, status);
    for (int r = 0; r < pl->n; r++)
        GS_ASSERT_RANK_EXIT(status[r], 0);
    GS_ASSERT_EQ(ok, pl->n);
}

/* ---- the choice ------------------------------------------------------------------- */

static void choice_body(gs_ctx *ctx, int rank, void *argp)
{
    const hosts_arg *a = argp;
    gs_tp *tp = NULL;
    GS_ASSERT_OK(gs_tp_open(ctx, NULL, &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), a->want);
    /* every peer as far as its transport: memory on this host, a link to the others (tcp here) */
    for (int p = 0; p < a->pl->n; p++) {
        gs_tp_reach want = a->pl->host_of[p] == a->pl->host_of[rank] && strcmp(a->want, "tcp") != 0
                               ? (gs_tp_reach){GS_TP_LAT_MEMORY, GS_TP_BW_MEMORY}
                               : (gs_tp_reach){GS_TP_LAT_KERNEL, GS_TP_BW_NETWORK};
        if (p == rank)
            continue;
        GS_ASSERT_EQ((int)gs_tp_reach_of(tp, p).latency, (int)want.latency);
        GS_ASSERT_EQ((int)gs_tp_reach_of(tp, p).bandwidth, (int)want.bandwidth);
    }
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(auto_picks_a_transport_per_peer_by_placement)
{
    static const placement one_host = {"one host", 3, {0, 0, 0}};
    static const placement one_each = {"one rank per host", 3, {0, 1, 2}};
    static const placement alone = {"3+1", 4, {0, 0, 1, 0}};
    static const char *const tcp_env[] = {"GS_TRANSPORT=tcp", NULL};
    hosts_arg a = {.pl = &one_host, .want = "shm"};
    run_placed(&one_host, choice_body, &a, NULL);
    a = (hosts_arg){.pl = &one_each, .want = "tcp"};
    run_placed(&one_each, choice_body, &a, NULL);
    a = (hosts_arg){.pl = &two_by_two, .want = "mixed"};
    run_placed(&two_by_two, choice_body, &a, NULL);
    a = (hosts_arg){.pl = &alone, .want = "mixed"}; /* rank 2, alone on its host, too */
    run_placed(&alone, choice_body, &a, NULL);
    a = (hosts_arg){.pl = &two_by_two, .want = "tcp"}; /* forced: one transport for everyone */
    run_placed(&two_by_two, choice_body, &a, tcp_env);
}

/* ---- one-sided operations per peer -------------------------------------------------- */

#define RMA_BYTES 8192

/* Every rank writes its rank into its slot of every peer's region, reads
 * the peer's own words back, adds one to each peer's counter, and sends
 * it a message: each over the instance that reaches that peer. */
static void rma_body(gs_ctx *ctx, int rank, void *argp)
{
    (void)argp;
    int n = gs_ctx_size(ctx);
    gs_tp *tp = NULL;
    gs_mr *mr = NULL;
    gs_rmr mine, all[8];
    uint64_t *words, *result;
    uint8_t *msg;
    int done = 0, recvs = 0;
    GS_ASSERT_OK(gs_tp_open(ctx, NULL, &tp));
    GS_ASSERT_STR_EQ(gs_tp_name(tp), "mixed");
    GS_ASSERT_OK(gs_mr_alloc(tp, RMA_BYTES, GS_ACCESS_ALL, &mr));
    words = gs_mr_addr(mr);
    memset(words, 0, RMA_BYTES);
    words[100] = 1000u + (uint64_t)rank; /* read by the peers */
    result = &words[200];
    msg = (uint8_t *)&words[400];
    gs_mr_pack(mr, &mine);
    GS_ASSERT_OK(gs_store_allgather(ctx, "rma.mr", &mine, sizeof(mine), all));
    for (int p = 0; p < n; p++)
        if (p != rank)
            GS_ASSERT_OK(gs_ep_recv(gs_tp_ep(tp, p), msg + 64 * p, mr, 64, 500 + (uint64_t)p));
    GS_ASSERT_OK(gs_store_barrier(ctx, "rma.recvs"));
    for (int p = 0; p < n; p++) {
        gs_ep *ep = gs_tp_ep(tp, p);
        uint64_t me = (uint64_t)rank + 1;
        gs_wc wc;
        int got;
        if (p == rank)
            continue;
        words[300 + p] = me;
        GS_ASSERT_OK(
            gs_ep_write(ep, &words[300 + p], mr, 8, &all[p], 8u * (uint64_t)rank, 1, GS_OP_SIGNALED));
        GS_ASSERT_OK(gs_ep_read(ep, &words[50 + p], mr, 8, &all[p], 8u * 100u, 2, GS_OP_SIGNALED));
        GS_ASSERT_OK(gs_ep_fetch_add(ep, result, mr, &all[p], 8u * 150u, 1, 3, GS_OP_SIGNALED));
        snprintf((char *)msg + 600 + 8 * p, 8, "hi %d", rank & 7);
        GS_ASSERT_OK(gs_ep_send(ep, msg + 600 + 8 * p, mr, 8, 4, GS_OP_SIGNALED));
        for (int left = 4; left > 0;) {
            GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &got, -1));
            GS_ASSERT_OK(wc.status);
            if (wc.opcode == GS_WC_RECV) {
                recvs++;
                continue;
            }
            GS_ASSERT_EQ(wc.peer, p);
            left--;
        }
        GS_ASSERT_U64_EQ(words[50 + p], 1000u + (uint64_t)p);
        done++;
    }
    while (recvs < n - 1) {
        gs_wc wc;
        int got;
        GS_ASSERT_OK(gs_tp_wait(tp, &wc, 1, &got, -1));
        GS_ASSERT_OK(wc.status);
        GS_ASSERT_EQ(wc.opcode, GS_WC_RECV);
        GS_ASSERT_U64_EQ(wc.wr_id, 500u + (uint64_t)wc.peer);
        recvs++;
    }
    GS_ASSERT_OK(gs_store_barrier(ctx, "rma.done"));
    for (int p = 0; p < n; p++) {
        char want[8];
        if (p == rank)
            continue;
        snprintf(want, sizeof(want), "hi %d", p & 7);
        GS_ASSERT_U64_EQ(words[p], (uint64_t)p + 1);
        GS_ASSERT_STR_EQ((char *)msg + 64 * p, want);
    }
    GS_ASSERT_U64_EQ(words[150], (uint64_t)(n - 1));
    GS_ASSERT_EQ(done, n - 1);
    GS_ASSERT_OK(gs_mr_dereg(mr));
    GS_ASSERT_OK(gs_tp_close(tp));
}

GS_TEST(one_sided_operations_reach_every_peer_on_its_transport)
{
    hosts_arg a = {.pl = &interleaved};
    run_placed(&interleaved, rma_body, &a, NULL);
}

/* ---- collectives ------------------------------------------------------------------ */

static const size_t counts[] = {0, 1, 4, 6, 4099, 300007};

static uint64_t allreduce_case(gs_comm *comm, int rank, int n, gs_dtype t, gs_redop op, size_t count,
                               uint64_t h)
{
    size_t bytes = count * gs_dtype_size(t);
    uint8_t *in = cc_alloc(bytes), *out = cc_alloc(bytes);
    char what[96];
    snprintf(what, sizeof(what), "rank %d allreduce count %zu", rank, count);
    cc_fill(t, op, rank, in, count);
    GS_ASSERT_OK(gs_allreduce(comm, in, out, count, t, op));
    cc_check_reduced(what, t, op, n, out, 0, count);
    cc_check_guard(out, bytes, what);
    h = cc_hash(h, out, bytes);
    free(in);
    free(out);
    return h;
}

static uint64_t rooted_cases(gs_comm *comm, int rank, int n, size_t count, uint64_t h)
{
    size_t bytes = count * 4, all_bytes = bytes * (size_t)n;
    uint8_t *in = cc_alloc(all_bytes), *out = cc_alloc(all_bytes);
    char what[96];
    for (int root = 0; root < n; root++) {
        snprintf(what, sizeof(what), "rank %d broadcast from %d count %zu", rank, root, count);
        cc_fill(GS_I32, GS_SUM, root, in, count);
        GS_ASSERT_OK(gs_broadcast(comm, in, out, count, GS_I32, root));
        GS_ASSERT(memcmp(in, out, bytes) == 0);
        cc_check_guard(out, bytes, what);
    }
    snprintf(what, sizeof(what), "rank %d reduce to %d count %zu", rank, n - 1, count);
    cc_fill(GS_F32, GS_SUM, rank, in, count);
    GS_ASSERT_OK(gs_reduce(comm, in, out, count, GS_F32, GS_SUM, n - 1));
    if (rank == n - 1)
        cc_check_reduced(what, GS_F32, GS_SUM, n, out, 0, count);
    cc_fill(GS_I32, GS_SUM, rank, in, count);
    GS_ASSERT_OK(gs_allgather(comm, in, out, count, GS_I32));
    for (int q = 0; q < n; q++) {
        uint8_t want[4];
        for (size_t i = 0; i < count; i++) {
            cc_put(GS_I32, GS_SUM, q, i, want);
            GS_ASSERT(memcmp(out + (size_t)q * bytes + i * 4, want, 4) == 0);
        }
    }
    h = cc_hash(h, out, all_bytes);
    snprintf(what, sizeof(what), "rank %d reduce_scatter count %zu", rank, count);
    cc_fill(GS_F32, GS_SUM, rank, in, count * (size_t)n);
    GS_ASSERT_OK(gs_reduce_scatter(comm, in, out, count, GS_F32, GS_SUM));
    cc_check_reduced(what, GS_F32, GS_SUM, n, out, (size_t)rank * count, count);
    /* alltoall: block q of rank r holds r * 1000 + q at every element */
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++) {
            int32_t v = rank * 1000 + q;
            memcpy(in + (size_t)q * bytes + i * 4, &v, 4);
        }
    GS_ASSERT_OK(gs_alltoall(comm, in, out, count, GS_I32));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < count; i++) {
            int32_t v;
            memcpy(&v, out + (size_t)q * bytes + i * 4, 4);
            GS_ASSERT_EQ(v, q * 1000 + rank);
        }
    free(in);
    free(out);
    return h;
}

/* A message around the ring of ranks, so that every pair of neighbours
 * (on one host or across) sends and receives. */
static void ring_p2p(gs_comm *comm, int rank, int n, size_t count)
{
    int32_t *out = malloc((count + 1) * 4), *in = malloc((count + 1) * 4);
    gs_req *req;
    GS_ASSERT(out && in);
    for (size_t i = 0; i < count; i++)
        out[i] = rank * 7 + (int32_t)i;
    GS_ASSERT_OK(gs_irecv(comm, in, count, GS_I32, (rank + n - 1) % n, 5, NULL, &req));
    GS_ASSERT_OK(gs_send(comm, out, count, GS_I32, (rank + 1) % n, 5));
    GS_ASSERT_OK(gs_req_wait(req));
    for (size_t i = 0; i < count; i++)
        GS_ASSERT_EQ(in[i], ((rank + n - 1) % n) * 7 + (int32_t)i);
    free(out);
    free(in);
}

static void collectives_body(gs_ctx *ctx, int rank, void *argp)
{
    const hosts_arg *a = argp;
    int n = gs_ctx_size(ctx);
    gs_comm *comm = NULL;
    uint64_t h = 14695981039346656037ull;
    (void)a;
    GS_ASSERT_OK(gs_comm_create(ctx, NULL, &comm));
    GS_ASSERT_STR_EQ(gs_tp_name(gs_comm_tp(comm)), "mixed");
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        h = allreduce_case(comm, rank, n, GS_F32, GS_SUM, counts[c], h);
        h = allreduce_case(comm, rank, n, GS_I32, GS_BXOR, counts[c], h);
        h = allreduce_case(comm, rank, n, GS_F64, GS_MAX, counts[c], h);
        if (counts[c] <= 4099)
            h = rooted_cases(comm, rank, n, counts[c], h);
        ring_p2p(comm, rank, n, counts[c]);
    }
    GS_ASSERT_OK(gs_barrier(comm));
    cc_same_everywhere(ctx, "hosts.results", h);
    GS_ASSERT_OK(gs_comm_destroy(comm));
}

GS_TEST(collectives_on_two_hosts_of_two)
{
    hosts_arg a = {.pl = &two_by_two};
    run_placed(&two_by_two, collectives_body, &a, NULL);
}

GS_TEST(collectives_on_uneven_interleaved_hosts)
{
    hosts_arg a = {.pl = &interleaved};
    run_placed(&interleaved, collectives_body, &a, NULL);
}

GS_TEST(collectives_on_three_hosts_round_robin)
{
    hosts_arg a = {.pl = &three_by_two};
    run_placed(&three_by_two, collectives_body, &a, NULL);
}

/* ---- the hierarchical allreduce --------------------------------------------------- */

/* GS_ALGO=hier on every rank: every type and operation, counts around the
 * parts (H * L of them) and many chunk columns, in and out of place. */
static void hier_body(gs_ctx *ctx, int rank, void *argp)
{
    static const gs_dtype types[] = {GS_F32, GS_F64, GS_BF16, GS_I32, GS_I64, GS_U8};
    static const gs_redop ops[] = {GS_SUM, GS_AVG, GS_MAX, GS_PROD, GS_BXOR};
    const hosts_arg *a = argp;
    int n = gs_ctx_size(ctx), parts = n;
    size_t hier_counts[] = {0, 1, (size_t)parts - 1, (size_t)parts, (size_t)parts + 1, 70001};
    gs_comm *comm = NULL;
    uint64_t h = 7;
    (void)a;
    cc_set_algo(ctx, GS_ALGO_HIER);
    GS_ASSERT_OK(gs_comm_create(ctx, NULL, &comm));
    GS_ASSERT(gs_coll_select(comm, GS_COLL_ALLREDUCE, 1 << 20) == &gs_hier_algo);
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            bool is_int = cc_is_int(types[t]);
            if ((is_int && ops[o] == GS_AVG) || (!is_int && ops[o] == GS_BXOR))
                continue;
            for (size_t c = 0; c < sizeof(hier_counts) / sizeof(hier_counts[0]); c++)
                h = allreduce_case(comm, rank, n, types[t], ops[o], hier_counts[c], h);
        }
    /* in place, with 4 KiB chunks: many columns */
    ctx->cfg.chunk_bytes = 4096;
    {
        size_t count = 100003, bytes = count * 4;
        uint8_t *buf = cc_alloc(bytes);
        gs_comm *small = NULL;
        GS_ASSERT_OK(gs_comm_create(ctx, NULL, &small));
        cc_fill(GS_F32, GS_SUM, rank, buf, count);
        GS_ASSERT_OK(gs_allreduce(small, buf, buf, count, GS_F32, GS_SUM));
        cc_check_reduced("in place", GS_F32, GS_SUM, n, buf, 0, count);
        cc_check_guard(buf, bytes, "in place");
        h = cc_hash(h, buf, bytes);
        GS_ASSERT_OK(gs_comm_destroy(small));
        free(buf);
    }
    cc_same_everywhere(ctx, "hier.results", h);
    GS_ASSERT_OK(gs_comm_destroy(comm));
}

GS_TEST(hierarchical_allreduce_on_even_hosts)
{
    static const placement two_by_three = {"2x3 interleaved", 6, {0, 1, 0, 1, 0, 1}};
    hosts_arg a = {.pl = &two_by_two};
    run_placed(&two_by_two, hier_body, &a, NULL);
    a.pl = &three_by_two;
    run_placed(&three_by_two, hier_body, &a, NULL);
    a.pl = &two_by_three;
    run_placed(&two_by_three, hier_body, &a, NULL);
}

/* GS_ALGO=hier for reduce_scatter and allgather, even and uneven hosts:
 * types, operations, counts, in place, many columns; the allgather's
 * results bitwise the same on every rank (hash *hg). */
static void blocks_case(gs_comm *comm, int rank, int n, gs_dtype t, gs_redop op, size_t count, bool inplace,
                        uint64_t *hg)
{
    size_t es = gs_dtype_size(t), bytes = count * es, all = bytes * (size_t)n;
    uint8_t *in = cc_alloc(all), *out = cc_alloc(all);
    char what[128];
    snprintf(what, sizeof(what), "rank %d hier reduce_scatter count %zu%s", rank, count,
             inplace ? " in place" : "");
    cc_fill(t, op, rank, in, count * (size_t)n);
    uint8_t *rs_out = inplace ? in + (size_t)rank * bytes : out;
    GS_ASSERT_OK(gs_reduce_scatter(comm, in, rs_out, count, t, op));
    cc_check_reduced(what, t, op, n, rs_out, (size_t)rank * count, count);
    if (op == GS_SUM) {
        snprintf(what, sizeof(what), "rank %d hier allgather count %zu%s", rank, count,
                 inplace ? " in place" : "");
        memset(out, 0, all);
        cc_fill(t, GS_SUM, rank, inplace ? out + (size_t)rank * bytes : in, count);
        GS_ASSERT_OK(gs_allgather(comm, inplace ? out + (size_t)rank * bytes : in, out, count, t));
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++) {
                uint8_t want[8];
                cc_put(t, GS_SUM, q, i, want);
                if (memcmp(out + (size_t)q * bytes + i * es, want, es) != 0)
                    gs_test_fail_here(__FILE__, __LINE__, "%s: block %d element %zu differs", what, q, i);
            }
        cc_check_guard(out, all, what);
        *hg = cc_hash(*hg, out, all);
    }
    free(in);
    free(out);
}

static void blocks_body(gs_ctx *ctx, int rank, void *argp)
{
    static const gs_dtype types[] = {GS_F32, GS_F64, GS_BF16, GS_I32, GS_U8};
    static const gs_redop ops[] = {GS_SUM, GS_AVG, GS_MAX, GS_BXOR};
    static const size_t block_counts[] = {0, 1, 3, 4099, 70001};
    int n = gs_ctx_size(ctx);
    gs_comm *comm = NULL;
    uint64_t h = 11;
    (void)argp;
    cc_set_algo(ctx, GS_ALGO_HIER);
    GS_ASSERT_OK(gs_comm_create(ctx, NULL, &comm));
    GS_ASSERT(gs_coll_select(comm, GS_COLL_REDUCE_SCATTER, 1 << 20) == &gs_hier_algo);
    GS_ASSERT(gs_coll_select(comm, GS_COLL_ALLGATHER, 1 << 20) == &gs_hier_algo);
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            bool is_int = cc_is_int(types[t]);
            if ((is_int && ops[o] == GS_AVG) || (!is_int && ops[o] == GS_BXOR))
                continue;
            for (size_t c = 0; c < sizeof(block_counts) / sizeof(block_counts[0]); c++)
                blocks_case(comm, rank, n, types[t], ops[o], block_counts[c], c % 2 == 1, &h);
        }
    /* 4 KiB chunks: many columns */
    ctx->cfg.chunk_bytes = 4096;
    {
        gs_comm *small = NULL;
        GS_ASSERT_OK(gs_comm_create(ctx, NULL, &small));
        blocks_case(small, rank, n, GS_F32, GS_SUM, 100003, false, &h);
        blocks_case(small, rank, n, GS_F32, GS_SUM, 50001, true, &h);
        GS_ASSERT_OK(gs_comm_destroy(small));
    }
    cc_same_everywhere(ctx, "hier.blocks", h);
    GS_ASSERT_OK(gs_comm_destroy(comm));
}

GS_TEST(hierarchical_reduce_scatter_and_allgather)
{
    static const placement two_by_three = {"2x3 interleaved", 6, {0, 1, 0, 1, 0, 1}};
    hosts_arg a = {.pl = &two_by_two, .want = "even"};
    run_placed(&two_by_two, blocks_body, &a, NULL);
    a.pl = &three_by_two;
    run_placed(&three_by_two, blocks_body, &a, NULL);
    a.pl = &two_by_three;
    run_placed(&two_by_three, blocks_body, &a, NULL);
}

/* Uneven hosts: the extras fold into the core (3+2 interleaved and in
 * blocks, a host of one rank, several extras on one core rank, three hosts
 * of different counts). */
GS_TEST(hierarchical_reduce_scatter_and_allgather_on_uneven_hosts)
{
    static const placement three_plus_two = {"3+2 in blocks", 5, {0, 0, 0, 1, 1}};
    static const placement two_plus_one = {"2+1", 3, {0, 1, 0}};
    static const placement five_plus_two = {"5+2 interleaved", 7, {0, 1, 0, 0, 1, 0, 0}};
    static const placement mixed = {"3+1+2", 6, {0, 1, 2, 0, 2, 0}};
    const placement *const all[] = {&interleaved, &three_plus_two, &two_plus_one, &five_plus_two, &mixed};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        hosts_arg a = {.pl = all[i], .want = "uneven"};
        run_placed(all[i], blocks_body, &a, NULL);
    }
}

/* Hosts of different rank counts: the extras fold into the core (one each,
 * several on one core rank, a host of one rank). */
GS_TEST(hierarchical_allreduce_on_uneven_hosts)
{
    static const placement two_plus_one = {"2+1", 3, {0, 0, 1}};
    static const placement five_plus_two = {"5+2 interleaved", 7, {0, 1, 0, 0, 1, 0, 0}};
    static const placement mixed = {"3+1+2", 6, {0, 1, 2, 0, 2, 0}};
    hosts_arg a = {.pl = &interleaved};
    run_placed(&interleaved, hier_body, &a, NULL);
    a.pl = &two_plus_one;
    run_placed(&two_plus_one, hier_body, &a, NULL);
    a.pl = &five_plus_two;
    run_placed(&five_plus_two, hier_body, &a, NULL);
    a.pl = &mixed;
    run_placed(&mixed, hier_body, &a, NULL);
}

/* ---- sub-communicators ----------------------------------------------------------- */

/* By host: shm inside each; by index on the host: one rank of each host, tcp. */
static void split_body(gs_ctx *ctx, int rank, void *argp)
{
    const hosts_arg *a = argp;
    const placement *pl = a->pl;
    int index = 0, local = 0;
    gs_comm *comm = NULL, *host = NULL, *across = NULL;
    uint64_t h = 1;
    for (int r = 0; r < pl->n; r++) {
        index += r < rank && pl->host_of[r] == pl->host_of[rank];
        local += pl->host_of[r] == pl->host_of[rank];
    }
    GS_ASSERT_OK(gs_comm_create(ctx, NULL, &comm));
    GS_ASSERT_OK(gs_comm_split(comm, pl->host_of[rank], rank, &host));
    GS_ASSERT_OK(gs_comm_split(comm, index, rank, &across));
    GS_ASSERT_STR_EQ(gs_tp_name(gs_comm_tp(host)), "shm");
    GS_ASSERT_STR_EQ(gs_tp_name(gs_comm_tp(across)), "tcp");
    h = allreduce_case(host, gs_comm_rank(host), gs_comm_size(host), GS_F32, GS_SUM, 4099, h);
    h = allreduce_case(across, gs_comm_rank(across), gs_comm_size(across), GS_F32, GS_SUM, 4099, h);
    h = allreduce_case(comm, rank, pl->n, GS_F32, GS_SUM, 4099, h);
    GS_ASSERT_OK(gs_comm_destroy(across));
    GS_ASSERT_OK(gs_comm_destroy(host));
    GS_ASSERT_OK(gs_comm_destroy(comm));
}

GS_TEST(split_by_host_runs_over_shm_and_across_over_tcp)
{
    hosts_arg a = {.pl = &three_by_two};
    GS_ASSERT_EQ(hosts_of(&three_by_two), 3);
    run_placed(&three_by_two, split_body, &a, NULL);
}

/* ---- a lost rank ------------------------------------------------------------------ */

#define LOST_COUNT (1u << 20)
#define VICTIM     3

static void lost_body(gs_ctx *ctx, int rank, void *argp)
{
    (void)argp;
    float *buf = malloc(LOST_COUNT * sizeof(float));
    gs_comm *comm = NULL;
    gs_status st = GS_OK;
    char want[32];
    GS_ASSERT(buf != NULL);
    for (size_t i = 0; i < LOST_COUNT; i++)
        buf[i] = (float)(i % 5);
    GS_ASSERT_OK(gs_comm_create(ctx, NULL, &comm));
    if (rank == VICTIM) {
        gs_req *req;
        for (int c = 0; c < 3; c++)
            GS_ASSERT_OK(gs_allreduce(comm, buf, buf, LOST_COUNT, GS_F32, GS_MAX));
        GS_ASSERT_OK(gs_iallreduce(comm, buf, buf, LOST_COUNT, GS_F32, GS_MAX, &req));
        gs_req_test(req);
        raise(SIGKILL);
    }
    for (int c = 0; c < 20 && st == GS_OK; c++)
        st = gs_allreduce(comm, buf, buf, LOST_COUNT, GS_F32, GS_MAX);
    fprintf(stderr, "  rank %d: %s: %s\n", rank, gs_status_name(st), gs_last_error());
    GS_ASSERT_STATUS(st, GS_ERR_PEER_LOST);
    snprintf(want, sizeof(want), "rank %d lost", VICTIM);
    GS_ASSERT(strstr(gs_last_error(), want) != NULL);
    gs_comm_destroy(comm);
    free(buf);
}

GS_TEST(a_rank_killed_on_one_host_is_lost_for_every_host)
{
    static const char *const env[] = {"GS_TRANSPORT=auto", NULL};
    gs_test_ranks_opts opts = {
        .n = 4, .timeout_ms = 60000, .rank_timeout_ms = 15000, .env = env, .host_of = two_by_two.host_of};
    int status[GS_TEST_RANKS_MAX];
    gs_test_run_ranks_opts(&opts, lost_body, NULL, status);
    for (int r = 0; r < 4; r++)
        if (r == VICTIM)
            GS_ASSERT_RANK_SIGNAL(status[r], SIGKILL);
        else
            GS_ASSERT_RANK_EXIT(status[r], 0);
}
