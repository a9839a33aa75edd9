#!/bin/sh
# Stage 2 of the rxe-vm guest, run by busybox from the initramfs with the host
# root at /host (read-only 9p) and the output folder at /out (read-write 9p).
# run.sh copies this file and writes params and cmd.sh into /out/.rxe-vm/.
# Steps: make the host root usable as a chroot, bring up rxe0 on dummy0 (or
# rxe<k> on the NICs of the two-guest mode), run
# the command in the chroot, record its exit code, power off.
ctl=/out/.rxe-vm
R=/host
. "$ctl/params"                          # OUT_PATH, MTU, WORK_PATH, GUEST, NICS

say() { echo "rxe-vm: $*"; }
finish() {
    sync
    poweroff -f
    echo o > /proc/sysrq-trigger
}
fail() {
    say "FAIL: $*"
    echo "$*" > "$ctl/failed"
    finish
}
# Run a command inside the host root with a clean environment.
in_host() {
    chroot "$R" /usr/bin/env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# Step 1: kernel filesystems and writable scratch space inside the chroot.
say "stage 2: mounting filesystems in the host root"
mount -t proc proc "$R/proc" || fail "mount proc"
mount -t sysfs sys "$R/sys" || fail "mount sysfs"
mount -t devtmpfs dev "$R/dev" || fail "mount devtmpfs"
mkdir -p "$R/dev/shm" "$R/dev/pts"
mount -t tmpfs -o mode=1777 shm "$R/dev/shm" || fail "mount /dev/shm"
mount -t devpts devpts "$R/dev/pts" || fail "mount devpts"
mount -t tmpfs -o mode=1777 tmp "$R/tmp" || fail "mount /tmp"
mount -t tmpfs -o mode=755 run "$R/run" || fail "mount /run"
# A working folder under /tmp or /run (shared on its own by run.sh), bound
# first: the output folder may lie inside it.
if [ -n "$WORK_PATH" ]; then
    mkdir -p "$R$WORK_PATH" 2>/dev/null
    mount --bind /work "$R$WORK_PATH" || fail "cannot bind the working folder to $WORK_PATH"
fi
# The output folder appears at its host path (mkdir works only under a tmpfs).
mkdir -p "$R$OUT_PATH" 2>/dev/null
mount --bind /out "$R$OUT_PATH" || fail "cannot bind the output folder to $OUT_PATH"

# Step 2: loopback for TCP exchange; the Ethernet under the rxe devices:
# dummy0 for one guest (rxe0), or the guest's NICs in the two-guest mode
# (rxe<k> on the NIC of MAC 52:54:00:77:<k>:<guest>, address
# 10.77.<k>.<guest+1>/24; run.sh joins NIC k of both guests by a UDP socket).
say "stage 2: bringing up the rxe devices"
in_host ip link set lo up || fail "ip link set lo up"
up_link() { # NETDEV ADDRESS RXE
    if [ -n "$MTU" ]; then
        in_host ip link set "$1" mtu "$MTU" || fail "ip link set $1 mtu $MTU"
    fi
    in_host ip addr add "$2" dev "$1" || fail "ip addr add $2 on $1"
    in_host ip link set "$1" up || fail "ip link set $1 up"
    in_host rdma link add "$3" type rxe netdev "$1" || fail "rdma link add $3 on $1 failed"
}
if [ "${NICS:-0}" -gt 0 ]; then
    hostname "guest$GUEST"
    k=0
    while [ $k -lt "$NICS" ]; do
        mac=$(printf '52:54:00:77:%02x:%02x' "$k" "$GUEST")
        dev=$(in_host ip -o link | awk -v m="$mac" '$0 ~ m { sub(":", "", $2); print $2; exit }')
        [ -n "$dev" ] || fail "no NIC with MAC $mac"
        up_link "$dev" "10.77.$k.$((GUEST + 1))/24" "rxe$k"
        k=$((k + 1))
    done
    ndev=$NICS
else
    in_host ip link show dummy0 >/dev/null 2>&1 ||
        in_host ip link add dummy0 type dummy || fail "ip link add dummy0 type dummy"
    up_link dummy0 10.77.0.1/24 rxe0
    ndev=1
fi

# Step 3: wait for the verbs device nodes and ACTIVE ports.
k=0
while [ $k -lt $ndev ]; do
    n=0
    until [ -c "$R/dev/infiniband/uverbs$k" ]; do
        n=$((n + 1)); [ $n -le 50 ] || fail "/dev/infiniband/uverbs$k did not appear"
        sleep 0.2
    done
    in_host ibv_devices | grep -qw "rxe$k" || fail "ibv_devices does not list rxe$k"
    n=0
    until in_host ibv_devinfo -d "rxe$k" | grep -q PORT_ACTIVE; do
        n=$((n + 1)); [ $n -le 50 ] || fail "rxe$k port did not become ACTIVE"
        sleep 0.2
    done
    k=$((k + 1))
done
say "rxe devices ready ($ndev)"

# Step 4: run the command; its output goes straight to the output folder.
ulimit -l unlimited
say "running command"
: > "$ctl/started"
chroot "$R" /usr/bin/env -i /bin/sh "$OUT_PATH/.rxe-vm/cmd.sh" \
    </dev/null >/out/stdout 2>/out/stderr
rc=$?
echo "$rc" > /out/rc
say "command exited with $rc"
finish
