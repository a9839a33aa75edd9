#!/bin/bash
# Emulated hosts: H network namespaces ("hosts", gs<pid>h0 ..) joined through
# a bridge in a hub namespace (gs<pid>hub), each host's link shaped by tc
# (tbf at RATE; netem DELAY where the kernel has sch_netem), and L ranks per
# host started inside its namespace, so the ranks of one host share a host
# id (it hashes the network namespace) and memory (shm), and reach the other
# hosts over tcp through the shaped links. Every namespace goes at exit.
#
#   tests/netns/hosts.sh BUILD [--hosts H] [--ranks L|L1,L2,..] [--rate R] [--delay D]
#                              [--placement block|cyclic] [--check | --bench] [--sizes LIST]
#                              [--coll allreduce|reduce_scatter|allgather]  (--bench; default allreduce)
#                              [--env NAME=VALUE]...   (for every rank, after the script's own)
#                              [--mpi BENCH_DIR] [--scale S]  (--bench: Open MPI's mpi_coll from
#                              BENCH_DIR/bin beside, launched into the same namespaces)
#
# --check (default): gsbench over every collective, GS_ALGO auto, ring and
#   hier (allreduce, reduce_scatter, allgather; hier must be what the init
#   summary says runs, on uneven hosts too), exact results (gsbench exits 1 on a wrong element);
#   the init summary must name the mixed transport; then a rank killed on
#   host 1 must end every rank of every host with a lost-peer error within
#   the deadline.
# --bench: allreduce (or --coll), GS_ALGO auto, hier and the flat ring, 8 B to 64 MiB,
#   with the network lower bound (each host sends 2(H-1)/H of the data
#   through its link at RATE; (H-1)/H of the whole buffer for reduce_scatter and allgather) and, with --mpi, Open MPI (vader inside a
#   host, tcp between) beside each median.
# Needs root (namespaces) and iproute2; a machine that cannot fails it.
set -uo pipefail
build=${1:?usage: tests/netns/hosts.sh BUILD [options]}
build=$(cd "$build" && pwd)
shift
hosts=2 ranks=2 rate=2gbit delay="" placement=cyclic mode=check sizes="" extra_env=() mpi="" scale=
bench_coll=allreduce
while [ $# -gt 0 ]; do
    case $1 in
    --hosts) hosts=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --rate) rate=$2; shift ;;
    --delay) delay=$2; shift ;;
    --placement) placement=$2; shift ;;
    --check) mode=check ;;
    --bench) mode=bench ;;
    --sizes) sizes=$2; shift ;;
    --coll) bench_coll=$2; shift ;;
    --env) extra_env+=("$2"); shift ;;
    --mpi) mpi=$2; shift ;;
    --scale) scale=$2; shift ;;
    *) echo "hosts: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
tag=gs$$
hub=${tag}hub
failed=0

cannot_run() {
    echo "hosts: FAILED: cannot run here: $*" >&2
    exit 1
}
cleanup() {
    [ -n "${pids:-}" ] && kill $pids 2>/dev/null
    for h in $(seq 0 $((hosts - 1))); do ip netns del "${tag}h$h" 2>/dev/null; done
    ip netns del "$hub" 2>/dev/null
}
[ "$(id -u)" = 0 ] || cannot_run "it creates network namespaces: run it as root"
command -v tc >/dev/null || cannot_run "tc is not installed: apt-get install iproute2"
[ -x "$build/tools/gsbench" ] || { echo "hosts: FAILED: $build/tools/gsbench missing" >&2; exit 1; }
rm -f "$build"/hosts-*.log
trap cleanup EXIT INT TERM

