#!/bin/bash
# Multi-host test of the tcp transport on one machine (scripts/test.sh runs it
# with the build folder as $1). As root it builds a small routed network of
# network namespaces, with names unique to this run ("gs<pid>..."):
#
#   gs<pid>r0 .. r3   one per rank: interface gsv0, 192.168.77.(4r+2)/30 and
#                     fd00:77:r::2/64, default routes via the hub
#   gs<pid>hub        the router: one veth per rank namespace, forwarding on
#
# Every address lives only inside these namespaces; all of them are removed
# at exit (trap). Then, over tcp across the namespaces:
#   1. the transport conformance suite, unchanged, each rank's sockets in its
#      own namespace (GS_TCP_NETNS, GS_TCP_IFNAME=gsv0), over IPv4, then again
#      with the IPv4 addresses removed (IPv6 only);
#   2. gsperf as a real two-host job: rank 0 in r0 serves the store on its
#      address, rank 1 in r1 joins it, GS_TRANSPORT=auto (the ranks' host ids
#      differ, so it must pick tcp); over IPv4 and over IPv6. With GS_TRACE:
#      rank 1 measures its clock against the store's in r0 over the network
#      (the two "hosts" share the machine's clock, so the true offset is 0 and
#      the measured one must lie within the bound it states).
#   3. tests/netns/hosts.sh: hosts of several ranks (shm inside, tcp between
#      through tbf-shaped links): 2x2, 3+2 (interleaved and in blocks) and 3x2, every collective exact
#      (the hierarchical reduce_scatter and allgather on the uneven hosts too),
#      a killed rank reported by every rank of every host.
# A machine where it cannot run (no root, no ip, no network namespaces or
# veth) fails it, saying what is missing and how to get it: never a skip.
set -uo pipefail
build=${1:?usage: tests/netns/ci.sh BUILD_DIR}
build=$(cd "$build" && pwd)
tag=gs$$
hub=${tag}hub
ranks=4
failed=0

cannot_run() {
    echo "netns: FAILED: cannot run here: $*" >&2
    exit 1
}
cleanup() {
    for r in $(seq 0 $((ranks - 1))); do ip netns del "${tag}r$r" 2>/dev/null; done
    ip netns del "$hub" 2>/dev/null
}

[ "$(id -u)" = 0 ] || cannot_run "it creates network namespaces: run it (scripts/test.sh) as root"
command -v ip >/dev/null || cannot_run "ip is not installed: apt-get install iproute2 (scripts/deps.sh does)"
[ -x "$build/tests/test_conformance" ] && [ -x "$build/tools/gsperf" ] || {
    echo "netns: FAILED: $build/tests/test_conformance or $build/tools/gsperf missing" >&2
    exit 1
}
trap cleanup EXIT INT TERM
if ! err=$(ip netns add "$hub" 2>&1); then
    cannot_run "ip netns add failed: $err (needs CAP_SYS_ADMIN and a kernel with network namespaces;" \
        "in a container: --privileged or --cap-add SYS_ADMIN)"
fi

# ---- the network -----------------------------------------------------------
setup() {
    ip -n "$hub" link set lo up &&
        ip netns exec "$hub" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 || return 1
    for r in $(seq 0 $((ranks - 1))); do
        local ns=${tag}r$r h=${tag}h$r
        ip netns add "$ns" &&
            ip -n "$hub" link add "$h" type veth peer name gsv0 netns "$ns" &&
            ip -n "$hub" addr add "192.168.77.$((4 * r + 1))/30" dev "$h" &&
            ip -n "$hub" addr add "fd00:77:$r::1/64" dev "$h" nodad &&
            ip -n "$hub" link set "$h" up &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" addr add "192.168.77.$((4 * r + 2))/30" dev gsv0 &&
            ip -n "$ns" addr add "fd00:77:$r::2/64" dev gsv0 nodad &&
            ip -n "$ns" link set gsv0 up &&
            ip -n "$ns" route add default via "192.168.77.$((4 * r + 1))" &&
            ip -n "$ns" -6 route add default via "fd00:77:$r::1" || return 1
    done
}
if ! err=$(setup 2>&1); then
    cannot_run "the namespace network (veth, routes, forwarding) failed: $err (the kernel needs the" \
        "veth driver: modprobe veth)"
