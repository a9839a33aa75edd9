/*
 * The verbs transport's single-process pieces: GID choice, work-completion
 * status mapping, access flags, configuration checks, device selection.
 * The device tests need a verbs device: they skip on a host without one and
 * run for real in the Soft-RoCE guest (tests/rxe-vm/ci.sh).
 */
#include "gs_test.h"

#ifdef GS_TP_BUILT_VERBS
#include "transport/verbs/verbs.h"
#include "util/config.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fake_env {
    const char *const *pairs; /* name, value, ..., NULL */
} fake_env;

static const char *fake_getenv(const char *name, void *arg)
{
    const fake_env *env = arg;
    for (const char *const *p = env->pairs; *p; p += 2)
        if (strcmp(*p, name) == 0)
            return p[1];
    return getenv(name); /* GS_IB_DEV etc. of the guest still apply */
}

static void config_with(gs_config *cfg, const char *const *pairs)
{
    fake_env env = {pairs};
    GS_ASSERT_OK(gs_config_parse(cfg, fake_getenv, &env));
}

static gs_verbs_gid_entry gid_entry(uint32_t index, const char *addr, uint32_t type)
{
    gs_verbs_gid_entry e = {.gid_index = index, .port_num = 1, .gid_type = type};
    if (addr)
        GS_ASSERT_EQ(inet_pton(AF_INET6, addr, e.gid.raw), 1);
    return e;
}

GS_TEST(gid_choice_prefers_routable_roce_v2)
{
    gs_verbs_gid_entry e[] = {
        gid_entry(0, "fe80::1", GS_VERBS_GID_TYPE_ROCE_V1),
        gid_entry(1, "fe80::1", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(2, "::ffff:10.0.0.7", GS_VERBS_GID_TYPE_ROCE_V1),
        gid_entry(3, "::ffff:10.0.0.7", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(4, NULL, GS_VERBS_GID_TYPE_ROCE_V2),
    };
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, NULL), 3);
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 3, NULL), 2);      /* routable v1 beats link-local v2 */
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 2, NULL), 1);      /* only link-local: v2 */
    GS_ASSERT_EQ(gs_verbs_gid_pick(&e[4], 1, NULL), -1); /* empty entries are skipped */
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 0, NULL), -1);
}

GS_TEST(gid_choice_takes_the_lowest_index_among_equals)
{
    gs_verbs_gid_entry e[] = {
        gid_entry(7, "::ffff:192.168.1.3", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(5, "::ffff:192.168.1.2", GS_VERBS_GID_TYPE_ROCE_V2),
    };
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 2, NULL), 1);
}

static gs_verbs_gid_filter filter_of(const char *family, const char *range)
{
    const char *const env[] = {"GS_IB_ADDR_FAMILY", family, "GS_IB_ADDR_RANGE", range, NULL};
    gs_config cfg;
    gs_verbs_gid_filter f;
    config_with(&cfg, env);
    GS_ASSERT_OK(gs_verbs_gid_filter_parse(&cfg, &f));
    return f;
}

GS_TEST(gid_choice_takes_ipv4_first_and_follows_family_and_range)
{
    gs_verbs_gid_entry e[] = {
        gid_entry(0, "fe80::1", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(1, "2001:db8::5", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(2, "::ffff:192.168.1.2", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(3, "::ffff:10.1.2.3", GS_VERBS_GID_TYPE_ROCE_V2),
        gid_entry(4, "::ffff:10.1.2.3", GS_VERBS_GID_TYPE_ROCE_V1),
    };
    gs_verbs_gid_filter f = filter_of("auto", "");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), 2); /* IPv4 before IPv6, then the lowest index */
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 2, &f), 1); /* no IPv4: IPv6 */
    f = filter_of("AF_INET6", "");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), 1);
    f = filter_of("AF_INET", "");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 2, &f), -1); /* only that family */
    f = filter_of("auto", "10.0.0.0/8");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), 3); /* RoCE v2 inside the range */
    f = filter_of("AF_INET", "10.1.2.3/32");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), 3);
    f = filter_of("auto", "192.168.0.0/17");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), 2);
    f = filter_of("auto", "192.168.128.0/17");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), -1);
    f = filter_of("auto", "2001:db8::/32");
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 5, &f), 1);
    f = filter_of("auto", "0.0.0.0/0"); /* every IPv4 address, no IPv6 one */
    GS_ASSERT_EQ(gs_verbs_gid_pick(e, 2, &f), -1);
}

static void expect_filter_error(const char *family, const char *range, const char *phrase)
{
    const char *const env[] = {"GS_IB_ADDR_FAMILY", family, "GS_IB_ADDR_RANGE", range, NULL};
    gs_config cfg;
    gs_verbs_gid_filter f;
    config_with(&cfg, env);
    GS_ASSERT_STATUS(gs_verbs_gid_filter_parse(&cfg, &f), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), phrase);
    GS_ASSERT_STATUS(gs_verbs_config_check(&cfg), GS_ERR_CONFIG);
}

GS_TEST(malformed_address_ranges_are_refused_naming_the_variable)
{
    expect_filter_error("auto", "10.0.0.0", "GS_IB_ADDR_RANGE=10.0.0.0 is not");
    expect_filter_error("auto", "10.0.0.0/33", "expected prefix/len");
    expect_filter_error("auto", "10.0.0/8", "expected prefix/len");
    expect_filter_error("auto", "fd00::/129", "expected prefix/len");
    expect_filter_error("auto", "fd00::/x", "expected prefix/len");
    expect_filter_error("AF_INET6", "10.0.0.0/8", "an IPv4 range but GS_IB_ADDR_FAMILY asks for AF_INET6");
    expect_filter_error("AF_INET", "fd00::/8", "an IPv6 range but GS_IB_ADDR_FAMILY asks for AF_INET");
}

