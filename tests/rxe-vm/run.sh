#!/usr/bin/env bash
# Run a command inside a QEMU guest that has Soft-RoCE (rdma_rxe) device rxe0.
# The guest chroots into this machine's / (read-only over 9p), so the host's
# binaries, libibverbs, librxe and the build tree are used as they are.
#
# usage: tests/rxe-vm/run.sh [--timeout S] [--out DIR] [--keep] [--guests 2 [--nics K]] -- CMD [ARG...]
#   CMD runs through /bin/sh in the same current directory as here, argv kept
#   exactly (use `-- sh -c '...'` for a shell line). Its stdout, stderr and exit
#   code go to DIR/{stdout,stderr,rc}; this script prints them and exits with
#   the command's code. Harness failures: 124 timeout, 125 guest/rxe failure.
#   --guests 2: two guests boot at once and CMD runs in both (DIR/guest<i>/
#   holds each one's files; the exit code is the first nonzero of the two).
#   They are joined by K virtual networks (--nics, default 1, at most 2): NIC
#   k of each guest carries rxe<k> at 10.77.<k>.<i+1>/24, and the two NICs k
#   are one wire (a UDP socket pair on the host's loopback). In CMD,
#   GS_RXE_GUEST is the guest's index, GS_RXE_GUESTS 2, GS_RXE_NICS K.
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
usage() { sed -n '4,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# Quote one word for /bin/sh: 'it'\''s'.
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

timeout_s=600 out='' keep=0 guests=1 nics=0
while [ $# -gt 0 ]; do
    case $1 in
        --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --keep) keep=1; shift ;;
        --guests) guests=${2:?--guests needs 1 or 2}; shift 2 ;;
        --nics) nics=${2:?--nics needs 1 or 2}; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "rxe-vm: unknown option $1" >&2; usage ;;
    esac
done
[ $# -gt 0 ] || usage
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds, got '$timeout_s'"
case $guests in
    1) [ "$nics" = 0 ] || die "--nics goes with --guests 2 (one guest runs on dummy0)" ;;
    2) [ "$nics" = 0 ] && nics=1
       [[ $nics =~ ^[12]$ ]] || die "--nics wants 1 or 2, got '$nics'" ;;
    *) die "--guests wants 1 or 2, got '$guests'" ;;
esac
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
# Guest i's files: $out itself for one guest, $out/guest<i> for two.
gout() { if [ "$guests" -eq 1 ]; then echo "$out"; else echo "$out/guest$1"; fi; }

# The guest's control files: parameters for guest.sh and the command script.
write_params() { # GUEST
    echo "OUT_PATH=$(shq "$(gout "$1")")"
    echo "MTU=$(shq "${GS_RXE_MTU:-}")"
    echo "WORK_PATH=$(shq "$work")"
    echo "GUEST=$1"
    echo "NICS=$nics"
}
write_cmd() { # GUEST CMD...
    local name extra g=$1
    shift
    extra=$(compgen -e | grep '^GS_' || true)
    for name in $PASSENV ${GS_RXE_PASSENV:-} $extra; do
        [ -n "${!name+set}" ] && echo "export $name=$(shq "${!name}")"
    done
    # ip and rdma live in sbin; add it if the host PATH lacks it.
    echo 'case :$PATH: in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin ;; esac'
    echo 'export PATH'
    echo "export GS_RXE_GUEST=1 GS_RXE_OUT=$(shq "$(gout "$g")") GS_RXE_DEVICE=rxe0"
    [ "$guests" -eq 1 ] || echo "export GS_RXE_GUEST=$g GS_RXE_GUESTS=$guests GS_RXE_NICS=$nics"
    echo "cd $(shq "$PWD") || { echo $(shq "rxe-vm: cannot cd to $PWD in the guest") >&2; exit 126; }"
    printf 'exec'
    for a in "$@"; do printf ' %s' "$(shq "$a")"; done
    echo
}
for g in $(seq 0 $((guests - 1))); do
    d=$(gout "$g")
    mkdir -p "$d"
    rm -rf "$d/.rxe-vm" "$d"/{stdout,stderr,rc,serial.log*}
    mkdir -p "$d/.rxe-vm"
    write_params "$g" > "$d/.rxe-vm/params"
    write_cmd "$g" "$@" > "$d/.rxe-vm/cmd.sh"
    cp "$HERE/guest.sh" "$d/.rxe-vm/guest.sh"
done

tail_serial() { # DIR
    echo "---- last lines of $1/serial.log ----" >&2
    tail -n 30 "$1/serial.log" >&2 2>/dev/null || echo "(no serial log)" >&2
    echo "----" >&2
}
print_output() { # DIR
    [ -f "$1/stdout" ] && cat "$1/stdout"
    [ -f "$1/stderr" ] && cat "$1/stderr" >&2
    return 0
}

