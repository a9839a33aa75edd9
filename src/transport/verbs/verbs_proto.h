/*
 * The verbs transport's formats: what ranks exchange through the bootstrap
 * store to connect a queue pair, and the control slot each rank keeps per
 * peer in a small registered region that the peer reaches with RDMA.
 * Fixed-width fields, version byte first, offsets never pointers.
 */
#ifndef GS_TRANSPORT_VERBS_PROTO_H
#define GS_TRANSPORT_VERBS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define GS_VERBS_PROTO_VERSION 3           /* 2: the partition key; 3: several queue pairs and devices */
#define GS_VERBS_CONN_MAGIC    0x53565347u /* "GSVS" */
#define GS_VERBS_QPS_MAX       16          /* queue pairs per peer (GS_IB_QPS_PER_PEER), the lanes */
#define GS_VERBS_RAILS_MAX     2 /* devices (GS_IB_RAILS): rail 1's rkey rides in the key's high half */

/*
 * The connection blob rank src publishes for rank dst (store key
 * "gs.verbs.<open>.<src>.<dst>"): everything dst needs to move its queue
 * pair to RTR and RTS against the queue pair src dedicated to it.
 */
typedef struct gs_verbs_conn_blob {
    uint8_t version;    /* GS_VERBS_PROTO_VERSION */
    uint8_t link_layer; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    uint8_t mtu;        /* enum ibv_mtu: src's active port MTU */
    uint8_t gid_type;   /* enum ibv_gid_type of the GID below */
    uint32_t magic;     /* GS_VERBS_CONN_MAGIC */
    uint32_t src_rank;
    uint32_t dst_rank;
    uint32_t qpn;       /* src's queue pair for dst */
    uint32_t psn;       /* its initial packet sequence number (24 bits) */
    uint16_t lid;       /* InfiniBand: the port's LID */
    uint8_t gid_index;  /* src's own GID index (informational) */
    uint8_t rd_atomic;  /* READ/atomic requests src accepts in flight from dst */
    uint32_t rq_depth;  /* receives src keeps posted for dst's WRITE_IMM/SEND */
    uint8_t gid[16];    /* RoCE: the address; InfiniBand: the port GID */
    uint64_t ctrl_addr; /* src's control slot for dst (struct gs_verbs_ctrl) */
    uint32_t ctrl_rkey;
    uint16_t pkey; /* the partition key src's queue pair uses (membership bit included) */
    uint8_t lanes; /* queue pairs src dedicated to dst, 1-GS_VERBS_QPS_MAX: both sides must agree */
    uint8_t rails; /* devices src uses, 1-GS_VERBS_RAILS_MAX (lane l on rail l mod rails): the same */
    uint32_t lane_qpn[GS_VERBS_QPS_MAX - 1]; /* the side lanes' queue pairs (1 ..); zero past lanes - 1 */
    uint32_t reserved2;                      /* zero */
    /* rail 1 (the second device), all zero with one rail: its address, as lid/gid/mtu/gid_type above */
    uint8_t rail_gid[16];
    uint16_t rail_lid;
    uint8_t rail_mtu;
    uint8_t rail_gid_type;
    uint32_t reserved3; /* zero */
    uint64_t reserved4; /* zero */
} gs_verbs_conn_blob;

_Static_assert(offsetof(gs_verbs_conn_blob, version) == 0, "version byte first");
_Static_assert(offsetof(gs_verbs_conn_blob, qpn) == 16 && offsetof(gs_verbs_conn_blob, gid) == 32 &&
                   offsetof(gs_verbs_conn_blob, ctrl_addr) == 48 &&
                   offsetof(gs_verbs_conn_blob, pkey) == 60 && offsetof(gs_verbs_conn_blob, lane_qpn) == 64 &&
                   offsetof(gs_verbs_conn_blob, rail_gid) == 128,
               "blob layout");
_Static_assert(sizeof(gs_verbs_conn_blob) == 160, "blob size");

/*
 * The immediate's notice of a striped WRITE_IMM: its stripes go as plain
 * WRITEs on every lane, and once all of them completed at the initiator
 * (acknowledged, so in the target's memory) lane 0 carries this as a
 * SEND_WITH_IMM (the user's immediate) into one of the target's receives.
 * The target reports it as the WRITE_IMM's one GS_WC_RECV_IMM with len
 * (a WRITE_IMM's own byte count would be its last stripe's only). User
 * SENDs never carry an immediate, so the two cannot be confused.
 */
#define GS_VERBS_NOTICE_MAGIC 0x4d4d4947u /* "GIMM" */
typedef struct gs_verbs_imm_notice {
    uint32_t magic; /* GS_VERBS_NOTICE_MAGIC */
    uint32_t reserved;
    uint64_t len; /* bytes the WRITE_IMM wrote */
} gs_verbs_imm_notice;
_Static_assert(sizeof(gs_verbs_imm_notice) == 16, "notice size");

/*
 * What every rank tells the others after each collective step of the open
 * (store key "gs.verbs.<open>.<step>", an allgather): how its part went and,
 * if it failed, why. Every rank then draws the same verdict from the same
 * notes, so either all of them use the transport or none does.
 */
typedef struct gs_verbs_open_note {
    int32_t status; /* gs_status of this rank's part of the step */
    uint32_t rank;
    char why[376]; /* gs_last_error() of the failure, NUL-terminated; "" on success */
} gs_verbs_open_note;

_Static_assert(sizeof(gs_verbs_open_note) == 384, "open note size");

/* Written into a peer's `closed` word when a rank closes its transport. */
#define GS_VERBS_CLOSED_MAGIC 0x6465736f6c63ull /* "closed" */

/*
 * One control slot per peer, 64 bytes, in a region registered for local
 * write, remote write and remote read. The first words are written or read
 * by the peer's HCA; the rest are local sources and landing places of this
 * rank's own control operations towards that peer.
 */
typedef struct gs_verbs_ctrl {
    uint64_t credits;     /* peer writes: receives it re-posted for this rank (total) */
    uint64_t closed;      /* peer writes GS_VERBS_CLOSED_MAGIC when it closes */
    uint64_t hb_target;   /* peer reads: its heartbeat target */
    uint64_t credits_out; /* local: source of this rank's credit WRITE to the peer */
    uint64_t closed_out;  /* local: source of this rank's close notice */
    uint64_t hb_result;   /* local: landing of this rank's heartbeat READ */
    uint64_t reserved[2];
} gs_verbs_ctrl;

_Static_assert(sizeof(gs_verbs_ctrl) == 64, "one cache line per peer");
_Static_assert(offsetof(gs_verbs_ctrl, credits) % 8 == 0, "credit word 8-byte aligned");

#endif