GS_TEST(gid_link_local_detection)
{
    gs_verbs_gid_entry a = gid_entry(0, "fe80::5054:ff:fe12:3456", GS_VERBS_GID_TYPE_ROCE_V2);
    gs_verbs_gid_entry b = gid_entry(0, "::ffff:169.254.3.4", GS_VERBS_GID_TYPE_ROCE_V2);
    gs_verbs_gid_entry c = gid_entry(0, "::ffff:10.77.0.1", GS_VERBS_GID_TYPE_ROCE_V2);
    gs_verbs_gid_entry d = gid_entry(0, "2001:db8::1", GS_VERBS_GID_TYPE_ROCE_V2);
    char text[64];
    GS_ASSERT(gs_verbs_gid_is_link_local(&a.gid));
    GS_ASSERT(gs_verbs_gid_is_link_local(&b.gid));
    GS_ASSERT(!gs_verbs_gid_is_link_local(&c.gid));
    GS_ASSERT(!gs_verbs_gid_is_link_local(&d.gid));
    gs_verbs_gid_format(&c.gid, text, sizeof(text));
    GS_ASSERT_STR_EQ(text, "::ffff:10.77.0.1");
}

GS_TEST(every_work_completion_status_maps_with_a_hint)
{
    const char *hint = NULL;
    for (int s = IBV_WC_SUCCESS; s <= IBV_WC_TM_RNDV_INCOMPLETE; s++) {
        gs_status st = gs_verbs_wc_status_map((enum ibv_wc_status)s, &hint);
        GS_ASSERT(hint != NULL);
        if (s == IBV_WC_SUCCESS) {
            GS_ASSERT_EQ(st, GS_OK);
            continue;
        }
        GS_ASSERT_LT(st, 0);
        GS_ASSERT_GT(strlen(hint), 10);
        if (strstr(hint, "unknown"))
            gs_test_fail_here(__FILE__, __LINE__, "status %d (%s) has no entry", s, ibv_wc_status_str(s));
    }
    GS_ASSERT_EQ(gs_verbs_wc_status_map(IBV_WC_REM_ACCESS_ERR, &hint), GS_ERR_REMOTE_ACCESS);
    GS_ASSERT_CONTAINS(hint, "bad key");
    GS_ASSERT_EQ(gs_verbs_wc_status_map(IBV_WC_RETRY_EXC_ERR, &hint), GS_ERR_PEER_LOST);
    GS_ASSERT_CONTAINS(hint, "GID");
    GS_ASSERT_CONTAINS(hint, "MTU");
    GS_ASSERT_EQ(gs_verbs_wc_status_map(IBV_WC_WR_FLUSH_ERR, &hint), GS_ERR_FLUSHED);
}

