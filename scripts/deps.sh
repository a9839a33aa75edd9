#!/bin/bash
# Installs the Debian 12 packages gradsync builds, tests and runs with (as root).
# Another apt or dpkg at work (unattended-upgrades, a second shell) is waited
# for, up to 10 minutes, instead of failing.
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang clang-format libclang-rt-14-dev libibverbs-dev rdma-core ibverbs-providers
      libopenblas-dev zlib1g-dev dataset-fashion-mnist openmpi-bin libopenmpi-dev iproute2 python3)
lock_wait_s=600

# Runs apt-get, waiting for the locks another apt or dpkg holds.
# DPkg::Lock::Timeout makes apt wait for dpkg's frontend lock; apt 2.6 does not
# wait for the package lists' lock (update) or the download cache's lock with
# it, so a failure that names a lock is retried until the same deadline.
apt_get() {
    local deadline=$((SECONDS + lock_wait_s)) log rc said=0
    log=$(mktemp)
    while :; do
        rc=0
        apt-get -o DPkg::Lock::Timeout="$lock_wait_s" "$@" >"$log" 2>&1 || rc=$?
        [ $rc -ne 0 ] && grep -q "Could not get lock" "$log" && [ $SECONDS -lt $deadline ] || break
        [ $said -eq 1 ] || echo "deps.sh: $(grep -m1 "Could not get lock" "$log" | sed 's/^E: //'); waiting" >&2
        said=1
        sleep 5
    done
    [ $rc -eq 0 ] || { cat "$log" >&2; echo "deps.sh: apt-get $* failed (exit $rc)" >&2; }
    rm -f "$log"
    return $rc
}

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "deps.sh: missing packages ${missing[*]}; run as root" >&2; exit 1; }
    echo "deps.sh: installing ${missing[*]} (waits up to $((lock_wait_s / 60)) minutes for another apt or dpkg)"
    export DEBIAN_FRONTEND=noninteractive
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends "${missing[@]}"
fi
