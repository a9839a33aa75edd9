#!/usr/bin/env bash
# Run a command inside a QEMU guest that has Soft-RoCE (rdma_rxe) device rxe0.
# The guest chroots into this machine's / (read-only over 9p), so the host's
# binaries, libibverbs, librxe and the build tree are used as they are.
#
# usage: tests/rxe-vm/run.sh [--timeout S] [--out DIR] [--keep] -- CMD [ARG...]
#   CMD runs through /bin/sh in the same current directory as here, argv kept
#   exactly (use `-- sh -c '...'` for a shell line). Its stdout, stderr and exit
#   code go to DIR/{stdout,stderr,rc}; this script prints them and exits with
#   the command's code. Harness failures: 124 timeout, 125 guest/rxe failure.
# env:   GS_RXE_CACHE    cache built by setup.sh (default $HOME/.cache/gradsync-rxe)
#        GS_RXE_PASSENV  extra variable names to pass into the guest (GS_* always are)
#        GS_RXE_MTU      MTU of dummy0 (default 1500: rxe active MTU 1024)
#        GS_RXE_QEMU     extra qemu options (word-split)
#        GS_RXE_BOOT_TRIES  boots to try when qemu crashes before CMD starts (default 3)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${GS_RXE_CACHE:-$HOME/.cache/gradsync-rxe}
PASSENV="PATH LD_LIBRARY_PATH PYTHONPATH HOME USER LOGNAME LANG LC_ALL TZ
         ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS MSAN_OPTIONS"
E_TIMEOUT=124
E_HARNESS=125

die() { echo "rxe-vm: error: $*" >&2; exit $E_HARNESS; }
usage() { sed -n '4,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# Quote one word for /bin/sh: 'it'\''s'.
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

timeout_s=600 out='' keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --keep) keep=1; shift ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "rxe-vm: unknown option $1" >&2; usage ;;
    esac
done
[ $# -gt 0 ] || usage
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds, got '$timeout_s'"
for f in vmlinuz initramfs.cpio.gz; do
    [ -f "$CACHE/$f" ] || die "$CACHE/$f missing; run tests/rxe-vm/setup.sh first"
done
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing; run setup.sh"
# The guest mounts fresh /tmp and /run over the shared host root: a working
# folder under them (CI's clone may live in /tmp) is shared on its own and
# bound back at its host path. Under /dev, /proc or /sys it cannot be.
work=
case $PWD/ in
    /dev/*|/proc/*|/sys/*)
        die "cannot run from $PWD: the guest mounts its own /dev, /proc and /sys" ;;
    /tmp/*|/run/*)
        work=$(git -C "$PWD" rev-parse --show-toplevel 2>/dev/null || echo "$PWD") ;;
esac

if [ -n "$out" ]; then
    mkdir -p "$out" && out=$(cd "$out" && pwd)
    keep=1
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/gs-rxe.XXXXXX")
fi
ctl=$out/.rxe-vm
rm -rf "$ctl" "$out"/{stdout,stderr,rc,serial.log*}
mkdir -p "$ctl"

# The guest's control files: parameters for guest.sh and the command script.
write_params() {
    echo "OUT_PATH=$(shq "$out")"
    echo "MTU=$(shq "${GS_RXE_MTU:-}")"
    echo "WORK_PATH=$(shq "$work")"
}
write_cmd() {
    local name extra
    extra=$(compgen -e | grep '^GS_' || true)
    for name in $PASSENV ${GS_RXE_PASSENV:-} $extra; do
        [ -n "${!name+set}" ] && echo "export $name=$(shq "${!name}")"
    done
    # ip and rdma live in sbin; add it if the host PATH lacks it.
    echo 'case :$PATH: in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin ;; esac'
    echo 'export PATH'
    echo "export GS_RXE_GUEST=1 GS_RXE_OUT=$(shq "$out") GS_RXE_DEVICE=rxe0"
    echo "cd $(shq "$PWD") || { echo $(shq "rxe-vm: cannot cd to $PWD in the guest") >&2; exit 126; }"
    printf 'exec'
    for a in "$@"; do printf ' %s' "$(shq "$a")"; done
    echo
}
write_params > "$ctl/params"
write_cmd "$@" > "$ctl/cmd.sh"
cp "$HERE/guest.sh" "$ctl/guest.sh"

tail_serial() {
    echo "---- last lines of $out/serial.log ----" >&2
    tail -n 30 "$out/serial.log" >&2 2>/dev/null || echo "(no serial log)" >&2
    echo "----" >&2
}
print_output() {
    [ -f "$out/stdout" ] && cat "$out/stdout"
    [ -f "$out/stderr" ] && cat "$out/stderr" >&2
    return 0
}

# Boot once, with at most $1 seconds. TCG, not KVM: with KVM the guest hangs
# while booting on this machine.
boot() {
    local rc=0
    # shellcheck disable=SC2086
    timeout -k 5 "$1" qemu-system-x86_64 \
        -accel tcg,thread=multi -cpu max -m 2G -smp 2 \
        -nic none -no-reboot -display none -monitor none \
        -serial "file:$out/serial.log" \
        -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1 loglevel=4" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$out,mount_tag=hostout,security_model=none,multidevs=remap" \
        -virtfs "local,path=${work:-$out},mount_tag=hostwork,security_model=none,multidevs=remap" \
        ${GS_RXE_QEMU:-} \
        >"$ctl/qemu.log" 2>&1 || rc=$?
    return $rc
}

# QEMU 7.2's TCG occasionally segfaults while the guest boots (seen about once
# in 30 boots). Boot again then, but only if the command had not started.
deadline=$((SECONDS + timeout_s))
tries=${GS_RXE_BOOT_TRIES:-3}
for try in $(seq 1 "$tries"); do
    qemu_rc=0
    left=$((deadline - SECONDS))
    [ $left -gt 0 ] || { qemu_rc=124; break; }
    boot "$left" || qemu_rc=$?
    if [ $qemu_rc -le 128 ] || [ $qemu_rc -eq 137 ] || [ -f "$ctl/started" ] ||
       [ -f "$ctl/failed" ] || [ "$try" -ge "$tries" ]; then
        break
    fi
    echo "rxe-vm: qemu died during boot (exit $qemu_rc), booting again" >&2
    mv -f "$out/serial.log" "$out/serial.log.try$try" 2>/dev/null || true
done

if [ $qemu_rc -eq 124 ] || [ $qemu_rc -eq 137 ]; then
    print_output
    echo "rxe-vm: error: timed out after ${timeout_s}s; qemu killed (output kept in $out)" >&2
    tail_serial
    exit $E_TIMEOUT
fi
if [ -f "$ctl/failed" ]; then
    echo "rxe-vm: error: guest setup failed: $(cat "$ctl/failed") (see $out)" >&2
    tail_serial
    exit $E_HARNESS
fi
if [ ! -f "$out/rc" ]; then
    print_output
    echo "rxe-vm: error: guest ended without an exit code (qemu exit $qemu_rc; see $out)" >&2
    cat "$ctl/qemu.log" >&2
    tail_serial
    exit $E_HARNESS
fi
rc=$(cat "$out/rc")
print_output
[ $keep -eq 1 ] || [ "$rc" -ne 0 ] || rm -rf "$out"
[ "$rc" -eq 0 ] || echo "rxe-vm: command exited with $rc (output kept in $out)" >&2
exit "$rc"
