#!/bin/bash
# Installs the Debian 12 packages gradsync builds, tests and runs with (as root).
# Another apt or dpkg at work is waited for, up to 10 minutes (apt-get-wait.sh).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang clang-format libclang-rt-14-dev libibverbs-dev rdma-core ibverbs-providers
      libopenblas-dev zlib1g-dev dataset-fashion-mnist openmpi-bin libopenmpi-dev iproute2 python3 gawk
      python3-torch python3-numpy libtorch-dev pybind11-dev python3-dev gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "deps.sh: missing packages ${missing[*]}; run as root" >&2; exit 1; }
    echo "deps.sh: installing ${missing[*]} (waits up to 10 minutes for another apt or dpkg)"
    export DEBIAN_FRONTEND=noninteractive
    "$(dirname "$0")/apt-get-wait.sh" update -qq
    "$(dirname "$0")/apt-get-wait.sh" install -y -qq --no-install-recommends "${missing[@]}"
fi
