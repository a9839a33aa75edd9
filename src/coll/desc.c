/*
 * Call descriptors: what every rank must agree on (collective, count, type,
 * operator, root, algorithm, sequence number). Each message carries its
 * sender's descriptor; a receiver that finds a different one fails the call
 * with GS_ERR_MISMATCH naming both sides (the engine then tells every peer).
 */
#include "coll/coll.h"

#include "util/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *algo_name(unsigned id)
{
    static const char *const names[] = {
        [GS_COLL_ALGO_LOCAL] = "local",   [GS_COLL_ALGO_RING] = "ring",         [GS_COLL_ALGO_RD] = "rd",
        [GS_COLL_ALGO_DIRECT] = "direct", [GS_COLL_ALGO_PAIRWISE] = "pairwise",
    };
    return id < sizeof(names) / sizeof(names[0]) ? names[id] : "?";
}

const char *gs_coll_kind_name(gs_coll_kind kind)
{
    switch (kind) {
    case GS_COLL_ALLREDUCE: return "allreduce";
    case GS_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case GS_COLL_ALLGATHER: return "allgather";
    case GS_COLL_BROADCAST: return "broadcast";
    case GS_COLL_BARRIER: return "barrier";
    case GS_COLL_ALLREDUCE_MULTI: return "allreduce_multi";
    case GS_COLL_REDUCE: return "reduce";
    case GS_COLL_GATHER: return "gather";
    case GS_COLL_SCATTER: return "scatter";
    case GS_COLL_ALLTOALL: return "alltoall";
    case GS_COLL_ALLTOALLV: return "alltoallv";
    case GS_COLL_ALLGATHERV: return "allgatherv";
    case GS_COLL_REDUCE_SCATTER_V: return "reduce_scatter_v";
    case GS_COLL_KIND_END: break;
    }
    return "unknown collective";
}

void gs_desc_fill(const gs_coll_op *op, gs_coll_hdr *hdr, uint32_t unit, size_t bytes)
{
    hdr->version = GS_COLL_PROTO_VERSION;
    hdr->kind = (uint8_t)op->kind;
    hdr->dtype = (uint8_t)op->dtype;
    hdr->op = (uint8_t)op->redop;
    hdr->algo = (uint8_t)op->algo->id;
    hdr->flags = 0;
    memset(hdr->pad, 0, sizeof(hdr->pad));
    hdr->root = op->root;
    hdr->sender = (uint32_t)op->comm->rank;
    hdr->seq = op->seq;
    hdr->count = op->count;
    hdr->unit = unit;
    hdr->bytes = (uint32_t)bytes;
    hdr->reserved = 0;
}

void gs_desc_fill_peer(const gs_coll_op *op, gs_coll_hdr *hdr, int peer)
{
    if (op->kind == GS_COLL_ALLTOALLV) { /* both directions, so both ranks of a pair see a disagreement */
        hdr->count = op->scounts[peer];
        hdr->reserved = op->rcounts[peer];
    }
}

/* alltoallv: whether the counts of hdr's sender and op's rank agree both ways. */
static bool pair_counts_agree(const gs_coll_op *op, const gs_coll_hdr *hdr)
{
    return hdr->sender < (uint32_t)op->comm->size && hdr->count == op->rcounts[hdr->sender] &&
           hdr->reserved == op->scounts[hdr->sender];
}

bool gs_desc_same(const gs_coll_op *op, const gs_coll_hdr *hdr)
{
    bool counts = op->kind == GS_COLL_ALLTOALLV ? pair_counts_agree(op, hdr) : hdr->count == op->count;
    return hdr->kind == (uint8_t)op->kind && hdr->dtype == (uint8_t)op->dtype &&
           hdr->op == (uint8_t)op->redop && hdr->algo == (uint8_t)op->algo->id && hdr->root == op->root &&
           hdr->seq == op->seq && counts;
}

