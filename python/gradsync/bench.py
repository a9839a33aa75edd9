"""torch.distributed collectives timed like nccl-tests and gsbench, over any backend.

    python3 -m gradsync.bench --backend gradsync|gloo|gradsync,gloo [--ranks 2] [-c all_reduce,broadcast,...]
                              [-b 8] [-e 64M] [-f 2] [--iters N] [--warmup N] [--scale S] [--bind]
    torchrun --nproc_per_node 2 -m gradsync.bench --backend gradsync     # or under any launcher

Method (gsbench's): per size a warm-up, then iterations each preceded by a
barrier on the group measured; each rank times its own call (issued and
waited for); an iteration's time is the max over ranks; the table shows the
median over iterations (min and max beside it). Iterations per size:
2^28 / size (about 256 MiB moved) times --scale, between 20 and 1000 times
--scale.

size is nccl-tests' size: the vector of all_reduce and broadcast, the whole
(n x block) buffer of all_gather, reduce_scatter and all_to_all.
algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce, x 1 for
broadcast, x (n-1)/n for the rest. #wrong: inputs hold small integers whose
reduction is exact; the last iteration's result is compared element by
element with the value computed here, the count summed over ranks.

--backend gradsync,gloo measures both in the same processes, interleaved
size by size (the first is the default group, the other a new_group), and
ends with the ratio of their times: the fair comparison on a shared host.

--bind pins each rank (and the threads it starts) to one core, rank i on
the i-th usable core, when the ranks of this host fit its cores: what
gsbench does by default (its --no-pin turns it off), so the two measure the
same placement. Without it the scheduler places the ranks, as under
torchrun.

Without RANK and WORLD_SIZE in the environment (a launcher's), it starts
--ranks processes itself on this host (file:// init). Run it with a python3
that has torch (Debian's /usr/bin/python3).
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64}


def parse_size(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    unit = text[-1] if text and text[-1] in units else ""
    return int(float(text[:len(text) - len(unit)]) * units[unit])


def sizes_of(args):
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s = max(s + 1, int(s * args.factor))
    return sizes


def pattern(n, rank, offset=0):
    """Small integers, exact in every dtype and in sums over a few ranks."""
    return ((torch.arange(n, dtype=torch.int64) * 3 + rank * 7 + offset) % 11 - 5)


class Case:
    """One collective at one size: buffers, the call, the expected result and busbw's factor."""

    def __init__(self, coll, nbytes, dtype, rank, world):
        es = torch.empty(0, dtype=dtype).element_size()
        self.coll, self.world = coll, world
        per = max(nbytes // es // (1 if coll in ("all_reduce", "broadcast") else world), 1)
        self.count = per if coll in ("all_reduce", "broadcast") else per * world
        self.bytes = self.count * es
        self.factor = {"all_reduce": 2 * (world - 1) / world, "broadcast": 1.0}.get(coll, (world - 1) / world)
        if coll == "all_reduce":
            self.src = pattern(per, rank).to(dtype)
            self.buf = self.src.clone()
            self.want = sum(pattern(per, r) for r in range(world)).to(dtype)
        elif coll == "broadcast":
            self.src = pattern(per, rank).to(dtype)
            self.buf = self.src.clone()
            self.want = pattern(per, 0).to(dtype)
        elif coll == "all_gather":
            self.src = pattern(per, rank).to(dtype)
            self.buf = torch.empty(per * world, dtype=dtype)
            self.want = torch.cat([pattern(per, r) for r in range(world)]).to(dtype)
        elif coll == "reduce_scatter":
            self.src = pattern(per * world, rank).to(dtype)
            self.buf = torch.empty(per, dtype=dtype)
            total = sum(pattern(per * world, r) for r in range(world))
            self.want = total[rank * per:(rank + 1) * per].to(dtype)
        elif coll == "all_to_all":
            # block q of rank r's input holds pattern(per, r, q); rank r receives block r from each
            self.src = torch.cat([pattern(per, rank, q) for q in range(world)]).to(dtype)
            self.buf = torch.empty(per * world, dtype=dtype)
            self.want = torch.cat([pattern(per, q, rank) for q in range(world)]).to(dtype)
        self.rank = rank

    def reset(self):
        if self.coll in ("all_reduce", "broadcast"):
            self.buf.copy_(self.src)  # in place: start again from the input

    def call(self, group):
        if self.coll == "all_reduce":
            dist.all_reduce(self.buf, group=group)
        elif self.coll == "broadcast":
            dist.broadcast(self.buf, 0, group=group)
        elif self.coll == "all_gather":
            dist._all_gather_base(self.buf, self.src, group=group)
        elif self.coll == "reduce_scatter":
            dist._reduce_scatter_base(self.buf, self.src, group=group)
        else:
            dist.all_to_all_single(self.buf, self.src, group=group)

    def wrong(self):
        return int((self.buf != self.want).sum().item())


def iterations(nbytes, args):
    if args.iters:
        return args.iters
    it = int((1 << 28) / nbytes * args.scale)
    return max(int(20 * args.scale), min(it, int(1000 * args.scale)), 1)


def measure(case, args, group):
    """Median (min, max) over iterations of the max over ranks, in microseconds; #wrong over ranks."""
    for _ in range(args.warmup):
        case.reset()
        case.call(group)
    n = iterations(case.bytes, args)
    times = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        case.reset()
        dist.barrier(group=group)
        t0 = time.perf_counter()
        case.call(group)
        times[i] = time.perf_counter() - t0
    wrong = torch.tensor([case.wrong()], dtype=torch.int64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(wrong, group=group)
    us = (times * 1e6).tolist()
    return statistics.median(us), min(us), max(us), int(wrong.item()), n


HEADER = "%-9s %12s %12s %8s %6s %11s %11s %11s %11s %11s %8s %6s" % (
    "backend", "size(B)", "count", "type", "redop", "time(us)", "min(us)", "max(us)", "algbw(GB/s)",
    "busbw(GB/s)", "#wrong", "iters")


def bench(args, rank, world, groups):
    """groups: (backend name, process group) pairs, measured in turn at each size."""
    rows = []
    for coll in args.collectives:
        if rank == 0:
            print(f"# {coll}: torch.distributed backend {args.backend}, {world} ranks, {args.dtype}, "
                  f"torch {torch.__version__}{', ranks pinned (--bind)' if args.bind else ''}", flush=True)
            print("# time: median over iterations of the max over ranks (min, max alongside)")
            print(HEADER, flush=True)
        for nbytes in sizes_of(args):
            for name, group in groups:
                case = Case(coll, nbytes, DTYPES[args.dtype], rank, world)
                med, lo, hi, wrong, n = measure(case, args, group)
                algbw = case.bytes / med / 1e3  # GB/s from bytes per microsecond
                rows.append(dict(backend=name, collective=coll, bytes=case.bytes, time_us=med,
                                 busbw=algbw * case.factor, wrong=wrong))
                if rank == 0:
                    redop = "sum" if coll in ("all_reduce", "reduce_scatter") else "-"
                    print("%-9s %12d %12d %8s %6s %11.2f %11.2f %11.2f %11.3f %11.3f %8d %6d" % (
                        name, case.bytes, case.count, args.dtype, redop, med, lo, hi, algbw,
                        algbw * case.factor, wrong, n), flush=True)
    if rank == 0 and len(groups) > 1:
        print_ratios(rows, groups)
    return rows


def print_ratios(rows, groups):
    """Each later backend's time over the first's, size by size (measured interleaved)."""
    first = groups[0][0]
    for name, _ in groups[1:]:
        print(f"# {name} time / {first} time (the same size, measured in turn)")
        print("%-15s %12s %10s" % ("collective", "size(B)", "ratio"))
        for r in rows:
            if r["backend"] != first:
                continue
            other = [o for o in rows if o["backend"] == name and o["collective"] == r["collective"]
                     and o["bytes"] == r["bytes"]]
            if other:
                print("%-15s %12d %10.2f" % (r["collective"], r["bytes"], other[0]["time_us"] / r["time_us"]))


def bind(rank, world):
    """Rank i of this host on its i-th usable core when the host's ranks fit (gsbench's pinning)."""
    local = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cores = sorted(os.sched_getaffinity(0))
    if local_world <= len(cores):
        os.sched_setaffinity(0, {cores[local]})


def _entry(rank, world, init, args):
    torch.set_num_threads(1)
    if args.bind:
        bind(rank, world)  # before any thread starts: they inherit it
    backends = args.backend.split(",")
    if "gradsync" in backends:
        import gradsync  # noqa: F401  registers the backend
    timeout = datetime.timedelta(seconds=args.timeout)
    if init:
        dist.init_process_group(backends[0], init_method=init, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backends[0], init_method="env://", timeout=timeout)
    groups = [(backends[0], None)] + [(b, dist.new_group(backend=b, timeout=timeout)) for b in backends[1:]]
    rows = bench(args, dist.get_rank(), dist.get_world_size(), groups)
    dist.barrier()
    dist.destroy_process_group()
    if any(r["wrong"] for r in rows):
        sys.exit(1)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m gradsync.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="gradsync",
                   help="gradsync, gloo (any torch.distributed backend), or several: gradsync,gloo")
    p.add_argument("--ranks", type=int, default=2, help="processes to start when no launcher set RANK")
    p.add_argument("-c", "--collectives", default="all_reduce",
                   help=f"comma-separated: {', '.join(COLLECTIVES)} or all")
    p.add_argument("-t", "--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("-b", "--min-bytes", type=parse_size, default=8)
    p.add_argument("-e", "--max-bytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--factor", type=float, default=2.0)
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: by size)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--scale", type=float, default=1.0, help="scales the iterations per size")
    p.add_argument("--bind", action="store_true",
                   help="pin rank i to the i-th usable core when the ranks fit the cores (as gsbench does)")
    p.add_argument("--timeout", type=int, default=300, help="seconds before a stuck collective fails")
    args = p.parse_args(argv)
    args.collectives = list(COLLECTIVES) if args.collectives == "all" else args.collectives.split(",")
    for c in args.collectives:
        if c not in COLLECTIVES:
            p.error(f"unknown collective {c!r} (one of {', '.join(COLLECTIVES)})")
    if args.factor <= 1 or args.min_bytes < 1 or args.min_bytes > args.max_bytes:
        p.error("need --factor > 1 and 1 <= --min-bytes <= --max-bytes")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _entry(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_entry, args=(args.ranks, "file://" + os.path.join(tmp, "store"), args),
                           nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
