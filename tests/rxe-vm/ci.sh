#!/usr/bin/env bash
# CI step: the verbs transport on real Soft-RoCE. Prepares the QEMU guest
# (setup.sh), boots it once (run.sh) and runs inside it, against rxe0:
#   1. the device as the guest sees it (ibv_devinfo),
#   2. the verbs transport's own tests, whole (test_verbs_local, test_verbs_rc),
#      and test_verbs_local once more from BUILD_DIR/ib-compat, a build with
#      -DGS_IB_COMPAT=ON (the fallbacks of newer libibverbs calls: sysfs
#      gid_attrs instead of ibv_query_gid_ex), made here on the host first,
#   3. gsperf over verbs (2 ranks, up to 64 KiB: a smoke run, not a benchmark),
#   4. the conformance suite over 4 queue pairs per peer (GS_IB_QPS_PER_PEER=4,
#      GS_IB_STRIPE_MIN=4K: every op over 4 KiB striped), then
#      every test binary that registers verbs cases ("verbs.<case>", as
#      `GS_TEST_TRANSPORT=verbs BIN --list` shows them on the host), with
#      GS_TEST_TRANSPORT=verbs: the conformance suite, the collectives, the
#      parameter server's tests, and whatever test joins them later. Where a
#      binary runs only some of its cases here, GUEST_CASES says which and why,
#   5. last, the fault tests (test_verbs_faults): they take rxe0's netdev down
#      and up and add a second rxe device for a while, so nothing runs beside them;
# then, in a second boot, two guests on one virtual wire (two.sh): conformance,
# collectives and PS across them, shm inside and verbs between, DSCP on the
# wire, 1% loss, a 1 s outage ridden out and a long one failing every rank.
# A guest that does not boot or whose rxe0 does not come up fails this step
# (run.sh exits 125); so does any failed or skipped case inside the guest, and
# a build without the verbs transport.
#
# usage: tests/rxe-vm/ci.sh BUILD_DIR   (scripts/test.sh passes its ASan+UBSan build)
# env:   GS_RXE_CI_TIMEOUT  seconds the guest may run (default 2400)
#        GS_RXE_CI_OUT      where the logs go (default BUILD_DIR/rxe-vm-ci)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The verbs transport's own tests, run whole (their cases are not per transport).
VERBS_TESTS=(test_verbs_local test_verbs_rc test_verbs_lanes)
# Tests that change the guest's network (and put it back): run after everything else.
FAULT_TESTS=(test_verbs_faults)
# Cases (substrings, as the test binaries take them) of the binaries that run
# only some of theirs in the guest. test_allreduce: the matrix at 2-4 ranks and
# the rounding test; its 5-8 rank, large and zero-copy cases pass too but take
# minutes each under emulation, and they run on shm and tcp on the host.
# test_mismatch, test_p2p, test_exchange: the checks and the matching live
# above the transport (they run whole on shm and tcp); over verbs each kind of
# case runs once at the smallest size that has it, to keep the rxe steps of CI
# inside 20 minutes (whole, the three took about 400 s of the guest's time).
# The others leave out (--except) their largest rank counts and sizes and
# their timing cases (figures, not checks; 20-30 s each under emulation).
declare -A GUEST_CASES=(
    [test_allreduce]="matrix_2 matrix_3 matrix_4 rounding"
    [test_mismatch]="mismatch_count mismatch_root mismatch_broadcast_vs_allreduce mismatch_alltoallv_counts absent_rank dead_rank"
    [test_p2p]="pingpong_2 fifo_2 any_source_4 posted_before_and_after beside_allreduce_2 self_and_errors dead_peer_2 mail_and_transport_in_order --except fragments"
    [test_exchange]="matrix_1 matrix_2 matrix_3 large_2"
    [test_collectives]="--except matrix_7 --except matrix_8"
    [test_rooted]="--except large_3"
    [test_shrink]="--except timing"
    [test_ps_elastic]="--except timing"
)
# Binaries with verbs cases that do not run in the guest, and why.
declare -A NOT_IN_GUEST=(
    [test_gstrain_elastic]="trains gstrain at 4 ranks several times per case (about a minute on the host, far more under emulation); the elastic calls over verbs run in test_shrink and test_grow"
)

