#!/bin/bash
# gsplot: benchmark results as one PNG, time and busbw against size, each
# source its own curve (gnuplot, Debian's gnuplot-nox).
#
#   gsplot -o OUT.png [--title TEXT] [--size WxH] [LABEL=]FILE...
#
# A FILE is either gsbench --json output (as gsrun prints it, "[0] " prefixes
# and all) or a baseline's text output, one row per size
# ("COLL BYTES MEDIAN_US MIN_US MAX_US ALGBW BUSBW ITERS": the baselines'
# mpi_coll and gloo_allreduce.py, docs/figures.md). LABEL names the curve (default: gsbench's
# "gradsync <collective> <transport>", a baseline's file name).
set -euo pipefail
out= title="gradsync beside its baselines" size=1200x500 sources=()
usage() { sed -n '4,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    -o) out=${2:?}; shift 2 ;;
    --title) title=${2:?}; shift 2 ;;
    --size) size=${2:?}; shift 2 ;;
    -h | --help) usage ;;
    *) sources+=("$1"); shift ;;
    esac
done
[ -n "$out" ] && [ ${#sources[@]} -gt 0 ] || usage
[[ $size =~ ^[0-9]+x[0-9]+$ ]] || { echo "gsplot: --size wants WxH, got '$size'" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "gsplot: gnuplot is missing: apt-get install gnuplot-nox" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Each source as "bytes time_us busbw_GBps" rows in $work/N.dat, its label in labels[N].
labels=()
for i in "${!sources[@]}"; do
    src=${sources[$i]} label=
    if [[ $src == *=* ]] && [ ! -e "$src" ]; then label=${src%%=*}; src=${src#*=}; fi
    [ -r "$src" ] || { echo "gsplot: cannot read $src" >&2; exit 1; }
    if grep -q '"tool": "gsbench"' "$src"; then
        [ -n "$label" ] || label=$(sed -n 's/.*"collective": "\([a-z_]*\)".*"transport": "\([a-z]*\)".*/gradsync \1 \2/p' "$src" | head -1)
        sed 's/^\[[0-9]*\] //' "$src" | awk -F'[:,]' '/"bytes":/ {
            for (i = 1; i < NF; i++) {
                if ($i ~ /"bytes"/) b = $(i + 1)
                if ($i ~ /"time_us"/) t = $(i + 1)
                if ($i ~ /"busbw_GBps"/) w = $(i + 1)
            }
            print b + 0, t + 0, w + 0 }' > "$work/$i.dat"
    else
        [ -n "$label" ] || label=$(basename "$src")
        awk 'NF >= 7 && $2 ~ /^[0-9]+$/ { print $2, $3, $7 }' "$src" > "$work/$i.dat"
    fi
    [ -s "$work/$i.dat" ] || { echo "gsplot: no rows in $src (gsbench --json or baseline text expected)" >&2; exit 1; }
    labels+=("${label//\'/}")
done

{
    echo "set terminal pngcairo size ${size/x/,} font 'sans,10'"
    echo "set output '$out'"
    echo "set multiplot layout 1,2 title '${title//\'/}'"
    echo "set logscale x 2; set grid; set xlabel 'message size (bytes)'; set key top left"
    echo "set xtics ('8' 8, '64' 64, '512' 512, '4K' 4096, '32K' 32768, '256K' 262144, '2M' 2097152, '16M' 16777216, '128M' 134217728)"
    for panel in time busbw; do
        if [ $panel = time ]; then
            echo "set title 'time (us, median)'; set logscale y 10; set ylabel 'us'"
            col=2
        else
            echo "set title 'bus bandwidth (GB/s)'; unset logscale y; set yrange [0:*]; set ylabel 'GB/s'"
            col=3
        fi
        plot="plot"
        for i in "${!labels[@]}"; do
            plot+=" '$work/$i.dat' using 1:$col with linespoints title '${labels[$i]}',"
        done
        echo "${plot%,}"
    done
    echo "unset multiplot"
} > "$work/plot.gp"
gnuplot "$work/plot.gp"
echo "gsplot: wrote $out (${size}, ${#labels[@]} curves)"
