#!/bin/bash
# Runs gstrain (under gsrun) and the PyTorch DDP reference with the same
# model, data, hyper-parameters and rank count, one after the other in the
# same session, and prints their epoch times side by side.
#
#   examples/pytorch/compare.sh [RANKS] [EPOCHS] [extra gstrain/train_ddp options...]
#   GS_BUILD=build (the build folder), GS_TRANSPORT (gsrun's transport)
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${1:-2}
epochs=${2:-1}
shift $(($# < 2 ? $# : 2))
build=${GS_BUILD:-build}
py=/usr/bin/python3
for f in "$build/tools/gsrun" "$build/examples/gstrain"; do
    [ -x "$f" ] || { echo "compare.sh: $f is missing; build first (cmake --build $build)" >&2; exit 1; }
done
"$py" -c "import torch" 2>/dev/null || { echo "compare.sh: apt-get install python3-torch" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tools/gsrun" -n "$ranks" -- "$build/examples/gstrain" --epochs "$epochs" --json "$@" |
    sed -n 's/^\[0\] //p' >"$tmp/gstrain.json"
"$py" examples/pytorch/train_ddp.py --ranks "$ranks" --epochs "$epochs" --json "$@" >"$tmp/torch.json"

"$py" - "$tmp/gstrain.json" "$tmp/torch.json" <<'EOF'
import json, sys
gs, pt = (json.load(open(p)) for p in sys.argv[1:3])
print(f"{gs['ranks']} ranks, global batch {gs['batch']}, {gs['train_images']} training images per epoch")
print(f"{'epoch':>5} {'gstrain s':>10} {'img/s':>8} {'sync %':>7} {'test acc':>9}   "
      f"{'pytorch s':>10} {'img/s':>8} {'test acc':>9}   {'ratio':>6}")
for g, p in zip(gs["epochs"], pt["epochs"]):
    print(f"{g['epoch']:>5} {g['time_s']:>10.2f} {g['images_per_s']:>8.0f} {100 * g['sync_share']:>6.1f}% "
          f"{100 * g['test_acc']:>8.2f}%   {p['time_s']:>10.2f} {p['images_per_s']:>8.0f} "
          f"{100 * p['test_acc']:>8.2f}%   {p['time_s'] / g['time_s']:>5.2f}x")
gt = sum(e["time_s"] for e in gs["epochs"]) / len(gs["epochs"])
ptt = sum(e["time_s"] for e in pt["epochs"]) / len(pt["epochs"])
print(f"mean epoch: gstrain {gt:.2f} s, pytorch DDP (gloo) {ptt:.2f} s: gstrain is {ptt / gt:.2f}x as fast")
EOF