GS_TEST(access_flags_follow_the_verbs_rules)
{
    GS_ASSERT_EQ(gs_verbs_access_flags(GS_ACCESS_REMOTE_READ), IBV_ACCESS_REMOTE_READ);
    GS_ASSERT_EQ(gs_verbs_access_flags(GS_ACCESS_LOCAL_WRITE), IBV_ACCESS_LOCAL_WRITE);
    /* remote write and atomics need local write too, or ibv_reg_mr refuses */
    GS_ASSERT_EQ(gs_verbs_access_flags(GS_ACCESS_REMOTE_WRITE),
                 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
    GS_ASSERT_EQ(gs_verbs_access_flags(GS_ACCESS_REMOTE_ATOMIC),
                 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE);
    GS_ASSERT_EQ(gs_verbs_access_flags(GS_ACCESS_ALL), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
}

GS_TEST(mtu_helpers)
{
    GS_ASSERT_EQ(gs_verbs_mtu_bytes(IBV_MTU_256), 256);
    GS_ASSERT_EQ(gs_verbs_mtu_bytes(IBV_MTU_4096), 4096);
    GS_ASSERT_EQ(gs_verbs_mtu_bytes((enum ibv_mtu)0), 0);
    GS_ASSERT_EQ(gs_verbs_mtu_min(IBV_MTU_4096, IBV_MTU_1024), IBV_MTU_1024);
    GS_ASSERT_EQ(gs_verbs_mtu_min(IBV_MTU_512, IBV_MTU_2048), IBV_MTU_512);
}

/* The configuration refuses it (so gs_init and gsinfo report it). */
static void expect_range_error(const char *var, const char *value)
{
    const char *const env[] = {var, value, NULL};
    fake_env fake = {env};
    gs_config cfg;
    GS_ASSERT_STATUS(gs_config_parse(&cfg, fake_getenv, &fake), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), var);
}

GS_TEST(config_ranges_are_checked_naming_the_variable)
{
    static const char *const none[] = {NULL};
    gs_config cfg;
    config_with(&cfg, none);
    GS_ASSERT_OK(gs_verbs_config_check(&cfg));
    /* the transport checks again a configuration that did not come through the parser */
    cfg.ib_sl = 16;
    GS_ASSERT_STATUS(gs_verbs_config_check(&cfg), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_SL=16");
    cfg.ib_sl = 0;
    cfg.ib_timeout = 0;
    GS_ASSERT_STATUS(gs_verbs_config_check(&cfg), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_TIMEOUT=0");
    expect_range_error("GS_IB_PORT", "0");
    expect_range_error("GS_IB_TIMEOUT", "32");
    expect_range_error("GS_IB_RETRY_CNT", "8");
    expect_range_error("GS_IB_RNR_RETRY", "-1");
    expect_range_error("GS_IB_GID_INDEX", "256");
    expect_range_error("GS_IB_TIMEOUT", "0"); /* infinite on hardware: refused */
    expect_range_error("GS_IB_SL", "16");
    expect_range_error("GS_IB_TC", "256");
    expect_range_error("GS_IB_PKEY", "0x10000");
    expect_range_error("GS_IB_PKEY", "0x8000"); /* base 0: the invalid partition */
    expect_range_error("GS_IB_PKEY", "full");
    expect_range_error("GS_IB_QPS_PER_PEER", "0");
    expect_range_error("GS_IB_QPS_PER_PEER", "17");
    expect_range_error("GS_IB_STRIPE_MIN", "1K");
    expect_range_error("GS_IB_RAILS", "3");
    cfg.ib_timeout = -1;
    cfg.ib_rails = 2; /* two devices need a queue pair on each */
    GS_ASSERT_STATUS(gs_verbs_config_check(&cfg), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_RAILS=2 needs at least one queue pair per device");
    cfg.ib_qps_per_peer = 2;
    GS_ASSERT_OK(gs_verbs_config_check(&cfg));
    cfg.ib_rails = 1;
    cfg.ib_timeout = -1;
    cfg.ib_qps_per_peer = 17;
    GS_ASSERT_STATUS(gs_verbs_config_check(&cfg), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_QPS_PER_PEER=17");
}

GS_TEST(device_lists_parse_as_comma_separated_dev_and_port)
{
    gs_verbs_dev_want w[GS_VERBS_DEVS_MAX];
    int n = -1;
    GS_ASSERT_OK(gs_verbs_dev_list_parse("", w, GS_VERBS_DEVS_MAX, &n));
    GS_ASSERT_EQ(n, 0);
    GS_ASSERT_OK(gs_verbs_dev_list_parse("rxe0", w, GS_VERBS_DEVS_MAX, &n));
    GS_ASSERT_EQ(n, 1);
    GS_ASSERT_STR_EQ(w[0].name, "rxe0");
    GS_ASSERT_EQ(w[0].port, 0); /* GS_IB_PORT */
    GS_ASSERT_OK(gs_verbs_dev_list_parse("mlx5_0:1,mlx5_1,mlx5_2:2", w, GS_VERBS_DEVS_MAX, &n));
    GS_ASSERT_EQ(n, 3);
    GS_ASSERT_STR_EQ(w[0].name, "mlx5_0");
    GS_ASSERT_EQ(w[0].port, 1);
    GS_ASSERT_STR_EQ(w[1].name, "mlx5_1");
    GS_ASSERT_EQ(w[1].port, 0);
    GS_ASSERT_STR_EQ(w[2].name, "mlx5_2");
    GS_ASSERT_EQ(w[2].port, 2);
    static const struct {
        const char *text, *why;
    } bad[] = {
        {",rxe0", "an empty device name"},
        {"rxe0,", "an empty device name"},
        {"rxe0,,rxe1", "an empty device name"},
        {":1", "an empty device name"},
        {"rxe0:0", "a port outside 1-255"},
        {"rxe0:256", "a port outside 1-255"},
        {"rxe0:", "a port outside 1-255"},
        {"rxe0:1x", "a port outside 1-255"},
        {"rxe0,rxe0:2", "listed twice"},
        {"a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", "too many devices"},
        {"a234567890123456789012345678901234567890123456789012345678901234", "longer than 63"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        GS_ASSERT_STATUS(gs_verbs_dev_list_parse(bad[i].text, w, GS_VERBS_DEVS_MAX, &n), GS_ERR_CONFIG);
        GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_DEV=");
        GS_ASSERT_CONTAINS(gs_last_error(), bad[i].why);
    }
}

GS_TEST(the_device_nearest_the_cpus_numa_node_is_chosen)
{
    static const int two[] = {0, 1}, unknown[] = {-1, 1}, far[] = {1, 1}, none_known[] = {-1, -1};
    GS_ASSERT_EQ(gs_verbs_numa_pick(two, 2, 0), 0);
    GS_ASSERT_EQ(gs_verbs_numa_pick(two, 2, 1), 1);
    GS_ASSERT_EQ(gs_verbs_numa_pick(two, 2, -1), 0);    /* the CPU's node unknown: the first listed */
    GS_ASSERT_EQ(gs_verbs_numa_pick(unknown, 2, 0), 0); /* unknown beats a known other node */
    GS_ASSERT_EQ(gs_verbs_numa_pick(unknown, 2, 1), 1);
    GS_ASSERT_EQ(gs_verbs_numa_pick(far, 2, 0), 0); /* all far: the first listed */
    GS_ASSERT_EQ(gs_verbs_numa_pick(none_known, 2, 3), 0);
    GS_ASSERT_EQ(gs_verbs_numa_pick(two, 0, 0), -1);
}

/* A made-up sysfs: /class/infiniband/<dev>/device/numa_node and /devices/system/cpu/cpuN/nodeM. */
static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    GS_ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

GS_TEST(numa_nodes_come_from_sysfs_and_are_unknown_when_absent)
{
    char root[] = "/tmp/gs-numa-XXXXXX", path[256];
    int cpu = -2;
    GS_ASSERT(mkdtemp(root) != NULL);
    snprintf(path, sizeof(path), "%s/rxe0", root);
    GS_ASSERT_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/rxe0/device", root);
    GS_ASSERT_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/rxe0/device/numa_node", root);
    write_file(path, "1\n");
    GS_ASSERT_EQ(gs_verbs_dev_numa_node(root, "rxe0"), 1);
    write_file(path, "-1\n"); /* what a device without locality says */
    GS_ASSERT_EQ(gs_verbs_dev_numa_node(root, "rxe0"), -1);
    write_file(path, "junk\n");
    GS_ASSERT_EQ(gs_verbs_dev_numa_node(root, "rxe0"), -1);
    GS_ASSERT_EQ(gs_verbs_dev_numa_node(root, "mlx5_9"), -1); /* no such file */
    unlink(path);
    /* the CPU's node: cpuN/nodeM for the CPU this thread runs on */
    GS_ASSERT_EQ(gs_verbs_cpu_numa_node(root, &cpu), -1);
    GS_ASSERT(cpu >= 0);
    snprintf(path, sizeof(path), "%s/cpu%d", root, cpu);
    GS_ASSERT_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/cpu%d/node3", root, cpu);
    GS_ASSERT_EQ(mkdir(path, 0700), 0);
    int node = gs_verbs_cpu_numa_node(root, &cpu);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/cpu%d", root, cpu);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/rxe0/device", root);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/rxe0", root);
    rmdir(path);
    rmdir(root);
    if (node == -1) /* moved to another CPU between the two reads: not the function's fault */
        GS_SKIP("the thread moved to another CPU during the check");
    GS_ASSERT_EQ(node, 3);
}

GS_TEST(partition_keys_parse_as_hex_or_decimal)
{
    uint16_t k = 0;
    GS_ASSERT_OK(gs_verbs_pkey_parse("0x8001", &k));
    GS_ASSERT_EQ(k, 0x8001);
    GS_ASSERT_OK(gs_verbs_pkey_parse("65535", &k));
    GS_ASSERT_EQ(k, 0xffff);
    GS_ASSERT_STATUS(gs_verbs_pkey_parse("-1", &k), GS_ERR_CONFIG);
    GS_ASSERT_STATUS(gs_verbs_pkey_parse("0x7fff1", &k), GS_ERR_CONFIG);
}

/* The defaults ride out a few seconds of outage and still fit GS_TIMEOUT_MS
 * (docs/verbs.md has the arithmetic). */
static double ride_out_s(const gs_config *cfg)
{
    return 4.096e-6 * (double)(1ull << gs_verbs_ack_timeout(cfg)) * (double)(cfg->ib_retry_cnt + 1);
}

GS_TEST(default_timeouts_ride_out_seconds_within_the_deadline)
{
    static const char *const none[] = {NULL};
    static const char *const short_deadline[] = {"GS_TIMEOUT_MS", "5000", NULL};
    static const char *const tiny_deadline[] = {"GS_TIMEOUT_MS", "300", NULL};
    static const char *const given[] = {"GS_IB_TIMEOUT", "20", NULL};
    gs_config cfg;
    config_with(&cfg, none); /* GS_TIMEOUT_MS 30 s: the full 17, 3.8 s ridden out */
    GS_ASSERT_EQ(gs_verbs_ack_timeout(&cfg), 17);
    GS_ASSERT(ride_out_s(&cfg) >= 3.0);
    GS_ASSERT(ride_out_s(&cfg) * 1e3 + 2.0 * (double)gs_verbs_heartbeat_ms(&cfg) <= (double)cfg.timeout_ms);
    GS_ASSERT(cfg.ib_retry_cnt < 7);   /* rxe retries forever at 7 */
    config_with(&cfg, short_deadline); /* a shorter deadline: a smaller exponent, still inside it */
    GS_ASSERT_EQ(gs_verbs_ack_timeout(&cfg), 16);
    GS_ASSERT(ride_out_s(&cfg) * 1e3 + 2.0 * (double)gs_verbs_heartbeat_ms(&cfg) <= 5000.0);
    config_with(&cfg, tiny_deadline); /* never below 1 */
    GS_ASSERT(gs_verbs_ack_timeout(&cfg) >= 1);
    config_with(&cfg, given); /* given: taken as it is */
    GS_ASSERT_EQ(gs_verbs_ack_timeout(&cfg), 20);
}

GS_TEST(memlock_description_names_ulimit)
{
    struct rlimit lim = {.rlim_cur = 64 * 1024, .rlim_max = RLIM_INFINITY};
    char text[128];
    gs_verbs_memlock_describe(&lim, text, sizeof(text));
    GS_ASSERT_CONTAINS(text, "ulimit -l");
    GS_ASSERT_CONTAINS(text, "64 KiB");
    GS_ASSERT_CONTAINS(text, "hard unlimited");
}

GS_TEST(connection_blob_layout)
{
    GS_ASSERT_EQ(sizeof(gs_verbs_conn_blob), 160);
    GS_ASSERT_EQ(offsetof(gs_verbs_conn_blob, rail_gid), 128);
    GS_ASSERT_EQ(offsetof(gs_verbs_conn_blob, lane_qpn), 64);
    GS_ASSERT_EQ(offsetof(gs_verbs_conn_blob, version), 0);
    GS_ASSERT_EQ(sizeof(gs_verbs_ctrl), 64);
}

GS_TEST(only_infiniband_transport_devices_with_ib_or_ethernet_ports_are_used)
{
    GS_ASSERT(gs_verbs_kind_refusal(IBV_TRANSPORT_IB, IBV_LINK_LAYER_INFINIBAND) == NULL);
    GS_ASSERT(gs_verbs_kind_refusal(IBV_TRANSPORT_IB, IBV_LINK_LAYER_ETHERNET) == NULL);
    GS_ASSERT_CONTAINS(gs_verbs_kind_refusal(IBV_TRANSPORT_IWARP, IBV_LINK_LAYER_ETHERNET), "iWARP");
    GS_ASSERT_CONTAINS(gs_verbs_kind_refusal(IBV_TRANSPORT_UNSPECIFIED, IBV_LINK_LAYER_UNSPECIFIED), "EFA");
    GS_ASSERT_CONTAINS(gs_verbs_kind_refusal(IBV_TRANSPORT_USNIC_UDP, IBV_LINK_LAYER_ETHERNET), "usNIC");
    GS_ASSERT_CONTAINS(gs_verbs_kind_refusal(IBV_TRANSPORT_IB, IBV_LINK_LAYER_UNSPECIFIED), "link layer");
    GS_ASSERT(gs_verbs_kind_refusal(IBV_TRANSPORT_UNKNOWN, IBV_LINK_LAYER_INFINIBAND) != NULL);
}

/* ---- the peer's connection blob: every field checked ---------------------------------------------- */

/* Rank 1 on a RoCE v2 port with a GID, as the peer rank 0 sees it. */
static void blob_receiver(gs_verbs_tp *vt, uint8_t link_layer)
{
    memset(vt, 0, sizeof(*vt));
    vt->base.rank = 1;
    vt->base.size = 2;
    vt->lanes = 1;
    vt->rails = 1;
    vt->dev.link_layer = link_layer;
    vt->dev.gid_index = link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : -1;
    vt->dev.gid_type =
        link_layer == IBV_LINK_LAYER_ETHERNET ? GS_VERBS_GID_TYPE_ROCE_V2 : GS_VERBS_GID_TYPE_IB;
    vt->dev.pkey = 0xffff;
    if (link_layer == IBV_LINK_LAYER_ETHERNET)
        GS_ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.77.0.2", vt->dev.gid.raw), 1);
}

static gs_verbs_conn_blob good_blob(uint8_t link_layer)
{
    gs_verbs_conn_blob b = {
        .version = GS_VERBS_PROTO_VERSION,
        .link_layer = link_layer,
        .mtu = IBV_MTU_1024,
        .gid_type = link_layer == IBV_LINK_LAYER_ETHERNET ? GS_VERBS_GID_TYPE_ROCE_V2 : GS_VERBS_GID_TYPE_IB,
        .magic = GS_VERBS_CONN_MAGIC,
        .src_rank = 0,
        .dst_rank = 1,
        .qpn = 0x11,
        .psn = 0xabcdef,
        .lid = link_layer == IBV_LINK_LAYER_ETHERNET ? 0 : 7,
        .gid_index = 1,
        .rd_atomic = 16,
        .rq_depth = 64,
        .ctrl_addr = 0x7f0000001040ull,
        .ctrl_rkey = 0x1234,
        .pkey = 0xffff,
        .lanes = 1,
        .rails = 1,
    };
    GS_ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.77.0.1", b.gid), 1);
    return b;
}

typedef struct blob_case {
    const char *what; /* the phrase the error must contain */
    void (*spoil)(gs_verbs_conn_blob *b);
} blob_case;

static void spoil_ll(gs_verbs_conn_blob *b)
{
    b->link_layer = 0;
}
static void spoil_mtu(gs_verbs_conn_blob *b)
{
    b->mtu = 6;
}
static void spoil_mtu0(gs_verbs_conn_blob *b)
{
    b->mtu = 0;
}
static void spoil_gid_type(gs_verbs_conn_blob *b)
{
    b->gid_type = 3;
}
static void spoil_qpn_wide(gs_verbs_conn_blob *b)
{
    b->qpn = 0x1000000;
}
static void spoil_qpn_gsi(gs_verbs_conn_blob *b)
{
    b->qpn = 1;
}
static void spoil_psn(gs_verbs_conn_blob *b)
{
    b->psn = 0x1000000;
}
static void spoil_roce_lid(gs_verbs_conn_blob *b)
{
    b->lid = 5;
}
static void spoil_rd0(gs_verbs_conn_blob *b)
{
    b->rd_atomic = 0;
}
static void spoil_rd_big(gs_verbs_conn_blob *b)
{
    b->rd_atomic = 200;
}
static void spoil_rq0(gs_verbs_conn_blob *b)
{
    b->rq_depth = 0;
}
static void spoil_rq_big(gs_verbs_conn_blob *b)
{
    b->rq_depth = 65;
}
static void spoil_gid_empty(gs_verbs_conn_blob *b)
{
    memset(b->gid, 0, sizeof(b->gid));
}
static void spoil_gid_mcast(gs_verbs_conn_blob *b)
{
    b->gid[0] = 0xff;
}
static void spoil_ctrl0(gs_verbs_conn_blob *b)
{
    b->ctrl_addr = 0;
}
static void spoil_ctrl_odd(gs_verbs_conn_blob *b)
{
    b->ctrl_addr |= 4;
}
static void spoil_reserved(gs_verbs_conn_blob *b)
{
    b->reserved3 = 1;
}
static void spoil_pkey0(gs_verbs_conn_blob *b)
{
    b->pkey = 0x8000;
}
static void spoil_version(gs_verbs_conn_blob *b)
{
    b->version = 1;
}
static void spoil_magic(gs_verbs_conn_blob *b)
{
    b->magic ^= 1;
}
static void spoil_dst(gs_verbs_conn_blob *b)
{
    b->dst_rank = 2;
}
static void spoil_lanes0(gs_verbs_conn_blob *b)
{
    b->lanes = 0;
}
static void spoil_lanes_big(gs_verbs_conn_blob *b)
{
    b->lanes = GS_VERBS_QPS_MAX + 1;
}
static void spoil_lane_past(gs_verbs_conn_blob *b)
{
    b->lane_qpn[3] = 0x22; /* one lane: no side lane's QP may be given */
}
static void spoil_lane_qpn(gs_verbs_conn_blob *b)
{
    b->lanes = 3;
    b->lane_qpn[0] = 0x21;
    b->lane_qpn[1] = 1; /* a management QP */
}
static void spoil_lane_dup(gs_verbs_conn_blob *b)
{
    b->lanes = 3;
    b->lane_qpn[0] = 0x21;
    b->lane_qpn[1] = 0x21;
}
static void spoil_lane_lane0(gs_verbs_conn_blob *b)
{
    b->lanes = 2;
    b->lane_qpn[0] = b->qpn;
}
static void spoil_reserved2(gs_verbs_conn_blob *b)
{
    b->reserved2 = 1;
}
static void spoil_reserved4(gs_verbs_conn_blob *b)
{
    b->reserved4 = 1;
}
static void spoil_rails0(gs_verbs_conn_blob *b)
{
    b->rails = 0;
}
static void spoil_rails3(gs_verbs_conn_blob *b)
{
    b->rails = 3;
}
static void spoil_rail_addr(gs_verbs_conn_blob *b)
{
    b->rail_gid[15] = 1; /* one rail: no second address */
}
static void spoil_rail_mtu(gs_verbs_conn_blob *b)
{
    b->rails = 2;
    memcpy(b->rail_gid, b->gid, sizeof(b->gid));
    b->rail_mtu = 0;
}
static void spoil_rail_gid(gs_verbs_conn_blob *b)
{
    b->rails = 2;
    b->rail_mtu = IBV_MTU_1024;
}

GS_TEST(malformed_connection_blobs_are_refused_naming_the_field)
{
    static const blob_case cases[] = {
        {"link layer neither", spoil_ll},
        {"MTU code", spoil_mtu},
        {"MTU code", spoil_mtu0},
        {"unknown GID type", spoil_gid_type},
        {"24 bits", spoil_qpn_wide},
        {"management QPs", spoil_qpn_gsi},
        {"PSN wider", spoil_psn},
        {"a LID on an Ethernet", spoil_roce_lid},
        {"READ/atomic depth", spoil_rd0},
        {"READ/atomic depth", spoil_rd_big},
        {"receive depth", spoil_rq0},
        {"receive depth", spoil_rq_big},
        {"empty GID", spoil_gid_empty},
        {"multicast GID", spoil_gid_mcast},
        {"control slot", spoil_ctrl0},
        {"control slot", spoil_ctrl_odd},
        {"reserved bytes", spoil_reserved},
        {"partition key with base 0", spoil_pkey0},
        {"version 1", spoil_version},
        {"magic", spoil_magic},
        {"names 0 -> 2", spoil_dst},
        {"queue pairs per peer outside 1-16", spoil_lanes0},
        {"queue pairs per peer outside 1-16", spoil_lanes_big},
        {"past the lane count", spoil_lane_past},
        {"side lane's QP number outside", spoil_lane_qpn},
        {"two side lanes with one QP number", spoil_lane_dup},
        {"equal to lane 0's", spoil_lane_lane0},
        {"reserved bytes", spoil_reserved2},
        {"reserved bytes", spoil_reserved4},
        {"devices (rails) outside 1-2", spoil_rails0},
        {"devices (rails) outside 1-2", spoil_rails3},
        {"a second rail's address with one rail", spoil_rail_addr},
        {"rail 1's MTU code", spoil_rail_mtu},
        {"rail 1's GID empty", spoil_rail_gid},
    };
    gs_verbs_tp vt;
    gs_verbs_conn_blob b;
    blob_receiver(&vt, IBV_LINK_LAYER_ETHERNET);
    b = good_blob(IBV_LINK_LAYER_ETHERNET);
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        b = good_blob(IBV_LINK_LAYER_ETHERNET);
        cases[i].spoil(&b);
        GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
        GS_ASSERT_CONTAINS(gs_last_error(), cases[i].what);
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 1: ");
        GS_ASSERT_CONTAINS(gs_last_error(), "peer rank 0");
    }
    /* a well-formed blob from the other kind of fabric is a configuration error */
    b = good_blob(IBV_LINK_LAYER_INFINIBAND);
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_CONFIG);
}

GS_TEST(both_sides_must_choose_the_same_gid_type_and_family)
{
    gs_verbs_tp vt;
    gs_verbs_conn_blob b;
    blob_receiver(&vt, IBV_LINK_LAYER_ETHERNET);
    b = good_blob(IBV_LINK_LAYER_ETHERNET);
    GS_ASSERT_EQ(inet_pton(AF_INET6, "2001:db8::1", b.gid), 1);
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "peer rank 0 chose a RoCE v2 IPv6 GID (index 1, 2001:db8::1)");
    GS_ASSERT_CONTAINS(gs_last_error(), "this rank a RoCE v2 IPv4 GID (index 1, ::ffff:10.77.0.2)");
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_ADDR_FAMILY");
    b = good_blob(IBV_LINK_LAYER_ETHERNET);
    b.gid_type = GS_VERBS_GID_TYPE_ROCE_V1;
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "chose a RoCE v1 IPv4 GID");
}

GS_TEST(both_sides_of_a_queue_pair_must_be_in_one_partition)
{
    gs_verbs_tp vt;
    gs_verbs_conn_blob b;
    blob_receiver(&vt, IBV_LINK_LAYER_ETHERNET);
    b = good_blob(IBV_LINK_LAYER_ETHERNET);
    b.pkey = 0x7fff; /* the default partition, limited membership: the same partition */
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    b.pkey = 0x8001;
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "partition 0x8001, this rank's in 0xffff");
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_PKEY");
}

