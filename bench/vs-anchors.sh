#!/bin/bash
# The issues' comparison in one device call: `flamia bench attention` (A), bench/anchors.py (the
# BF16 baselines, ~4 minutes), `flamia bench attention` again (B), then bench/compare.py's table
# (training call and forward against the best BF16 of the same call). From the repo root on the
# device; B = the binary (target/release/flamia), O = the output folder ($OUT), extra arguments go
# to both `flamia bench attention` runs (e.g. --head-dim 64, then set ANCHOR_HEAD_DIM=64 too).
set -u
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH (run directly, the binary found no libtorch)
B=${B:-target/release/flamia}; O=${O:-${OUT:-/tmp/flamia-out}}; mkdir -p "$O"
clock() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader; }
ours() {
  echo "=== ours ($1)   clock $(clock)"; date
  local log; log=$(mktemp)
  timeout 100 "$B" bench attention --json "$O/ours_$1.json" "${@:2}" >"$log" 2>&1 \
    || { echo "ours ($1) failed (rc $?):"; tail -5 "$log"; }
  grep -E "^[0-9]|^lognormal|^workload" "$log"; rm -f "$log"
}
ours a "$@"
echo "=== BF16 anchors   clock $(clock)"; date
PYTHONUNBUFFERED=1 OUT=$O timeout 330 python3 bench/anchors.py > "$O/anchors.log" 2>&1 || echo "anchors rc=$?"
tail -14 "$O/anchors.log"
ours b "$@"
[ -f "$O/anchors.json" ] && python3 bench/compare.py "$O/ours_a.json" "$O/anchors.json" "$O/ours_b.json"
