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
# A test binary that fails is run once more (ps/test_ps_fail over tcp has a rare race, issue #7 open);
# a failure twice in a row fails CI, and every failure stays in the log.
ctest --test-dir "$build" --output-on-failure --timeout 1200 -j1 --repeat until-pass:2
for extra in tests/*/ci.sh; do
    [ -x "$extra" ] || continue
    echo "== $extra"
    "$extra" "$build"
done
