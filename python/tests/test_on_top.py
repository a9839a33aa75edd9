"""What runs on top of the "gradsync" backend: DistributedDataParallel with
several buckets, unused parameters and no_sync(); the communication hooks
fp16_compress, bf16_compress and PowerSGD; ZeroRedundancyOptimizer; the
object collectives; the profiler naming the backend's operations.

Each test starts 2 ranks (file:// init) whose default group is gradsync and
which also make a gloo group (new_group): the same training runs once over
each, in the same processes, from the same weights and batches, and the
weights after N steps are compared.

Tolerance: with 2 ranks a sum is a + b on either backend (commutative, one
rounding), and the hooks do the same arithmetic around the all-reduce, so a
correct backend gives the same bits as gloo; the tests allow 1e-6 (relative
and absolute, about 8 float32 ulps near 1) so that a backend reducing in a
different order or in float32 for float16 data would still pass, while a
lost or doubled bucket (an error of the size of a gradient times lr, 1e-3
here) fails.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/test_on_top.py [-k NAME] [-v]
"""
import datetime
import faulthandler
import os
import tempfile
import traceback
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import gradsync  # noqa: F401  registers the backend

TIMEOUT = datetime.timedelta(seconds=60)
TEST_TIMEOUT_S = int(os.environ.get("GS_TEST_TIMEOUT_S", "240"))
WORLD = 2
STEPS = 6
TOL = 1e-6


def _entry(rank, world, init, body, errors):
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S - 5, exit=True)  # a hang shows where it is
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gradsync", init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
        gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
        body(rank, world, gloo)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # reported by the parent, with the rank
        errors[rank] = traceback.format_exc()
        raise


def run(body, world=WORLD):
    """Runs body(rank, world, gloo_group) on `world` processes, bounded by TEST_TIMEOUT_S."""
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "store")
        errors = mp.Manager().dict()
        ctx = mp.start_processes(_entry, args=(world, init, body, errors), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=TEST_TIMEOUT_S)
        try:
            while not ctx.join(timeout=1):
                if datetime.datetime.now() > deadline:
                    raise AssertionError(f"timed out after {TEST_TIMEOUT_S} s")
        except mp.ProcessRaisedException as e:
            raise AssertionError("\n".join(errors.values()) or str(e)) from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()


# ---- models and training (module level: spawn pickles the bodies by name) -------------

class Net(torch.nn.Module):
    """Eight layers, 1.6 MiB of float32 gradients (DDP's first bucket holds 1 MiB whatever
    bucket_cap_mb says, the rest go in buckets of bucket_cap_mb), and an optional unused branch."""

    def __init__(self, unused_branch=False, hidden=6):
        super().__init__()
        self.a = torch.nn.Linear(64, 256)
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(hidden))
        self.c = torch.nn.Linear(256, 10)
        self.unused = torch.nn.Linear(256, 10) if unused_branch else None

    def forward(self, x):
        x = torch.relu(self.a(x))
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.c(x)


