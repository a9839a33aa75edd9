/* Checks of everything that arrives on a tcp connection before it is acted
 * on: hellos and frame headers. Pure functions (no state, no I/O), so the
 * fuzzer and the unit tests can drive them directly. */
#include "transport/tcp/tcp_proto.h"

#include <string.h>

const char *gs_tcp_op_name(unsigned op)
{
    switch (op) {
    case GS_TCP_OP_WRITE: return "WRITE";
    case GS_TCP_OP_WRITE_IMM: return "WRITE_IMM";
    case GS_TCP_OP_READ_REQ: return "READ";
    case GS_TCP_OP_FETCH_ADD: return "FETCH_ADD";
    case GS_TCP_OP_CMP_SWAP: return "CMP_SWAP";
    case GS_TCP_OP_SEND: return "SEND";
    case GS_TCP_OP_READ_RESP: return "READ_RESP";
    case GS_TCP_OP_ATOMIC_RESP: return "ATOMIC_RESP";
    case GS_TCP_OP_ACK: return "ACK";
    case GS_TCP_OP_NAK: return "NAK";
    case GS_TCP_OP_BYE: return "BYE";
    case GS_TCP_OP_SWITCH: return "SWITCH";
    default: return "unknown op";
    }
}

/* Which header fields an op may use; the others must be zero. */
enum { F_IMM = 1, F_KEY = 2, F_OFF = 4, F_ARG0 = 8, F_ARG1 = 16, F_FLAGS = 32, F_STATUS = 64 };

static unsigned fields_of(unsigned op)
{
    switch (op) {
    case GS_TCP_OP_WRITE: return F_KEY | F_OFF | F_FLAGS;
    case GS_TCP_OP_WRITE_IMM: return F_IMM | F_KEY | F_OFF | F_FLAGS;
    case GS_TCP_OP_READ_REQ: return F_KEY | F_OFF | F_ARG0 | F_FLAGS;
    case GS_TCP_OP_FETCH_ADD: return F_KEY | F_OFF | F_ARG0 | F_FLAGS;
    case GS_TCP_OP_CMP_SWAP: return F_KEY | F_OFF | F_ARG0 | F_ARG1 | F_FLAGS;
    case GS_TCP_OP_SEND: return F_FLAGS;
    case GS_TCP_OP_ATOMIC_RESP: return F_ARG0;
    case GS_TCP_OP_NAK: return F_STATUS;
    default: return 0;
    }
}

static int known_op(unsigned op)
{
    return gs_tcp_op_is_request(op) || (op >= GS_TCP_OP_READ_RESP && op <= GS_TCP_OP_SWITCH);
}

/* Whether the op may carry len payload bytes. */
static const char *check_len(const gs_tcp_hdr *hdr)
{
    switch (hdr->op) {
    case GS_TCP_OP_WRITE:
    case GS_TCP_OP_WRITE_IMM:
    case GS_TCP_OP_READ_RESP:
        return hdr->len <= GS_TCP_MAX_PAYLOAD ? NULL : "payload length beyond the protocol's bound";
    case GS_TCP_OP_SEND: return hdr->len <= GS_SEND_MAX ? NULL : "SEND longer than GS_SEND_MAX";
    default: return hdr->len == 0 ? NULL : "payload on an op that carries none";
    }
}

static const char *check_unused_fields(const gs_tcp_hdr *hdr)
{
    unsigned used = fields_of(hdr->op);
    if (!(used & F_IMM) && hdr->imm)
        return "immediate on an op that carries none";
    if (!(used & F_KEY) && hdr->key)
        return "region key on an op that names no region";
    if (!(used & F_OFF) && hdr->off)
        return "offset on an op that names no region";
    if (!(used & F_ARG0) && hdr->arg0)
        return "argument on an op that takes none";
    if (!(used & F_ARG1) && hdr->arg1)
        return "second argument on an op that takes none";
    if (!(used & F_FLAGS) && hdr->flags)
        return "flags on a reply";
    if (hdr->flags & ~(unsigned)GS_TCP_F_ALL)
        return "unknown flag bits";
    if (!(used & F_STATUS) && hdr->status)
        return "status on an op that carries none";
    return NULL;
}

/* Numbering: requests come in order; replies name a request already sent;
 * acks grow and never pass what was sent. */
