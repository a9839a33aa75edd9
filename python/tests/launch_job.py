"""One rank of a job that test_launch.py starts under a launcher (torchrun,
gsrun, mpirun, srun's variables): init_process_group("gradsync") with no
init_method (env://, as a user would write it), then all_reduce, broadcast
and one DDP step checked against results computed here. Prints
"launch-ok rank R of W local L attempt N" on success (N: torchrun's
restart count); exits non-zero on any failure.

    EXPECT_WORLD=W  the world size the launcher should give (checked)
    FAIL_ONCE=1     rank 1 exits 3 on torchrun's first attempt
                    (TORCHELASTIC_RESTART_COUNT=0): the restarted job must
                    make a new process group and pass
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import gradsync  # noqa: F401  registers the backend, maps mpirun's/srun's variables


def ddp_step(rank, world):
    """One SGD step of DDP; every rank must end with the weights a single
    process gets from the mean of every rank's gradient."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    init = [p.detach().clone() for p in model.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)

    def batch(r):
        g = torch.Generator().manual_seed(10 + r)
        return torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)

    x, y = batch(rank)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()
    grads = [torch.zeros_like(p) for p in init]
    for r in range(world):  # the reference, on one process
        ref = torch.nn.Linear(6, 3)
        with torch.no_grad():
            for p, q in zip(ref.parameters(), init):
                p.copy_(q)
        x, y = batch(r)
        torch.nn.functional.mse_loss(ref(x), y).backward()
        for g, p in zip(grads, ref.parameters()):
            g += p.grad / world
    for p, q, g in zip(model.parameters(), init, grads):
        assert torch.allclose(p, q - 0.5 * g, atol=1e-6), (p, q - 0.5 * g)


def main():
    if os.environ.get("FAIL_ONCE") and os.environ.get("RANK") == "1" and \
            os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        sys.exit(3)
    dist.init_process_group("gradsync", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gradsync", dist.get_backend()
    want = os.environ.get("EXPECT_WORLD")
    assert want is None or world == int(want), (world, want)
    assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
    t = torch.arange(5, dtype=torch.float32) + rank
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(5, dtype=torch.float32) * world + world * (world - 1) / 2), t
    b = torch.full((3,), float(rank), dtype=torch.float64)
    dist.broadcast(b, src=world - 1)
    assert torch.equal(b, torch.full((3,), float(world - 1), dtype=torch.float64)), b
    ddp_step(rank, world)
    dist.barrier()
    print("launch-ok rank %d of %d local %s attempt %s" % (rank, world, os.environ.get("LOCAL_RANK"),
                                                          os.environ.get("TORCHELASTIC_RESTART_COUNT", "-")),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
