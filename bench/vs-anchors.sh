#!/bin/bash
# The issues' comparison in one device call: `flamia bench attention` (A), bench/anchors.py (the
# BF16 baselines, ~4 minutes), bench/cudnn_fp8.py (cuDNN FP8, ~2 minutes; only where the
# nvidia-cudnn-frontend wheel was carried in .whl, else it says it skipped), `flamia bench
# attention` again (B), then bench/compare.py's table (training call and forward against the best
# BF16 of the same call, and against cuDNN FP8 where it ran). From the repo root on the
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
FP8=()
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  # cuDNN FP8 (per-tensor scales, padded batches): the issue's FP8 baseline, ~2 minutes
  echo "=== cuDNN FP8   clock $(clock)"; date
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OUT=$O timeout 300 python3 bench/cudnn_fp8.py > "$O/cudnn_fp8.log" 2>&1 \
    || echo "cudnn_fp8 rc=$?"
  tail -12 "$O/cudnn_fp8.log"
  [ -f "$O/cudnn_fp8.json" ] && FP8=(--fp8 "$O/cudnn_fp8.json")
else
  echo "=== cuDNN FP8 skipped: no nvidia_cudnn_frontend wheel in .whl (carry .whl: bench/README.md)"
fi
ours b "$@"
[ -f "$O/anchors.json" ] && python3 bench/compare.py "$O/ours_a.json" "$O/anchors.json" "$O/ours_b.json" "${FP8[@]}"
