#!/bin/bash
# gradsync's tcp transport against raw TCP on loopback, interleaved in one
# session (compare ratios, never absolute times across runs):
#   raw: ../shared/bench's tcp_pingpong local (8-byte ping-pong with blocking
#        reads, 64 MiB stream acknowledged by 1 byte; both pinned to cores 0/1)
#   ours: gsperf over tcp, 2 ranks: 8-byte WRITE_IMM half round trip (GS_POLL
#        hybrid, the default, and event), 64 MiB WRITE bandwidth
# Usage: tests/transport/tcp_bench.sh BUILD_DIR [REPS]   (a Release build)
# Prints each repetition and the medians with the ratios.
set -euo pipefail
build=$(cd "${1:?usage: tcp_bench.sh BUILD_DIR [REPS]}" && pwd)
reps=${2:-5}
bench_src=${GS_BENCH_SRC:-/work/shared/bench/src}
raw=$build/tcp_pingpong
gsrun=$build/tools/gsrun
gsperf=$build/tools/gsperf
gcc -O2 -o "$raw" "$bench_src/tcp_pingpong.c"

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
perf_col() { # op mode args... -> the first data row's third column
    local op=$1 mode=$2
    shift 2
    GS_POLL=$mode timeout 300 "$gsrun" -n 2 -- "$gsperf" --transport tcp --op "$op" --no-floor "$@" 2>&1 |
        awk '/^\[0\] +[0-9]+ +[0-9]+ +[0-9.]+/ { print $4; exit }'
}

: >"$build/tcp_bench.txt"
for r in $(seq "$reps"); do
    out=$(timeout 300 "$raw" local)
    raw_lat=$(awk '/^lat8/ { print $2 }' <<<"$out")
    raw_bw=$(awk '/^bw64M/ { print $2 }' <<<"$out")
    lat_h=$(perf_col write_imm hybrid --lat --min 8 --max 8)
    lat_e=$(perf_col write_imm event --lat --min 8 --max 8)
    bw=$(perf_col write hybrid --bw --min 67108864 --max 67108864 --iters 16)
    echo "$raw_lat $raw_bw $lat_h $lat_e $bw" >>"$build/tcp_bench.txt"
    echo "rep $r: raw 8 B one-way ${raw_lat} us, raw 64 MiB ${raw_bw} GB/s;" \
        "tcp write_imm 8 B ${lat_h} us (hybrid) ${lat_e} us (event), tcp write 64 MiB ${bw} GB/s"
done
col() { awk -v c="$1" '{ print $c }' "$build/tcp_bench.txt" | median; }
raw_lat=$(col 1) raw_bw=$(col 2) lat_h=$(col 3) lat_e=$(col 4) bw=$(col 5)
echo "medians over $reps: raw ${raw_lat} us / ${raw_bw} GB/s; tcp ${lat_h} us hybrid, ${lat_e} us event, ${bw} GB/s"
awk -v a="$lat_h" -v e="$lat_e" -v r="$raw_lat" -v b="$bw" -v rb="$raw_bw" 'BEGIN {
    printf "latency ratio tcp/raw: %.2fx hybrid, %.2fx event (target <= 1.3x)\n", a / r, e / r
    printf "bandwidth ratio tcp/raw: %.0f%% (target >= 90%%)\n", 100 * b / rb }'
