/* Device discovery and selection, port query, GID choice. */
#include "transport/verbs/verbs.h"

#include "util/log.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rejects GS_IB_* values the hardware would refuse later with a vaguer error. */
gs_status gs_verbs_config_check(const gs_config *cfg)
{
    static const struct {
        const char *var;
        size_t offset;
        int64_t lo, hi;
        const char *meaning;
    } ranges[] = {
        {"GS_IB_PORT", offsetof(gs_config, ib_port), 1, 255, "a port number 1-255"},
        {"GS_IB_GID_INDEX", offsetof(gs_config, ib_gid_index), -1, 255,
         "-1 (automatic) or a GID index 0-255"},
        {"GS_IB_TIMEOUT", offsetof(gs_config, ib_timeout), -1, 31,
         "-1 (automatic) or an exponent 1-31 (4.096 us * 2^n; 0 means no timeout on hardware: a dead peer "
         "would never be found)"},
        {"GS_IB_SL", offsetof(gs_config, ib_sl), 0, 15, "a service level 0-15"},
        {"GS_IB_TC", offsetof(gs_config, ib_tc), 0, 255, "a traffic class 0-255 (RoCE v2: DSCP << 2)"},
        {"GS_IB_RETRY_CNT", offsetof(gs_config, ib_retry_cnt), 0, 7, "a retry count 0-7"},
        {"GS_IB_RNR_RETRY", offsetof(gs_config, ib_rnr_retry), 0, 7, "a retry count 0-7"},
        {"GS_IB_RNR_TIMER", offsetof(gs_config, ib_rnr_timer), 0, 31, "a timer code 0-31"},
        {"GS_IB_QPS_PER_PEER", offsetof(gs_config, ib_qps_per_peer), 1, GS_VERBS_QPS_MAX,
         "1-16 queue pairs per peer"},
        {"GS_IB_STRIPE_MIN", offsetof(gs_config, ib_stripe_min), 4096, 1 << 30, "4K-1G bytes"},
        {"GS_IB_RAILS", offsetof(gs_config, ib_rails), 1, GS_VERBS_RAILS_MAX, "1 or 2 devices"},
    };
    for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
        int64_t v = *(const int64_t *)(const void *)((const char *)cfg + ranges[i].offset);
        if (v < ranges[i].lo || v > ranges[i].hi)
            return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG, "%s=%lld is out of range: expected %s",
                           ranges[i].var, (long long)v, ranges[i].meaning);
    }
    if (cfg->ib_timeout == 0)
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_CONFIG,
            "GS_IB_TIMEOUT=0 is refused: it means no ack timeout on hardware, so a dead peer would never "
            "be found; use -1 (automatic) or 1-31");
    gs_verbs_gid_filter filter;
    gs_status st = cfg->ib_pkey[0] ? gs_verbs_pkey_parse(cfg->ib_pkey, NULL) : GS_OK;
    if (st == GS_OK)
        st = gs_verbs_gid_filter_parse(cfg, &filter);
    if (st != GS_OK)
        return st;
    if (cfg->ib_rails > cfg->ib_qps_per_peer)
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_CONFIG,
            "GS_IB_RAILS=%lld needs at least one queue pair per device: set GS_IB_QPS_PER_PEER to %lld "
            "or more (it is %lld)",
            (long long)cfg->ib_rails, (long long)cfg->ib_rails, (long long)cfg->ib_qps_per_peer);
    if (cfg->ib_retry_cnt == 7)
        gs_log_warn(VERBS, "GS_IB_RETRY_CNT=7: Soft-RoCE (rxe) retries forever at 7, so a dead peer is never "
                           "detected there");
    if (cfg->ib_rnr_retry == 7)
        gs_log_warn(
            VERBS, "GS_IB_RNR_RETRY=7 retries forever: a peer that stops posting receives hangs its senders");
    return GS_OK;
}

int64_t gs_verbs_heartbeat_ms(const gs_config *cfg)
{
    int64_t ms = cfg->timeout_ms / 4;
    return ms < 50 ? 50 : ms > 1000 ? 1000 : ms;
}

int gs_verbs_ack_timeout(const gs_config *cfg)
{
    if (cfg->ib_timeout > 0)
        return (int)cfg->ib_timeout;
    /* the largest n <= the maximum with (retries + 1) tries of 4.096 us * 2^n, plus two heartbeats, inside
     * the deadline */
    double budget_s = ((double)cfg->timeout_ms - 2.0 * (double)gs_verbs_heartbeat_ms(cfg)) / 1e3;
    int n = GS_VERBS_ACK_TIMEOUT_MAX;
    while (n > 1 && (double)(cfg->ib_retry_cnt + 1) * 4.096e-6 * (double)(1ull << n) > budget_s)
        n--;
    return n;
}