# ranks per host: one count for all, or a list (uneven hosts)
IFS=, read -r -a per_host <<<"$ranks"
while [ ${#per_host[@]} -lt "$hosts" ]; do per_host+=("${per_host[0]}"); done
world=0
for h in $(seq 0 $((hosts - 1))); do world=$((world + per_host[h])); done
# host_of[r]: cyclic deals ranks round robin over hosts with room left; block fills host 0 first
host_of=()
left=("${per_host[@]}")
h=0
for r in $(seq 0 $((world - 1))); do
    if [ "$placement" = block ]; then
        while [ "${left[h]}" -eq 0 ]; do h=$((h + 1)); done
    else
        while [ "${left[h]}" -eq 0 ]; do h=$(((h + 1) % hosts)); done
    fi
    host_of+=("$h")
    left[h]=$((left[h] - 1))
    [ "$placement" = block ] || h=$(((h + 1) % hosts))
done

# ---- the network --------------------------------------------------------------
setup() {
    ip netns add "$hub" && ip -n "$hub" link set lo up &&
        ip -n "$hub" link add gsbr type bridge && ip -n "$hub" link set gsbr up || return 1
    for h in $(seq 0 $((hosts - 1))); do
        local ns=${tag}h$h
        ip netns add "$ns" &&
            ip -n "$hub" link add "gsp$h" type veth peer name gsv0 netns "$ns" &&
            ip -n "$hub" link set "gsp$h" master gsbr && ip -n "$hub" link set "gsp$h" up &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" addr add "10.77.0.$((h + 1))/24" dev gsv0 &&
            ip -n "$ns" link set gsv0 up || return 1
        # a host's egress, both ways round: its own link and the hub's port towards it
        for side in "$ns gsv0" "$hub gsp$h"; do
            set -- $side
            if [ -n "$delay" ]; then
                ip netns exec "$1" tc qdisc add dev "$2" root handle 1: netem delay "$delay" &&
                    ip netns exec "$1" tc qdisc add dev "$2" parent 1: handle 2: tbf rate "$rate" burst 1mb \
                        latency 50ms || return 2
            else
                ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 1mb latency 50ms || return 1
            fi
        done
    done
}
err=$(setup 2>&1)
case $? in
0) ;;
2) cannot_run "tc netem failed ($err): the kernel lacks sch_netem; run without --delay" ;;
*) cannot_run "the namespace network (bridge, veth, tbf) failed: $err" ;;
esac
echo "hosts: $hosts hosts (${per_host[*]} ranks, $placement placement: host of each rank ${host_of[*]})," \
    "links $rate${delay:+, delay $delay}, through $hub"

# ---- a job ----------------------------------------------------------------------
# job LABEL ENV... -- PROG ARGS...: every rank in its host's namespace; rank 0
# (in h<host_of[0]>) serves the store. Logs in $build/hosts-LABEL.r<rank>.log.
port=29700
job() {
    local label=$1 token env=() rcs=()
    shift
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    port=$((port + 1))
    pids=""
    for r in $(seq 0 $((world - 1))); do
        ip netns exec "${tag}h${host_of[r]}" env GS_RANK=$r GS_WORLD_SIZE=$world \
            "GS_STORE=10.77.0.$((host_of[0] + 1)):$port" "GS_JOB_TOKEN=$token" GS_TCP_IFNAME=gsv0 \
            GS_TRANSPORT=auto "${env[@]}" ${extra_env[@]+"${extra_env[@]}"} timeout 600 "$@" >"$build/hosts-$label.r$r.log" 2>&1 &
        pids="$pids $!"
    done
    job_rc=0
    for p in $pids; do
        wait "$p"
        rcs+=($?)
    done
    pids=""
    job_rcs=("${rcs[@]}")
    for rc in "${rcs[@]}"; do [ "$rc" -eq 0 ] || job_rc=1; done
}

gsbench=$build/tools/gsbench
if [ "$mode" = check ]; then
    for coll in allreduce reduce_scatter allgather broadcast reduce gather scatter alltoall sendrecv; do
        for algo in auto ring hier; do
            case $coll in allreduce | reduce_scatter | allgather) ;; *) [ "$algo" != auto ] && continue ;; esac
            label="$coll-$algo"
            job "$label" GS_ALGO=$algo GS_LOG_LEVEL=info GS_TIMEOUT_MS=30000 -- \
                "$gsbench" --coll "$coll" --sizes ${sizes:-8,4100,64K,1M,4M} --iters 3 --warmup 1 --no-pin
            log0=$build/hosts-$label.r0.log
            if [ $job_rc -ne 0 ]; then
                tail -n 15 "$log0" "$build/hosts-$label.r$((world - 1)).log"
                echo "hosts: FAILED: $coll GS_ALGO=$algo (exit codes ${job_rcs[*]})" >&2
                failed=1
            elif ! grep -q "transport per peer: on this host shm" "$log0"; then
                echo "hosts: FAILED: $coll: the init summary does not name shm on the host ($log0)" >&2
                failed=1
            elif [ "$algo" = hier ] && ! grep -q "algorithms (GS_ALGO=forced):.*$coll hier at every size" "$log0"; then
                echo "hosts: FAILED: $coll GS_ALGO=hier: the init summary does not name hier for it ($log0)" >&2
                failed=1
            else
                echo "hosts: $coll GS_ALGO=$algo: exact on every rank ($(grep -c '^ *[0-9]' "$log0") sizes)"
            fi
        done
    done
    # a rank killed on one host: every rank of every host stops with a lost peer
    victim=$((world - 1))
    job killed GS_TIMEOUT_MS=10000 -- sh -c "if [ \$GS_RANK = $victim ]; then (sleep 2; kill -9 \$\$) & fi;
        exec $gsbench --sizes 4M --iters 100000 --no-pin"
    lost=0
    for r in $(seq 0 $((world - 1))); do
        [ "$r" = "$victim" ] && continue
        grep -q "rank $victim lost" "$build/hosts-killed.r$r.log" && [ "${job_rcs[r]}" -ne 0 ] &&
            [ "${job_rcs[r]}" -ne 124 ] && lost=$((lost + 1))
    done
    if [ $lost -eq $((world - 1)) ]; then
        echo "hosts: rank $victim killed on host ${host_of[victim]}: every other rank reported it lost"
    else
        echo "hosts: FAILED: rank $victim killed: $lost of $((world - 1)) ranks reported it lost" \
            "(exit codes ${job_rcs[*]}, logs $build/hosts-killed.r*.log)" >&2
        failed=1
    fi
