#!/bin/bash
# The README's test command: installs what is needed, builds with ASan+UBSan
# from clean, and runs every test (ctest; each test binary forks its cases
# with a timeout). Extra steps (rxe guest, fuzzing) run when present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build=${GS_TEST_BUILD:-build-test}
rm -rf "$build"
cmake -S . -B "$build" -DGS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$build" -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
scripts/readme-params.sh --check "$build/tools/gsinfo"
scripts/format.sh --check
ctest --test-dir "$build" --output-on-failure --timeout 1200 -j1
for extra in tests/*/ci.sh; do
    [ -x "$extra" ] || continue
    echo "== $extra"
    "$extra" "$build"
done
