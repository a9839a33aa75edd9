#!/bin/bash
# The README's test command: installs what is needed, builds with ASan+UBSan
# from clean, and runs every test (ctest; each test binary forks its cases
# with a timeout), then every tests/*/ci.sh (the rxe guest, the network
# namespaces, fuzzing). A ci.sh that cannot run on this machine fails, saying
# what is missing; so does one that is not executable.
#
# GS_TEST_SKIP: ci.sh steps not to run, by folder name ("rxe-vm netns", commas
# or spaces), for a machine that cannot run them; each is announced as
# SKIPPED and listed again at the end. CI (.ci/run) never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."

# The GS_TEST_SKIP names, each checked against the ci.sh steps there are.
skip_list() {
    local name
    for name in ${GS_TEST_SKIP//,/ }; do
        [ -f "tests/$name/ci.sh" ] || {
            echo "scripts/test.sh: GS_TEST_SKIP names '$name', which has no tests/$name/ci.sh" >&2
            return 1
        }
        echo "$name"
    done
}
GS_TEST_SKIP=${GS_TEST_SKIP:-}
skip=$(skip_list)

scripts/deps.sh
build=${GS_TEST_BUILD:-build-test}
rm -rf "$build"
cmake -S . -B "$build" -DGS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$build" -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for awk in mawk gawk; do
    AWK=$awk scripts/readme-params.sh --check "$build/tools/gsinfo"
done
scripts/format.sh --check
ctest --test-dir "$build" --output-on-failure --timeout 1200 -j1
skipped=()
for extra in tests/*/ci.sh; do
    name=$(basename "$(dirname "$extra")")
    if grep -qx "$name" <<<"$skip"; then
        echo "== $extra: SKIPPED (GS_TEST_SKIP=$GS_TEST_SKIP): its tests did not run"
        skipped+=("$extra")
        continue
    fi
    [ -x "$extra" ] || {
        echo "scripts/test.sh: $extra is not executable: chmod +x $extra (and git update-index --chmod=+x)" >&2
        exit 1
    }
    echo "== $extra"
    "$extra" "$build"
done
if [ ${#skipped[@]} -gt 0 ]; then
    echo "== scripts/test.sh: passed, BUT ${#skipped[@]} step(s) SKIPPED by GS_TEST_SKIP: ${skipped[*]}"
else
    echo "== scripts/test.sh: every test passed"
fi
