#!/usr/bin/env bash
# CI step: two hosts on a real (virtual) wire. Boots two Soft-RoCE guests
# joined by two virtual networks (run.sh --guests 2 --nics 2: NIC eth0 of
# each guest, rxe0 on it, 10.77.0.1 and 10.77.0.2; eth1 and rxe1 on
# 10.77.1.x, used by the rails step only) and runs across them, every step in
# both guests at once, meeting through a store served in guest 0:
#   1. meet       a first job with a long deadline (the guests boot apart),
#   2. conformance, collectives, ps: the verbs cases of test_conformance,
#                 test_collectives and test_ps_sync with each job's ranks
#                 spread over the guests (GS_TEST_SPAN: rank r in guest r mod 2),
#   3. mixed      2 ranks in each guest, GS_TRANSPORT=auto: shm inside a
#                 guest, verbs between (the init summary must say so), gsbench
#                 over every collective exact, allreduce with GS_ALGO auto,
#                 ring and hier,
#   4. dscp       GS_IB_TC=104: tcpdump in guest 0 must see RoCE v2 packets
#                 (UDP 4791) with IP tos 0x68 (DSCP 26),
#   5. loss       netem drops 1% of each guest's packets: every collective
#                 still exact,
#   6. outage     100% loss for 1 s from guest 0 in the middle of a run: the
#                 run rides it out (the QPs' retries) and stays exact,
#   7. cut        100% loss for longer than the retry budget: every rank ends
#                 with a lost peer or an I/O error within the deadline (not
#                 killed by the step's time limit),
#   8. rails      the guests' second NIC (eth1, rxe1): GS_IB_DEV=rxe0,rxe1
#                 GS_IB_RAILS=2 GS_IB_QPS_PER_PEER=4, gsbench exact at 1 MiB
#                 (striped WRITE_IMMs) with the stripes seen on both NICs'
#                 counters, then gsperf WRITE bandwidth at 1 MiB with 1 QP,
#                 4 QPs and 4 QPs on two rails (printed, not judged: TCG).
# The rest of the logs: BUILD_DIR/rxe-two/guest<i>/<step>.log.
#
# usage: tests/rxe-vm/two.sh BUILD_DIR   (tests/rxe-vm/ci.sh runs it after the one-guest steps)
# env:   GS_RXE_TWO_TIMEOUT  seconds the guests may run (default 1200)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ADDR0=10.77.0.1
STORE_PORT=29800 # jobs of this script: 29800 + k; span-mode test jobs: 31000 + k

# Which cases run across the guests. Left out: cases that kill a rank and
# check how each rank ended (span mode reports only its own machine's
# ranks), 4 ranks of the matrix (the mixed step runs 4 across the guests),
# and the longest stress cases (atomics under contention, ordering
# under load, all-to-all at 3-4 ranks in 3 modes: 2.5 minutes together
# here), which the one-guest steps run whole; the PS's big-shard and
# credit-stress cases likewise.
declare -A SPAN_CASES=(
    [conformance]="--except killed --except under_contention --except under_load --except all_to_all"
    [collectives]="matrix_2_ranks matrix_3_ranks barrier"
    [ps_sync]="sgd_one_server momentum_two_servers nonblocking_requests"
)

# ---- inside a guest ------------------------------------------------------------------------------
me=${GS_RXE_GUEST:-0}
jobs=0

say() { echo "rxe-two[guest $me]: $*"; }

# job NAME LIMIT RANKS_HERE ENV... -- CMD...: RANKS_HERE ranks in each guest
# (rank r in guest r mod 2), rank 0 serving the store at ADDR0; waits for
# this guest's ranks. Logs: NAME.r<rank>.log. Sets job_rcs (this guest's).
job() {
    local name=$1 limit=$2 per=$3 env=() pids=() l r port
    shift 3
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    port=$((STORE_PORT + jobs))
    jobs=$((jobs + 1))
    for l in $(seq 0 $((per - 1))); do
        r=$((l * 2 + me))
        env GS_RANK=$r GS_WORLD_SIZE=$((per * 2)) GS_LOCAL_RANK=$l GS_STORE=$ADDR0:$port \
            GS_JOB_TOKEN="$GS_TEST_SPAN_TOKEN-$port" GS_TCP_IFNAME=eth0 \
            ${env[@]+"${env[@]}"} timeout -k 5 "$limit" "$@" >"$GS_RXE_OUT/$name.r$r.log" 2>&1 &
        pids+=($!)
    done
    job_rcs=()
    for p in "${pids[@]}"; do
        rc=0
        wait "$p" || rc=$?
        job_rcs+=("$rc")
    done
}
all_zero() { local rc; for rc in "$@"; do [ "$rc" -eq 0 ] || return 1; done; }
logs_tail() { # NAME
    local f
    for f in "$GS_RXE_OUT/$1".r*.log; do echo "---- $f"; grep -v ' INFO ' "$f" | tail -n 20; done >&2
}