# ---- inside the guest --------------------------------------------------------------------------
guest_main() { # BUILD_DIR TEST...: the binaries with verbs cases
    local build=$1 failed=0 t
    shift
    cd "$build"
    step devinfo 60 ibv_devinfo -d "${GS_RXE_DEVICE:-rxe0}" || failed=1
    for t in "${VERBS_TESTS[@]}"; do
        step "${t#test_}" 300 "tests/$t" || failed=1
    done
    step verbs_local_compat 300 ib-compat/tests/test_verbs_local || failed=1
    step gsperf 300 tools/gsrun -n 2 --transport verbs -- \
        tools/gsperf --transport verbs --max 65536 --iters 100 || failed=1
    # the conformance cases of data and order once more over 4 queue pairs per peer, every op
    # over 4 KiB striped (the rest do not stripe)
    step conformance_qps4 600 env GS_TEST_TRANSPORT=verbs GS_IB_QPS_PER_PEER=4 GS_IB_STRIPE_MIN=4K \
        tests/test_conformance write_every write_imm_every streamed_ read_every write_then notifications \
        send_stream atomics_return caller_memory || failed=1
    for t in "$@"; do
        # shellcheck disable=SC2086 # GUEST_CASES holds words
        step "${t#test_}" 600 env GS_TEST_TRANSPORT=verbs "tests/$t" ${GUEST_CASES[$t]:-} || failed=1
    done
    for t in "${FAULT_TESTS[@]}"; do
        step "${t#test_}" 300 "tests/$t" || failed=1
    done
    echo "== rxe-vm ci: $([ $failed -eq 0 ] && echo 'all steps passed' || echo 'FAILED')"
    return $failed
}

# Runs one step with a time limit, its output into $GS_RXE_OUT/NAME.log;
# prints a summary, or the log's tail on failure. A skipped test case in the
# guest is a failure (the device is there), except the one that needs its absence.
step() {
    local name=$1 limit=$2 log=$GS_RXE_OUT/$1.log rc=0 t0 skips
    shift 2
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$log" 2>&1 || rc=$?
    skips=$(grep '^\[ SKIP \]' "$log" | grep -cv 'without_a_device' || true)
    if [ $rc -eq 0 ] && grep -q '^0 passed, 0 failed, 0 skipped' "$log"; then
        echo "rxe-vm ci: $name: no case ran" >&2
        rc=1
    fi
    if [ $rc -eq 0 ] && [ "$skips" -gt 0 ]; then
        echo "rxe-vm ci: $name: $skips case(s) skipped in the guest, where they must run:" >&2
        grep -B2 '^\[ SKIP \]' "$log" >&2
        rc=1
    fi
    echo "== rxe-vm ci: $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $(($(date +%s) - t0)) s"
    if [ "$name" = gsperf ] || [ "$name" = devinfo ]; then
        grep -v ' INFO \| WARN ' "$log" || true
    else
        grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$log" | tail -n 1 || true
    fi
    if [ $rc -ne 0 ]; then
        [ $rc -eq 124 ] && echo "rxe-vm ci: $name: timed out after $limit s" >&2
        echo "---- $name: last lines of $log ----" >&2
        grep -v ' INFO ' "$log" | tail -n 60 >&2
    fi
    return $rc
}

if [ -n "${GS_RXE_GUEST:-}" ]; then
    guest_main "$@"
    exit
fi

# ---- on the host -------------------------------------------------------------------------------
# The test binaries of the build that register verbs cases, one a line.
verbs_test_binaries() { # BUILD_DIR
    local bin names
    for bin in "$1"/tests/test_*; do
        [ -x "$bin" ] || continue
        names=$(GS_TEST_TRANSPORT=verbs "$bin" --list) || {
            echo "rxe-vm ci: $bin --list failed" >&2
            return 1
        }
        if grep -Eq '^[0-9]+ passed, ' <<<"$names"; then
            echo "rxe-vm ci: $bin does not know --list: rebuild the tree" >&2
            return 1
        fi
        grep -q '^verbs\.' <<<"$names" || continue
        if [ -n "${NOT_IN_GUEST[$(basename "$bin")]:-}" ]; then
            echo "rxe-vm ci: not in the guest: $(basename "$bin"): ${NOT_IN_GUEST[$(basename "$bin")]}" >&2
            continue
        fi
        basename "$bin"
    done
    return 0
}

