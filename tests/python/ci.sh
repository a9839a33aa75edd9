#!/bin/bash
# The PyTorch backend and the Python package (scripts/test.sh runs it with the
# build folder as $1). The ASan build cannot be loaded into Python, so this
# builds the package beside it without sanitizers ($1-py, Release), then runs
# python/tests/test_backend.py under Debian's /usr/bin/python3 (PyTorch 1.13):
# torch.distributed with init_process_group("gradsync") on 1-3 ranks, every
# operation the backend has, DDP against gloo. Fails (not skips) when
# python3-torch or libtorch-dev is missing: scripts/deps.sh installs them.
set -euo pipefail
build=${1:?usage: tests/python/ci.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$build-py" && cd "$build-py" && pwd)
/usr/bin/python3 -c "import torch" 2>/dev/null || {
    echo "python: FAILED: Debian's python3-torch is missing (scripts/deps.sh installs it)" >&2
    exit 1
}
echo "python: building the backend in $out"
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGS_SANITIZE=OFF -DGS_BUILD_TESTS=OFF \
    -DGS_BUILD_EXAMPLES=OFF -DGS_WITH_TORCH=ON >/dev/null
cmake --build "$out" --target gs_c10d -j"$(nproc)" >/dev/null
echo "python: test_backend.py"
PYTHONPATH="$out/python" timeout 900 /usr/bin/python3 "$root/python/tests/test_backend.py" -v 2>&1 |
    grep -vE "^\s*$|Warning|warnings.warn|InitGoogleLogging" | tail -40
# What runs on top of the backend: DDP buckets, unused parameters, no_sync,
# the fp16/bf16/PowerSGD communication hooks and ZeroRedundancyOptimizer
# against gloo, object collectives, profiler ranges.
echo "python: test_on_top.py"
PYTHONPATH="$out/python" timeout 900 /usr/bin/python3 "$root/python/tests/test_on_top.py" -v 2>&1 |
    grep -vE "^\s*$|Warning|warnings.warn|InitGoogleLogging" | tail -20
