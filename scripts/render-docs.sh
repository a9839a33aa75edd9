#!/bin/bash
# Renders README.md and docs/README.md as GitHub does (cmark-gfm: tables,
# autolinks) into HTML and takes a headless-chromium screenshot of each, to
# look at: what renders wrong (a table without its header row, raw pipes,
# a broken image) shows in the picture. Needs Debian's cmark-gfm and
# chromium (apt-get install cmark-gfm chromium).
# usage: scripts/render-docs.sh [OUT_DIR]   (default /tmp/gradsync-render)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/gradsync-render}
for tool in cmark-gfm chromium; do
    command -v "$tool" >/dev/null || { echo "render-docs.sh: $tool missing (apt-get install cmark-gfm chromium)" >&2; exit 1; }
done
mkdir -p "$out"
for md in README.md docs/README.md; do
    name=$(echo "$md" | tr / _ | sed 's/\.md$//')
    dir=$(dirname "$md")
    {
        echo "<!doctype html><html><head><meta charset=utf-8><base href=\"file://$PWD/$dir/\">"
        echo "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;font-size:14px}"
        echo "table{border-collapse:collapse}td,th{border:1px solid #999;padding:3px 6px}"
        echo "pre{background:#f4f4f4;padding:6px;overflow:auto}</style></head><body>"
        cmark-gfm --unsafe -e table -e autolink -e strikethrough "$md"
        echo "</body></html>"
    } > "$out/$name.html"
    # pages of 1400 pixels, each a picture small enough to read: the page
    # shifted up by a negative margin (headless chromium shoots the top only)
    lines=$(wc -l < "$md")
    pages=$(( (lines * 24) / 1400 + 1 ))
    for ((i = 0; i < pages; i++)); do
        sed "s|<body>|<body style=\"margin-top:-$((i * 1400))px\">|" "$out/$name.html" > "$out/$name.page.html"
        timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,1400 \
            --screenshot="$out/$name-$i.png" "file://$out/$name.page.html" >/dev/null 2>&1
    done
    rm -f "$out/$name.page.html"
    echo "$md -> $out/$name.html, $out/$name-0.png .. $name-$((pages - 1)).png"
done