GS_TEST(infiniband_blobs_need_a_unicast_lid_and_may_lack_a_gid)
{
    gs_verbs_tp vt;
    gs_verbs_conn_blob b;
    blob_receiver(&vt, IBV_LINK_LAYER_INFINIBAND);
    b = good_blob(IBV_LINK_LAYER_INFINIBAND);
    memset(b.gid, 0, sizeof(b.gid)); /* no GRH without GS_IB_GID_INDEX: the GID is not used */
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    b.lid = 0;
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "LID outside");
    b.lid = 0xc000; /* multicast */
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    b.lid = 0xbfff;
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    vt.dev.gid_index = 0; /* GS_IB_GID_INDEX: a GRH, so the GID must be there */
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "empty GID");
}

GS_TEST(both_sides_must_open_the_same_queue_pairs_per_peer)
{
    gs_verbs_tp vt;
    gs_verbs_conn_blob b;
    blob_receiver(&vt, IBV_LINK_LAYER_ETHERNET);
    vt.lanes = 4;
    b = good_blob(IBV_LINK_LAYER_ETHERNET);
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "peer rank 0 opened 1 queue pairs per peer");
    GS_ASSERT_CONTAINS(gs_last_error(), "this rank 4");
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_QPS_PER_PEER");
    b.lanes = 4;
    b.lane_qpn[0] = 0x21;
    b.lane_qpn[1] = 0x22;
    b.lane_qpn[2] = 0x23;
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    b.lane_qpn[2] = 0; /* a lane without its queue pair */
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "side lane's QP number outside");
    /* two devices against one */
    b.lane_qpn[2] = 0x23;
    b.rails = 2;
    memcpy(b.rail_gid, b.gid, sizeof(b.gid));
    b.rail_gid[15] ^= 1;
    b.rail_mtu = IBV_MTU_1024;
    b.rail_gid_type = GS_VERBS_GID_TYPE_ROCE_V2;
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "peer rank 0 uses 2 devices (GS_IB_RAILS), this rank 1");
    vt.rails = 2;
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    /* two devices number their queue pairs apart: lane 1 (rail 1) may share lane 0's number, lane 2 not */
    b.lane_qpn[0] = b.qpn;
    GS_ASSERT_OK(gs_verbs_ep_check_blob(&vt, 0, &b));
    b.lane_qpn[1] = b.qpn;
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "equal to lane 0's");
    b.lane_qpn[1] = 0x22;
    b.lane_qpn[2] = b.lane_qpn[0]; /* lanes 1 and 3, both on rail 1 */
    GS_ASSERT_STATUS(gs_verbs_ep_check_blob(&vt, 0, &b), GS_ERR_PROTOCOL);
    GS_ASSERT_CONTAINS(gs_last_error(), "two side lanes with one QP number");
}