/* The call in words, as the user wrote it. */
static void format(char *buf, size_t cap, unsigned kind, unsigned dtype, unsigned op, int32_t root,
                   uint64_t count, uint64_t seq, unsigned algo)
{
    const char *k = gs_coll_kind_name((gs_coll_kind)kind);
    const char *t = gs_dtype_name((gs_dtype)dtype), *o = gs_redop_name((gs_redop)op);
    switch (kind) {
    case GS_COLL_BARRIER: snprintf(buf, cap, "%s #%" PRIu64 " ()", k, seq); break;
    case GS_COLL_ALLGATHER:
        snprintf(buf, cap, "%s #%" PRIu64 " (count %" PRIu64 ", %s)", k, seq, count, t);
        break;
    case GS_COLL_BROADCAST:
        snprintf(buf, cap, "%s #%" PRIu64 " (count %" PRIu64 ", %s, root %d)", k, seq, count, t, (int)root);
        break;
    case GS_COLL_ALLREDUCE_MULTI:
        snprintf(buf, cap, "%s #%" PRIu64 " (total count %" PRIu64 ", %s, %s, tensor list 0x%08x)", k, seq,
                 count, t, o, (unsigned)root);
        break;
    case GS_COLL_REDUCE:
        snprintf(buf, cap, "%s #%" PRIu64 " (count %" PRIu64 ", %s, %s, root %d)", k, seq, count, t, o,
                 (int)root);
        break;
    case GS_COLL_GATHER:
    case GS_COLL_SCATTER:
        snprintf(buf, cap, "%s #%" PRIu64 " (count %" PRIu64 ", %s, root %d)", k, seq, count, t, (int)root);
        break;
    case GS_COLL_ALLTOALL:
        snprintf(buf, cap, "%s #%" PRIu64 " (count %" PRIu64 " per rank, %s)", k, seq, count, t);
        break;
    case GS_COLL_ALLTOALLV: snprintf(buf, cap, "%s #%" PRIu64 " (%s)", k, seq, t); break;
    case GS_COLL_ALLGATHERV:
        snprintf(buf, cap, "%s #%" PRIu64 " (total count %" PRIu64 ", %s, counts 0x%08x)", k, seq, count, t,
                 (unsigned)root);
        break;
    case GS_COLL_REDUCE_SCATTER_V:
        snprintf(buf, cap, "%s #%" PRIu64 " (total count %" PRIu64 ", %s, %s, counts 0x%08x)", k, seq, count,
                 t, o, (unsigned)root);
        break;
    default: snprintf(buf, cap, "%s #%" PRIu64 " (count %" PRIu64 ", %s, %s)", k, seq, count, t, o); break;
    }
    size_t used = strlen(buf);
    if (used < cap)
        snprintf(buf + used, cap - used, " [%s]", algo_name(algo));
}

void gs_desc_format_op(const gs_coll_op *op, char *buf, size_t cap)
{
    format(buf, cap, op->kind, op->dtype, op->redop, op->root, op->count, op->seq, op->algo->id);
}

void gs_desc_format_hdr(const gs_coll_hdr *hdr, char *buf, size_t cap)
{
    format(buf, cap, hdr->kind, hdr->dtype, hdr->op, hdr->root, hdr->count, hdr->seq, hdr->algo);
}

gs_status gs_desc_mismatch(gs_comm *comm, const gs_coll_op *op, const gs_coll_hdr *hdr, const char *what)
{
    char mine[200], theirs[200], text[600];
    gs_desc_format_op(op, mine, sizeof(mine));
    gs_desc_format_hdr(hdr, theirs, sizeof(theirs));
    if (op->kind == GS_COLL_ALLTOALLV && hdr->kind == GS_COLL_ALLTOALLV && hdr->seq == op->seq &&
        hdr->sender < (uint32_t)comm->size && !pair_counts_agree(op, hdr))
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_MISMATCH,
                       "mismatched collective calls: rank %d called %s sending rank %u %zu elements and "
                       "receiving %zu from it, but rank %u called %s receiving %" PRIu64
                       " and sending it %" PRIu64,
                       comm->rank, mine, hdr->sender, op->scounts[hdr->sender], op->rcounts[hdr->sender],
                       hdr->sender, theirs, hdr->reserved, hdr->count);
    snprintf(text, sizeof(text), "mismatched collective calls: rank %d called %s but rank %u called %s%s%s",
             comm->rank, mine, hdr->sender, theirs, *what ? ": " : "", what);
    if (hdr->algo != (uint8_t)op->algo->id && hdr->kind == (uint8_t)op->kind && hdr->count == op->count)
        snprintf(text + strlen(text), sizeof(text) - strlen(text), " (set GS_ALGO alike on every rank)");
    return gs_fail(GS_SUBSYS_COLL, GS_ERR_MISMATCH, "%s", text);
}

gs_status gs_desc_check(gs_comm *comm, const gs_coll_op *op, const gs_coll_hdr *hdr, int peer, uint32_t unit,
                        size_t bytes)
{
    if (!gs_desc_same(op, hdr))
        return gs_desc_mismatch(comm, op, hdr, "");
    if (hdr->sender != (uint32_t)peer || hdr->unit != unit || hdr->bytes != bytes) {
        char mine[200];
        gs_desc_format_op(op, mine, sizeof(mine));
        return gs_fail(GS_SUBSYS_COLL, GS_ERR_PROTOCOL,
                       "rank %d in %s: message from rank %u is step 0x%x with %u bytes, expected step 0x%x "
                       "with %zu bytes from rank %d",
                       comm->rank, mine, hdr->sender, hdr->unit, hdr->bytes, unit, bytes, peer);
    }
    return GS_OK;
}
