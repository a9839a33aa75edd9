#!/bin/bash
# Applies .clang-format to every tracked C file; with --check, lists the files
# that differ and fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format missing (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.h')
if [ "${1:-}" = "--check" ]; then
    bad=0
    for f in "${files[@]}"; do
        clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f (scripts/format.sh)" >&2; bad=1; }
    done
    exit $bad
fi
clang-format -i "${files[@]}"