def make_net(unused_branch=False, hidden=6):
    torch.manual_seed(0)
    return Net(unused_branch, hidden)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(group, hook=None, hook_state=None, steps=STEPS, accumulate=1, **ddp_args):
    """SGD over DDP on `group`; the weights after `steps` steps (rank 0's and this rank's the same)."""
    model = make_net(ddp_args.pop("unused_branch", False), ddp_args.pop("hidden", 6))
    ddp = DDP(model, process_group=group, **ddp_args)
    if hook is not None and hook.__name__ == "bf16_compress_hook":
        # DDP.register_comm_hook refuses this hook without CUDA 11 and NCCL 2.10 (for gloo too);
        # the hook itself is plain tensor code: registered as register_comm_hook would
        dist._register_comm_hook(ddp.reducer, hook_state, hook)
    elif hook is not None:
        ddp.register_comm_hook(hook_state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        for micro in range(accumulate):
            x, y = batch(dist.get_rank(), step * accumulate + micro)
            if micro < accumulate - 1:
                with ddp.no_sync():  # gradients add up locally, no all-reduce
                    torch.nn.functional.cross_entropy(ddp(x), y).backward()
            else:
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, ddp


def assert_close(a, b, tol=TOL, what=""):
    assert a.keys() == b.keys()
    for k in a:
        d = (a[k] - b[k]).abs().max().item() if a[k].numel() else 0.0
        assert torch.allclose(a[k], b[k], rtol=tol, atol=tol), f"{what} {k}: max |difference| {d}"


def assert_same_on_ranks(state, group):
    """Every rank has rank 0's weights."""
    for k, v in state.items():
        w = v.clone()
        dist.broadcast(w, 0, group=group)
        assert torch.equal(w, v), f"rank {dist.get_rank()} differs from rank 0 in {k}"


def body_buckets(rank, world, gloo):
    mine, ddp = train(None, bucket_cap_mb=0.1)
    n_buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
    assert n_buckets >= 4, n_buckets  # 1 MiB, then 3 of one layer each
    ref, _ = train(gloo, bucket_cap_mb=0.1)
    assert_close(mine, ref, what="buckets")
    assert_same_on_ranks(mine, None)
    moved = sum((mine[k] - make_net().state_dict()[k]).abs().sum().item() for k in mine)
    assert moved > 0


def body_unused(rank, world, gloo):
    mine, _ = train(None, find_unused_parameters=True, unused_branch=True, bucket_cap_mb=0.1)
    ref, _ = train(gloo, find_unused_parameters=True, unused_branch=True, bucket_cap_mb=0.1)
    assert_close(mine, ref, what="unused")
    start = make_net(True).state_dict()
    assert torch.equal(mine["unused.weight"], start["unused.weight"])  # never updated
    assert_same_on_ranks(mine, None)


def body_no_sync(rank, world, gloo):
    mine, _ = train(None, accumulate=3, bucket_cap_mb=0.1)
    ref, _ = train(gloo, accumulate=3, bucket_cap_mb=0.1)
    assert_close(mine, ref, what="no_sync")
    assert_same_on_ranks(mine, None)


def bf16_over_float32_hook(group, bucket):
    """bf16_compress_hook's arithmetic with the sum done in float32 (gloo has no bfloat16 all-reduce in
    1.13): each rank's bucket rounded to bfloat16 and divided by the ranks, summed, rounded to bfloat16."""
    buffer = bucket.buffer()
    part = buffer.to(torch.bfloat16).div_(dist.get_world_size(group)).float()
    fut = dist.all_reduce(part, group=group, async_op=True).get_future()

    def decompress(fut):
        buffer.copy_(fut.value()[0].to(torch.bfloat16))
        return buffer
    return fut.then(decompress)


def body_hooks(rank, world, gloo):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
    for name, hook, ref_hook in (("fp16", default_hooks.fp16_compress_hook, default_hooks.fp16_compress_hook),
                                 ("bf16", default_hooks.bf16_compress_hook, bf16_over_float32_hook)):
        mine, _ = train(None, hook=hook, hook_state=None, bucket_cap_mb=0.1)
        ref, _ = train(gloo, hook=ref_hook, hook_state=gloo, bucket_cap_mb=0.1)
        plain, _ = train(gloo, bucket_cap_mb=0.1)
        assert_close(mine, ref, what=name)
        assert_same_on_ranks(mine, None)
        # the hook did compress: the weights differ from plain float32 DDP's
        assert any(not torch.equal(mine[k], plain[k]) for k in mine), name
    # PowerSGD on one bucket (0.6 MiB, under DDP's first bucket of 1 MiB): with several, the hook
    # all-reduces P and Q from each bucket's future callbacks, which run on whichever thread
    # completed that bucket, so the ranks may call them in different orders (gradsync then fails
    # with GS_ERR_MISMATCH naming both calls; see docs/pytorch.md)
    states = {}
    for label, group in (("gradsync", None), ("gloo", gloo)):
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
        states[label], _ = train(group, hook=psgd.powerSGD_hook, hook_state=state, hidden=2)
    assert_close(states["gradsync"], states["gloo"], what="powerSGD")
    assert_same_on_ranks(states["gradsync"], None)


def body_zero(rank, world, gloo):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    out = {}
    for label, group in (("gradsync", None), ("gloo", gloo)):
        model = make_net()
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.1)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3,
                                      process_group=group)
        for step in range(STEPS):
            x, y = batch(rank, step)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        opt.consolidate_state_dict(to=0)  # gathers the shards' optimizer state on rank 0
        if rank == 0:
            assert len(opt.state_dict()["state"]) == len(list(model.parameters()))
        out[label] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert_close(out["gradsync"], out["gloo"], what="ZeroRedundancyOptimizer")
    assert_same_on_ranks(out["gradsync"], None)


def body_objects(rank, world, gloo):
    objs = [{"rank": rank, "s": "x" * (rank * 1000)}, None] if rank == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs[0] == {"rank": 0, "s": ""} and objs[1] is None, objs
    objs = [f"from {rank}", list(range(rank * 3000))] if rank == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1)
    assert objs == ["from 1", list(range(3000))]
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "data": list(range(rank * 5000))})
    assert gathered == [{"rank": r, "data": list(range(r * 5000))} for r in range(world)], gathered[0]
    ref = [None] * world
    dist.all_gather_object(ref, {"rank": rank, "data": list(range(rank * 5000))}, group=gloo)
    assert gathered == ref
    if rank == 0:
        out = [None] * world
        dist.gather_object("g0", out, dst=0)
        assert out == ["g0", "g1"], out
    else:
        dist.gather_object("g1", None, dst=0)


def body_profiler(rank, world, gloo):
    from torch.profiler import ProfilerActivity, profile
    t = torch.ones(1000)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        out = [torch.empty(1000) for _ in range(world)]
        dist.all_gather(out, t)
        dist.barrier()
        dist.all_reduce(t, group=gloo)  # the same event for gloo, for comparison
    names = {e.name for e in prof.events()}
    for want in ("gradsync:all_reduce", "gradsync:broadcast", "gradsync:all_gather", "gradsync:barrier",
                 "gloo:all_reduce"):
        assert want in names, (want, sorted(n for n in names if ":" in n))
    assert torch.equal(t, torch.full((1000,), 4.0))  # 1 + 1, then 2 + 2 over gloo


class OnTop(unittest.TestCase):
    def test_ddp_buckets(self):
        run(body_buckets)

    def test_ddp_find_unused_parameters(self):
        run(body_unused)

    def test_ddp_no_sync(self):
        run(body_no_sync)

    def test_comm_hooks(self):
        run(body_hooks)

    def test_zero_redundancy_optimizer(self):
        run(body_zero)

    def test_object_collectives(self):
        run(body_objects)

    def test_profiler(self):
        run(body_profiler)


if __name__ == "__main__":
    unittest.main()