/* Random corruption of a good blob: whatever is accepted is within every bound the connect relies on. */
GS_TEST(randomly_corrupted_blobs_never_pass_out_of_bounds_values)
{
    gs_verbs_tp vt;
    unsigned seed = 18;
    int accepted = 0;
    blob_receiver(&vt, IBV_LINK_LAYER_ETHERNET);
    int level = gs_log_level_now;
    gs_log_level_now = GS_LOG_NONE; /* thousands of refusals */
    for (int i = 0; i < 20000; i++) {
        gs_verbs_conn_blob b = good_blob(IBV_LINK_LAYER_ETHERNET);
        uint8_t *raw = (uint8_t *)&b;
        int flips = 1 + (int)(rand_r(&seed) % 3);
        for (int f = 0; f < flips; f++)
            raw[rand_r(&seed) % sizeof(b)] = (uint8_t)rand_r(&seed);
        if (gs_verbs_ep_check_blob(&vt, 0, &b) != GS_OK)
            continue;
        accepted++;
        GS_ASSERT(b.qpn >= 2 && b.qpn <= 0xffffff && b.psn <= 0xffffff);
        GS_ASSERT(b.rd_atomic >= 1 && b.rd_atomic <= GS_VERBS_RD_ATOMIC_MAX);
        GS_ASSERT(b.rq_depth >= 1 && b.rq_depth <= GS_VERBS_RQ_DEPTH);
        GS_ASSERT(gs_verbs_mtu_bytes((enum ibv_mtu)b.mtu) > 0 && b.reserved2 == 0 && b.lid == 0);
        GS_ASSERT_EQ(b.pkey & 0x7fff, 0x7fff);
        GS_ASSERT(b.ctrl_addr != 0 && (b.ctrl_addr & 7) == 0 && b.gid[0] != 0xff);
        GS_ASSERT_EQ(b.lanes, 1); /* this receiver opened one queue pair per peer, on one device */
        GS_ASSERT_EQ(b.rails, 1);
        GS_ASSERT(b.rail_lid == 0 && b.rail_mtu == 0 && b.rail_gid_type == 0 && b.reserved3 == 0);
        for (int l = 0; l < GS_VERBS_QPS_MAX - 1; l++)
            GS_ASSERT_EQ(b.lane_qpn[l], 0);
    }
    gs_log_level_now = level;
    GS_ASSERT_GT(accepted, 0); /* flips of the free fields (rkey, GID bytes, gid_index) pass */
}