gs_status gs_verbs_pkey_parse(const char *text, uint16_t *pkey_p)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 0);
    if (errno || end == text || *end || text[0] == '-' || v > 0xffff || (v & 0x7fff) == 0)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "GS_IB_PKEY=%s is not a partition key: expected 0x0001-0xffff with a nonzero base "
                       "(bit 15 is full membership), e.g. 0x8001",
                       text);
    if (pkey_p)
        *pkey_p = (uint16_t)v;
    return GS_OK;
}

gs_status gs_verbs_pkey_index(const gs_config *cfg, int rank, gs_verbs_dev *dev)
{
    uint16_t want = 0, got, base_match = UINT16_MAX;
    char seen[160] = "";
    size_t n = 0;
    dev->pkey_index = 0;
    dev->pkey = 0xffff; /* the default partition, if the table cannot be read */
    if (!cfg->ib_pkey[0]) {
        __be16 raw;
        if (ibv_query_pkey(dev->ctx, dev->port, 0, &raw) == 0)
            dev->pkey = ntohs(raw);
        return GS_OK;
    }
    if (gs_verbs_pkey_parse(cfg->ib_pkey, &want) != GS_OK)
        return GS_ERR_CONFIG;
    for (int i = 0; i < dev->port_attr.pkey_tbl_len && i <= UINT16_MAX; i++) {
        __be16 raw;
        if (ibv_query_pkey(dev->ctx, dev->port, i, &raw) != 0)
            break;
        got = ntohs(raw);
        if (got == want) {
            dev->pkey_index = (uint16_t)i;
            dev->pkey = got;
            return GS_OK;
        }
        if ((got & 0x7fff) == (want & 0x7fff) && base_match == UINT16_MAX)
            base_match = (uint16_t)i; /* the same partition, another membership */
        if (got && n + 12 < sizeof(seen))
            n += (size_t)snprintf(seen + n, sizeof(seen) - n, "%s0x%04x", n ? " " : "", got);
    }
    if (base_match != UINT16_MAX) {
        gs_log_warn(VERBS,
                    "rank %d: GS_IB_PKEY=%s: port %u has the partition with another membership bit; using "
                    "its entry %u",
                    rank, cfg->ib_pkey, dev->port, base_match);
        dev->pkey_index = base_match;
        __be16 raw;
        dev->pkey = ibv_query_pkey(dev->ctx, dev->port, base_match, &raw) == 0 ? ntohs(raw) : want;
        return GS_OK;
    }
    return gs_fail(
        GS_SUBSYS_VERBS, GS_ERR_CONFIG,
        "rank %d: GS_IB_PKEY=%s is not in the partition table of %s port %u (it holds: %s); ask the "
        "subnet manager's admin, or leave GS_IB_PKEY unset",
        rank, cfg->ib_pkey, dev->name, dev->port, seen[0] ? seen : "nothing");
}

int gs_verbs_mtu_bytes(enum ibv_mtu mtu)
{
    return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0;
}

enum ibv_mtu gs_verbs_mtu_min(enum ibv_mtu a, enum ibv_mtu b)
{
    return a < b ? a : b;
}

bool gs_verbs_gid_is_link_local(const union ibv_gid *gid)
{
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t *raw = gid->raw;
    if (memcmp(raw, v4_mapped, sizeof(v4_mapped)) == 0)
        return raw[12] == 169 && raw[13] == 254;      /* IPv4 link-local 169.254/16 */
    return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80; /* IPv6 fe80::/10 */
}

static bool gid_is_empty(const union ibv_gid *gid)
{
    for (size_t i = 0; i < sizeof(gid->raw); i++)
        if (gid->raw[i])
            return false;
    return true;
}

void gs_verbs_gid_format(const union ibv_gid *gid, char *buf, size_t cap)
{
    if (!inet_ntop(AF_INET6, gid->raw, buf, (socklen_t)cap))
        snprintf(buf, cap, "(unprintable)");
}

const char *gs_verbs_gid_type_name(uint32_t type)
{
    switch (type) {
    case GS_VERBS_GID_TYPE_IB: return "IB";
    case GS_VERBS_GID_TYPE_ROCE_V1: return "RoCE v1";
    case GS_VERBS_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "unknown type";
    }
}

int gs_verbs_gid_family(const union ibv_gid *gid)
{
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid->raw, v4_mapped, sizeof(v4_mapped)) == 0 ? AF_INET : AF_INET6;
}