# Guest 0: waits (up to 120 s) until rank 0 of job NAME printed gsbench's
# header, so both ranks are connected (the guests start a step seconds
# apart under emulation: a link cut at a fixed time may catch a rank before
# it joined the store). Remove the log first: "rm -f $GS_RXE_OUT/NAME.r0.log".
started() { # NAME
    local i
    for i in $(seq 1200); do
        grep -q '^# gsbench' "$GS_RXE_OUT/$1.r0.log" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "rxe-two: $1: rank 0's run did not start within 120 s" >&2
    return 1
}

# netem on eth0 (egress of this guest): "loss 1%", "loss 100%", or "" to remove.
netem() {
    tc qdisc del dev eth0 root 2>/dev/null || true
    [ -z "$1" ] || tc qdisc add dev eth0 root netem $1
}

# Both guests start a step together: a job of its own with a long deadline
# (a step that failed in one guest may have ended there much earlier).
meet() { # STEP
    job "meet-$1" 300 1 GS_TRANSPORT=tcp GS_TIMEOUT_MS=240000 -- "$gsbench" --sizes 8 --iters 1 --no-pin
    all_zero "${job_rcs[@]}" || { logs_tail "meet-$1"; return 1; }
}

# GS_RXE_TWO_STEPS (words) runs only those steps (and meet); default: all.
want() { [ -z "${GS_RXE_TWO_STEPS:-}" ] || [[ " $GS_RXE_TWO_STEPS " == *" $1 "* ]]; }

step_result() { # NAME OK(0/1) T0
    echo "== rxe-two[guest $me]: $1: $([ "$2" -eq 0 ] && echo ok || echo FAILED) in $(($(date +%s) - $3)) s"
    [ "$2" -eq 0 ] || failed=1
}