/* Whether this machine has a verbs device at all (the rxe guest does). */
static int device_count(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (list)
        ibv_free_device_list(list);
    return list ? n : 0;
}

GS_TEST(device_open_finds_an_active_port_or_says_why_not)
{
    static const char *const none[] = {NULL};
    gs_config cfg;
    gs_verbs_dev dev = {0};
    gs_status st;
    config_with(&cfg, none);
    st = gs_verbs_dev_open(&cfg, 0, &dev);
    if (device_count() == 0) {
        GS_ASSERT_STATUS(st, GS_ERR_UNSUPPORTED);
        GS_ASSERT_CONTAINS(gs_last_error(), "rank 0");
        return;
    }
    GS_ASSERT_OK(st);
    GS_ASSERT(dev.ctx != NULL);
    GS_ASSERT_EQ(dev.port_attr.state, IBV_PORT_ACTIVE);
    GS_ASSERT_GT(gs_verbs_mtu_bytes(dev.port_attr.active_mtu), 0);
    if (dev.link_layer == IBV_LINK_LAYER_ETHERNET) {
        GS_ASSERT_GE(dev.gid_index, 0);
        GS_ASSERT(dev.gid_type == GS_VERBS_GID_TYPE_ROCE_V1 || dev.gid_type == GS_VERBS_GID_TYPE_ROCE_V2);
    }
    gs_verbs_dev_close(&dev);
}