gs_status gs_verbs_gid_filter_parse(const gs_config *cfg, gs_verbs_gid_filter *f)
{
    static const int families[] = {0, AF_INET, AF_INET6}; /* GS_IB_ADDR_FAMILY's choices, in order */
    char addr[GS_CONFIG_STR_MAX], *slash, *end;
    long bits;
    int family;

    *f = (gs_verbs_gid_filter){.family = families[cfg->ib_addr_family], .prefix_bits = -1};
    if (!cfg->ib_addr_range[0])
        return GS_OK;
    snprintf(addr, sizeof(addr), "%s", cfg->ib_addr_range);
    slash = strchr(addr, '/');
    if (slash)
        *slash = '\0';
    family = strchr(addr, ':') ? AF_INET6 : AF_INET;
    bits = slash ? strtol(slash + 1, &end, 10) : -1;
    if (!slash || end == slash + 1 || *end || bits < 0 || bits > (family == AF_INET ? 32 : 128) ||
        inet_pton(family, addr, family == AF_INET ? f->prefix + 12 : f->prefix) != 1)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "GS_IB_ADDR_RANGE=%s is not an address range: expected prefix/len, e.g. 10.0.0.0/8 "
                       "or fd00::/8",
                       cfg->ib_addr_range);
    if (f->family && f->family != family)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "GS_IB_ADDR_RANGE=%s is an %s range but GS_IB_ADDR_FAMILY asks for %s",
                       cfg->ib_addr_range, family == AF_INET ? "IPv4" : "IPv6",
                       f->family == AF_INET ? "AF_INET" : "AF_INET6");
    if (family == AF_INET) {
        f->prefix[10] = f->prefix[11] = 0xff;
        bits += 96;
    }
    f->family = family;
    f->prefix_bits = (int)bits;
    return GS_OK;
}

static bool gid_passes(const union ibv_gid *gid, const gs_verbs_gid_filter *f)
{
    if (!f)
        return true;
    if (f->family && gs_verbs_gid_family(gid) != f->family)
        return false;
    for (int bit = 0; bit < f->prefix_bits; bit++) {
        unsigned mask = 0x80u >> (bit % 8);
        if ((gid->raw[bit / 8] & mask) != (f->prefix[bit / 8] & mask))
            return false;
    }
    return true;
}

/* Routable beats link-local, then RoCE v2 beats v1, then IPv4 beats IPv6 (NCCL's default family). */
static int gid_score(const gs_verbs_gid_entry *e)
{
    int score = gs_verbs_gid_is_link_local(&e->gid) ? 0 : 8;
    if (e->gid_type == GS_VERBS_GID_TYPE_ROCE_V2)
        score += 4;
    else if (e->gid_type == GS_VERBS_GID_TYPE_ROCE_V1)
        score += 2;
    if (gs_verbs_gid_family(&e->gid) == AF_INET)
        score += 1;
    return score;
}

int gs_verbs_gid_pick(const gs_verbs_gid_entry *entries, int n, const gs_verbs_gid_filter *f)
{
    int best = -1, best_score = -1;
    for (int i = 0; i < n; i++) {
        if (gid_is_empty(&entries[i].gid) || !gid_passes(&entries[i].gid, f))
            continue;
        int score = gid_score(&entries[i]);
        if (score > best_score || (score == best_score && entries[i].gid_index < entries[best].gid_index)) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

static gs_status gid_explicit(const gs_config *cfg, int rank, gs_verbs_dev *dev, gs_verbs_gid_entry *e)
{
    int rc =
        gs_verbs_query_gid(dev->ctx, dev->name, dev->port, dev->link_layer, (uint32_t)cfg->ib_gid_index, e);
    if (rc != 0 || gid_is_empty(&e->gid))
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "rank %d: GS_IB_GID_INDEX=%lld: entry of %s port %u is empty or unreadable (%s); "
                       "list the valid ones with `ibv_devinfo -v -d %s` or unset the variable",
                       rank, (long long)cfg->ib_gid_index, dev->name, dev->port,
                       rc ? strerror(rc) : "all zero", dev->name);
    return GS_OK;
}

static gs_status gid_automatic(const gs_config *cfg, int rank, gs_verbs_dev *dev, gs_verbs_gid_entry *e)
{
    gs_verbs_gid_filter filter;
    int cap = dev->port_attr.gid_tbl_len > 0 ? dev->port_attr.gid_tbl_len : 1;
    gs_verbs_gid_entry *entries = calloc((size_t)cap, sizeof(*entries));
    gs_status status = GS_OK;
    int n, best;

    if (gs_verbs_gid_filter_parse(cfg, &filter) != GS_OK)
        return GS_ERR_CONFIG;
    if (!entries)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_NOMEM, "rank %d: no memory for %d GID entries", rank, cap);
    n = gs_verbs_read_gids(dev->ctx, dev->name, dev->port, dev->link_layer, dev->port_attr.gid_tbl_len,
                           entries, cap);
    best = gs_verbs_gid_pick(entries, n, &filter);
    if (best < 0 && gs_verbs_gid_pick(entries, n, NULL) >= 0)
        status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                         "rank %d: no GID of %s port %u matches GS_IB_ADDR_FAMILY=%s GS_IB_ADDR_RANGE=%s (%d "
                         "entries; list them with `ibv_devinfo -v -d %s`): widen the range or unset them",
                         rank, dev->name, dev->port,
                         filter.family == AF_INET    ? "AF_INET"
                         : filter.family == AF_INET6 ? "AF_INET6"
                                                     : "auto",
                         cfg->ib_addr_range[0] ? cfg->ib_addr_range : "(unset)", n, dev->name);
    else if (best < 0)
        status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
                         "rank %d: %s port %u has no usable GID (%d entries, all empty): give its network "
                         "interface an IP address, or set GS_IB_GID_INDEX",
                         rank, dev->name, dev->port, n);
    else
        *e = entries[best];
    free(entries);
    return status;
}

