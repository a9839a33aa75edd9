#!/usr/bin/python3
"""The PyTorch reference for gstrain: the same model, data, initialization,
shuffling and hyper-parameters, trained with torch.distributed
DistributedDataParallel over the gloo or the gradsync backend on localhost.

    /usr/bin/python3 examples/pytorch/train_ddp.py --ranks 4 --epochs 1 [--backend gradsync] [--model cnn]
    PYTHONPATH=build/python torchrun --nproc_per_node 2 examples/pytorch/train_ddp.py --backend gradsync

--model mlp is gstrain's MLP; --model cnn a small ResNet (a 3x3 stem and
three residual blocks of 16, 32 and 64 channels, batch norm, global average
pooling) on the same images, seeded by torch.manual_seed(--seed). Under a
launcher (RANK and WORLD_SIZE set, as torchrun does) it joins by env://;
otherwise it starts --ranks processes itself. After training every rank
hashes its state_dict (SHA-256 of every tensor's bytes, in key order) and
rank 0 reports whether all ranks hold the same weights.

Every rank takes its share of each global batch (as gstrain does); the loss
of a rank is its summed cross-entropy times ranks / global batch, so that
DDP's gradient average is the mean over the global batch. Weights and the
shuffled order come from gstrain's counter-based random numbers, so both
programs start from the same weights and see the same batches.

Needs Debian's python3-torch (apt-get install python3-torch) and
dataset-fashion-mnist.
"""
import argparse
import datetime
import gzip
import hashlib
import json
import os
import socket
import sys
import time

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel
except ImportError:
    sys.exit("train_ddp.py: PyTorch is missing: apt-get install python3-torch "
             "(and run it with Debian's /usr/bin/python3)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = "/usr/share/datasets/fashion-mnist"
WIDTHS = (784, 512, 256, 10)
PIXEL_MEAN, PIXEL_STD = np.float32(0.2860), np.float32(0.3530)
MASK = (1 << 64) - 1
STREAM_INIT, STREAM_SHUFFLE = 1, 2


# --- gstrain's random numbers (examples/gstrain/util.h) --------------------

def mix64(z):
    """splitmix64's finalizer on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return z ^ (z >> np.uint64(31))


def rand_key(seed, stream):
    inner = int(mix64(np.array([seed & MASK], dtype=np.uint64))[0])
    return int(mix64(np.array([inner ^ ((stream * 0xd1b54a32d192ed03) & MASK)], dtype=np.uint64))[0])


def rand_at(key, first, count):
    """Draws first .. first+count-1 of the stream with this key."""
    i = np.arange(first + 1, first + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix64(np.uint64(key) + i * np.uint64(0x9e3779b97f4a7c15))


def rand_unit(key, first, count):
    return (rand_at(key, first, count) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def init_weights(seed):
    """He-uniform weights and zero biases, exactly as gt_mlp_init."""
    key, offset, layers = rand_key(seed, STREAM_INIT), 0, []
    for fan_in, fan_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        bound = np.sqrt(np.float32(6.0) / np.float32(fan_in)).astype(np.float32)
        u = rand_unit(key, offset, fan_out * fan_in)
        w = ((np.float32(2.0) * u - np.float32(1.0)) * bound).reshape(fan_out, fan_in)
        layers.append((w, np.zeros(fan_out, dtype=np.float32)))
        offset += fan_out * fan_in + fan_out
    return layers


def shuffled_order(n, seed, epoch):
    """Fisher-Yates with the epoch's stream, exactly as gstrain's shuffle."""
    key = rand_key(seed, (epoch << 8) | STREAM_SHUFFLE)
    draws = rand_at(key, 0, max(n - 1, 0))
    i = np.arange(n - 1, 0, -1, dtype=np.uint64)
    picks = (draws % (i + np.uint64(1))).tolist() if n > 1 else []
    order = list(range(n))
    for k, j in enumerate(picks):
        a = n - 1 - k
        order[a], order[j] = order[j], order[a]
    return np.array(order, dtype=np.int64)


# --- data -------------------------------------------------------------------

def read_idx(path, magic, dims):
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        sys.exit(f"train_ddp.py: cannot read {path}: {e}; "
                 "install it with `apt-get install dataset-fashion-mnist` or pass --data DIR")
    head = np.frombuffer(raw, dtype=">u4", count=1 + dims)
    if head[0] != magic:
        sys.exit(f"train_ddp.py: {path}: bad IDX magic; reinstall dataset-fashion-mnist")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 * (1 + dims)), head[1:]


def load(data_dir, split, limit):
    labels, _ = read_idx(f"{data_dir}/{split}-labels-idx1-ubyte.gz", 0x801, 1)
    pixels, _ = read_idx(f"{data_dir}/{split}-images-idx3-ubyte.gz", 0x803, 3)
    n = min(limit, len(labels)) if limit else len(labels)
    scale = np.float32(1.0) / (np.float32(255.0) * PIXEL_STD)
    shift = PIXEL_MEAN / PIXEL_STD
    x = pixels[: n * 784].reshape(n, 784).astype(np.float32) * scale - shift
    return torch.from_numpy(x), torch.from_numpy(labels[:n].astype(np.int64))


# --- training ---------------------------------------------------------------

def build_model(seed):
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for lin, (w, b) in zip(linears, init_weights(seed)):
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
    return model


class Block(torch.nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, and the shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.short = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                             torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


def build_cnn(seed):
    """A small ResNet for 28x28 images (about 78,000 parameters)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 16, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))


