#!/usr/bin/env bash
# Prepare the Soft-RoCE test guest: install the host packages, fetch the Debian
# kernel (extracted into the cache, never installed on the host) and build an
# initramfs that loads virtio/9p/rdma_rxe (and virtio_net, sch_netem for the
# two-guest mode) and hands over to the guest script.
#
# usage: tests/rxe-vm/setup.sh          (as root; idempotent, reuses the cache)
# env:   GS_RXE_CACHE   cache folder (default $HOME/.cache/gradsync-rxe)
#        GS_RXE_KERNEL  kernel package to use (default: what linux-image-amd64 depends on)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
APT_GET=$HERE/../../scripts/apt-get-wait.sh  # apt-get, waiting for another apt or dpkg
CACHE=${GS_RXE_CACHE:-$HOME/.cache/gradsync-rxe}
PACKAGES=(qemu-system-x86 busybox-static kmod cpio iproute2 rdma-core
          ibverbs-providers ibverbs-utils xz-utils zstd tcpdump)
# Modules the guest needs, loaded with their dependencies in this order:
# virtio_net for the two-guest mode's NICs (run.sh --guests 2), sch_netem
# for its packet loss and outages on the wire.
MODULES=(virtio_pci 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs dummy virtio_net sch_netem)

log() { echo "rxe-vm setup: $*" >&2; }
die() { echo "rxe-vm setup: error: $*" >&2; exit 1; }

# Step 1: host packages. apt-get update only when something cannot be found.
# Another apt or dpkg at work is waited for (up to 10 minutes).
install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' ||
            missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && { log "host packages present"; return; }
    [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run this script as root"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! "$APT_GET" install -y --no-install-recommends "${missing[@]}"; then
        log "install failed; running apt-get update once and retrying"
        "$APT_GET" update
        "$APT_GET" install -y --no-install-recommends "${missing[@]}"
    fi
}

# The versioned kernel package behind the linux-image-amd64 metapackage.
kernel_package() {
    if [ -n "${GS_RXE_KERNEL:-}" ]; then echo "$GS_RXE_KERNEL"; return; fi
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
          awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    if [ -z "$pkg" ]; then
        "$APT_GET" update >&2
        pkg=$(apt-cache depends linux-image-amd64 |
              awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    fi
    [ -n "$pkg" ] || die "cannot tell which kernel package linux-image-amd64 depends on"
    echo "$pkg"
}

# Step 2: download and extract the kernel package into $CACHE/kernel/<pkg>.
fetch_kernel() {
    local pkg=$1 dir=$CACHE/kernel/$1 dl
    if [ -f "$dir/.extracted" ]; then log "kernel $pkg cached"; return; fi
    log "downloading $pkg"
    rm -rf "$dir" && mkdir -p "$dir"
    # apt drops privileges to _apt for downloads: use a folder it can write.
    dl=$(mktemp -d "${TMPDIR:-/tmp}/gs-rxe-dl.XXXXXX")
    if id _apt >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then chown _apt "$dl"; fi
    (cd "$dl" && apt-get download "$pkg") || { rm -rf "$dl"; die "apt-get download $pkg failed"; }
    dpkg-deb -x "$dl"/*.deb "$dir/root" || { rm -rf "$dl"; die "cannot extract $pkg"; }
    rm -rf "$dl"
    touch "$dir/.extracted"
}

# Print "path" lines of the .ko files for $MODULES, dependencies first, once each.
module_files() {
    local root=$1 kver=$2 m line ko
    for m in "${MODULES[@]}"; do
        modprobe --show-depends -d "$root" -S "$kver" "$m" ||
            die "modprobe cannot resolve module $m for $kver"
    done | while read -r line; do
        case $line in
            insmod\ *) read -r _ ko _ <<< "$line"; echo "$ko" ;;
            builtin\ *) ;;                     # compiled in, nothing to load
            *) die "unexpected modprobe output: $line" ;;
        esac
    done | awk '!seen[$0]++'
}

# Step 3: an initramfs with busybox, the modules and a small /init.
build_initramfs() {
    local pkg=$1 root=$CACHE/kernel/$1/root kver stage ko name n=0
    kver=$(ls "$root/lib/modules")
    [ "$(echo "$kver" | wc -l)" -eq 1 ] || die "expected one kernel in $root/lib/modules"
    depmod -b "$root" "$kver"
    stage=$CACHE/initramfs.d
    rm -rf "$stage" && mkdir -p "$stage"/{bin,dev,proc,sys,host,out,modules}
    cp /bin/busybox "$stage/bin/busybox"
    ln -s busybox "$stage/bin/sh"
    mknod -m 600 "$stage/dev/console" c 5 1 2>/dev/null || true
    module_files "$root" "$kver" > "$stage/modules/list.host"
    while read -r ko; do
        n=$((n + 1))
        name=$(printf '%02d-%s' "$n" "$(basename "$ko")")
        case $ko in
            *.ko.xz)  xz -dc "$ko"   > "$stage/modules/${name%.xz}" ;;
            *.ko.zst) zstd -qdc "$ko" > "$stage/modules/${name%.zst}" ;;
            *.ko.gz)  gzip -dc "$ko" > "$stage/modules/${name%.gz}" ;;
            *)        cp "$ko" "$stage/modules/$name" ;;
        esac
    done < "$stage/modules/list.host"
    install -m 755 "$HERE/initramfs-init.sh" "$stage/init"
    (cd "$stage" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) |
        gzip -1 > "$CACHE/initramfs.cpio.gz.tmp"
    mv "$CACHE/initramfs.cpio.gz.tmp" "$CACHE/initramfs.cpio.gz"
    cp "$root/boot/vmlinuz-$kver" "$CACHE/vmlinuz"
    log "initramfs for $kver: $n modules"
}

# A stamp names what the initramfs was built from; a mismatch rebuilds it.
stamp_of() {
    echo "kernel=$1"
    echo "modules=${MODULES[*]}"
    echo "init=$(sha256sum < "$HERE/initramfs-init.sh" | cut -d' ' -f1)"
}

main() {
    install_packages
    mkdir -p "$CACHE"
    local pkg stamp
    pkg=$(kernel_package)
    fetch_kernel "$pkg"
    stamp=$(stamp_of "$pkg")
    if [ -f "$CACHE/initramfs.cpio.gz" ] && [ -f "$CACHE/vmlinuz" ] &&
       [ "$(cat "$CACHE/stamp" 2>/dev/null)" = "$stamp" ]; then
        log "initramfs up to date"
    else
        build_initramfs "$pkg"
        echo "$stamp" > "$CACHE/stamp"
    fi
    log "ready: $CACHE (run tests/rxe-vm/run.sh -- CMD...)"
}

main "$@"