/* RoCE needs a GID; InfiniBand uses one when GS_IB_GID_INDEX asks for a GRH or the port requires one
 * (IBV_QPF_GRH_REQUIRED in the port's flags). */
static gs_status choose_address(const gs_config *cfg, int rank, gs_verbs_dev *dev)
{
    gs_verbs_gid_entry e = {0};
    char text[64];
    gs_status status;
    bool ib = dev->link_layer != IBV_LINK_LAYER_ETHERNET;

    bool grh_required = ib && gs_verbs_port_grh_required(&dev->port_attr);

    dev->lid = dev->port_attr.lid;
    dev->gid_index = -1;
    if (grh_required && cfg->ib_gid_index < 0)
        gs_log_info(VERBS, "rank %d: InfiniBand port %s:%u requires a GRH: addressing peers by GID", rank,
                    dev->name, dev->port);
    if (ib && cfg->ib_gid_index < 0 && !grh_required) {
        if (dev->lid == 0)
            return gs_fail(GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
                           "rank %d: InfiniBand port %s:%u has no LID: is a subnet manager (opensm) running?",
                           rank, dev->name, dev->port);
        gs_log_info(VERBS, "rank %d: %s port %u InfiniBand, LID %u", rank, dev->name, dev->port, dev->lid);
        return GS_OK;
    }
    status = cfg->ib_gid_index >= 0 ? gid_explicit(cfg, rank, dev, &e) : gid_automatic(cfg, rank, dev, &e);
    if (status != GS_OK)
        return status;
    dev->gid_index = (int)e.gid_index;
    dev->gid = e.gid;
    dev->gid_type = e.gid_type;
    gs_verbs_gid_format(&dev->gid, text, sizeof(text));
    gs_log_info(VERBS, "rank %d: %s port %u GID index %d (%s, %s%s)%s", rank, dev->name, dev->port,
                dev->gid_index, gs_verbs_gid_type_name(dev->gid_type), text,
                gs_verbs_gid_is_link_local(&dev->gid) ? ", link-local" : "",
                cfg->ib_gid_index >= 0 ? " from GS_IB_GID_INDEX" : " chosen automatically");
    if (!ib && gs_verbs_gid_is_link_local(&dev->gid))
        gs_log_warn(VERBS,
                    "rank %d: only a link-local GID on %s port %u: peers on other subnets cannot be reached",
                    rank, dev->name, dev->port);
    return GS_OK;
}

const char *gs_verbs_kind_refusal(int transport_type, uint8_t link_layer)
{
    switch (transport_type) {
    case IBV_TRANSPORT_IB: break;
    case IBV_TRANSPORT_IWARP:
        return "an iWARP device: its queue pairs connect only through the RDMA connection manager, and it "
               "has no InfiniBand atomics";
    case IBV_TRANSPORT_USNIC:
    case IBV_TRANSPORT_USNIC_UDP: return "a usNIC device: it has no RC queue pairs";
    case IBV_TRANSPORT_UNSPECIFIED:
        return "transport type unspecified (e.g. AWS EFA, whose SRD queue pairs are not RC)";
    default: return "an unknown transport type (not InfiniBand)";
    }
    if (link_layer == IBV_LINK_LAYER_INFINIBAND || link_layer == IBV_LINK_LAYER_ETHERNET)
        return NULL;
    return "its port's link layer is neither InfiniBand nor Ethernet (unspecified)";
}