def state_hash(model):
    """SHA-256 of the state_dict: every tensor's bytes, in key order."""
    h = hashlib.sha256()
    for key, value in model.state_dict().items():
        h.update(key.encode())
        h.update(value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def shard(lo, global_batch, rank, ranks):
    return lo + global_batch * rank // ranks, lo + global_batch * (rank + 1) // ranks


def evaluate(model, x, y, rank, ranks):
    lo, hi = shard(0, len(y), rank, ranks)
    sums = torch.zeros(2, dtype=torch.float64)
    model.eval()  # batch norm from its running statistics
    with torch.no_grad():
        for a in range(lo, hi, 1024):
            b = min(a + 1024, hi)
            logits = model(x[a:b])
            sums[0] += torch.nn.functional.cross_entropy(logits, y[a:b], reduction="sum").double()
            sums[1] += (logits.argmax(1) == y[a:b]).sum().double()
    model.train()
    dist.all_reduce(sums)
    return sums[0].item() / len(y), sums[1].item() / len(y)


def train_epoch(ddp, opt, x, y, args, epoch, rank, ranks):
    order = torch.from_numpy(shuffled_order(len(y), args.seed, epoch))
    sums = torch.zeros(2, dtype=torch.float64)
    start = time.perf_counter()
    for lo in range(0, len(y), args.batch):
        global_batch = min(args.batch, len(y) - lo)
        a, b = shard(lo, global_batch, rank, ranks)
        idx = order[a:b]
        logits = ddp(x[idx])
        loss = torch.nn.functional.cross_entropy(logits, y[idx], reduction="sum")
        opt.zero_grad(set_to_none=True)
        (loss * (ranks / global_batch)).backward()
        opt.step()
        sums[0] += loss.detach().double()
        sums[1] += (logits.argmax(1) == y[idx]).sum().double()
    elapsed = time.perf_counter() - start
    dist.all_reduce(sums)
    return elapsed, sums[0].item() / len(y), sums[1].item() / len(y)


def import_gradsync():
    """Registers the gradsync backend: from PYTHONPATH, else from the build tree."""
    try:
        import gradsync  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "build", "python"))
        try:
            import gradsync  # noqa: F401,F811
        except ImportError as e:
            sys.exit(f"train_ddp.py: --backend gradsync: cannot import gradsync ({e}); "
                     "build it (cmake --build build --target gs_c10d) and set PYTHONPATH=build/python")


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    if args.backend == "gradsync":
        import_gradsync()
    timeout = datetime.timedelta(seconds=args.timeout)
    if port is None:  # under a launcher: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are set
        dist.init_process_group(args.backend, init_method="env://", timeout=timeout)
        rank, args.ranks = dist.get_rank(), dist.get_world_size()
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group(args.backend, rank=rank, world_size=args.ranks, timeout=timeout)
    x, y = load(args.data, "train", args.limit)
    tx, ty = load(args.data, "t10k", args.test_limit)
    model = build_model(args.seed) if args.model == "mlp" else build_cnn(args.seed)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    epochs = []
    for epoch in range(1, args.epochs + 1):
        elapsed, loss, acc = train_epoch(ddp, opt, x, y, args, epoch, rank, args.ranks)
        # batch norm's running statistics are each rank's own since DDP's last forward, which
        # broadcast rank 0's: broadcast them once more, as the next forward would
        for buf in model.buffers():
            dist.broadcast(buf, 0)
        test_loss, test_acc = evaluate(model, tx, ty, rank, args.ranks)
        e = dict(epoch=epoch, time_s=elapsed, images_per_s=len(y) / elapsed, train_loss=loss,
                 train_acc=acc, test_loss=test_loss, test_acc=test_acc)
        epochs.append(e)
        if rank == 0 and not args.json:
            print(f"epoch {epoch}/{args.epochs}  train loss {loss:.4f} acc {100 * acc:.2f}%  "
                  f"test loss {test_loss:.4f} acc {100 * test_acc:.2f}%  {elapsed:.2f} s  "
                  f"{e['images_per_s']:.0f} img/s", flush=True)
    hashes = [None] * args.ranks
    dist.all_gather_object(hashes, state_hash(model))
    same = len(set(hashes)) == 1
    if rank == 0 and not args.json:
        print(f"weights sha256 {hashes[0][:16]}...: {'the same on all' if same else 'DIFFERENT on the'} "
              f"{args.ranks} ranks", flush=True)
    if rank == 0 and args.json:
        print(json.dumps(dict(framework=f"pytorch {torch.__version__} DDP {args.backend}", model=args.model,
                              backend=args.backend, ranks=args.ranks, batch=args.batch, lr=args.lr,
                              momentum=args.momentum, threads=args.threads, train_images=len(y),
                              weights_sha256=hashes[0], same_weights_on_ranks=same, epochs=epochs)),
              flush=True)
    # Leave together, and drop DDP (its reducer holds the gloo group) before
    # the group: otherwise a rank may hang in the destructors at exit.
    dist.barrier()
    del ddp, opt
    dist.destroy_process_group()
    if not same:
        sys.exit(f"train_ddp.py: rank {rank}: the ranks' weights differ after training")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="processes to start (without a launcher)")
    p.add_argument("--backend", default="gloo", choices=("gloo", "gradsync"))
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=256, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="first N training images (0: all)")
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads per rank")
    p.add_argument("--data", default=DATA_DIR)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=int, default=600,
                   help="seconds before a stuck collective or the whole run is given up")
    args = p.parse_args()
    # torch's GEMMs go to the system BLAS (Debian: OpenBLAS), which starts one
    # thread per core unless told: --threads per rank, as gstrain's --threads.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    ranks = int(os.environ["WORLD_SIZE"]) if launched else args.ranks
    if not args.json and os.environ.get("RANK", "0") == "0":
        print(f"train_ddp: {ranks} ranks, {args.model} under DDP over {args.backend} "
              f"(torch {torch.__version__}), "
              f"global batch {args.batch}, lr {args.lr}, momentum {args.momentum}, "
              f"{args.threads} thread(s) per rank", flush=True)
    if launched:
        worker(int(os.environ["RANK"]), args, None)
        return
    procs = mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=False)
    deadline = time.monotonic() + args.timeout
    while not procs.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in procs.processes:
                proc.terminate()
            sys.exit(f"train_ddp.py: gave up after {args.timeout} s (--timeout)")


if __name__ == "__main__":
    main()
