#!/bin/bash
# gsbench allreduce (or COLL) against Open MPI's MPI_Allreduce (or the same
# collective through ../shared/bench's mpi_coll), run interleaved in one session: REPS rounds of [probe, gsbench, probe, MPI],
# every run by the same method (barrier, max over ranks, median over
# iterations), f32 sum, sizes 8 B .. 64 MiB. Prints each size's median over
# rounds and the ratio MPI/gradsync of the per-round medians.
#
#   tests/coll/bench_vs_mpi.sh BUILD_DIR [RANKS] [REPS] [extra gsbench args...]
#   TRANSPORT=tcp tests/coll/bench_vs_mpi.sh ...   # gradsync over tcp, Open MPI over its tcp btl
#   COLL=reduce tests/coll/bench_vs_mpi.sh ...     # any collective bin/mpi_coll runs (reduce broadcast
#       # allgather reduce_scatter alltoall gather scatter): gsbench -c COLL beside mpi_coll COLL, the
#       # same sizes (the larger buffer of a rank, nccl-tests' way) and busbw factors
#   BASELINE=gloo TRANSPORT=tcp tests/coll/bench_vs_mpi.sh ...
#       # PyTorch gloo (../shared/bench/py/gloo_allreduce.py, Debian python3-torch) instead of MPI
#
# Over tcp each round also times the floor (tests/coll/tcp_exchange.c): the
# same bytes as a 2-rank allreduce moves (N each way), exchanged through plain
# send/recv with nothing else to do; the tables get its time and the ratio
# floor/gradsync for 1, 16 and 64 MiB (RAW=0 leaves it out).
#
# The probe is the 10 ms cross-core cache-line ping-pong of the baseline
# (about 50 ns or about 200 ns one way here: the host moves the vCPUs), taken
# before each run and after the last; when rounds differ, the table is also
# printed for the fast rounds and the slow rounds alone (mixed rounds, where
# the placement moved, only count in the first table). Needs openmpi-bin and the
# baseline built (/work/shared/bench/run.sh deps; make in $BENCH_WORK).
set -euo pipefail
build=${1:?usage: bench_vs_mpi.sh BUILD_DIR [RANKS] [REPS] [gsbench args...]}
ranks=${2:-2}
reps=${3:-5}
shift $(($# < 3 ? $# : 3))
bench=${BENCH_WORK:-/tmp/gradsync-baselines}
sizes=8,64,1K,4K,64K,1M,16M,64M
scale=1
oversub=
if [ "$ranks" -gt "$(nproc)" ]; then scale=0.25; oversub=--oversubscribe; fi
transport=${TRANSPORT:-shm}
coll=${COLL:-allreduce}
baseline=${BASELINE:-mpi}
gloo_py=${GLOO_PY:-$(dirname "$0")/../../../shared/bench/py/gloo_allreduce.py}
[ -f "$gloo_py" ] || gloo_py=$bench/py/gloo_allreduce.py
mpi_net=()
if [ "$transport" = tcp ]; then
    mpi_net=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
fi
# MPI_Bcast has one buffer: the root's data is its result. gsbench times
# broadcast in place too, so that both do the same work (out of place the
# root also copies its input to its result).
inplace=()
[ "$coll" = broadcast ] && inplace=(--inplace)
out=$(mktemp -d)
raw=
if [ "$transport" = tcp ] && [ "$ranks" = 2 ] && [ "${RAW:-1}" != 0 ]; then
    raw=$build/tests/tcp_exchange # built with the tests (GS_BUILD_TESTS, the default)
    [ -x "$raw" ] || { echo "bench_vs_mpi.sh: $raw missing: build the tests in $build" >&2; exit 1; }
fi
for r in $(seq "$reps"); do
    p1=$("$bench/bin/shm_pingpong" spin 500 100 | cut -d' ' -f2)
    "$build/tools/gsrun" -n "$ranks" --transport "$transport" "$build/tools/gsbench" -c "$coll" --sizes "$sizes" \
        --scale "$scale" --json "${inplace[@]}" "$@" | sed 's/^\[0\] //' > "$out/gs.$r.json"
    p2=$("$bench/bin/shm_pingpong" spin 500 100 | cut -d' ' -f2)
    if [ "$baseline" = gloo ]; then
        GLOO_SOCKET_IFNAME=lo timeout 600 /usr/bin/python3 "$gloo_py" "$ranks" $((29600 + r)) "$scale" \
            > "$out/mpi.$r.txt" 2>/dev/null
    elif [ "$coll" = allreduce ]; then
        timeout 600 mpirun --allow-run-as-root -np "$ranks" $oversub "${mpi_net[@]}" "$bench/bin/mpi_allreduce" "$scale" \
            > "$out/mpi.$r.txt" 2>/dev/null
    else
        timeout 600 mpirun --allow-run-as-root -np "$ranks" $oversub "${mpi_net[@]}" "$bench/bin/mpi_coll" "$coll" \
            "$scale" > "$out/mpi.$r.txt" 2>/dev/null
    fi
    [ -z "$raw" ] || timeout 300 "$raw" 1M,16M,64M 20 > "$out/raw.$r.txt"
    p3=$("$bench/bin/shm_pingpong" spin 500 100 | cut -d' ' -f2)
    echo "round $r: probe before gsbench ${p1} ns, before $baseline ${p2} ns, after it${raw:+ and the floor} ${p3} ns" >&2
    echo "$p1 $p2 $p3" > "$out/probe.$r.txt"
done
python3 - "$out" "$reps" "$baseline" "$coll" <<'EOF'
import json, statistics, sys
out, reps, base, coll = sys.argv[1], int(sys.argv[2]), sys.argv[3].replace("mpi", "MPI"), sys.argv[4]
gs, mpi, raw = {}, {}, {}
for r in range(1, reps + 1):
    try:
        for line in open(f"{out}/raw.{r}.txt"):
            f = line.split()
            if f and f[0] == "exchange":
                raw.setdefault(int(f[1]), []).append(float(f[2]))
    except FileNotFoundError:
        pass
    for row in json.load(open(f"{out}/gs.{r}.json"))["rows"]:
        gs.setdefault(row["bytes"], []).append((row["time_us"], row["busbw_GBps"], row["wrong"]))
    for line in open(f"{out}/mpi.{r}.txt"):
        f = line.split()
        if f and f[0] == coll:
            mpi.setdefault(int(f[1]), []).append((float(f[2]), float(f[6])))
# placement of each round from its three probes (about 50 ns: cores sharing
# a cache; about 200 ns: not): rounds that moved in between are "mixed"
place = []
for r in range(1, reps + 1):
    p = [float(x) for x in open(f"{out}/probe.{r}.txt").read().split()]
    place.append("fast" if max(p) < 120 else "slow" if min(p) >= 120 else "mixed")
med = lambda v: statistics.median(v) if v else float("nan")

def table(title, keep):
    rounds = [i for i in range(reps) if keep(place[i])]
    if not rounds:
        return
    print(f"{coll}: {title} ({len(rounds)} of {reps} rounds)")
    floor = " floor us | floor/gradsync |" if raw else ""
    print(f"| size | gradsync us | {base} us | {base}/gradsync time (per-round median, min..max) | gradsync busbw GB/s | {base} busbw GB/s | #wrong |{floor}")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if raw else ""))
    for b in sorted(gs):
        g = [gs[b][i] for i in rounds]
        m = [mpi[b][i] for i in rounds] if b in mpi else []
        ratios = [mm[0] / gg[0] for gg, mm in zip(g, m)]
        cells = ""
        if raw:
            w = [raw[b][i] for i in rounds] if b in raw else []
            cells = (f" {med(w):.2f} | {med([ww / gg[0] for gg, ww in zip(g, w)]):.2f} |" if w else " | |")
        print(f"| {b} | {med([x[0] for x in g]):.2f} | {med([x[0] for x in m]):.2f} | "
              f"{med(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f}) | {med([x[1] for x in g]):.3f} | "
              f"{med([x[1] for x in m]):.3f} | {sum(x[2] for x in gs[b])} |{cells}")

table("all rounds", lambda p: True)
if len(set(place)) > 1:  # the host moved the vCPUs during the run: each placement apart
    print()
    table("fast placement (every probe < 120 ns)", lambda p: p == "fast")
    print()
    table("slow placement (every probe >= 120 ns)", lambda p: p == "slow")
EOF
rm -rf "$out"