/* Opens dev_list[i] and queries it and its port; *active_p tells whether the port is ACTIVE. */
static gs_status open_one(struct ibv_device *device, uint8_t port, int rank, gs_verbs_dev *dev,
                          bool *active_p)
{
    int rc;
    snprintf(dev->name, sizeof(dev->name), "%s", ibv_get_device_name(device));
    dev->port = port;
    dev->ctx = ibv_open_device(device);
    if (!dev->ctx)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_SYSTEM, "rank %d: ibv_open_device(%s) failed: %s", rank,
                       dev->name, strerror(errno));
    rc = ibv_query_device(dev->ctx, &dev->attr);
    if (rc == 0 && port > dev->attr.phys_port_cnt)
        rc = EINVAL;
    if (rc == 0)
        rc = ibv_query_port(dev->ctx, port, &dev->port_attr);
    if (rc != 0) {
        gs_log_warn(VERBS, "rank %d: cannot query %s port %u: %s (it has %u ports)", rank, dev->name, port,
                    strerror(rc), dev->attr.phys_port_cnt);
        *active_p = false;
        return GS_OK;
    }
    dev->link_layer = dev->port_attr.link_layer;
    dev->fence_unneeded = dev->attr.vendor_id == GS_VERBS_RXE_VENDOR_ID;
    if (dev->fence_unneeded)
        gs_log_info(VERBS,
                    "rank %d: %s is Soft-RoCE: fenced operations are posted without the fence "
                    "(its responder runs requests in order; fenced ones can stall there)",
                    rank, dev->name);
    *active_p = dev->port_attr.state == IBV_PORT_ACTIVE;
    return GS_OK;
}

void gs_verbs_dev_close(gs_verbs_dev *dev)
{
    if (dev->ctx && ibv_close_device(dev->ctx) != 0)
        gs_log_warn(VERBS, "ibv_close_device(%s) failed: %s", dev->name, strerror(errno));
    dev->ctx = NULL;
}

/* Appends "name port p state" (or why it was refused) to the list of devices seen, for the error message. */
static void note_device(char *seen, size_t cap, const gs_verbs_dev *dev, bool queried, const char *refusal)
{
    size_t used = strlen(seen);
    snprintf(seen + used, cap - used, "%s%s port %u %s%s", used ? ", " : "", dev->name, dev->port,
             queried ? ibv_port_state_str(dev->port_attr.state) : "unreadable",
             refusal ? " but refused: " : "");
    used = strlen(seen);
    if (refusal)
        snprintf(seen + used, cap - used, "%s", refusal);
}

/* What is wrong with GS_IB_DEV's list (one phrase), or NULL with out[*n_p] filled. */
static const char *list_parse(const char *text, gs_verbs_dev_want *out, int cap, int *n_p)
{
    const char *p = text, *why = NULL;
    int n = 0;
    while (*p && !why) {
        size_t len = strcspn(p, ","), name_len;
        const char *colon = memchr(p, ':', len);
        name_len = colon ? (size_t)(colon - p) : len;
        if (n == cap)
            why = "too many devices (at most 16)";
        else if (name_len == 0)
            why = "an empty device name";
        else if (name_len >= sizeof(out[n].name))
            why = "a device name longer than 63 characters";
        if (!why) {
            memcpy(out[n].name, p, name_len);
            out[n].name[name_len] = '\0';
            out[n].port = 0;
        }
        if (!why && colon) {
            char digits[8] = "", *end;
            size_t dl = len - name_len - 1;
            long port = -1;
            if (dl > 0 && dl < sizeof(digits)) {
                memcpy(digits, colon + 1, dl);
                port = strtol(digits, &end, 10);
                if (*end)
                    port = -1;
            }
            if (port < 1 || port > 255)
                why = "a port outside 1-255";
            else
                out[n].port = (uint8_t)port;
        }
        for (int i = 0; !why && i < n; i++)
            if (strcmp(out[i].name, out[n].name) == 0)
                why = "a device listed twice";
        if (why)
            break;
        n++;
        p += len;
        if (*p == ',' && *++p == '\0')
            why = "an empty device name";
    }
    *n_p = why ? 0 : n;
    return why;
}

gs_status gs_verbs_dev_list_parse(const char *text, gs_verbs_dev_want *out, int cap, int *n_p)
{
    const char *why = list_parse(text, out, cap, n_p);
    if (why)
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                       "GS_IB_DEV=%s: %s; expected a comma list of dev[:port], e.g. mlx5_0:1,mlx5_1", text,
                       why);
    return GS_OK;
}

