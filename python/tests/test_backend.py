"""torch.distributed over the "gradsync" backend: every operation the
backend has, on 1-4 ranks, against results computed here, with the store
PyTorch gives (file:// and tcp:// init methods, env:// as torchrun sets it),
non-contiguous tensors, every dtype and ReduceOp it takes, futures, a
sub-group, DDP training against gloo, and errors that name what failed.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/test_backend.py [-k NAME] [-v]
"""
import datetime
import os
import socket
import sys
import tempfile
import traceback
import unittest
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradsync  # noqa: F401  registers the backend

TIMEOUT = datetime.timedelta(seconds=60)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int16,
          torch.int8, torch.uint8]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, init, body, errors):
    try:
        dist.init_process_group("gradsync", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
        body(rank, world)
        dist.destroy_process_group()
    except Exception:  # reported by the parent, with the rank
        errors[rank] = traceback.format_exc()
        raise


def run(world, body, init=None):
    """Runs body(rank, world) on `world` processes joined into one group."""
    with tempfile.TemporaryDirectory() as tmp:
        init = init or "file://" + os.path.join(tmp, "store")
        errors = mp.Manager().dict()
        try:
            mp.spawn(_entry, args=(world, init, body, errors), nprocs=world, join=True)
        except Exception as e:
            raise AssertionError("\n".join(errors.values()) or str(e)) from None


def values(rank, n, dtype, offset=0):
    """Rank's input: small integers, exact in every type and sum of ranks."""
    return ((torch.arange(n) * 3 + rank * 7 + offset) % 11 - 5).to(dtype)


# ---- the bodies (module level: spawn pickles them by name) ----------------------

def body_allreduce(rank, world):
    for dtype in DTYPES:
        for n in (0, 1, 5, 1000, 70001):
            t = values(rank, n, dtype)
            dist.all_reduce(t)
            want = sum(values(r, n, torch.float64) for r in range(world)).to(dtype)
            assert torch.equal(t, want), (dtype, n)
    ops = {dist.ReduceOp.SUM: lambda a: sum(a), dist.ReduceOp.PRODUCT: lambda a: torch.stack(a).prod(0),
           dist.ReduceOp.MIN: lambda a: torch.stack(a).min(0).values, dist.ReduceOp.MAX: lambda a: torch.stack(a).max(0).values}
    for op, ref in ops.items():
        t = values(rank, 33, torch.float64)
        dist.all_reduce(t, op=op)
        assert torch.equal(t, ref([values(r, 33, torch.float64) for r in range(world)])), op
    t = values(rank, 8, torch.float32).repeat(2)  # AVG: the sum divided by the ranks
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.allclose(t, sum(values(r, 8, torch.float32).repeat(2) for r in range(world)) / world)
    # non-contiguous: a column of a matrix
    m = torch.stack([values(rank, 6, torch.float32), values(rank, 6, torch.float32, 1)], 1)
    col = m[:, 1]
    assert not col.is_contiguous()
    dist.all_reduce(col)
    assert torch.equal(m[:, 1], sum(values(r, 6, torch.float32, 1) for r in range(world)))
    assert torch.equal(m[:, 0], values(rank, 6, torch.float32))


def body_async(rank, world):
    ts = [values(rank, 1000 + i, torch.float32) for i in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    torch.futures.wait_all(futs)
    for i, (t, f) in enumerate(zip(ts, futs)):
        want = sum(values(r, 1000 + i, torch.float32) for r in range(world))
        assert torch.equal(t, want) and torch.equal(f.value()[0], want)
        assert works[i].is_completed() and works[i].is_success()


def body_late_peer(rank, world):
    """Rank 0 calls first, the others 0.3 s later: its first all_reduce
    outlives the test the calling thread makes and is handed to the worker;
    what rank 0 calls meanwhile (small and large, async and blocking, another
    collective) queues behind it and runs in call order. Then the other way
    round for a barrier and a blocking all_reduce."""
    import time
    if rank:
        time.sleep(0.3)
    sizes = (5, 70001, 3, 300000)  # 300000 floats: above the size the caller's thread runs itself
    ts = [values(rank, n, torch.float32, i) for i, n in enumerate(sizes)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    last = values(rank, 2, torch.int64, 9)
    dist.all_reduce(last)
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=world - 1)
    for i, (w, t) in enumerate(zip(works, ts)):
        w.wait()
        assert torch.equal(t, sum(values(r, sizes[i], torch.float32, i) for r in range(world))), i
    assert torch.equal(last, sum(values(r, 2, torch.int64, 9) for r in range(world)))
    assert torch.equal(b, torch.full((4,), float(world - 1)))
    if rank == 0:
        time.sleep(0.3)
    dist.barrier()
    t = torch.ones(7)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((7,), float(world)))


def body_broadcast_allgather(rank, world):
    warnings.filterwarnings("ignore", "torch.distributed.all_gather_coalesced will be deprecated")
    for dtype in DTYPES:
        t = values(rank, 17, dtype)
        dist.broadcast(t, src=world - 1)
        assert torch.equal(t, values(world - 1, 17, dtype))
        outs = [torch.empty(9, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, values(rank, 9, dtype))
        for r in range(world):
            assert torch.equal(outs[r], values(r, 9, dtype))
        flat = torch.empty(world * 9, dtype=dtype)
        dist._all_gather_base(flat, values(rank, 9, dtype))
        assert torch.equal(flat, torch.cat([values(r, 9, dtype) for r in range(world)]))
        # coalesced: outs[r][i] is rank r's input i, inputs of different shapes
        outs = [[torch.empty(9, dtype=dtype), torch.empty(2, 2, dtype=dtype)] for _ in range(world)]
        dist.all_gather_coalesced(outs, [values(rank, 9, dtype), values(rank, 4, dtype, 1).view(2, 2)])
        for r in range(world):
            assert torch.equal(outs[r][0], values(r, 9, dtype))
            assert torch.equal(outs[r][1], values(r, 4, dtype, 1).view(2, 2))


def body_reduce_scatter(rank, world):
    ins = [values(rank, 13, torch.float32, k) for k in range(world)]
    out = torch.empty(13)
    dist.reduce_scatter(out, ins)
    assert torch.equal(out, sum(values(r, 13, torch.float32, rank) for r in range(world)))
    flat_in = torch.cat(ins)
    dist._reduce_scatter_base(out, flat_in)
    assert torch.equal(out, sum(values(r, 13, torch.float32, rank) for r in range(world)))


def body_barriers(rank, world):
    for _ in range(3):
        dist.barrier()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)  # a barrier ends only when every rank came
    assert t.item() == world * (world - 1) / 2


def body_subgroup(rank, world):
    # every rank calls new_group; the backend is made on the members only
    g = dist.new_group([0, world - 1])
    t = values(rank, 10, torch.int64)
    if rank in (0, world - 1):
        dist.all_reduce(t, group=g)
        assert torch.equal(t, values(0, 10, torch.int64) + values(world - 1, 10, torch.int64))
    t = values(rank, 4, torch.float32)
    dist.all_reduce(t)  # the default group goes on
    assert torch.equal(t, sum(values(r, 4, torch.float32) for r in range(world)))


def body_errors(rank, world):
    # complex tensors travel as their real view (torch.distributed's own doing)
    z = torch.tensor([1 + 2j, 3 - 1j]) * (rank + 1)
    dist.all_reduce(z)
    assert torch.equal(z, torch.tensor([1 + 2j, 3 - 1j]) * (world * (world + 1) // 2))
    b = torch.tensor([rank % 2 == 0, True, False])  # bool: MAX is or, MIN is and
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    assert b.tolist() == [True, True, False]
    i = torch.tensor([0b1100 | rank, 0b1010], dtype=torch.int32)
    dist.all_reduce(i, op=dist.ReduceOp.BOR)
    want = 0
    for r in range(world):
        want |= 0b1100 | r
    assert i.tolist() == [want, 0b1010]
    for bad, needle in ((lambda: dist.all_reduce(torch.zeros(3), op=dist.ReduceOp.BAND), "bitwise operators"),
                        (lambda: dist.all_reduce(torch.zeros(3, dtype=torch.complex64), op=dist.ReduceOp.MAX),
                         "")):
        try:
            bad()
        except Exception as e:  # refused before anything moves, on every rank alike
            assert needle in str(e), str(e)
        else:
            raise AssertionError("accepted: " + needle)
    t = torch.ones(5)
    dist.all_reduce(t)  # the group still works
    assert torch.equal(t, torch.full((5,), float(world)))


def body_mismatch(rank, world):
    t = torch.zeros(10 + (rank == world - 1))
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        assert "GS_ERR_MISMATCH" in str(e) and "mismatched collective calls" in str(e), str(e)
    else:
        raise AssertionError("a mismatched allreduce succeeded")


def body_rooted(rank, world):
    for root in range(world):
        t = values(rank, 21, torch.float32)
        dist.reduce(t, dst=root)
        if rank == root:
            assert torch.equal(t, sum(values(r, 21, torch.float32) for r in range(world)))
        else:
            assert torch.equal(t, values(rank, 21, torch.float32))  # a non-root's tensor stays
        outs = [torch.empty(5, dtype=torch.int64) for _ in range(world)] if rank == root else None
        dist.gather(values(rank, 5, torch.int64), gather_list=outs, dst=root)
        if rank == root:
            assert all(torch.equal(outs[r], values(r, 5, torch.int64)) for r in range(world))
        out = torch.empty(4, dtype=torch.float64)
        ins = [values(q, 4, torch.float64, 100) for q in range(world)] if rank == root else None
        dist.scatter(out, scatter_list=ins, src=root)
        assert torch.equal(out, values(rank, 4, torch.float64, 100))


def body_alltoall(rank, world):
    # equal parts: block q of rank r goes to rank q as block r
    inp = torch.cat([values(rank * 10 + q, 3, torch.float32) for q in range(world)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    assert torch.equal(out, torch.cat([values(r * 10 + rank, 3, torch.float32) for r in range(world)]))
    # uneven split sizes: rank r sends q + r + 1 rows to rank q
    send_splits = [q + rank + 1 for q in range(world)]
    recv_splits = [rank + r + 1 for r in range(world)]
    inp = torch.cat([torch.full((n, 2), float(rank * 100 + q)) for q, n in enumerate(send_splits)])
    out = torch.empty(sum(recv_splits), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    assert torch.equal(out, torch.cat([torch.full((n, 2), float(r * 100 + rank)) for r, n in enumerate(recv_splits)]))
    outs = [torch.empty(2, dtype=torch.int32) for _ in range(world)]
    dist.all_to_all(outs, [values(rank * 10 + q, 2, torch.int32) for q in range(world)])
    assert all(torch.equal(outs[r], values(r * 10 + rank, 2, torch.int32)) for r in range(world))


def body_p2p(rank, world):
    # a ring of sends and receives, blocking and not, then any-source receives on rank 0
    right, left = (rank + 1) % world, (rank - 1) % world
    for n in (0, 1, 1000, 70001):
        got = torch.empty(n)
        if rank % 2 == 0:
            dist.send(values(rank, n, torch.float32), right, tag=n % 7)
            dist.recv(got, left, tag=n % 7)
        else:
            dist.recv(got, left, tag=n % 7)
            dist.send(values(rank, n, torch.float32), right, tag=n % 7)
        assert torch.equal(got, values(left, n, torch.float32)), n
    reqs = [dist.isend(values(rank, 9, torch.int64, k), right, tag=k) for k in range(4)]
    outs = [torch.empty(9, dtype=torch.int64) for _ in range(4)]
    rreqs = [dist.irecv(outs[k], left, tag=k) for k in reversed(range(4))]
    t = torch.ones(3)
    dist.all_reduce(t)  # a collective while the point-to-point is in flight
    for r in reqs + rreqs:
        r.wait()
    assert all(torch.equal(outs[k], values(left, 9, torch.int64, k)) for k in range(4))
    assert torch.equal(t, torch.full((3,), float(world)))
    if rank == 0:
        seen = set()
        for _ in range(world - 1):
            got = torch.empty(2)
            src = dist.recv(got, tag=42)  # any source
            assert torch.equal(got, torch.full((2,), float(src)))
            seen.add(src)
        assert seen == set(range(1, world))
    else:
        dist.send(torch.full((2,), float(rank)), 0, tag=42)


def _ddp_losses(rank, world, backend_group):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=backend_group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(5):
        x = torch.randn(8, 20, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def body_ddp(rank, world):
    gloo = dist.new_group(backend="gloo")
    mine, wa = _ddp_losses(rank, world, None)  # the default group: gradsync
    theirs, wb = _ddp_losses(rank, world, gloo)
    for a, b in zip(wa, wb):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    assert all(abs(x - y) < 1e-5 for x, y in zip(mine, theirs)), (mine, theirs)


class Backend(unittest.TestCase):
    def test_allreduce_every_dtype_op_and_layout(self):
        for world in (1, 2, 3):
            run(world, body_allreduce)

    def test_async_works_and_futures(self):
        run(2, body_async)

    def test_late_peer_keeps_call_order(self):
        for world in (2, 3):
            run(world, body_late_peer)

    def test_broadcast_and_allgather(self):
        run(3, body_broadcast_allgather)

    def test_reduce_scatter(self):
        run(2, body_reduce_scatter)

    def test_barriers(self):
        run(3, body_barriers)

    def test_subgroup(self):
        run(3, body_subgroup)

    def test_unsupported_is_a_clear_error(self):
        run(2, body_errors)

    def test_mismatch_is_a_runtime_error(self):
        run(2, body_mismatch)

    def test_reduce_gather_scatter(self):
        for world in (1, 3):
            run(world, body_rooted)

    def test_alltoall(self):
        run(3, body_alltoall)

    def test_send_recv(self):
        for world in (2, 3):
            run(world, body_p2p)

    def test_ddp_matches_gloo(self):
        run(2, body_ddp)

    def test_tcp_init_method(self):
        run(2, body_async, init="tcp://127.0.0.1:%d" % free_port())

    def test_env_init_method(self):
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
        run(2, body_barriers, init="env://")


if __name__ == "__main__":
    mp.set_start_method("spawn")
    unittest.main(argv=sys.argv)
