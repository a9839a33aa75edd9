#!/usr/bin/python3
"""Measures gstrain's synchronization share of the step time for a few
variants, run interleaved so that a shared machine's load hits them alike.

    examples/gstrain/sync_share.py --ranks 2 --reps 6 \\
        'default=' 'per-layer=--bucket-kb 0' 'no-overlap=--no-overlap' 'event=GS_POLL=event'

Each variant is NAME=WORDS: WORDS that look like VAR=value go to the
environment, the rest to gstrain (after --split-wait --json and --args).
Prints per variant the medians over the least disturbed third of the epochs
(the fastest) and over all of them.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, words):
    env, extra = dict(os.environ), []
    for w in words:
        if "=" in w and w.split("=", 1)[0].isupper():
            k, v = w.split("=", 1)
            env[k] = v
        else:
            extra.append(w)
    cmd = [os.path.join(args.build, "tools", "gsrun"), "-n", str(args.ranks), "--",
           os.path.join(args.build, "examples", "gstrain"), "--split-wait", "--json"] + args.args.split() + extra
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    line = [l[4:] for l in out.stdout.splitlines() if l.startswith("[0] {")]
    if out.returncode != 0 or not line:
        sys.exit(f"sync_share.py: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(line[0])["epochs"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="+", help="NAME=gstrain options and VAR=value words")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--args", default="--epochs 3 --limit 30720 --test-limit 100",
                   help="gstrain options for every variant")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = p.parse_args()
    variants = [(v.split("=", 1)[0], v.split("=", 1)[1].split()) for v in args.variants]
    epochs = {name: [] for name, _ in variants}
    for _ in range(args.reps):
        for name, words in variants:
            epochs[name] += run(args, words)
    print(f"{args.ranks} ranks, gstrain {args.args} --split-wait, {args.reps} runs per variant, "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    for name, eps in epochs.items():
        eps.sort(key=lambda e: e["time_s"])
        best = eps[: max(1, len(eps) // 3)]
        med = lambda rows, k: statistics.median(e[k] for e in rows)
        print(f"{name:16s} best third: epoch {med(best, 'time_s'):.3f} s, compute {med(best, 'compute_s'):.3f} s, "
              f"wait {med(best, 'wait_s'):.3f} s, sync {med(best, 'sync_s'):.3f} s "
              f"({100 * med(best, 'sync_share'):.1f}%) | all {len(eps)} epochs: epoch {med(eps, 'time_s'):.3f} s, "
              f"sync {100 * med(eps, 'sync_share'):.1f}%")


if __name__ == "__main__":
    main()
