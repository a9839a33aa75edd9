#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_tcp_frame (tests/fuzz/corpus/tcp_frame/):
byte streams a peer could send after the hello, in the wire format of
src/transport/tcp/tcp_proto.h. Keys are those the fuzz target gives its
regions: 0x100000000 (4 KiB, all access), 0x100000001 (2 KiB, remote read
only). Run from anywhere; it rewrites the folder's files."""
import os
import struct

WRITE, WRITE_IMM, READ_REQ, FETCH_ADD, CMP_SWAP, SEND = 1, 2, 3, 4, 5, 6
READ_RESP, ATOMIC_RESP, ACK, NAK, BYE, SWITCH = 16, 17, 18, 19, 20, 21
VERSION = 2  # GS_TCP_PROTO_VERSION
KEY, RO_KEY, ACK_REQ = 0x100000000, 0x100000001, 1


def hdr(op, seq=0, length=0, key=0, off=0, arg0=0, arg1=0, imm=0, flags=0, status=0, ack=0, version=VERSION):
    return struct.pack("<BBBBIQQQQQQQ", version, op, flags, status, imm, length, key, off, arg0, arg1, seq, ack)


def frames(*parts):
    return b"".join(parts)


def two(*segments):
    """A two-connection input: (connection, bytes) segments after the magic
    (0: the shared connection, 1: the peer's own)."""
    return b"GS2C" + b"".join(struct.pack("<BH", conn, len(data)) + data for conn, data in segments)


corpus = {
    "write_small": frames(hdr(WRITE, 0, 16, KEY, 8), b"0123456789abcdef"),
    "write_imm_signaled": frames(hdr(WRITE_IMM, 0, 8, KEY, 0, imm=7, flags=ACK_REQ), b"ABCDEFGH"),
    "write_whole_region": frames(hdr(WRITE, 0, 4096, KEY, 0), bytes(range(256)) * 16),
    "read_then_atomics": frames(hdr(READ_REQ, 0, 0, KEY, 64, arg0=128), hdr(FETCH_ADD, 1, 0, KEY, 8, arg0=5),
                                hdr(CMP_SWAP, 2, 0, KEY, 16, arg0=0, arg1=9)),
    "send_then_write": frames(hdr(SEND, 0, 5), b"hello", hdr(WRITE, 1, 4, KEY, 4000), b"tail"),
    "many_sends": frames(*[hdr(SEND, i, 3) + b"abc" for i in range(80)]),
    "read_only_region": frames(hdr(READ_REQ, 0, 0, RO_KEY, 0, arg0=2048), hdr(WRITE, 1, 4, RO_KEY, 0), b"nope"),
    "ack_and_bye": frames(hdr(ACK), hdr(BYE)),
    "write_past_end": frames(hdr(WRITE, 0, 32, KEY, 4080), b"x" * 32),
    "truncated_payload": frames(hdr(WRITE_IMM, 0, 100, KEY, 0, imm=1), b"y" * 40),
    "bad_version": frames(hdr(WRITE, 0, 4, KEY, 0, version=VERSION + 1), b"zzzz"),
    "switch_on_one_connection": frames(hdr(WRITE, 0, 4, KEY, 0), b"abcd", hdr(SWITCH)),
    "unsolicited_reply": frames(hdr(ATOMIC_RESP, 0, arg0=1)),
    "nak": frames(hdr(NAK, 0, status=7)),
    "two_switch_and_back": two((0, hdr(WRITE, 0, 4, KEY, 0) + b"abcd" + hdr(SWITCH)),
                               (1, hdr(WRITE_IMM, 1, 8, KEY, 8, imm=5) + b"side...." + hdr(SWITCH)),
                               (0, hdr(SEND, 2, 3) + b"end")),
    "two_side_before_switch": two((1, hdr(WRITE, 1, 4, KEY, 64) + b"late"),
                                  (0, hdr(WRITE, 0, 4, KEY, 0) + b"frst" + hdr(SWITCH))),
    "two_bytes_after_switch": two((0, hdr(SWITCH) + hdr(WRITE, 0, 4, KEY, 0) + b"oops")),
    "two_switch_then_eof": two((0, hdr(WRITE, 0, 4, KEY, 0) + b"abcd" + hdr(SWITCH))),
    "two_large_on_side": two((0, hdr(SWITCH)), (1, hdr(WRITE, 0, 4096, KEY, 0)),
                             (1, bytes(range(256)) * 16), (1, hdr(SWITCH)), (0, hdr(BYE))),
    "zero_length_ops": frames(hdr(WRITE, 0, 0, KEY, 4096), hdr(WRITE_IMM, 1, 0, KEY, 0, imm=3),
                              hdr(READ_REQ, 2, 0, KEY, 4096, arg0=0), hdr(SEND, 3, 0)),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "tcp_frame")
os.makedirs(here, exist_ok=True)
for name, data in corpus.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
print(f"wrote {len(corpus)} seeds to {here}")
