#!/bin/bash
# Session 7, device call 1: head dim 64 (quantiser, v4 forward, v4 backward) and row dS exponents on
# the v4 backward, correctness first: the d=64 accuracy test as a smoke test (compute-sanitizer on
# it if it fails), then every GPU test (gpu_quant at d=128 and 64, gpu_attention incl. the d=64 and
# causally-safe-on-v4 cases, bridge_cuda), then a short bench at d=64 and with the precision options.
# Stage: bash bench/device_bwd4.sh --stage; run from the repo root on the device with
# .device-carry/bwd4 carried: bash bench/device_s7c1.sh (logs under $OUT).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
SMOKE=head_dim_64_is_as_accurate_as_the_reference
echo "=== smoke: $SMOKE"; date
timeout 120 $C/gpu_attention --ignored --exact $SMOKE --nocapture > "$O/smoke.log" 2>&1
rc=$?
grep -E "rel L2|panicked|error|test result" "$O/smoke.log" | tail -40; echo "smoke rc=$rc"
if [ $rc != 0 ]; then
  echo "=== compute-sanitizer on the smoke test"
  timeout 120 /usr/local/cuda/bin/compute-sanitizer --print-limit 10 $C/gpu_attention --ignored --exact $SMOKE 2>&1 | grep -v "^    " | head -40
fi
echo "=== gpu_quant"; date
timeout 90 $C/gpu_quant --ignored --test-threads=4 2>&1 | grep -E "^test |test result|panicked|d=64|d=128" | head -30
echo "=== gpu_attention (all)"; date
timeout 330 $C/gpu_attention --ignored --test-threads=2 --skip $SMOKE --nocapture > "$O/gpu_attention.log" 2>&1
echo "rc=$?"
grep -E "^test |test result|panicked|assert|leak|exceeds" "$O/gpu_attention.log" | grep -v "^mxfp8 \|^nvfp4 \|^leaky" | head -60
grep -E "rel L2" "$O/gpu_attention.log" | awk '{print $NF, $0}' | sort -g -r | head -0
echo "=== bridge_cuda"; date
timeout 90 $C/bridge_cuda --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
echo "=== bench d=64, default"; date
timeout 60 $B bench attention --head-dim 64 --workload 1x65536 --workload 64x1024 --json "$O/d64.json" 2>&1 | tail -8
echo "=== bench d=128, default and causally safe (row dS on v4)"; date
timeout 60 $B bench attention --workload 1x65536 --workload 64x1024 --json "$O/d128.json" 2>&1 | grep -E "^1x|^64x|registers"
timeout 60 $B bench attention --causally-safe --workload 1x65536 --workload 64x1024 --json "$O/d128safe.json" 2>&1 | grep -E "^1x|^64x|registers|precision"
date
} 2>&1 | tee "$O/s7c1.log"
