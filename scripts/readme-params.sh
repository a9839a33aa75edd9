#!/bin/bash
# Regenerates the README's environment-variable table from the configuration
# table (gsinfo --params --markdown). With --check, fails if the README is stale.
# The table reaches awk through the environment, not `awk -v`: -v processes
# backslash escapes, and the table's `\|` would come out as `|` under gawk.
# AWK picks the awk (default awk; the tests run it with mawk and gawk).
set -euo pipefail
cd "$(dirname "$0")/.."
gsinfo=${1:-build/tools/gsinfo}
[ "${1:-}" = "--check" ] && gsinfo=${2:-build/tools/gsinfo}
begin='<!-- params-table: begin -->'
end='<!-- params-table: end -->'
table=$(env -i "$gsinfo" --params --markdown)
new=$(GS_BEGIN=$begin GS_END=$end GS_TABLE=$table "${AWK:-awk}" '
    BEGIN { b = ENVIRON["GS_BEGIN"]; e = ENVIRON["GS_END"]; t = ENVIRON["GS_TABLE"] }
    $0 == b { print; print t; skip = 1; next }
    $0 == e { skip = 0 }
    !skip { print }' README.md)
if [ "${1:-}" = "--check" ]; then
    [ "$new" = "$(cat README.md)" ] || { echo "README.md's variable table is stale: run scripts/readme-params.sh" >&2; exit 1; }
else
    printf '%s\n' "$new" > README.md
fi