# NIC k of guest g: its MAC (guest.sh finds the NIC by it) and its end of the
# wire, a UDP socket on the host's loopback sending to the other guest's end.
port_base=$((20000 + ($$ % 2000) * 16))
nic_args() { # GUEST
    local k mine theirs
    [ "$guests" -eq 1 ] && { echo "-nic none"; return; }
    for k in $(seq 0 $((nics - 1))); do
        mine=$((port_base + 2 * k + $1))
        theirs=$((port_base + 2 * k + 1 - $1))
        printf -- '-netdev socket,id=n%d,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d ' "$k" "$theirs" "$mine"
        printf -- '-device virtio-net-pci,netdev=n%d,mac=52:54:00:77:%02x:%02x ' "$k" "$k" "$1"
    done
}

# Boot guest g once, with at most $2 seconds. TCG, not KVM: with KVM the
# guest hangs while booting on this machine.
boot() { # GUEST SECONDS
    local rc=0 d
    d=$(gout "$1")
    # shellcheck disable=SC2046,SC2086
    timeout -k 5 "$2" qemu-system-x86_64 \
        -accel tcg,thread=multi -cpu max -m 2G -smp 2 \
        $(nic_args "$1") -no-reboot -display none -monitor none \
        -serial "file:$d/serial.log" \
        -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1 loglevel=4" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$d,mount_tag=hostout,security_model=none,multidevs=remap" \
        -virtfs "local,path=${work:-$d},mount_tag=hostwork,security_model=none,multidevs=remap" \
        ${GS_RXE_QEMU:-} \
        >"$d/.rxe-vm/qemu.log" 2>&1 || rc=$?
    return $rc
}

# QEMU 7.2's TCG occasionally segfaults while the guest boots (seen about once
# in 30 boots). Boot again then, but only if the command had not started.
# Leaves qemu's last exit code in the guest's .rxe-vm/qemu_rc.
deadline=$((SECONDS + timeout_s))
run_guest() { # GUEST
    local d try qemu_rc left tries=${GS_RXE_BOOT_TRIES:-3}
    d=$(gout "$1")
    for try in $(seq 1 "$tries"); do
        qemu_rc=0
        left=$((deadline - SECONDS))
        [ $left -gt 0 ] || { qemu_rc=124; break; }
        boot "$1" "$left" || qemu_rc=$?
        if [ $qemu_rc -le 128 ] || [ $qemu_rc -eq 137 ] || [ -f "$d/.rxe-vm/started" ] ||
           [ -f "$d/.rxe-vm/failed" ] || [ "$try" -ge "$tries" ]; then
            break
        fi
        echo "rxe-vm: qemu${2:+ of guest $1} died during boot (exit $qemu_rc), booting again" >&2
        mv -f "$d/serial.log" "$d/serial.log.try$try" 2>/dev/null || true
    done
    echo "$qemu_rc" > "$d/.rxe-vm/qemu_rc"
}

# The outcome of guest g: prints its output; returns its command's exit code
# or a harness failure.
outcome() { # GUEST
    local d qemu_rc rc name=
    d=$(gout "$1")
    [ "$guests" -eq 1 ] || { name=" of guest $1"; echo "---- guest $1 ----"; }
    qemu_rc=$(cat "$d/.rxe-vm/qemu_rc" 2>/dev/null || echo 125)
    if [ "$qemu_rc" -eq 124 ] || [ "$qemu_rc" -eq 137 ]; then
        print_output "$d"
        echo "rxe-vm: error: timed out after ${timeout_s}s; qemu$name killed (output kept in $d)" >&2
        tail_serial "$d"
        return $E_TIMEOUT
    fi
    if [ -f "$d/.rxe-vm/failed" ]; then
        echo "rxe-vm: error: guest$name setup failed: $(cat "$d/.rxe-vm/failed") (see $d)" >&2
        tail_serial "$d"
        return $E_HARNESS
    fi
    if [ ! -f "$d/rc" ]; then
        print_output "$d"
        echo "rxe-vm: error: guest$name ended without an exit code (qemu exit $qemu_rc; see $d)" >&2
        cat "$d/.rxe-vm/qemu.log" >&2
        tail_serial "$d"
        return $E_HARNESS
    fi
    rc=$(cat "$d/rc")
    print_output "$d"
    [ "$rc" -eq 0 ] || echo "rxe-vm: command$name exited with $rc (output kept in $d)" >&2
    return "$rc"
}

if [ "$guests" -eq 1 ]; then
    run_guest 0
else
    gpids=()
    for g in $(seq 0 $((guests - 1))); do
        run_guest "$g" two &
        gpids+=($!)
    done
    trap 'kill "${gpids[@]}" 2>/dev/null' EXIT
    wait "${gpids[@]}"
    trap - EXIT
fi
final=0
for g in $(seq 0 $((guests - 1))); do
    rc=0
    outcome "$g" || rc=$?
    [ $final -ne 0 ] || final=$rc
done
[ $keep -eq 1 ] || [ $final -ne 0 ] || rm -rf "$out"
exit $final
