#!/bin/bash
# Fuzzes the tcp transport's frame parser for a bounded time (scripts/test.sh
# runs it with the build folder as $1). Builds libgradsync with clang
# (-fsanitize=fuzzer-no-link,address,undefined) beside that folder, links
# tests/fuzz/fuzz_tcp_frame.c with libFuzzer, and runs it from the committed
# seed corpus for GS_FUZZ_SECONDS (default 60). A crash, leak, sanitizer
# report or timeout fails the script; the reproducer lands in $1/fuzz/.
#
#   tests/fuzz/ci.sh build-test                 # as CI does
#   GS_FUZZ_SECONDS=600 tests/fuzz/ci.sh build  # longer, by hand
set -euo pipefail
build=${1:?usage: tests/fuzz/ci.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=${GS_FUZZ_SECONDS:-60}
out=$(mkdir -p "$build/fuzz" && cd "$build/fuzz" && pwd)
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"

if ! command -v clang >/dev/null; then
    echo "fuzz: clang not found (scripts/deps.sh installs it)" >&2
    exit 1
fi

echo "fuzz: building libgradsync with clang in $out/lib"
cmake -S "$root" -B "$out/lib" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DGS_BUILD_TESTS=OFF \
    -DGS_BUILD_EXAMPLES=OFF -DGS_WITH_VERBS=OFF -DCMAKE_C_FLAGS="$flags -fsanitize=fuzzer-no-link" >/dev/null
cmake --build "$out/lib" --target gradsync_static -j"$(nproc)" >/dev/null
# shellcheck disable=SC2086
clang $flags -fsanitize=fuzzer -D_GNU_SOURCE -I"$root/include" -I"$root/src" "$here/fuzz_tcp_frame.c" \
    "$out/lib/src/libgradsync.a" -lpthread -o "$out/fuzz_tcp_frame"

# New inputs go to a scratch corpus, never into the committed seeds.
rm -rf "$out/corpus" && mkdir -p "$out/corpus"
echo "fuzz: running fuzz_tcp_frame for ${seconds}s"
"$out/fuzz_tcp_frame" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -artifact_prefix="$out/" -print_final_stats=1 "$out/corpus" "$here/corpus/tcp_frame" 2>"$out/fuzz.log" || {
    tail -60 "$out/fuzz.log"
    echo "fuzz: FAILED: fuzz_tcp_frame found a crash; reproducer in $out/ (run: $out/fuzz_tcp_frame FILE)" >&2
    exit 1
}
grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" "$out/fuzz.log" | sed 's/^/fuzz: /'
echo "fuzz: passed (${seconds}s, corpus of $(ls "$out/corpus" | wc -l) new inputs)"
