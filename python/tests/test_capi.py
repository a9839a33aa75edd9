"""The ctypes bindings of the C API (gradsync.Context, Comm, Request,
ParameterServer) on 1-3 ranks over shm and tcp: every collective, blocking
and not, the fused and uneven ones too, against numpy references (bitwise:
the inputs are small integers, exact in every type), send/recv, split and
groups, abort, a deadline, torch tensors written in place, errors as
exceptions, the store calls and an external store (torch's TCPStore), the
parameter server's SGD with 2 workers and 1 server, and importing the
package without torch.

Each test forks its ranks (gradsync's own store on 127.0.0.1, a free port)
and kills what is left at its deadline; no process or /dev/shm segment
stays behind.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/test_capi.py [-k NAME] [-v]
"""
import ctypes
import datetime
import functools
import gc
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
import weakref

import numpy as np
import torch

import gradsync

RUN_TIMEOUT = 90  # seconds for one multi-rank run, every rank included
CTX_TIMEOUT = 20  # the ranks' deadline of every wait: an error comes well before RUN_TIMEOUT
TRANSPORTS = ("shm", "tcp")
NP_DTYPES = (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.int8, np.int16, np.bool_)
INTEGER = (np.int32, np.int64, np.uint8, np.int8, np.int16)
COUNTS = (0, 1, 5, 1000, 70001)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, tmp, body, args):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the test
    os.environ.update(GS_RANK=str(rank), GS_WORLD_SIZE=str(world), GS_STORE="127.0.0.1:%d" % port,
                      GS_TIMEOUT_MS=str(CTX_TIMEOUT * 1000))
    code = 0
    try:
        body(rank, world, *args)
    except BaseException:
        with open(os.path.join(tmp, "%d.err" % rank), "w") as f:
            f.write(traceback.format_exc())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(world, body, *args, timeout=RUN_TIMEOUT):
    """Runs body(rank, world, *args) in `world` forked processes; raises AssertionError with every
    failed rank's traceback. A rank still running at the deadline is killed (and fails)."""
    # the ranks read their configuration at the library's first use: the parent must not have used it
    assert gradsync._lib._lib is None, "the test process loaded libgradsync before forking its ranks"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        pids = {}
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                _rank_main(rank, world, port, tmp, body, args)
            pids[rank] = pid
        status = _reap(pids, time.monotonic() + timeout)
        failed = []
        for rank in range(world):
            path = os.path.join(tmp, "%d.err" % rank)
            if os.path.exists(path):
                with open(path) as f:
                    failed.append("rank %d:\n%s" % (rank, f.read()))
            elif status[rank] != 0:
                failed.append("rank %d: %s" % (rank, status[rank]))
        if failed:
            raise AssertionError("\n".join(failed))


def _reap(pids, deadline):
    status, left = {}, dict(pids)
    while left:
        for rank, pid in list(left.items()):
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status[rank] = os.waitstatus_to_exitcode(st)
                del left[rank]
        if left and time.monotonic() > deadline:
            for rank, pid in left.items():
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status[rank] = "still running at the deadline: killed"
            break
        time.sleep(0.005)
    return status


def open_comm(rank, world, transport):
    ctx = gradsync.Context(rank=rank, world_size=world, store=os.environ["GS_STORE"], timeout=CTX_TIMEOUT)
    return ctx, gradsync.Comm(ctx, transport)


def values(rank, n, dtype, offset=0):
    """Rank's input: small integers (-5..5), exact in every type; bool: every third."""
    v = (np.arange(n) * 3 + rank * 7 + offset) % 11 - 5
    return (v % 3 == 0) if dtype == np.bool_ else v.astype(dtype)


UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
          "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def reference(op, arrays):
    """The reduction in the arrays' own type: integer sums wrap, bool sum is or, as gradsync does."""
    return functools.reduce(UFUNCS[op], arrays)


def equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- the bodies -------------------------------------------------------------------