# shm inside each guest, verbs between them
step_mixed() {
    local c a rc
    # one job, every collective in turn, each gsbench a new context with a store port and token of
    # its own (1000 above the job's, then one up a run): a rank that finished a run early must not
    # reach the store of the run before, whose rank 0 may still be saying goodbye
    job mixed 600 2 GS_TRANSPORT=auto GS_LOG_LEVEL=info GS_TIMEOUT_MS=60000 -- sh -c '
        i=0
        for run in allreduce:auto allreduce:ring allreduce:hier reduce_scatter:auto reduce_scatter:hier \
            allgather:auto allgather:hier broadcast:auto reduce:auto gather:auto scatter:auto \
            alltoall:auto sendrecv:auto; do
            i=$((i + 1))
            echo "== ${run%:*} GS_ALGO=${run#*:}"
            GS_STORE=${GS_STORE%:*}:$((${GS_STORE##*:} + 1000 + i)) GS_JOB_TOKEN=$GS_JOB_TOKEN-$i \
                GS_ALGO=${run#*:} "$0" --coll ${run%:*} --sizes 8,4100,64K,1M --iters 2 --warmup 1 --no-pin ||
                { echo "== FAILED: $run"; exit 1; }
        done' "$gsbench"
    if ! all_zero "${job_rcs[@]}"; then
        echo "rxe-two: mixed failed (exit codes ${job_rcs[*]})" >&2
        logs_tail mixed
        ok=1
    fi
    if [ $me = 0 ] && ! grep -q "transport per peer: on this host shm.*verbs" "$GS_RXE_OUT/mixed.r0.log"; then
        echo "rxe-two: mixed: the init summary does not name shm inside and verbs between:" >&2
        grep "transport per peer" "$GS_RXE_OUT/mixed.r0.log" >&2 || true
        ok=1
    fi
}

# the traffic class on the wire: DSCP 26 is tos 0x68
step_dscp() {
    local c a rc
    local cap=$GS_RXE_OUT/dscp.tcpdump
    if [ $me = 0 ]; then
        timeout 120 tcpdump -n -v -c 20 -i eth0 udp port 4791 >"$cap" 2>"$cap.err" &
        local tcpdump_pid=$!
        sleep 2
    fi
    job dscp 300 1 GS_TRANSPORT=verbs GS_IB_TC=104 GS_TIMEOUT_MS=60000 -- \
        "$gsbench" --sizes 8,64K --iters 20 --no-pin
    all_zero "${job_rcs[@]}" || { ok=1; logs_tail dscp; }
    if [ $me = 0 ]; then
        wait "$tcpdump_pid" || true
        if ! grep -q 'tos 0x68' "$cap"; then
            echo "rxe-two: dscp: no RoCE v2 packet with tos 0x68 in the capture:" >&2
            head -n 10 "$cap" "$cap.err" >&2
            ok=1
        elif grep 'udp\|UDP' "$cap" | grep -v 'tos 0x68' | grep 'tos 0x' >/dev/null; then # not -q (pipefail)
            echo "rxe-two: dscp: RoCE v2 packets with another tos:" >&2
            grep -v 'tos 0x68' "$cap" | head -n 5 >&2
            ok=1
        else
            say "dscp: $(grep -c 'tos 0x68' "$cap") RoCE v2 packets captured, every one tos 0x68"
        fi
    fi
}

# 1% loss each way
step_loss() {
    local c a rc
    netem "loss 1%"
    job loss 600 1 GS_TRANSPORT=verbs GS_TIMEOUT_MS=60000 -- sh -c '
        i=0
        for c in allreduce reduce_scatter allgather broadcast alltoall; do
            i=$((i + 1))
            echo "== $c"
            GS_STORE=${GS_STORE%:*}:$((${GS_STORE##*:} + 1000 + i)) GS_JOB_TOKEN=$GS_JOB_TOKEN-$i \
                "$0" --coll $c --sizes 8,64K,1M --iters 5 --warmup 1 --no-pin || { echo "== FAILED: $c"; exit 1; }
        done' "$gsbench" # a store of its own a run, as in the mixed step
    all_zero "${job_rcs[@]}" || { ok=1; logs_tail loss; }
    netem ""
}

# a 1 s outage in the middle of a run
step_outage() {
    local c a rc
    if [ $me = 0 ]; then
        rm -f "$GS_RXE_OUT/outage.during" "$GS_RXE_OUT/outage.r0.log"
        (started outage; sleep 2; netem "loss 100%"; say "outage: link cut"; sleep 1; netem ""; say "outage: link back"
         pgrep -f 'gsbench --sizes 64K --iters 400' >/dev/null && : > "$GS_RXE_OUT/outage.during") &
    fi
    job outage 300 1 GS_TRANSPORT=verbs GS_TIMEOUT_MS=60000 -- \
        "$gsbench" --sizes 64K --iters 400 --warmup 1 --no-pin
    wait
    all_zero "${job_rcs[@]}" || { ok=1; logs_tail outage; }
    if [ $me = 0 ] && [ ! -f "$GS_RXE_OUT/outage.during" ]; then
        echo "rxe-two: outage: the run was over before the link came back: it tested nothing (raise --iters)" >&2
        ok=1
    fi
}

# an outage longer than the retry budget: every rank fails, none hangs
step_cut() {
    local c a rc
    if [ $me = 0 ]; then
        rm -f "$GS_RXE_OUT/cut.r0.log"
        (started cut; sleep 2; netem "loss 100%"; say "cut: link cut"; sleep 40; netem ""; say "cut: link back") &
    fi
    job cut 120 1 GS_TRANSPORT=verbs GS_TIMEOUT_MS=10000 -- \
        "$gsbench" --sizes 64K --iters 1000000 --no-pin
    rc=${job_rcs[0]}
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
        echo "rxe-two: cut: rank $me exited $rc; expected a failure of its own (not 0, not the time limit)" >&2
        logs_tail cut
        ok=1
    elif ! grep -Eq 'lost|I/O|retry' "$GS_RXE_OUT/cut.r$me.log"; then
        echo "rxe-two: cut: rank $me failed without naming a lost peer or an I/O error:" >&2
        logs_tail cut
        ok=1
    else
        say "cut: $(grep -Em1 'lost|I/O|retry' "$GS_RXE_OUT/cut.r$me.log")"
    fi
    wait
}

# Bytes this guest sent on a NIC.
tx_bytes() { cat "/sys/class/net/$1/statistics/tx_bytes"; }

# Two rails: both NICs carry stripes, results exact; then the bandwidth of 1 QP, 4 QPs, 4 QPs on 2 rails.
step_rails() {
    local v e0 e1 env line
    if [ "${GS_RXE_NICS:-1}" -lt 2 ]; then
        echo "rxe-two: rails: needs two NICs (run.sh --nics 2)" >&2
        ok=1
        return
    fi
    e0=$(tx_bytes eth0) e1=$(tx_bytes eth1)
    job rails 120 1 GS_TRANSPORT=verbs GS_IB_DEV=rxe0,rxe1 GS_IB_RAILS=2 GS_IB_QPS_PER_PEER=4 \
        GS_LOG_LEVEL=info GS_TIMEOUT_MS=60000 -- "$gsbench" --sizes 8,1M --iters 3 --no-pin
    all_zero "${job_rcs[@]}" || { ok=1; logs_tail rails; }
    e0=$(($(tx_bytes eth0) - e0)) e1=$(($(tx_bytes eth1) - e1))
    if ! grep -q 'rail 1: device rxe1' "$GS_RXE_OUT/rails.r$me.log"; then
        echo "rxe-two: rails: rank $me did not open rxe1 as its second rail" >&2
        ok=1
    elif [ "$e0" -lt 1000000 ] || [ "$e1" -lt 1000000 ]; then
        echo "rxe-two: rails: the stripes did not use both NICs (sent $e0 bytes on eth0, $e1 on eth1)" >&2
        ok=1
    else
        say "rails: gsbench exact over rxe0+rxe1, sent $e0 bytes on eth0 and $e1 on eth1"
    fi
    for v in 1:1 4:1 4:2; do
        env="GS_IB_QPS_PER_PEER=${v%:*} GS_IB_RAILS=${v#*:}"
        job "rails-bw-${v%:*}-${v#*:}" 120 1 GS_TRANSPORT=verbs GS_IB_DEV=rxe0,rxe1 $env GS_TIMEOUT_MS=60000 -- \
            "$build/tools/gsperf" --transport verbs --op write --bw --min 1048576 --max 1048576 --iters 16 --no-floor --no-pin
        all_zero "${job_rcs[@]}" || { ok=1; logs_tail "rails-bw-${v%:*}-${v#*:}"; }
        line=$(grep -E '^(\[0\] )? *1048576 ' "$GS_RXE_OUT/rails-bw-${v%:*}-${v#*:}.r$me.log" | tail -n 1 || true)
        [ $me = 1 ] || say "rails: WRITE 1 MiB, $env: ${line:-no figure}"
    done
}

guest_main() { # BUILD_DIR
    local build=$1 t0 ok
    failed=0
    cd "$build"
    gsbench=$build/tools/gsbench

    t0=$(date +%s) ok=0
    job meet 300 1 GS_TRANSPORT=verbs GS_TIMEOUT_MS=240000 -- "$gsbench" --sizes 8 --iters 1 --no-pin
    all_zero "${job_rcs[@]}" || { ok=1; logs_tail meet; }
    step_result meet $ok "$t0"
    [ $ok -eq 0 ] || return 1

    local t k=0
    for t in conformance collectives ps_sync; do
        k=$((k + 1))
        want "$t" || continue
        t0=$(date +%s) ok=0
        meet "$t" || ok=1
        # shellcheck disable=SC2086 # SPAN_CASES holds words
        GS_TEST_SPAN="$me/2@$ADDR0:$((30000 + 500 * k))" GS_TEST_TRANSPORT=verbs \
            timeout -k 5 600 "tests/test_$t" ${SPAN_CASES[$t]} >"$GS_RXE_OUT/$t.log" 2>&1 || ok=1
        grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$GS_RXE_OUT/$t.log" | tail -n 1
        if grep -q '^0 passed' "$GS_RXE_OUT/$t.log" || grep -q '^\[ SKIP \]' "$GS_RXE_OUT/$t.log"; then
            echo "rxe-two: $t: no case ran, or a case skipped" >&2
            ok=1
        fi
        [ $ok -eq 0 ] || grep -v ' INFO ' "$GS_RXE_OUT/$t.log" | tail -n 40 >&2
        step_result "$t" $ok "$t0"
    done

    local s
    for s in mixed dscp loss outage cut rails; do # each step sets ok=1 when it fails
        want $s || continue
        t0=$(date +%s) ok=0
        meet $s || ok=1
        step_$s || ok=1
        step_result $s $ok "$t0"
    done

    echo "== rxe-two[guest $me]: $([ $failed -eq 0 ] && echo 'all steps passed' || echo 'FAILED')"
    return $failed
}

if [ -n "${GS_RXE_GUESTS:-}" ]; then
    guest_main "$@"
    exit
fi

# ---- on the host ---------------------------------------------------------------------------------
[ $# -eq 1 ] || { echo "usage: tests/rxe-vm/two.sh BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
for f in tools/gsbench tests/test_conformance tests/test_collectives tests/test_ps_sync; do
    [ -x "$build/$f" ] || { echo "rxe-two: $build/$f is missing: build the tree first" >&2; exit 1; }
done
command -v tcpdump >/dev/null || { echo "rxe-two: tcpdump missing: run tests/rxe-vm/setup.sh" >&2; exit 1; }
GS_TEST_SPAN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export GS_TEST_SPAN_TOKEN
t0=$(date +%s)
rc=0
"$HERE/run.sh" --guests 2 --nics 2 --timeout "${GS_RXE_TWO_TIMEOUT:-1200}" --out "$build/rxe-two" -- \
    "$HERE/two.sh" "$build" || rc=$?
echo "== rxe-two: $([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t0)) s"
exit $rc