static const char *check_numbers(const gs_tcp_hdr *hdr, const gs_tcp_rx_expect *expect)
{
    if (hdr->ack < expect->acked)
        return "acknowledgement went backwards";
    if (hdr->ack > expect->sent_reqs)
        return "acknowledgement of requests never sent";
    if (gs_tcp_op_is_request(hdr->op))
        return hdr->seq == expect->next_seq ? NULL : "request out of sequence";
    if (hdr->op == GS_TCP_OP_READ_RESP || hdr->op == GS_TCP_OP_ATOMIC_RESP || hdr->op == GS_TCP_OP_NAK)
        return hdr->seq < expect->sent_reqs ? NULL : "reply to a request never sent";
    return hdr->seq == 0 ? NULL : "sequence number on a control frame";
}

static const char *check_status(const gs_tcp_hdr *hdr)
{
    int status = -(int)hdr->status;
    if (hdr->op != GS_TCP_OP_NAK)
        return NULL;
    if (status == GS_ERR_REMOTE_ACCESS || status == GS_ERR_PROTOCOL || status == GS_ERR_INVALID)
        return NULL;
    return "NAK with a status that is not a remote error";
}

gs_status gs_tcp_hdr_check(const gs_tcp_hdr *hdr, const gs_tcp_rx_expect *expect, const char **why_p)
{
    const char *why = NULL;
    if (hdr->version != GS_TCP_PROTO_VERSION)
        why = "unsupported protocol version";
    else if (!known_op(hdr->op))
        why = "unknown op";
    if (!why)
        why = check_unused_fields(hdr);
    if (!why)
        why = check_len(hdr);
    if (!why)
        why = check_numbers(hdr, expect);
    if (!why)
        why = check_status(hdr);
    if (why) {
        *why_p = why;
        return GS_ERR_PROTOCOL;
    }
    return GS_OK;
}

/* Compares n bytes in time independent of where they differ. */
static int equal_const_time(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint8_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

void gs_tcp_hello_fill(gs_tcp_hello *hello, int kind, int rank, int size, uint32_t instance,
                       const uint8_t nonce[GS_TCP_NONCE_BYTES], const char *token)
{
    size_t token_len = strnlen(token, GS_TCP_TOKEN_BYTES);
    memset(hello, 0, sizeof(*hello));
    hello->version = GS_TCP_PROTO_VERSION;
    hello->kind = (uint8_t)kind;
    hello->token_len = (uint16_t)token_len;
    hello->magic = GS_TCP_HELLO_MAGIC;
    hello->rank = (uint32_t)rank;
    hello->size = (uint32_t)size;
    hello->instance = instance;
    memcpy(hello->nonce, nonce, GS_TCP_NONCE_BYTES);
    memcpy(hello->token, token, token_len);
}

gs_status gs_tcp_hello_check(const gs_tcp_hello *hello, int kind, int size, uint32_t instance,
                             const uint8_t nonce[GS_TCP_NONCE_BYTES], const char *token, const char **why_p)
{
    gs_tcp_hello expected;
    int token_ok, nonce_ok;

    if (hello->magic != GS_TCP_HELLO_MAGIC || hello->version != GS_TCP_PROTO_VERSION || hello->kind != kind ||
        hello->reserved != 0) {
        *why_p = "not a gradsync tcp hello of this protocol version";
        return GS_ERR_PROTOCOL;
    }
    gs_tcp_hello_fill(&expected, kind, 0, size, instance, nonce, token);
    /* both compares always run, over the full fixed-size fields */
    token_ok = equal_const_time(hello->token, expected.token, GS_TCP_TOKEN_BYTES) &
               (hello->token_len == expected.token_len);
    nonce_ok = equal_const_time(hello->nonce, expected.nonce, GS_TCP_NONCE_BYTES);
    if (!token_ok) {
        *why_p = "wrong job token (GS_JOB_TOKEN)";
        return GS_ERR_AUTH;
    }
    if (!nonce_ok) {
        *why_p = "wrong listener nonce (not a member of this job's transport)";
        return GS_ERR_AUTH;
    }
    if (hello->size != (uint32_t)size || hello->instance != instance) {
        *why_p = "hello from another job or transport instance (world size or instance differs)";
        return GS_ERR_AUTH;
    }
    if (hello->rank >= (uint32_t)size) {
        *why_p = "hello claims a rank outside the job";
        return GS_ERR_AUTH;
    }
    return GS_OK;
}
