/*
 * libibverbs calls newer than the rdma-core some clusters run, each with a
 * fallback: the configure step (cmake/verbs_compat.cmake) defines
 * GS_IB_HAVE_QUERY_GID_EX, GS_IB_HAVE_QUERY_GID_TABLE, GS_IB_HAVE_FORK_STATUS
 * and GS_IB_HAVE_PORT_FLAGS for what it found; -DGS_IB_COMPAT=ON defines
 * none, so the fallbacks are built and tested on a new rdma-core too.
 */
#include "transport/verbs/verbs.h"

#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYSFS_ROOT "/sys/class/infiniband"

/* The first line of a small sysfs file, without its newline: 0 or an errno. */
static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    int err = 0;
    if (!f)
        return errno;
    if (!fgets(buf, (int)cap, f))
        err = ferror(f) ? EIO : ENODATA;
    fclose(f);
    if (err == 0)
        buf[strcspn(buf, "\n")] = '\0';
    return err;
}

int gs_verbs_query_gid_sysfs(struct ibv_context *ctx, const char *sysfs_root, const char *dev_name,
                             uint8_t port, uint8_t link_layer, uint32_t index, gs_verbs_gid_entry *e)
{
    char path[512], text[64];
    int rc;

    memset(e, 0, sizeof(*e));
    if (ibv_query_gid(ctx, port, (int)index, &e->gid) != 0)
        return errno ? errno : EINVAL;
    e->gid_index = index;
    e->port_num = port;
    if (link_layer != IBV_LINK_LAYER_ETHERNET)
        return 0; /* InfiniBand: every GID is of type IB, no netdev */
    /* RoCE: the kernel names the type ("IB/RoCE v1" or "RoCE v2"); an unused entry reads EINVAL */
    snprintf(path, sizeof(path), "%s/%s/ports/%u/gid_attrs/types/%u", sysfs_root, dev_name, port, index);
    rc = read_line(path, text, sizeof(text));
    if (rc != 0)
        return rc;
    if (strcmp(text, "RoCE v2") == 0)
        e->gid_type = GS_VERBS_GID_TYPE_ROCE_V2;
    else if (strcmp(text, "IB/RoCE v1") == 0 || strcmp(text, "RoCE v1") == 0)
        e->gid_type = GS_VERBS_GID_TYPE_ROCE_V1;
    else
        return EPROTO;
    snprintf(path, sizeof(path), "%s/%s/ports/%u/gid_attrs/ndevs/%u", sysfs_root, dev_name, port, index);
    if (read_line(path, text, sizeof(text)) == 0)
        e->ndev_ifindex = if_nametoindex(text);
    return 0;
}

int gs_verbs_query_gid(struct ibv_context *ctx, const char *dev_name, uint8_t port, uint8_t link_layer,
                       uint32_t index, gs_verbs_gid_entry *e)
{
#ifdef GS_IB_HAVE_QUERY_GID_EX
    struct ibv_gid_entry ie;
    int rc = ibv_query_gid_ex(ctx, port, index, &ie, 0);
    (void)dev_name;
    (void)link_layer;
    if (rc != 0)
        return rc;
    *e = (gs_verbs_gid_entry){.gid = ie.gid,
                              .gid_index = ie.gid_index,
                              .port_num = ie.port_num,
                              .gid_type = ie.gid_type,
                              .ndev_ifindex = ie.ndev_ifindex};
    return 0;
#else
    return gs_verbs_query_gid_sysfs(ctx, SYSFS_ROOT, dev_name, port, link_layer, index, e);
#endif
}

static bool gid_is_zero(const union ibv_gid *gid)
{
    for (size_t i = 0; i < sizeof(gid->raw); i++)
        if (gid->raw[i])
            return false;
    return true;
}

#ifdef GS_IB_HAVE_QUERY_GID_TABLE
/* One ibv_query_gid_table call: the port's entries, or -1 where the call fails. */
static int read_gid_table(struct ibv_context *ctx, uint8_t port, int table_len, gs_verbs_gid_entry *out,
                          int cap)
{
    struct ibv_device_attr attr;
    size_t all;
    struct ibv_gid_entry *table;
    ssize_t got;
    int n = 0;

    if (ibv_query_device(ctx, &attr) != 0)
        return -1;
    all = (size_t)attr.phys_port_cnt * (size_t)(table_len > 0 ? table_len : 1);
    table = calloc(all, sizeof(*table));
    got = table ? ibv_query_gid_table(ctx, table, all, 0) : -ENOMEM;
    for (ssize_t i = 0; i < got && n < cap; i++)
        if (table[i].port_num == port)
            out[n++] = (gs_verbs_gid_entry){.gid = table[i].gid,
                                            .gid_index = table[i].gid_index,
                                            .port_num = table[i].port_num,
                                            .gid_type = table[i].gid_type,
                                            .ndev_ifindex = table[i].ndev_ifindex};
    free(table);
    return got < 0 ? -1 : n;
}
#endif

int gs_verbs_read_gids(struct ibv_context *ctx, const char *dev_name, uint8_t port, uint8_t link_layer,
                       int table_len, gs_verbs_gid_entry *out, int cap)
{
    int n = -1;
#ifdef GS_IB_HAVE_QUERY_GID_TABLE
    n = read_gid_table(ctx, port, table_len, out, cap);
#endif
    if (n >= 0)
        return n;
    n = 0; /* entry by entry */
    for (int i = 0; i < table_len && n < cap; i++)
        if (gs_verbs_query_gid(ctx, dev_name, port, link_layer, (uint32_t)i, &out[n]) == 0 &&
            !gid_is_zero(&out[n].gid))
            n++;
    return n;
}

bool gs_verbs_port_grh_required(const struct ibv_port_attr *attr)
{
#ifdef GS_IB_HAVE_PORT_FLAGS
    return (attr->flags & IBV_QPF_GRH_REQUIRED) != 0;
#else
    (void)attr;
    return false;
#endif
}

const char *gs_verbs_fork_state(void)
{
#ifdef GS_IB_HAVE_FORK_STATUS
    return ibv_is_fork_initialized() == IBV_FORK_UNNEEDED
               ? "the kernel copies pinned pages on fork, nothing to do"
               : "registered memory is excluded from children (MADV_DONTFORK)";
#else
    return "registered memory is excluded from children (MADV_DONTFORK; this libibverbs cannot tell "
           "whether the kernel makes that unneeded)";
#endif
}

const char *gs_verbs_compat_summary(void)
{
#if defined(GS_IB_HAVE_QUERY_GID_EX) && defined(GS_IB_HAVE_QUERY_GID_TABLE) &&                               \
    defined(GS_IB_HAVE_FORK_STATUS) && defined(GS_IB_HAVE_PORT_FLAGS)
    return "native";
#else
    return "compat (some of ibv_query_gid_ex, ibv_query_gid_table, ibv_is_fork_initialized, port flags "
           "replaced by fallbacks: GID types from sysfs gid_attrs)";
#endif
}
