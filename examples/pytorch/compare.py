#!/usr/bin/python3
"""Runs gstrain (under gsrun) and the PyTorch DDP reference (train_ddp.py)
with the same model, data, hyper-parameters and rank count, alternately and
in the same session, and prints their epoch times side by side (medians over
every epoch of every repetition, and gstrain's fastest epoch, the one least
disturbed when the machine is shared).

    examples/pytorch/compare.py --ranks 2 --epochs 1 --reps 3 [--limit N] [--gstrain-args=--split-wait]

Needs a build (--build, default build/) and Debian's python3-torch.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_gstrain(args, common):
    cmd = [os.path.join(args.build, "tools", "gsrun"), "-n", str(args.ranks), "--",
           os.path.join(args.build, "examples", "gstrain"), "--json"] + common + args.gstrain_args.split()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
    line = [l[4:] for l in out.stdout.splitlines() if l.startswith("[0] {")]
    if out.returncode != 0 or not line:
        sys.exit(f"compare.py: gstrain failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(line[0])


def run_torch(args, common):
    cmd = [sys.executable, os.path.join(ROOT, "examples", "pytorch", "train_ddp.py"), "--json",
           "--ranks", str(args.ranks), "--timeout", str(args.timeout)] + common
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout + 30)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not line:
        sys.exit(f"compare.py: train_ddp.py failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(line[0])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--limit", type=int, default=0, help="training images (0: all)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--gstrain-args", default="", help="extra gstrain options, e.g. --split-wait")
    p.add_argument("--timeout", type=int, default=600)
    args = p.parse_args()
    common = ["--epochs", str(args.epochs), "--batch", str(args.batch)]
    if args.limit:
        common += ["--limit", str(args.limit)]
    gs, pt = [], []
    for _ in range(args.reps):
        gs += run_gstrain(args, common)["epochs"]
        pt += run_torch(args, common)["epochs"]
    med = lambda rows, key: statistics.median(r[key] for r in rows)
    g_t, p_t = med(gs, "time_s"), med(pt, "time_s")
    load = open("/proc/loadavg").read().split()[0]
    print(f"{args.ranks} ranks, global batch {args.batch}, {args.reps} x {args.epochs} epochs each, "
          f"load average {load}")
    print(f"gstrain      epoch {g_t:6.2f} s (min {min(r['time_s'] for r in gs):.2f})  "
          f"{med(gs, 'images_per_s'):7.0f} img/s  compute {med(gs, 'compute_s'):.2f} s  "
          f"wait {med(gs, 'wait_s'):.2f} s  sync {med(gs, 'sync_s'):.2f} s ({100 * med(gs, 'sync_share'):.1f}%)  "
          f"test acc {100 * gs[-1]['test_acc']:.2f}%")
    fast = min(gs, key=lambda r: r["time_s"])
    print(f"gstrain fastest epoch {fast['time_s']:.2f} s: compute {fast['compute_s']:.2f} s, "
          f"wait {fast['wait_s']:.2f} s ({100 * fast['wait_share']:.1f}%), "
          f"sync {fast['sync_s']:.2f} s ({100 * fast['sync_share']:.1f}%)")
    print(f"pytorch DDP  epoch {p_t:6.2f} s (min {min(r['time_s'] for r in pt):.2f})  "
          f"{med(pt, 'images_per_s'):7.0f} img/s  test acc {100 * pt[-1]['test_acc']:.2f}%")
    print(f"gstrain is {p_t / g_t:.2f}x as fast as PyTorch DDP (gloo) per epoch")


if __name__ == "__main__":
    main()
