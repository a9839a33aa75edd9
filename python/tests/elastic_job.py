"""One worker of the torchrun elastic test (test_launch.py): DDP training
over the "gradsync" backend that survives a worker's failure the way
torchrun's elastic agent handles it: the agent stops every worker and starts
them again, each makes a new process group, and training goes on from the
last checkpoint.

Each step trains a small model on batches fixed by (rank, step), then rank 0
writes a checkpoint (model, optimizer, step; atomically). A step's weights
exist only once every rank's gradient was all-reduced, so a checkpoint is
always of a step completed on every rank. At the end every rank checks its
weights against the same steps computed in this process from the mean
gradient of every rank, and prints
"elastic-ok rank R of W attempt N resumed-from S".

    CKPT_DIR=dir   where the checkpoint lives (shared by the attempts)
    STEPS=n        steps in all (default 8)
    FAIL_AT=k      on torchrun's first attempt rank 1 exits 3 inside step k,
                   after its forward and backward, before its gradients are
                   reduced: rank 0 is left waiting in DDP's all-reduce
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import gradsync  # noqa: F401  registers the backend

LR, MOMENTUM = 0.1, 0.9


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return torch.nn.functional.mse_loss(model(x), y)


def reference(world, steps):
    """The same training on one process: each step the mean of every rank's gradient."""
    model, opt = model_and_optimizer()
    for step in range(steps):
        opt.zero_grad()
        for r in range(world):
            (loss_of(model, r, step) / world).backward()
        opt.step()
    return model


def save(path, model, opt, step):
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, path)  # a reader sees the old checkpoint or the new one, whole


def main():
    ckpt = os.path.join(os.environ["CKPT_DIR"], "checkpoint.pt")
    steps = int(os.environ.get("STEPS", "8"))
    fail_at = int(os.environ.get("FAIL_AT", "-1"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "-")
    dist.init_process_group("gradsync", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gradsync", dist.get_backend()
    model, opt = model_and_optimizer()
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    print("elastic-start rank %d of %d attempt %s from step %d" % (rank, world, attempt, start), flush=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for step in range(start, steps):
        opt.zero_grad()
        loss = loss_of(ddp, rank, step)
        if rank == 1 and step == fail_at and attempt == "0":
            print("elastic-fail rank 1 exits inside step %d" % step, flush=True)
            os._exit(3)  # mid-step: the backward below would have reduced the gradients
        loss.backward()
        opt.step()
        if rank == 0:
            save(ckpt, model, opt, step + 1)
    want = reference(world, steps)
    for p, q in zip(model.parameters(), want.parameters()):
        if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
            print("elastic: rank %d: weights differ from the reference by %g" % (rank, (p - q).abs().max()),
                  file=sys.stderr)
            sys.exit(1)
    dist.barrier()
    print("elastic-ok rank %d of %d attempt %s resumed-from %d" % (rank, world, attempt, start), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