static void need_device(void)
{
    if (device_count() == 0)
        GS_SKIP("no verbs device on this machine (runs in the Soft-RoCE guest: tests/rxe-vm/ci.sh)");
}

static gs_status open_with(const char *const *env, gs_verbs_dev *dev)
{
    gs_config cfg;
    memset(dev, 0, sizeof(*dev));
    config_with(&cfg, env);
    return gs_verbs_dev_open(&cfg, 0, dev);
}

/* On rxe0 over dummy0 (10.77.0.1/24): link-local IPv6 and 10.77.0.1, each as RoCE v1 and v2. */
GS_TEST(gid_choice_on_the_device_follows_family_and_range)
{
    static const char *const none[] = {NULL};
    static const char *const v6[] = {"GS_IB_ADDR_FAMILY", "AF_INET6", NULL};
    static const char *const in_range[] = {"GS_IB_ADDR_RANGE", "10.77.0.0/24", NULL};
    static const char *const out_of_range[] = {"GS_IB_ADDR_RANGE", "192.168.0.0/16", NULL};
    gs_verbs_dev dev;
    int auto_index;
    need_device();
    GS_ASSERT_OK(open_with(none, &dev));
    if (dev.link_layer != IBV_LINK_LAYER_ETHERNET) {
        gs_verbs_dev_close(&dev);
        GS_SKIP("not a RoCE port");
    }
    GS_ASSERT_EQ(dev.gid_type, GS_VERBS_GID_TYPE_ROCE_V2);
    GS_ASSERT_EQ(gs_verbs_gid_family(&dev.gid), AF_INET);
    auto_index = dev.gid_index;
    gs_verbs_dev_close(&dev);
    GS_ASSERT_OK(open_with(in_range, &dev));
    GS_ASSERT_EQ(dev.gid_index, auto_index);
    gs_verbs_dev_close(&dev);
    GS_ASSERT_OK(open_with(v6, &dev));
    GS_ASSERT_EQ(gs_verbs_gid_family(&dev.gid), AF_INET6);
    GS_ASSERT_EQ(dev.gid_type, GS_VERBS_GID_TYPE_ROCE_V2);
    GS_ASSERT(dev.gid_index != auto_index);
    gs_verbs_dev_close(&dev);
    GS_ASSERT_STATUS(open_with(out_of_range, &dev), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_ADDR_RANGE=192.168.0.0/16");
    gs_verbs_dev_close(&dev);
}

/* The sysfs fallback (older rdma-core, or -DGS_IB_COMPAT=ON) reads what ibv_query_gid_ex reads. */
GS_TEST(gid_entries_from_sysfs_match_the_library)
{
    static const char *const none[] = {NULL};
    gs_verbs_dev dev;
    int valid = 0;
    need_device();
    GS_ASSERT_OK(open_with(none, &dev));
    printf("libibverbs calls: %s\n", gs_verbs_compat_summary());
    for (int i = 0; i < dev.port_attr.gid_tbl_len && i < 64; i++) {
        gs_verbs_gid_entry a, b;
        int ra = gs_verbs_query_gid(dev.ctx, dev.name, dev.port, dev.link_layer, (uint32_t)i, &a);
        int rb = gs_verbs_query_gid_sysfs(dev.ctx, "/sys/class/infiniband", dev.name, dev.port,
                                          dev.link_layer, (uint32_t)i, &b);
        if (ra != 0)
            continue;
        GS_ASSERT_EQ(rb, 0);
        GS_ASSERT_EQ(memcmp(a.gid.raw, b.gid.raw, 16), 0);
        GS_ASSERT_EQ(a.gid_type, b.gid_type);
        GS_ASSERT_EQ(a.gid_index, b.gid_index);
        GS_ASSERT_EQ(a.ndev_ifindex, b.ndev_ifindex);
        valid++;
    }
    GS_ASSERT_GT(valid, 0);
    gs_verbs_dev_close(&dev);
}

GS_TEST(compat_summary_names_the_build)
{
#if defined(GS_IB_HAVE_QUERY_GID_EX) && defined(GS_IB_HAVE_QUERY_GID_TABLE) &&                               \
    defined(GS_IB_HAVE_FORK_STATUS) && defined(GS_IB_HAVE_PORT_FLAGS)
    GS_ASSERT_STR_EQ(gs_verbs_compat_summary(), "native");
#else
    GS_ASSERT_CONTAINS(gs_verbs_compat_summary(), "compat");
#endif
    GS_ASSERT(gs_verbs_fork_state() != NULL);
}

GS_TEST(device_by_unknown_name_is_a_config_error)
{
    static const char *const env[] = {"GS_IB_DEV", "no_such_hca0", NULL};
    gs_config cfg;
    gs_verbs_dev dev = {0};
    need_device();
    config_with(&cfg, env);
    GS_ASSERT_STATUS(gs_verbs_dev_open(&cfg, 3, &dev), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_DEV=no_such_hca0");
    GS_ASSERT_CONTAINS(gs_last_error(), "devices:");
}

GS_TEST(device_with_an_inactive_port_is_refused)
{
    static const char *const env[] = {"GS_IB_PORT", "9", NULL};
    gs_config cfg;
    gs_verbs_dev dev = {0};
    need_device();
    config_with(&cfg, env);
    GS_ASSERT_STATUS(gs_verbs_dev_open(&cfg, 0, &dev), GS_ERR_UNSUPPORTED);
    GS_ASSERT_CONTAINS(gs_last_error(), "ACTIVE");
}

GS_TEST(explicit_gid_index_must_name_a_valid_entry)
{
    static const char *const bad[] = {"GS_IB_GID_INDEX", "250", NULL};
    static const char *const good[] = {"GS_IB_GID_INDEX", "0", NULL};
    gs_config cfg;
    gs_verbs_dev dev = {0};
    need_device();
    config_with(&cfg, bad);
    GS_ASSERT_STATUS(gs_verbs_dev_open(&cfg, 0, &dev), GS_ERR_CONFIG);
    GS_ASSERT_CONTAINS(gs_last_error(), "GS_IB_GID_INDEX=250");
    config_with(&cfg, good);
    GS_ASSERT_OK(gs_verbs_dev_open(&cfg, 0, &dev));
    GS_ASSERT_EQ(dev.gid_index, 0);
    gs_verbs_dev_close(&dev);
}

#else
GS_TEST(verbs_not_built)
{
    GS_SKIP("built without libibverbs");
}
#endif
