#!/usr/bin/env bash
# The parameter server beside an allreduce of the same sizes, measured in one
# session: gsbench --ps with W workers and S servers, then gsrun -n W gsbench
# (allreduce), repeated ROUNDS times interleaved; per size the median over
# the rounds of each run's median, and the ratio push_pull / allreduce.
#
# usage: tools/gsbench/ps_vs_allreduce.sh BUILD_DIR [-w W] [-s S] [-t TRANSPORT] [-r ROUNDS]
#                                    [--sizes LIST] [--iters N] [--agg write|atomic] [--mode sync|async]
# e.g.   tools/gsbench/ps_vs_allreduce.sh build -w 2 -s 1 -t shm --sizes 1M,16M,64M -r 3
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
build=$1
shift
workers=2 servers=1 transport=shm rounds=3 sizes=4K,64K,1M,16M,64M iters=20 agg=write mode=sync
while [ $# -gt 0 ]; do
    case $1 in
    -w) workers=$2; shift 2 ;;
    -s) servers=$2; shift 2 ;;
    -t) transport=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --agg) agg=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    *) echo "ps_vs_allreduce.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
gsrun=$build/tools/gsrun gsbench=$build/tools/gsbench
for f in "$gsrun" "$gsbench"; do
    [ -x "$f" ] || { echo "ps_vs_allreduce.sh: $f is missing: build the tree first" >&2; exit 1; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for r in $(seq 1 "$rounds"); do
    "$gsrun" -n $((workers + servers)) "$gsbench" --ps --servers "$servers" --transport "$transport" \
        --agg "$agg" --mode "$mode" --sizes "$sizes" --iters "$iters" --json 2>"$out/ps.$r.err" |
        sed 's/^\[0\] //' >"$out/ps.$r.json"
    "$gsrun" -n "$workers" "$gsbench" -c allreduce --transport "$transport" --sizes "$sizes" --iters "$iters" \
        --json 2>"$out/ar.$r.err" | sed 's/^\[0\] //' >"$out/ar.$r.json"
done

python3 - "$out" "$rounds" "$workers" "$servers" "$transport" "$agg" "$mode" <<'EOF'
import json, statistics, sys
out, rounds, w, s, transport, agg, mode = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def load(name):
    runs = []
    for r in range(1, rounds + 1):
        text = open(f"{out}/{name}.{r}.json").read()
        runs.append(json.loads(text[text.index("{"):]))
    return runs
ps, ar = load("ps"), load("ar")
wrong = sum(row["wrong"] for run in ps + ar for row in run["rows"])
print(f"# {w} workers + {s} servers ({mode}, {agg}) vs {w}-rank allreduce, transport {transport}, "
      f"median of {rounds} interleaved rounds; #wrong over all runs: {wrong}")
print(f"{'size(B)':>12} {'push(us)':>11} {'pull(us)':>11} {'pushpull(us)':>13} {'allreduce(us)':>14} "
      f"{'pp GB/s':>8} {'ar GB/s':>8} {'pp/ar':>6}")
for i, row in enumerate(ps[0]["rows"]):
    med = lambda runs, key: statistics.median(run["rows"][i][key] for run in runs)
    pp, a = med(ps, "push_pull_us"), med(ar, "time_us")
    print(f"{row['bytes']:>12} {med(ps, 'push_us'):>11.1f} {med(ps, 'pull_us'):>11.1f} {pp:>13.1f} {a:>14.1f} "
          f"{row['bytes'] / pp / 1e3:>8.3f} {row['bytes'] / a / 1e3:>8.3f} {pp / a:>6.2f}")
sys.exit(1 if wrong else 0)
EOF