int gs_verbs_dev_numa_node(const char *sysfs_root, const char *name)
{
    char path[512];
    int node = -1;
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s/device/numa_node", sysfs_root, name);
    f = fopen(path, "r");
    if (!f)
        return -1;
    if (fscanf(f, "%d", &node) != 1 || node < -1)
        node = -1;
    fclose(f);
    return node;
}

int gs_verbs_cpu_numa_node(const char *sysfs_cpu_root, int *cpu_p)
{
    int cpu = sched_getcpu(), node = -1;
    char path[512];
    DIR *d;
    struct dirent *e;
    if (cpu_p)
        *cpu_p = cpu;
    if (cpu < 0)
        return -1;
    snprintf(path, sizeof(path), "%s/cpu%d", sysfs_cpu_root, cpu);
    d = opendir(path);
    while (d && (e = readdir(d)) != NULL && node < 0) {
        char *end;
        long v;
        if (strncmp(e->d_name, "node", 4) != 0 || !e->d_name[4])
            continue;
        v = strtol(e->d_name + 4, &end, 10);
        if (!*end && v >= 0 && v < 4096)
            node = (int)v;
    }
    if (d)
        closedir(d);
    return node;
}

/* Same node as the CPU 2, unknown 1, another node 0; with the CPU's node unknown, all alike. */
static int numa_score(int node, int cpu_node)
{
    if (cpu_node < 0)
        return 1;
    return node == cpu_node ? 2 : node < 0 ? 1 : 0;
}

int gs_verbs_numa_pick(const int *nodes, int n, int cpu_node)
{
    int best = -1, best_score = -1;
    for (int i = 0; i < n; i++) {
        int score = numa_score(nodes[i], cpu_node);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

#define GS_VERBS_SYSFS     "/sys/class/infiniband"
#define GS_VERBS_SYSFS_CPU "/sys/devices/system/cpu"

/* The device list index named name, or -1. */
static int find_device(struct ibv_device **list, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ibv_get_device_name(list[i]), name) == 0)
            return i;
    return -1;
}

typedef struct dev_search {
    const gs_config *cfg;
    int rank, cpu, cpu_node, usable;
    int want, kept;                /* devices wanted (rails), and kept so far */
    int score[GS_VERBS_RAILS_MAX]; /* of the kept ones, best first */
    gs_verbs_dev *best;            /* [want]: the kept ones, open */
    char seen[768];                /* the devices looked at and why not taken, for the error */
    char cands[384];               /* the usable ones and their nodes, for the log */
} dev_search;

/* Looks at device list[i] port `port`: usable ones compete on NUMA locality (the best stays open). */
static gs_status consider(dev_search *s, struct ibv_device *device, uint8_t port, bool named)
{
    gs_verbs_dev cand = {0};
    bool active = false;
    const char *refusal = NULL;
    gs_status status = open_one(device, port, s->rank, &cand, &active);
    size_t used;
    int score;

    if (status != GS_OK)
        return status;
    if (active)
        refusal = gs_verbs_kind_refusal(device->transport_type, cand.link_layer);
    if (refusal && named) {
        gs_verbs_dev_close(&cand);
        return gs_fail(GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
                       "rank %d: GS_IB_DEV=%s: the verbs transport cannot use %s port %u: %s; use "
                       "GS_TRANSPORT=tcp",
                       s->rank, s->cfg->ib_dev, cand.name, cand.port, refusal);
    }
    if (!active || refusal) {
        note_device(s->seen, sizeof(s->seen), &cand, cand.port_attr.state != 0, refusal);
        gs_verbs_dev_close(&cand);
        return GS_OK;
    }
    cand.numa_node = gs_verbs_dev_numa_node(GS_VERBS_SYSFS, cand.name);
    used = strlen(s->cands);
    snprintf(s->cands + used, sizeof(s->cands) - used, "%s%s:%u on node %d", used ? ", " : "", cand.name,
             cand.port, cand.numa_node);
    s->usable++;
    score = numa_score(cand.numa_node, s->cpu_node);
    /* kept best first; among equals the first listed stays ahead */
    int at = s->kept;
    while (at > 0 && s->score[at - 1] < score)
        at--;
    if (at >= s->want) {
        gs_verbs_dev_close(&cand);
        return GS_OK;
    }
    if (s->kept == s->want)
        gs_verbs_dev_close(&s->best[--s->kept]);
    for (int k = s->kept; k > at; k--) {
        s->best[k] = s->best[k - 1];
        s->score[k] = s->score[k - 1];
    }
    s->best[at] = cand;
    s->score[at] = score;
    s->kept++;
    return GS_OK;
}