def body_allreduce(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    assert (comm.rank, comm.size, comm.transport) == (rank, world, transport)
    for dtype in NP_DTYPES:
        bitwise = dtype in INTEGER or dtype == np.bool_
        ops = ("sum", "min", "max", "prod") + (("band", "bor", "bxor") if bitwise else ())
        for n in COUNTS:
            for op in ops if n == 5 else ("sum",):
                want = reference(op, [values(r, n, dtype) for r in range(world)])
                t = values(rank, n, dtype)
                assert comm.allreduce(t, op=op) is t  # in place
                assert equal(t, want), (dtype, n, op, t, want)
            out = np.full(n, 7, dtype)
            src = values(rank, n, dtype)
            comm.allreduce(src, out, gradsync.Op.MAX)
            assert equal(out, reference("max", [values(r, n, dtype) for r in range(world)])), (dtype, n)
            assert equal(src, values(rank, n, dtype))
    t = values(rank, 12, np.float64)
    comm.allreduce(t, op="avg")
    assert np.array_equal(t, sum(values(r, 12, np.float64) for r in range(world)) / world)
    m = values(rank, 20, np.int64).reshape(4, 5)  # a 2-D array is its 20 elements
    comm.allreduce(m)
    assert equal(m, reference("sum", [values(r, 20, np.int64).reshape(4, 5) for r in range(world)]))
    comm.destroy()
    ctx.close()


def body_rooted_and_alltoall(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    for dtype in (np.float32, np.int8, np.uint8, np.float16, np.bool_):
        for n in (0, 1, 7, 3001):
            for root in range(world):
                t = values(rank, n, dtype, root)
                out = comm.reduce(t, np.zeros(n, dtype) if rank == root else None, "sum", root)
                if rank == root:
                    assert equal(out, reference("sum", [values(r, n, dtype, root) for r in range(world)]))
                else:
                    assert out is None
                b = values(rank, n, dtype, 1) if rank == root else np.zeros(n, dtype)
                comm.broadcast(b, root)
                assert equal(b, values(root, n, dtype, 1)), (dtype, n, root)
                full = np.zeros(world * n, dtype) if rank == root else None
                comm.gather(values(rank, n, dtype, 2), full, root)
                if rank == root:
                    assert equal(full, np.concatenate([values(r, n, dtype, 2) for r in range(world)]))
                part = np.zeros(n, dtype)
                comm.scatter(values(root, world * n, dtype, 3) if rank == root else None, part, root)
                assert equal(part, values(root, world * n, dtype, 3)[rank * n:(rank + 1) * n])
            gathered = np.zeros(world * n, dtype)
            comm.allgather(values(rank, n, dtype), gathered)
            assert equal(gathered, np.concatenate([values(r, n, dtype) for r in range(world)]))
            full = [values(r, world * n, dtype, 4) for r in range(world)]
            mine = np.zeros(n, dtype)
            comm.reduce_scatter(full[rank], mine, "max")
            assert equal(mine, reference("max", full)[rank * n:(rank + 1) * n])
            sent = values(rank, world * n, dtype, 5)
            got = comm.alltoall(sent, np.zeros(world * n, dtype))
            want = np.concatenate([values(q, world * n, dtype, 5)[rank * n:(rank + 1) * n]
                                   for q in range(world)])
            assert equal(got, want)
            comm.alltoall(sent)  # in place
            assert equal(sent, want)
    gathered = np.zeros(world * 4, np.int32)  # allgather in place: this rank's block already there
    gathered[rank * 4:(rank + 1) * 4] = values(rank, 4, np.int32)
    comm.allgather(gathered[rank * 4:(rank + 1) * 4], gathered)
    assert equal(gathered, np.concatenate([values(r, 4, np.int32) for r in range(world)]))
    for _ in range(3):
        comm.barrier()
    comm.destroy()
    ctx.close()


def body_nonblocking(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    n = 40000
    bufs = [values(rank, n + i, np.float32, i) for i in range(4)]
    reqs = [comm.iallreduce(b) for b in bufs]
    gathered = np.zeros(world * 9, np.int64)
    reqs.append(comm.iallgather(values(rank, 9, np.int64), gathered))
    reqs.append(comm.ibarrier())
    bcast = values(rank, 33, np.int16)
    reqs.append(comm.ibroadcast(bcast, world - 1))
    red = np.zeros(17, np.float64)
    reqs.append(comm.ireduce(values(rank, 17, np.float64), red if rank == 0 else None, "min", 0))
    rs = np.zeros(5, np.int32)
    reqs.append(comm.ireduce_scatter(values(rank, world * 5, np.int32), rs))
    ga = np.zeros(world * 3, np.uint8) if rank == 0 else None
    reqs.append(comm.igather(values(rank, 3, np.uint8), ga, 0))
    sc = np.zeros(6, np.float16)
    reqs.append(comm.iscatter(values(0, world * 6, np.float16) if rank == 0 else None, sc, 0))
    a2a = np.zeros(world * 2, np.int8)
    reqs.append(comm.ialltoall(values(rank, world * 2, np.int8), a2a))
    # a buffer only the request holds stays alive until it completes
    gone = weakref.ref(reqs[-1]._buffers[0].obj)
    gc.collect()
    assert gone() is not None
    polls = 0
    while not all([r.test() for r in reqs[:3]]):
        polls += 1
    for r in reqs:
        r.wait()
        assert r.done and r.test()  # a finished request answers again, without C
    gc.collect()
    assert gone() is None
    assert not comm._pending
    for i, b in enumerate(bufs):
        assert equal(b, reference("sum", [values(r, n + i, np.float32, i) for r in range(world)]))
    assert equal(gathered, np.concatenate([values(r, 9, np.int64) for r in range(world)]))
    assert equal(bcast, values(world - 1, 33, np.int16))
    if rank == 0:
        assert equal(red, reference("min", [values(r, 17, np.float64) for r in range(world)]))
        assert equal(ga, np.concatenate([values(r, 3, np.uint8) for r in range(world)]))
    assert equal(rs, reference("sum", [values(r, world * 5, np.int32) for r in range(world)])[rank * 5:][:5])
    assert equal(sc, values(0, world * 6, np.float16)[rank * 6:(rank + 1) * 6])
    assert equal(a2a, np.concatenate([values(q, world * 2, np.int8)[rank * 2:][:2] for q in range(world)]))
    comm.destroy()
    ctx.close()


def body_fused_and_uneven(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    for nb in (False, True):
        bufs = [values(rank, n, np.int32, n) for n in (0, 5, 1000)]
        req = comm.iallreduce_multi(bufs, "max") if nb else comm.allreduce_multi(bufs, "max")
        if nb:
            req.wait()
        for b, n in zip(bufs, (0, 5, 1000)):
            assert equal(b, reference("max", [values(r, n, np.int32, n) for r in range(world)]))
        counts = [q + 1 for q in range(world)]  # rank q gives q + 1 elements
        out = np.zeros(sum(counts), np.float64)
        args = (values(rank, rank + 1, np.float64), out, counts)
        req = comm.iallgatherv(*args) if nb else comm.allgatherv(*args)
        if nb:
            req.wait()
        assert equal(out, np.concatenate([values(q, q + 1, np.float64) for q in range(world)]))
        gaps = np.full(3 * world, -1, np.int16)  # at displacements 3q, leaving gaps
        comm.allgatherv(values(rank, rank + 1, np.int16), gaps, counts, [3 * q for q in range(world)])
        for q in range(world):
            assert equal(gaps[3 * q:3 * q + q + 1], values(q, q + 1, np.int16))
        counts = [q + 2 for q in range(world)]
        mine = np.zeros(counts[rank], np.int64)
        full = [values(r, sum(counts), np.int64) for r in range(world)]
        args = (full[rank], mine, counts)
        req = comm.ireduce_scatter_v(*args) if nb else comm.reduce_scatter_v(*args)
        if nb:
            req.wait()
        at = sum(counts[:rank])
        assert equal(mine, reference("sum", full)[at:at + counts[rank]])
        # alltoallv: rank r sends (r + q) % 3 + 1 elements to rank q
        sc = [(rank + q) % 3 + 1 for q in range(world)]
        rc = [(p + rank) % 3 + 1 for p in range(world)]
        got = np.zeros(sum(rc), np.uint8)
        args = (values(rank, sum(sc), np.uint8), sc, got, rc)
        req = comm.ialltoallv(*args) if nb else comm.alltoallv(*args)
        if nb:
            req.wait()
        want = []
        for p in range(world):
            p_counts = [(p + q) % 3 + 1 for q in range(world)]
            at = sum(p_counts[:rank])
            want.append(values(p, sum(p_counts), np.uint8)[at:at + p_counts[rank]])
        assert equal(got, np.concatenate(want))
    if world > 1:
        one = np.zeros(1, np.float32)
        expect_value_error(lambda: comm.allgatherv(one, np.zeros(world, np.float32), [1]),
                           "1 counts, expected %d" % world)
        expect_value_error(lambda: comm.allgatherv(one, np.zeros(1, np.float32), [1] * world),
                           "recvbuf: 1 elements, the blocks reach to %d" % world)
    comm.destroy()
    ctx.close()


def body_send_recv(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    right, left = (rank + 1) % world, (rank - 1) % world
    for n in (0, 1, 1000, 70001):  # eager and large (the receiver READs it)
        got = np.zeros(n, np.float64)
        rreq = comm.irecv(got, left, tag=n)
        comm.send(values(rank, n, np.float64), right, tag=n)
        st = rreq.wait()
        assert st == gradsync.RecvStatus(left, n, n) and rreq.result == st
        assert equal(got, values(left, n, np.float64))
    if world > 1:  # any source, in the order the tags ask for
        if rank == 0:
            seen = set()
            for _ in range(world - 1):
                buf = np.zeros(3, np.int32)
                st = comm.recv(buf, gradsync.ANY_SOURCE, tag=5)
                assert equal(buf, values(st.source, 3, np.int32)) and st.count == 3
                seen.add(st.source)
            assert seen == set(range(1, world))
        else:
            req = comm.isend(values(rank, 3, np.int32), 0, tag=5)
            req.wait()
    comm.destroy()
    ctx.close()


def body_split_group_abort(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    sub = comm.split(rank % 2, key=-rank)  # ordered by key: the highest rank first
    members = [r for r in range(world) if r % 2 == rank % 2]
    assert sub.size == len(members) and sub.rank == sorted(members, reverse=True).index(rank)
    t = values(rank, 11, np.int64)
    sub.allreduce(t)
    assert equal(t, reference("sum", [values(r, 11, np.int64) for r in members]))
    none = comm.split(gradsync.NO_COLOR if rank == 0 else 0)
    assert (none is None) == (rank == 0)
    if none is not None:
        none.barrier()
        none.destroy()
    sub.destroy()
    if world > 1 and rank in (0, world - 1):
        pair = comm.create_group([world - 1, 0])
        assert pair.size == 2 and pair.rank == (0 if rank == world - 1 else 1)
        t = values(rank, 7, np.float32)
        pair.allreduce(t)
        assert equal(t, values(0, 7, np.float32) + values(world - 1, 7, np.float32))
        if rank == 0:
            pair.abort()  # the other side learns at once, without waiting out the deadline
        else:
            start = time.monotonic()
            try:
                pair.allreduce(np.zeros(3, np.float32))
                raise AssertionError("allreduce with an aborted peer succeeded")
            except gradsync.PeerLostError as e:
                assert e.name == "GS_ERR_PEER_LOST" and "rank" in e.detail, e
            assert time.monotonic() - start < CTX_TIMEOUT / 2
            pair.destroy()
    comm.barrier()
    comm.destroy()
    ctx.close()


def body_torch(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        t = torch.arange(1000).remainder(7).to(dtype) if dtype != torch.bool else torch.arange(9) % 3 == 0
        before = t.clone()
        ptr = t.data_ptr()
        assert comm.allreduce(t, op="max") is t  # the same tensor, written in place
        assert t.data_ptr() == ptr and torch.equal(t, before)  # max of equal inputs
    t = torch.full((4, 250), float(rank + 1), dtype=torch.bfloat16)
    ptr = t.data_ptr()
    req = comm.iallreduce(t)
    req.wait()
    assert t.data_ptr() == ptr and torch.equal(t, torch.full((4, 250), world * (world + 1) / 2,
                                                             dtype=torch.bfloat16))
    view = np.zeros(6, np.float32)  # a tensor over numpy memory: both see the result
    shared = torch.from_numpy(view)
    comm.allreduce(torch.full((6,), 2.0), shared)
    assert (view == 2.0 * world).all()
    out = torch.zeros(world * 3, dtype=torch.int32)
    comm.allgather(torch.tensor([rank, 10 + rank, 20 + rank], dtype=torch.int32), out)
    assert out.tolist() == [k for r in range(world) for k in (r, 10 + r, 20 + r)]
    m = torch.zeros(3, 4)
    for bad in (m[:, 1], m.t()):
        try:
            comm.allreduce(bad)
            raise AssertionError("a non-contiguous tensor was taken")
        except ValueError as e:
            assert "not contiguous" in str(e), e
    try:
        comm.allreduce(torch.zeros(2, dtype=torch.complex64))
        raise AssertionError("complex taken")
    except ValueError as e:
        assert "no gradsync type" in str(e), e
    comm.destroy()
    ctx.close()


def expect_value_error(fn, text):
    try:
        fn()
    except ValueError as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError("no ValueError (%s)" % text)


def body_errors(rank, world, transport):
    ctx, comm = open_comm(rank, world, transport)
    f = np.zeros(10, np.float32)
    expect_value_error(lambda: comm.allreduce(np.zeros(4, np.complex128)), "no gradsync type")
    expect_value_error(lambda: comm.allreduce(np.zeros(4, ">f4")), "no gradsync type")
    expect_value_error(lambda: comm.allreduce(np.zeros(4, np.float128)), "no gradsync type")
    expect_value_error(lambda: comm.allreduce(np.zeros(20, np.float32)[::2]), "not C-contiguous")
    expect_value_error(lambda: comm.allreduce(np.zeros((4, 5), np.float32).T), "not C-contiguous")
    expect_value_error(lambda: comm.allreduce(f, np.zeros(11, np.float32)),
                       "sendbuf has 10 elements, recvbuf 11")
    expect_value_error(lambda: comm.allreduce(f, np.zeros(10, np.float64)), "types differ")
    expect_value_error(lambda: comm.allgather(f, np.zeros(10 * world + 1, np.float32)),
                       "recvbuf %d: expected %d ranks x sendbuf" % (10 * world + 1, world) if world > 1 else
                       "recvbuf 11: expected as many as sendbuf")
    expect_value_error(lambda: comm.allreduce([1.0, 2.0]), "a list")
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    expect_value_error(lambda: comm.allreduce(ro), "read-only")
    comm.allreduce(ro, np.zeros(3, np.float32))  # read-only is fine to send
    expect_value_error(lambda: comm.allreduce(f, op="mean"), "op: 'mean'")
    # f32 BAND: refused by the library on every rank alike, and the communicator still works
    try:
        comm.allreduce(f, op="band")
        raise AssertionError("band on float32 succeeded")
    except gradsync.Error as e:
        assert e.name == "GS_ERR_INVALID" and isinstance(e, RuntimeError), e
    comm.barrier()
    if world > 1:  # mismatched counts: every rank is told, naming both calls
        try:
            comm.allreduce(np.ones(100 + rank, np.float32))
            raise AssertionError("mismatched allreduce succeeded")
        except gradsync.MismatchError as e:
            assert e.name == "GS_ERR_MISMATCH" and e.status == -10 and e.call == "gs_allreduce", e
            assert "GS_ERR_MISMATCH" in str(e) and e.detail in str(e), e
    comm.destroy()
    comm.destroy()  # a second destroy does nothing
    expect_value_error(lambda: comm.barrier(), "used after destroy")
    ctx.close()


def body_timeout(rank, world, transport):
    # rank 1's deadline is short; rank 0's long enough to wait for it in destroy()
    timeout = 1.5 if rank == 1 else CTX_TIMEOUT
    ctx = gradsync.Context(rank=rank, world_size=world, store=os.environ["GS_STORE"], timeout=timeout)
    comm = gradsync.Comm(ctx, transport)
    if rank == 1:  # a receive no one sends to
        start = time.monotonic()
        try:
            comm.recv(np.zeros(4, np.int32), 0, tag=99)
            raise AssertionError("a receive without a sender returned")
        except gradsync.TimeoutError as e:
            assert isinstance(e, TimeoutError) and e.name == "GS_ERR_TIMEOUT" and "recv" in e.detail, e
        assert 1.0 < time.monotonic() - start < 10, time.monotonic() - start
    comm.destroy()
    ctx.close()


def body_context_from_env(rank, world, transport):
    os.environ["GS_TRANSPORT"] = transport  # read at the library's first use in this process
    with gradsync.Context() as ctx:  # GS_RANK, GS_WORLD_SIZE, GS_STORE, GS_TIMEOUT_MS from run()
        assert (ctx.rank, ctx.size) == (rank, world), ctx
        assert ctx.param("GS_TIMEOUT_MS") == str(CTX_TIMEOUT * 1000)
        assert ctx.param("GS_TRANSPORT") == transport
        assert ctx.host
        ctx.store_put("py/%d" % rank, b"rank %d\0binary" % rank)  # values are bytes, NUL included
        assert ctx.store_get("py/%d" % ((rank + 1) % world)) == b"rank %d\0binary" % ((rank + 1) % world)
        big = bytes(range(256)) * 100  # more than store_get's first buffer
        if rank == 0:
            ctx.store_put("py/big", big)
        assert ctx.store_get("py/big") == big
        assert ctx.store_allgather("py/ag", bytes([rank]) * 3) == [bytes([r]) * 3 for r in range(world)]
        ctx.store_barrier("py/b")
        try:
            ctx.param("GS_NO_SUCH")
            raise AssertionError("an unknown parameter was answered")
        except gradsync.Error as e:
            assert e.name == "GS_ERR_INVALID", e
        with gradsync.Comm(ctx) as comm:
            assert comm.transport == transport
            t = np.array([rank], np.int64)
            comm.allreduce(t)
            assert t[0] == world * (world - 1) // 2
            try:
                ctx.close()
                raise AssertionError("closed a context with a communicator open")
            except RuntimeError as e:
                assert "destroy" in str(e)
    assert ctx._handle is None


class FailingStore:
    def set(self, key, value):
        raise RuntimeError("the store is down")

    def get(self, key):
        raise RuntimeError("the store is down")


def body_external_store(rank, world, transport):
    import torch.distributed as dist
    port = int(os.environ["GS_STORE"].rsplit(":", 1)[1])  # run()'s port, gradsync's own store unused here
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, datetime.timedelta(seconds=CTX_TIMEOUT))
    with gradsync.Context(rank=rank, world_size=world, store=store, timeout=CTX_TIMEOUT) as ctx:
        with gradsync.Comm(ctx, transport) as comm:
            t = values(rank, 1000, np.int64)
            comm.allreduce(t)
            assert equal(t, reference("sum", [values(r, 1000, np.int64) for r in range(world)]))
        ctx.store_put("py/x%d" % rank, b"through torch")  # the store calls go to the external store too
        assert store.get("py/x%d" % rank) == b"through torch"
    store.add("py/done", 1)  # the others' last use of it
    while rank == 0 and store.add("py/done", 0) < world:  # rank 0 serves the TCPStore: it leaves last
        time.sleep(0.01)
    if rank == 0:
        expect_value_error(lambda: gradsync.Context(rank=0, world_size=1, store=object()), "has no set()")
        try:
            gradsync.Context(rank=0, world_size=2, store=FailingStore(), timeout=2)
            raise AssertionError("a context over a failing store was made")
        except gradsync.Error as e:  # the store's own exception is the cause
            assert isinstance(e.__cause__, RuntimeError) and "down" in str(e.__cause__), repr(e.__cause__)


LR = 0.5  # a power of two: the expected parameters are exact


def body_ps(rank, world, transport, serve_in_thread):
    ctx = gradsync.Context(rank=rank, world_size=world, store=os.environ["GS_STORE"], timeout=CTX_TIMEOUT)
    ps = gradsync.ParameterServer(ctx, servers=1, transport=transport, optimizer="sgd", lr=LR)
    n, keys = 1000, (3, 9)
    init = {k: np.arange(n, dtype=np.float32) * k for k in keys}
    grads = {w: [values(w, n, np.float32, s) for s in range(4)] for w in range(2)}
    assert ps.num_workers == 2 and ps.num_servers == 1 and ps.is_server == (rank == world - 1)
    for k in keys:
        ps.register(k, init[k] if rank == 0 else None, count=n)
    if ps.is_server:
        assert ps.index == 0
        if serve_in_thread:
            ps.serve_start()
        else:
            ps.serve()
        ps.destroy()
        ctx.close()
        return
    assert ps.index == rank
    expect_value_error(lambda: ps.push(keys[0], np.zeros(n + 1, np.float32)), "1001 elements, expected 1000")
    expect_value_error(lambda: ps.push(keys[0], np.zeros(n, np.float64)), "float32")
    expect_value_error(lambda: ps.pull(77, np.zeros(n, np.float32)), "key 77 is not registered")
    want = {k: init[k].copy() for k in keys}
    out = np.zeros(n, np.float32)

    def step(k, s):  # what every worker's step s does to key k: the mean gradient, times lr
        want[k] -= np.float32(LR) * ((grads[0][s] + grads[1][s]) / np.float32(2))

    k = keys[0]
    ps.push(k, grads[rank][0])
    step(k, 0)
    assert ps.pull(k, out) is out and equal(out, want[k]), (out[:4], want[k][:4])
    ps.push_pull(k, grads[rank][1], out)
    step(k, 1)
    assert equal(out, want[k])
    ps.ipush(k, grads[rank][2]).wait()
    step(k, 2)
    req = ps.ipull(k, out)
    while not req.test():
        pass
    assert equal(out, want[k])
    t = torch.zeros(n)  # a tensor pulled in place
    ptr = t.data_ptr()
    ps.ipush_pull(k, grads[rank][3], t).wait()
    step(k, 3)
    assert t.data_ptr() == ptr and equal(t.numpy(), want[k])
    ps.push_pull(keys[1], grads[rank][0], out)  # the other key, untouched until now
    step(keys[1], 0)
    assert equal(out, want[keys[1]])
    ps.destroy()
    ctx.close()


# ---- the tests ----------------------------------------------------------------------

def shm_segments():
    """/dev/shm entries but Python multiprocessing's semaphores (sem.mp-*), which
    other Python programs on the machine (torch's tests) make and remove."""
    return {n for n in os.listdir("/dev/shm") if not n.startswith("sem.mp-")}


class Capi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.segments = shm_segments()

    @classmethod
    def tearDownClass(cls):
        left = shm_segments() - cls.segments
        assert not left, "left in /dev/shm: %s" % sorted(left)

    def tearDown(self):
        try:  # every rank reaped: this process has no child left
            pid, _ = os.waitpid(-1, os.WNOHANG)
            raise AssertionError("a child process is left (pid %d)" % pid)
        except ChildProcessError:
            pass

    def each(self, body, worlds=(1, 2, 3), *args):
        for transport in TRANSPORTS:
            for world in worlds:
                with self.subTest(transport=transport, world=world):
                    run(world, body, transport, *args)

    def test_allreduce_every_dtype_and_op(self):
        self.each(body_allreduce)

    def test_rooted_allgather_reduce_scatter_alltoall_barrier(self):
        self.each(body_rooted_and_alltoall)

    def test_nonblocking_requests(self):
        self.each(body_nonblocking)

    def test_fused_and_uneven_collectives(self):
        self.each(body_fused_and_uneven)

    def test_send_recv(self):
        self.each(body_send_recv)

    def test_split_group_abort(self):
        self.each(body_split_group_abort, (2, 3))

    def test_torch_tensors_in_place(self):
        self.each(body_torch, (2,))

    def test_errors(self):
        self.each(body_errors, (1, 2))

    def test_timeout(self):
        self.each(body_timeout, (2,))

    def test_external_store(self):
        self.each(body_external_store, (1, 2))

    def test_context_from_environment(self):
        self.each(body_context_from_env, (2,))

    def test_ps_sgd_serve(self):
        self.each(body_ps, (3,), False)

    def test_ps_sgd_serve_start(self):
        self.each(body_ps, (3,), True)

    def test_import_without_torch(self):
        # python -S: no dist-packages, so neither torch nor numpy: the package imports, the backend is
        # not registered, and the bindings run a one-rank allreduce on memory offered through the array
        # interface
        code = """
import array, sys, gradsync
assert not gradsync.backend_registered and "torch" not in sys.modules and "numpy" not in sys.modules
class Arr:
    def __init__(self, a):
        self.a = a
        addr, n = a.buffer_info()
        self.__array_interface__ = {"typestr": "<i8", "shape": (n,), "data": (addr, False), "version": 3}
a = array.array("q", [1, 2, 3])
with gradsync.Context(rank=0, world_size=1, store="127.0.0.1:%d" % int(sys.argv[1])) as ctx:
    with gradsync.Comm(ctx, "shm") as comm:
        comm.allreduce(Arr(a), op="prod")
try:
    import torch
except ImportError:
    print(gradsync.version(), list(a))
"""
        out = subprocess.run([sys.executable, "-S", "-c", code, str(free_port())], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "0.2.0 [1, 2, 3]")
        self.assertEqual(out.stderr, "")

    def test_example_under_gsrun(self):
        # docs/python.md's example, as a launcher starts it: Context() from gsrun's variables and job token
        build = os.path.join(os.path.dirname(gradsync.__file__), "..", "..")
        gsrun = os.path.join(build, "tools", "gsrun")
        example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python", "allreduce.py")
        self.assertTrue(os.path.exists(gsrun), "%s is missing: build the target gsrun" % gsrun)
        for transport in TRANSPORTS:
            out = subprocess.run([gsrun, "-n", "2", "--transport", transport, sys.executable, example],
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            for r in range(2):
                self.assertIn("rank %d of 2 over %s: mean gradient 1.5, as expected" % (r, transport),
                              out.stdout)

    def test_library_lookup(self):
        env = dict(os.environ, GS_LIBRARY="/nonexistent/libgradsync.so")
        code = "import gradsync\ntry:\n    gradsync.version()\nexcept OSError as e:\n    print(e)\n"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("/nonexistent/libgradsync.so (GS_LIBRARY)", out.stdout)
        self.assertNotIn("unknown variable", out.stderr)
        lib = os.path.join(os.path.dirname(gradsync.__file__), "..", "..", "src", "libgradsync.so")
        env["GS_LIBRARY"] = os.path.abspath(lib)  # a variable of the library's table: no warning
        code = ("import gradsync\nwith gradsync.Context(rank=0, world_size=1, store='127.0.0.1:%d'):\n"
                "    print(gradsync.version())\n" % free_port())
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual((out.returncode, out.stdout.strip(), out.stderr), (0, "0.2.0", ""))
        self.assertTrue(gradsync.backend_registered)  # torch and the module here: the backend is registered


if __name__ == "__main__":
    unittest.main(argv=sys.argv)