else
    bits=$(echo "$rate" | awk '{ v = $1 + 0; u = tolower($1); sub(/^[0-9.]+/, "", u);
        m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; printf "%.0f", v * m }')
    for algo in auto hier ring; do
        job "bench-$algo" GS_ALGO=$algo -- "$gsbench" --coll "$bench_coll" --sizes "${sizes:-8,1K,64K,1M,16M,64M}" --json --no-pin \
            --scale "${scale:-1}"
        [ $job_rc -eq 0 ] || { echo "hosts: FAILED: bench GS_ALGO=$algo" >&2; failed=1; }
    done
    mpi_log=$build/hosts-bench-mpi.log
    : >"$mpi_log"
    if [ -n "$mpi" ]; then
        # Open MPI across the same namespaces: mpirun in host 0's, orted started in each other
        # host's by an rsh agent, each in a UTS namespace of its own hostname (h0, h1, ...: Open MPI
        # tells hosts apart by name); vader (shared memory) inside a host, tcp between, each host's
        # vader files apart (the namespaces share /dev/shm)
        agent=$build/hosts-mpi-agent.sh
        printf '#!/bin/sh\nhost=$1; shift\nmkdir -p /tmp/%s-vader-$host\nexec ip netns exec %sh${host#h} unshare --uts sh -c "hostname $host; export OMPI_MCA_btl_vader_backing_directory=/tmp/%s-vader-$host; $*"\n' \
            "$tag" "$tag" "$tag" >"$agent"
        chmod +x "$agent"
        hostlist="h0:${per_host[0]}"
        for h in $(seq 1 $((hosts - 1))); do hostlist="$hostlist,h$h:${per_host[h]}"; done
        mkdir -p "/tmp/$tag-vader-h0"
        ip netns exec "${tag}h0" unshare --uts env "OMPI_MCA_btl_vader_backing_directory=/tmp/$tag-vader-h0" \
            sh -c 'hostname h0; exec "$@"' sh timeout 900 mpirun --allow-run-as-root --oversubscribe --mca plm_rsh_agent "$agent" -H "$hostlist" \
            --map-by node -np "$world" --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
            --mca btl_tcp_if_include gsv0 \
            --mca oob_tcp_if_include gsv0 "$mpi/bin/mpi_coll" "$bench_coll" "${mpi_scale:-0.05}" >"$mpi_log" 2>&1 ||
            { tail -5 "$mpi_log"; echo "hosts: FAILED: Open MPI across the namespaces" >&2; failed=1; }
        rm -rf /tmp/"$tag"-vader-*
    fi
    echo "hosts: $bench_coll f32, $world ranks on $hosts hosts ($placement), links $rate; median time (us)"
    printf "%10s %10s %10s %10s %10s %10s %8s %8s\n" "size(B)" "auto" "hier" "ring" "OpenMPI" "bound" \
        "auto/bd" "MPI/auto"
    python3 - "$build" "$hosts" "$bits" "$mpi_log" "$bench_coll" <<'EOF2'
import json, sys
def rows(path):
    text = open(path).read()
    obj = json.loads(text[text.index("{"):])
    return {r["bytes"]: r["time_us"] for r in obj["rows"]}
build, H, bits, coll = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[5]
share = 2 * (H - 1) / H if coll == "allreduce" else (H - 1) / H
t = {a: rows("%s/hosts-bench-%s.r0.log" % (build, a)) for a in ("auto", "hier", "ring")}
mpi = {}
for line in open(sys.argv[4]):
    f = line.split()
    if len(f) >= 3 and f[0] == coll and f[1].isdigit():
        mpi[int(f[1])] = float(f[2])
nan = float("nan")
for size in sorted(t["auto"]):
    bound = share * size * 8 / bits * 1e6
    a = t["auto"][size]
    print("%10d %10.1f %10.1f %10.1f %10.1f %10.1f %8.2f %8.2f" % (
        size, a, t["hier"].get(size, nan), t["ring"].get(size, nan), mpi.get(size, nan), bound,
        a / bound if bound else nan, mpi.get(size, nan) / a))
EOF2
fi
[ $failed -eq 0 ] && echo "hosts: passed" || echo "hosts: FAILED" >&2
exit $failed