/* GS_IB_DEV's devices in its order, else every device of the InfiniBand transport type with port GS_IB_PORT
 * active and an InfiniBand or Ethernet link layer; of several, the nearest to this CPU's NUMA node. */
static gs_status select_device(const gs_config *cfg, int rank, struct ibv_device **list, int n,
                               gs_verbs_dev *dev, int rails, dev_search *out)
{
    gs_verbs_dev_want want[GS_VERBS_DEVS_MAX];
    dev_search s = {.cfg = cfg, .rank = rank, .want = rails, .best = dev};
    int nwant = 0;
    gs_status status = gs_verbs_dev_list_parse(cfg->ib_dev, want, GS_VERBS_DEVS_MAX, &nwant);

    memset(dev, 0, (size_t)rails * sizeof(*dev));
    s.cpu_node = gs_verbs_cpu_numa_node(GS_VERBS_SYSFS_CPU, &s.cpu);
    for (int w = 0; status == GS_OK && w < nwant; w++) {
        int i = find_device(list, n, want[w].name);
        if (i < 0) {
            for (int j = 0; j < n; j++) {
                size_t used = strlen(s.seen);
                snprintf(s.seen + used, sizeof(s.seen) - used, "%s%s", j ? ", " : "",
                         ibv_get_device_name(list[j]));
            }
            status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                             "rank %d: GS_IB_DEV=%s: no such device %s (devices: %s)", rank, cfg->ib_dev,
                             want[w].name, s.seen);
        } else {
            status = consider(&s, list[i], want[w].port ? want[w].port : (uint8_t)cfg->ib_port, true);
        }
    }
    for (int i = 0; status == GS_OK && nwant == 0 && i < n; i++)
        status = consider(&s, list[i], (uint8_t)cfg->ib_port, false);
    if (status == GS_OK && s.kept > 0 && s.kept < rails)
        status = gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_CONFIG,
            "rank %d: GS_IB_RAILS=%d but only %d usable device%s (%s%s%s): list more in GS_IB_DEV, "
            "or lower GS_IB_RAILS",
            rank, rails, s.kept, s.kept == 1 ? "" : "s", s.cands, s.seen[0] ? "; not usable: " : "", s.seen);
    if (out)
        *out = s;
    if (status != GS_OK) {
        for (int k = 0; k < s.kept; k++)
            gs_verbs_dev_close(&dev[k]);
        return status;
    }
    for (int k = 0; k < s.kept; k++)
        gs_log_info(
            VERBS,
            "rank %d: rail %d: device %s port %u chosen (NUMA node %d; this rank runs on CPU %d, node "
            "%d) of %d usable: %s%s",
            rank, k, dev[k].name, dev[k].port, dev[k].numa_node, s.cpu, s.cpu_node, s.usable, s.cands,
            nwant ? " (GS_IB_DEV)" : "");
    if (s.kept > 0)
        return GS_OK;
    if (nwant)
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
            "rank %d: GS_IB_DEV=%s: none of its devices has its port ACTIVE (%s); check the link with "
            "ibv_devinfo",
            rank, cfg->ib_dev, s.seen);
    return gs_fail(
        GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
        "rank %d: no usable verbs device with port %lld ACTIVE (%s); check the link with ibv_devinfo, "
        "or pick another port with GS_IB_PORT",
        rank, (long long)cfg->ib_port, s.seen);
}

/* Address and partition of one chosen device, and its summary in the log. */
static gs_status dev_finish(const gs_config *cfg, int rank, gs_verbs_dev *dev)
{
    gs_status status = choose_address(cfg, rank, dev);
    if (status == GS_OK)
        status = gs_verbs_pkey_index(cfg, rank, dev);
    if (status != GS_OK)
        return status;
    gs_log_info(VERBS, "rank %d: device %s port %u %s, active MTU %d, atomics %s, max %d WRs per QP", rank,
                dev->name, dev->port,
                dev->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand",
                gs_verbs_mtu_bytes(dev->port_attr.active_mtu),
                dev->attr.atomic_cap == IBV_ATOMIC_NONE ? "none" : "yes", dev->attr.max_qp_wr);
    return GS_OK;
}

gs_status gs_verbs_dev_open(const gs_config *cfg, int rank, gs_verbs_dev *dev)
{
    return gs_verbs_devs_open(cfg, rank, dev, 1);
}

