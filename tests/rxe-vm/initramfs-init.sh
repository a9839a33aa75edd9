#!/bin/sh
# /init of the rxe-vm initramfs, run by busybox (setup.sh copies it in).
# Stage 1: load the modules, mount the host root (read-only) and the output
# folder over 9p, then hand over to stage 2 (guest.sh), which run.sh put in
# the output folder. Every failure prints "rxe-vm: FAIL" and powers off.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys

say() { echo "rxe-vm: $*"; }
fail() {
    say "FAIL: $*"
    echo "$*" > /out/.rxe-vm/failed 2>/dev/null
    sync
    poweroff -f
    echo o > /proc/sysrq-trigger
}

say "stage 1: loading modules"
for ko in /modules/*.ko; do
    insmod "$ko" || fail "insmod $ko"
done

opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts",ro,cache=loose hostroot /host || fail "cannot mount 9p hostroot"
mount -t 9p -o "$opts" hostout /out || fail "cannot mount 9p hostout"
mkdir -p /work
mount -t 9p -o "$opts" hostwork /work || fail "cannot mount 9p hostwork"
[ -f /out/.rxe-vm/guest.sh ] || fail "no /out/.rxe-vm/guest.sh"
say "stage 1 done"
exec /bin/sh /out/.rxe-vm/guest.sh
