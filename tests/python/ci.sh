#!/bin/bash
# The PyTorch backend and the Python package (scripts/test.sh runs it with the
# build folder as $1). The ASan build cannot be loaded into Python, so this
# builds the package beside it without sanitizers ($1-py, Release), then runs
# under Debian's /usr/bin/python3 (PyTorch 1.13):
#   python/tests/test_backend.py: torch.distributed with
#     init_process_group("gradsync") on 1-3 ranks, every operation the
#     backend has, DDP against gloo;
#   python/tests/test_capi.py: the ctypes bindings of the C API over
#     libgradsync.so on 1-3 ranks, shm and tcp, numpy arrays and tensors;
#   python/tests/test_launch.py: init_process_group("gradsync") under
#     torchrun, gsrun, mpirun and srun's variables;
#   PyTorch's DistributedTest (python/tests/dist_suite.py).
# Fails (not skips) when python3-torch, python3-numpy or libtorch-dev is
# missing: scripts/deps.sh installs them.
set -euo pipefail
build=${1:?usage: tests/python/ci.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$build-py" && cd "$build-py" && pwd)
for pkg in torch numpy; do
    /usr/bin/python3 -c "import $pkg" 2>/dev/null || {
        echo "python: FAILED: Debian's python3-$pkg is missing (scripts/deps.sh installs it)" >&2
        exit 1
    }
done
echo "python: building the backend, libgradsync.so, gsrun and the example gshello in $out"
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGS_SANITIZE=OFF -DGS_BUILD_TESTS=OFF \
    -DGS_BUILD_EXAMPLES=ON -DGS_WITH_TORCH=ON >/dev/null
cmake --build "$out" --target gs_c10d gradsync gsrun gshello -j"$(nproc)" >/dev/null
# The backend links libgradsync.so (not a copy of the static library): after `import gradsync`
# the process holds exactly one libgradsync, the one the ctypes bindings loaded.
echo "python: the module and the bindings share one libgradsync.so"
# grep reads all (not -q): leaving early would break readelf's pipe, a failure under pipefail
readelf -d "$out/python/gradsync/_c10d.so" | grep 'NEEDED.*\[libgradsync\.so' >/dev/null || {
    echo "python: FAILED: _c10d.so does not link libgradsync.so" >&2
    exit 1
}
PYTHONPATH="$out/python" /usr/bin/python3 - <<'PY'
import gradsync, gradsync._backend  # noqa: F401  (the backend's module loaded)
print("python: libgradsync", gradsync.version())  # and the ctypes bindings'
maps = {line.split()[-1] for line in open("/proc/self/maps") if "libgradsync" in line}
assert len(maps) == 1, "libgradsync mapped from %s" % sorted(maps)
print("python: one libgradsync:", maps.pop())
PY
echo "python: test_backend.py"
PYTHONPATH="$out/python" timeout 900 /usr/bin/python3 "$root/python/tests/test_backend.py" -v 2>&1 |
    grep -vE "^\s*$|Warning|warnings.warn|InitGoogleLogging" | tail -40
echo "python: test_capi.py"
PYTHONPATH="$out/python" timeout 600 /usr/bin/python3 "$root/python/tests/test_capi.py" -v 2>&1 | tail -40
# torchrun, gsrun, mpirun (openmpi-bin) and srun's variables; a missing launcher fails
echo "python: test_launch.py"
PYTHONPATH="$out/python" GS_TOOLS="$out/tools" GS_EXAMPLES="$out/examples" timeout 600 /usr/bin/python3 "$root/python/tests/test_launch.py" -v \
    2>&1 | grep -vE "^\s*$|Warning|warnings.warn|InitGoogleLogging" | tail -40
# PyTorch's own DistributedTest suite, the tests that run on CPU (the lists
# in python/tests/dist_suite_ws*.txt; docs/pytorch.md has the full run): every
# one must pass, a skip among them is a failure.
suite() {
    local log
    log=$(mktemp)
    echo "python: DistributedTest at WORLD_SIZE=$1 ($(grep -cv '^#' "$2") tests)"
    PYTHONPATH="$out/python" WORLD_SIZE=$1 GS_SUITE_TESTS=$2 timeout 1500 /usr/bin/python3 \
        "$root/python/tests/dist_suite.py" >"$log" 2>&1 || true
    grep -E "^(Ran|OK|FAILED)|^(FAIL|ERROR): " "$log" || true
    if ! grep -qx OK "$log"; then
        echo "python: FAILED: DistributedTest at WORLD_SIZE=$1: not every listed test passed" >&2
        grep -vE "^\s*$|Warning|warnings.warn|^INFO:" "$log" | tail -80 >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
}
suite 2 "$root/python/tests/dist_suite_ws2.txt"
suite 3 "$root/python/tests/dist_suite_ws3.txt"
# What runs on top of the backend: DDP buckets, unused parameters, no_sync,
# the fp16/bf16/PowerSGD communication hooks and ZeroRedundancyOptimizer
# against gloo, object collectives, profiler ranges.
echo "python: test_on_top.py"
PYTHONPATH="$out/python" timeout 900 /usr/bin/python3 "$root/python/tests/test_on_top.py" -v 2>&1 |
    grep -vE "^\s*$|Warning|warnings.warn|InitGoogleLogging" | tail -20