gs_status gs_verbs_devs_open(const gs_config *cfg, int rank, gs_verbs_dev *devs, int rails)
{
    int n = 0;
    gs_status status;
    struct ibv_device **list = ibv_get_device_list(&n);

    if (!list)
        return gs_fail(
            GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
            "rank %d: ibv_get_device_list failed: %s: this kernel offers no RDMA devices; use "
            "GS_TRANSPORT=tcp, or load ib_uverbs and a driver (Soft-RoCE: rdma link add rxe0 type rxe "
            "netdev <if>)",
            rank, strerror(errno));
    if (n == 0) {
        status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_UNSUPPORTED,
                         "rank %d: no verbs device found (ibv_devices lists none); use GS_TRANSPORT=tcp or "
                         "create one (Soft-RoCE: rdma link add rxe0 type rxe netdev <if>)",
                         rank);
        goto out_free;
    }
    status = select_device(cfg, rank, list, n, devs, rails, NULL);
    for (int k = 0; status == GS_OK && k < rails; k++)
        status = dev_finish(cfg, rank, &devs[k]);
    for (int k = 1; status == GS_OK && k < rails; k++)
        if (devs[k].link_layer != devs[0].link_layer)
            status = gs_fail(GS_SUBSYS_VERBS, GS_ERR_CONFIG,
                             "rank %d: rails %s and %s have different link layers (InfiniBand and Ethernet): "
                             "list devices of one fabric in GS_IB_DEV",
                             rank, devs[0].name, devs[k].name);
    if (status != GS_OK)
        for (int k = 0; k < rails; k++)
            gs_verbs_dev_close(&devs[k]);
out_free:
    ibv_free_device_list(list);
    return status;
}

/* Whether a device (GS_IB_DEV, else any) that select_device would take has port GS_IB_PORT active;
 * quiet, for GS_TRANSPORT=auto (whose open then probes the data path, see verbs_tp.c). */
bool gs_verbs_available(const gs_config *cfg)
{
    int n = 0;
    bool found = false;
    struct ibv_device **list = ibv_get_device_list(&n);

    gs_verbs_dev_want want[GS_VERBS_DEVS_MAX];
    int nwant = 0;

    if (list_parse(cfg->ib_dev, want, GS_VERBS_DEVS_MAX, &nwant))
        n = 0; /* the open says why */
    for (int i = 0; list && i < n && !found; i++) {
        struct ibv_context *ctx;
        struct ibv_port_attr attr;
        uint8_t port = (uint8_t)cfg->ib_port;
        int w = 0;
        while (w < nwant && strcmp(want[w].name, ibv_get_device_name(list[i])) != 0)
            w++;
        if (nwant && w == nwant)
            continue;
        if (nwant && want[w].port)
            port = want[w].port;
        if (list[i]->transport_type != IBV_TRANSPORT_IB)
            continue;
        ctx = ibv_open_device(list[i]);
        if (!ctx)
            continue;
        found = port >= 1 && ibv_query_port(ctx, port, &attr) == 0 && attr.state == IBV_PORT_ACTIVE &&
                !gs_verbs_kind_refusal(list[i]->transport_type, attr.link_layer);
        ibv_close_device(ctx);
    }
    if (list)
        ibv_free_device_list(list);
    return found;
}

void gs_verbs_devices_text(const gs_config *cfg, char *buf, size_t cap)
{
    int n = 0, rails = cfg->ib_rails >= 1 && cfg->ib_rails <= GS_VERBS_RAILS_MAX ? (int)cfg->ib_rails : 1;
    struct ibv_device **list = ibv_get_device_list(&n);
    gs_verbs_dev devs[GS_VERBS_RAILS_MAX] = {{0}};
    dev_search s = {0};
    size_t used = 0;

    if (!list || n == 0) {
        snprintf(buf, cap, "no verbs device (%s)", list ? "ibv_devices lists none" : strerror(errno));
        if (list)
            ibv_free_device_list(list);
        return;
    }
    if (select_device(cfg, -1, list, n, devs, rails, &s) != GS_OK) {
        snprintf(buf, cap, "none chosen: %s", gs_last_error());
    } else {
        for (int k = 0; k < s.kept; k++) {
            used +=
                (size_t)snprintf(buf + used, cap > used ? cap - used : 0, "%srail %d %s:%u (NUMA node %d)",
                                 k ? ", " : "", k, devs[k].name, devs[k].port, devs[k].numa_node);
            gs_verbs_dev_close(&devs[k]);
        }
        snprintf(buf + used, cap > used ? cap - used : 0,
                 "; this process on CPU %d, NUMA node %d; usable: %s", s.cpu, s.cpu_node, s.cands);
    }
    ibv_free_device_list(list);
}
