#!/usr/bin/env bash
# CI step: the verbs transport on real Soft-RoCE. Prepares the QEMU guest
# (setup.sh), boots it once (run.sh) and runs inside it, against rxe0:
#   1. the device as the guest sees it (ibv_devinfo),
#   2. the transport conformance suite on verbs (2-4 ranks; remote-access
#      violations leave the target untouched; a peer killed mid-stream is
#      GS_ERR_PEER_LOST within the deadline),
#   3. the verbs transport's own tests (test_verbs_local, test_verbs_rc),
#   4. gsperf over verbs (2 ranks, up to 64 KiB: a smoke run, not a benchmark),
#   5. the parameter server's tests on verbs (tests/ps: sync, async/SSP and the
#      torn-read stress, atomic aggregation, failures, kill-and-restart).
# A guest that does not boot or whose rxe0 does not come up fails this step
# (run.sh exits 125); so does any failed or skipped case inside the guest.
#
# usage: tests/rxe-vm/ci.sh BUILD_DIR   (scripts/test.sh passes its ASan+UBSan build)
# env:   GS_RXE_CI_TIMEOUT  seconds the guest may run (default 2400)
#        GS_RXE_CI_OUT      where the logs go (default BUILD_DIR/rxe-vm-ci)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PS_TESTS=(test_ps_sync test_ps_async test_ps_atomic test_ps_ckpt test_ps_fail test_ps_restart)
NEEDED=(tests/test_conformance tests/test_verbs_local tests/test_verbs_rc tools/gsrun tools/gsperf
        tests/test_collectives tests/test_mismatch tests/test_allreduce "${PS_TESTS[@]/#/tests/}")

# ---- inside the guest --------------------------------------------------------------------------
guest_main() {
    local build=$1 failed=0
    cd "$build"
    step devinfo 60 ibv_devinfo -d "${GS_RXE_DEVICE:-rxe0}" || failed=1
    step conformance 600 env GS_TEST_TRANSPORT=verbs tests/test_conformance || failed=1
    step verbs_local 120 tests/test_verbs_local || failed=1
    step verbs_rc 300 tests/test_verbs_rc || failed=1
    step gsperf 300 tools/gsrun -n 2 --transport verbs -- \
        tools/gsperf --transport verbs --max 65536 --iters 100 || failed=1
    # The collectives over verbs: every collective, the mismatch cases and the
    # allreduce matrix at 2-4 ranks (the 5-8 rank and 1M+3 cases pass too but
    # take minutes each under emulation; they run on shm and tcp on the host).
    step collectives 600 env GS_TEST_TRANSPORT=verbs tests/test_collectives || failed=1
    step mismatch 600 env GS_TEST_TRANSPORT=verbs tests/test_mismatch || failed=1
    step allreduce 600 env GS_TEST_TRANSPORT=verbs tests/test_allreduce matrix_2 matrix_3 matrix_4 rounding ||
        failed=1
    for t in "${PS_TESTS[@]}"; do
        step "${t#test_}" 300 env GS_TEST_TRANSPORT=verbs "tests/$t" || failed=1
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
[ $# -eq 1 ] || { echo "usage: tests/rxe-vm/ci.sh BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
for f in "${NEEDED[@]}"; do
    [ -x "$build/$f" ] || { echo "rxe-vm ci: $build/$f is missing: build the tree first" >&2; exit 1; }
done
out=${GS_RXE_CI_OUT:-$build/rxe-vm-ci}
t0=$(date +%s)
"$HERE/setup.sh"
echo "== rxe-vm ci: guest ready in $(($(date +%s) - t0)) s; booting (logs in $out)"
rc=0
"$HERE/run.sh" --timeout "${GS_RXE_CI_TIMEOUT:-2400}" --out "$out" -- "$HERE/ci.sh" "$build" || rc=$?
echo "== rxe-vm ci: $([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t0)) s"
exit $rc
