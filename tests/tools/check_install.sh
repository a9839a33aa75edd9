#!/bin/bash
# cmake --install puts the library, the header, the tools and gradsync.pc in a
# prefix; a program builds from pkg-config alone and runs; libgradsync.so
# exports gs_* symbols only; the installed programs link libgradsync.so and
# load the prefix's own (RUNPATH $ORIGIN/../lib), not the build tree's.
# usage: check_install.sh BUILD_DIR [extra compiler flags, e.g. sanitizers]
set -euo pipefail
build=$1
shift
prefix=$(mktemp -d "${TMPDIR:-/tmp}/gs-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/gradsync.h bin/gsrun bin/gsinfo bin/gsperf bin/gsbench bin/gstrace bin/gsplot; do
    [ -e "$prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
pc=$(find "$prefix" -name gradsync.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: gradsync.pc not installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(pkg-config --variable=libdir gradsync)
cat > "$prefix/use.c" <<'SRC'
#include <gradsync.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    printf("gradsync %s\n", gs_version());
    return strcmp(gs_status_name(GS_ERR_PEER_LOST), "GS_ERR_PEER_LOST") != 0;
}
SRC
# shellcheck disable=SC2046
cc "$@" "$prefix/use.c" -o "$prefix/use" $(pkg-config --cflags --libs gradsync) -Wl,-rpath,"$libdir"
"$prefix/use"
others=$(nm -D --defined-only "$libdir/libgradsync.so" | awk '{print $3}' | grep -v '^gs_' || true)
[ -z "$others" ] || { echo "FAIL: libgradsync.so exports more than gs_*:"; echo "$others"; exit 1; }
programs=0
for f in "$prefix"/bin/*; do
    head -c 4 "$f" | grep -q ELF || continue # gsplot is a script
    dyn=$(readelf -d "$f")
    if ! grep -q 'NEEDED.*\[libgradsync\.so' <<<"$dyn"; then
        # gstrace calls nothing of the library (the linker drops it, --as-needed); the others must link it
        case $(basename "$f") in gstrace) continue ;; esac
        echo "FAIL: $f does not link libgradsync.so"
        exit 1
    fi
    grep -q 'RUNPATH.*\[\$ORIGIN/' <<<"$dyn" || { echo "FAIL: $f has no \$ORIGIN RUNPATH:"; grep PATH <<<"$dyn"; exit 1; }
    loaded=$(env -u LD_LIBRARY_PATH ldd "$f" | awk '$1 ~ /^libgradsync\.so/ {print $3}')
    [ "$(realpath "$loaded")" = "$(realpath "$libdir/libgradsync.so.0")" ] ||
        { echo "FAIL: $f loads '$loaded', not the prefix's $libdir/libgradsync.so.0"; exit 1; }
    programs=$((programs + 1))
done
[ "$programs" -ge 5 ] || { echo "FAIL: only $programs installed programs checked"; exit 1; }
env -u LD_LIBRARY_PATH "$prefix/bin/gsinfo" | grep -q "^gradsync " || { echo "FAIL: installed gsinfo does not run"; exit 1; }
if [ -e "$prefix/bin/gshello" ]; then
    env -u LD_LIBRARY_PATH "$prefix/bin/gsrun" -n 2 --timeout-ms 20000 "$prefix/bin/gshello" >/dev/null ||
        { echo "FAIL: installed gsrun -n 2 gshello failed"; exit 1; }
fi
echo "1 passed, 0 failed"
