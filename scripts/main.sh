#!/bin/bash
# The README's main command: installs what is needed, builds (release) and runs
# the main job: data-parallel training over shared memory with 4 local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGS_SANITIZE=OFF >/dev/null
cmake --build build -j"$(nproc)"
exec build/tools/gsrun -n "${GS_RANKS:-4}" -- build/examples/gstrain "$@"