fi
netns_list=$(seq -s, -f "${tag}r%g" 0 $((ranks - 1)))
echo "netns: namespaces $netns_list routed through $hub"
# ---- 1. the conformance suite across namespaces ------------------------------
conformance() { # label
    local log=$build/netns-conformance-$1.log
    if GS_TEST_TRANSPORT=tcp GS_TCP_NETNS=$netns_list GS_TCP_IFNAME=gsv0 GS_LOG_LEVEL=warn \
        timeout 600 "$build/tests/test_conformance" tcp. >"$log" 2>&1; then
        echo "netns: conformance over $1 across namespaces: $(tail -1 "$log")"
    else
        grep -E "FAIL|^\[ " "$log" | tail -30
        echo "netns: FAILED: conformance over $1 (log: $log)" >&2
        failed=1
    fi
}

# ---- 2. gsperf as a two-host job ----------------------------------------------
gsperf_two_hosts() { # label store-address
    local token port=29601 log0=$build/netns-gsperf-$1.r0.log log1=$build/netns-gsperf-$1.r1.log
    token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    local common=(GS_WORLD_SIZE=2 "GS_STORE=$2:$port" "GS_JOB_TOKEN=$token" GS_TRANSPORT=auto GS_TIMEOUT_MS=30000
        "GS_TRACE=$build/netns-trace-$1.%r.json")
    local args=(--op all --iters 200 --min 8 --max 262144 --no-floor --no-pin)
    ip netns exec "${tag}r0" env "${common[@]}" GS_RANK=0 timeout 300 "$build/tools/gsperf" "${args[@]}" \
        >"$log0" 2>&1 &
    local pid0=$!
    ip netns exec "${tag}r1" env "${common[@]}" GS_RANK=1 timeout 300 "$build/tools/gsperf" "${args[@]}" \
        >"$log1" 2>&1
    local rc1=$? rc0=0
    wait $pid0 || rc0=$?
    if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && grep -q "transport tcp" "$log0"; then
        echo "netns: gsperf over $1, store at $2 in ${tag}r0, rank 1 in ${tag}r1: ok ($(grep -c '^ *[0-9]' "$log0") rows)"
        grep -A3 "write_imm latency" "$log0" | sed 's/^/netns:   /'
    else
        tail -n 20 "$log0" "$log1"
        echo "netns: FAILED: gsperf over $1 (rank 0 rc $rc0, rank 1 rc $rc1, logs $log0 $log1)" >&2
        failed=1
    fi
    local head
    head=$(head -1 "$build/netns-trace-$1.1.json" 2>/dev/null)
    if echo "$head" | grep -q '"clock_source": "store"' &&
        echo "$head" | awk -F'[:,]' '{ for (i = 1; i < NF; i++) { if ($i ~ /clock_offset_ns/) o = $(i + 1);
            if ($i ~ /clock_bound_ns/) b = $(i + 1) } } END { o = o < 0 ? -o : o; exit !(b > 0 && o <= b) }'; then
        echo "netns: GS_TRACE clock over $1, measured against the store across hosts: $(echo "$head" |
            grep -o '"clock_offset_ns": [-0-9]*, "clock_bound_ns": [0-9]*')"
    else
        echo "netns: FAILED: GS_TRACE clock over $1: $head (want source store, |offset| <= bound)" >&2
        failed=1
    fi
}

conformance IPv4
gsperf_two_hosts IPv4 192.168.77.2
gsperf_two_hosts IPv6 "[fd00:77:0::2]"
for r in $(seq 0 $((ranks - 1))); do ip -n "${tag}r$r" -4 addr flush dev gsv0; done
conformance IPv6

# ---- 3. emulated hosts of several ranks (tests/netns/hosts.sh: its own namespaces) ----
cleanup
for shape in "--hosts 2 --ranks 2" "--hosts 2 --ranks 3,2" "--hosts 2 --ranks 3,2 --placement block" \
    "--hosts 3 --ranks 2 --placement block"; do
    # shellcheck disable=SC2086
    if out=$(bash "$(dirname "$0")/hosts.sh" "$build" $shape --check 2>&1); then
        echo "netns: emulated hosts ($shape): $(echo "$out" | grep -c 'exact on every rank') collective runs exact, lost rank seen by all"
    else
        echo "$out" | tail -25
        echo "netns: FAILED: emulated hosts ($shape)" >&2
        failed=1
    fi
done

[ $failed -eq 0 ] && echo "netns: passed" || echo "netns: FAILED" >&2
exit $failed