[ $# -eq 1 ] || { echo "usage: tests/rxe-vm/ci.sh BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
for f in tools/gsinfo tools/gsrun tools/gsperf "${VERBS_TESTS[@]/#/tests/}" "${FAULT_TESTS[@]/#/tests/}"; do
    [ -x "$build/$f" ] || { echo "rxe-vm ci: $build/$f is missing: build the tree first" >&2; exit 1; }
done
if ! env -i "$build/tools/gsinfo" | grep '^transports:.* verbs' >/dev/null; then # not -q: an early exit breaks the pipe (pipefail)
    echo "rxe-vm ci: $build has no verbs transport: install libibverbs-dev (scripts/deps.sh does) and" \
        "configure the build again (cmake -S . -B $1 -DGS_WITH_VERBS=ON)" >&2
    exit 1
fi
# The fallback build: test_verbs_local with -DGS_IB_COMPAT=ON, configured like BUILD_DIR.
compat_build() { # BUILD_DIR
    local src type sanitize
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt")
    type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$1/CMakeCache.txt")
    sanitize=$(sed -n 's/^GS_SANITIZE:[A-Z]*=//p' "$1/CMakeCache.txt")
    cmake -S "$src" -B "$1/ib-compat" -DCMAKE_BUILD_TYPE="$type" -DGS_SANITIZE="${sanitize:-OFF}" \
        -DGS_WITH_VERBS=ON -DGS_IB_COMPAT=ON >"$1/ib-compat.log" 2>&1 &&
        cmake --build "$1/ib-compat" --target test_verbs_local -j"$(nproc)" >>"$1/ib-compat.log" 2>&1 || {
        echo "rxe-vm ci: the GS_IB_COMPAT=ON build failed:" >&2
        tail -n 40 "$1/ib-compat.log" >&2
        return 1
    }
    # on the host it runs what needs no device (the device cases skip here, and must pass in the guest)
    "$1/ib-compat/tests/test_verbs_local" >>"$1/ib-compat.log" 2>&1 || {
        echo "rxe-vm ci: the GS_IB_COMPAT=ON test_verbs_local failed on the host:" >&2
        tail -n 40 "$1/ib-compat.log" >&2
        return 1
    }
}
t0=$(date +%s)
compat_build "$build"
echo "== rxe-vm ci: GS_IB_COMPAT=ON build of test_verbs_local: ok in $(($(date +%s) - t0)) s"
list=$(verbs_test_binaries "$build")
[ -n "$list" ] || { echo "rxe-vm ci: no test binary in $build/tests registers verbs cases" >&2; exit 1; }
mapfile -t tests <<<"$list"
for t in "${!GUEST_CASES[@]}"; do
    [[ " ${tests[*]} " == *" $t "* ]] || { echo "rxe-vm ci: GUEST_CASES names $t, which has no verbs cases" >&2; exit 1; }
    for c in ${GUEST_CASES[$t]}; do
        [ "$c" != --except ] || continue # the word after it is checked as any other: it must name a case
        # the list first, then grep: grep -q leaving early would break the pipe (pipefail)
        cases=$(GS_TEST_TRANSPORT=verbs "$build/tests/$t" --list "$c")
        grep -q '^verbs\.' <<<"$cases" ||
            { echo "rxe-vm ci: GUEST_CASES[$t] names '$c', which no verbs case of $t matches" >&2; exit 1; }
    done
done
echo "== rxe-vm ci: test binaries with verbs cases: ${tests[*]}"
out=${GS_RXE_CI_OUT:-$build/rxe-vm-ci}
t0=$(date +%s)
"$HERE/setup.sh"
echo "== rxe-vm ci: guest ready in $(($(date +%s) - t0)) s; booting (logs in $out)"
rc=0
"$HERE/run.sh" --timeout "${GS_RXE_CI_TIMEOUT:-2400}" --out "$out" -- "$HERE/ci.sh" "$build" "${tests[@]}" || rc=$?
echo "== rxe-vm ci: one guest: $([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t0)) s"
rc2=0
"$HERE/two.sh" "$build" || rc2=$?
[ $rc -ne 0 ] || rc=$rc2
echo "== rxe-vm ci: $([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t0)) s"
exit $rc
