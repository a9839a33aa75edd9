#!/bin/bash
# The README's main command: installs what is needed, builds (release) and runs
# the main job: data-parallel training over shared memory with 4 local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
if [ -x build/examples/gstrain ]; then
    exec build/tools/gsrun -n "${GS_RANKS:-4}" -- build/examples/gstrain "$@"
fi
# Until the trainer lands: a 2-rank run through the launcher (barrier + allgather).
exec build/tools/gsrun -n 2 -- build/tools/gshello "$@"
