#!/bin/bash
# Prepared in session 21 for the next session's first device call (H200, ~10 minutes):
# the whole gpu_attention suite on the final tree (session 21's call 5 ran 27 of its 30 before the
# session's device time ran out: step_constants_by_bulk_copy_... was cut, walking_up_... did not
# start) and gpu_quant, then bench/vs-anchors.sh with cuDNN FP8 (ours, anchors.py, cudnn_fp8.py,
# ours again) on the tree with the quantisers' streaming code stores (QUANT_STCS, the default
# since session 21).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*, plus the cuDNN FP8
#   wheel in .whl (bench/README.md's pip download line); carry .device-carry/bwd4 and .whl.
#   `bash bench/device_s22.sh tests` runs the tests alone, `... va` the comparison alone.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:-all}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ "$mode" != va ]; then
  echo "=== the whole gpu_attention suite (~270-320 s)"; date
  timeout 420 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
  timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
fi
if [ "$mode" != tests ]; then
  echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
  B=$C/flamia O=$O/va timeout 500 bash bench/vs-anchors.sh 2>&1 | tail -40
fi
date
} 2>&1 | tee "$O/s22-$mode.log"
