#!/bin/bash
# GS_TRACE, gstrace merge, gsplot, gstrain --plot and the init summary
# (ctest tools/test_trace; $1 the build folder, $2 the source folder):
#   1. a 2-rank gsbench allreduce and a PS job with GS_TRACE: each rank's file
#      is valid JSON, its tracks nest, the expected operations are there;
#   2. gstrace merge: every rank, every collective call overlapping on all of
#      them within the stated clock bound (2 ranks over shm, 3 over tcp);
#   3. gstrain with GS_TRACE: its forward/backward/sync/update spans beside the
#      collectives; --plot draws a 1200x400 PNG;
#   4. gsplot draws a recorded gsbench JSON beside a recorded Open MPI run;
#   5. GS_LOG_LEVEL=info: rank 0's init summary, once, with what it must say.
set -euo pipefail
build=$(cd "${1:?usage: test_trace.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?}" && pwd)
py=/usr/bin/python3
check="$py $src/tests/tools/check_trace.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { timeout 300 "$build/tools/gsrun" "$@"; }

echo "== 1. traced gsbench and PS job"
GS_TRACE="$work/bench.%r.json" run -n 2 "$build/tools/gsbench" -c allreduce --sizes 8,64K --iters 50 --warmup 5 \
    > "$work/bench.out"
for r in 0 1; do
    $check file "$work/bench.$r.json" --expect coll:allreduce:8:55 --expect coll:allreduce:65536:55 \
        --expect coll:barrier:-:100
done
GS_TRACE="$work/ps.%r.json" run -n 3 "$build/tools/gsbench" --ps --servers 1 --sizes 4K,1M --iters 20 \
    --warmup 2 > "$work/ps.out"
$check file "$work/ps.0.json" --expect ps:push_pull:4096:22 --expect ps:push_pull:1048576:22
$check file "$work/ps.2.json" --expect ps:apply:-:44

echo "== 2. gstrace merge"
"$build/tools/gstrace" merge -o "$work/bench.json" "$work/bench.0.json" "$work/bench.1.json"
$check merged "$work/bench.json" --ranks 2
GS_TRACE="$work/tcp.%r.json" run -n 3 --transport tcp "$build/tools/gsbench" -c broadcast --sizes 8,1M --iters 20 \
    --warmup 2 > "$work/tcp.out"
"$build/tools/gstrace" merge -o "$work/tcp.json" "$work"/tcp.[012].json
$check merged "$work/tcp.json" --ranks 3

if [ -x "$build/examples/gstrain" ]; then
    echo "== 3. gstrain traced, and --plot"
    GS_TRACE="$work/train.%r.json" run -n 2 "$build/examples/gstrain" --epochs 2 --limit 2000 --test-limit 500 \
        --progress none --plot "$work/train.png" > "$work/train.out"
    for r in 0 1; do
        $check file "$work/train.$r.json" --spans forward,backward,sync,update --expect coll:allreduce:-:10
    done
    $check png "$work/train.png" 1200 400
else
    echo "test_trace: FAILED: $build/examples/gstrain missing (build the examples)" >&2
    exit 1
fi

echo "== 4. gsplot"
"$build/tools/gsplot" -o "$work/bench.png" --size 1000x450 "gradsync=$src/tests/tools/data/gsbench_allreduce_shm2.json" \
    "Open MPI=$src/tests/tools/data/mpi_allreduce_shm2.txt"
$check png "$work/bench.png" 1000 450

echo "== 5. init summary"
GS_LOG_LEVEL=info GS_CHUNK_BYTES=128K run -n 2 "$build/tools/gsbench" --sizes 8 --iters 5 > "$work/info.out" 2>&1
grep ' INFO coll: ' "$work/info.out" > "$work/summary" || true
for want in "gradsync [0-9.]*: 2 ranks on 1 host (2 on this one)" "transport for every peer.*: shm (memfd" \
    "algorithms (GS_ALGO=auto, by size): allreduce direct <= 16M, ring above" "thresholds: chunk 128K" \
    "cpu affinity of rank 0: " "set apart from the defaults: .*GS_CHUNK_BYTES=131072"; do
    grep -q "$want" "$work/summary" || { cat "$work/summary"; echo "test_trace: FAILED: no '$want'" >&2; exit 1; }
done
[ "$(grep -c 'INFO coll: gradsync ' "$work/summary")" = 1 ] || { echo "test_trace: FAILED: summary not once" >&2; exit 1; }
grep -q ' r1 .*INFO coll: gradsync' "$work/info.out" && { echo "test_trace: FAILED: rank 1 printed it" >&2; exit 1; }
echo "test_trace: passed"
