#!/usr/bin/env bash
# Smoke test of the Soft-RoCE guest: device info and real RC traffic.
# On the host it boots the guest (run.sh) and runs itself inside; in the guest
# it prints `ibv_devinfo -v -d rxe0` and runs ibv_rc_pingpong server and client
# in the one guest: the TCP exchange goes over lo, the RDMA traffic is rxe0
# looping back to itself on dummy0. Then verbs_probe (built here on the host,
# into the cache) checks WRITE, WRITE_IMM, READ, atomics, SEND/RECV and a
# remote access error. Exits non-zero if any step fails.
#
# usage: tests/rxe-vm/smoke.sh [run.sh options]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ -z "${GS_RXE_GUEST:-}" ]; then
    # Build the probe on the host: the guest sees the cache read-only.
    probe=${GS_RXE_CACHE:-$HOME/.cache/gradsync-rxe}/probe/verbs_probe
    mkdir -p "$(dirname "$probe")"
    ${CC:-cc} -O2 -g -Wall -Wextra -Werror -o "$probe" "$HERE/verbs_probe.c" -libverbs ||
        { echo "smoke: cannot build verbs_probe (needs a C compiler and libibverbs-dev)" >&2; exit 1; }
    export GS_RXE_PROBE=$probe
    exec "$HERE/run.sh" "$@" -- "$HERE/smoke.sh"
fi

step() { echo "== smoke: $*"; }
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }

# Run one ping-pong pair: server in the background, client to localhost.
# $1: port, rest: extra ibv_rc_pingpong options for both sides.
pingpong() {
    local port=$1 server rc=0 src=0
    shift
    ibv_rc_pingpong -d rxe0 -p "$port" "$@" > "$GS_RXE_OUT/server.$port" 2>&1 &
    server=$!
    sleep 0.5                                 # let the server listen
    timeout 60 ibv_rc_pingpong -d rxe0 -p "$port" "$@" localhost || rc=$?
    wait "$server" || src=$?
    sed 's/^/  server: /' "$GS_RXE_OUT/server.$port"
    [ "$rc" -eq 0 ] || fail "ibv_rc_pingpong client $* exited with $rc"
    [ "$src" -eq 0 ] || fail "ibv_rc_pingpong server $* exited with $src"
}

step "ibv_devices"
ibv_devices
step "ibv_devinfo -v -d rxe0"
ibv_devinfo -v -d rxe0
step "RC ping-pong, GID 0 (link-local IPv6), 4 KiB x 1000"
pingpong 18515 -g 0 -s 4096 -n 1000
step "RC ping-pong, GID 1 (IPv4-mapped 10.77.0.1), 64 KiB x 100, MTU 1024"
pingpong 18516 -g 1 -s 65536 -n 100 -m 1024
step "verbs_probe, GID 0"
"$GS_RXE_PROBE" rxe0 0 || fail "verbs_probe rxe0 0"
step "verbs_probe, GID 1"
"$GS_RXE_PROBE" rxe0 1 || fail "verbs_probe rxe0 1"
step "all passed"
