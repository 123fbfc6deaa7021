#!/bin/bash
# Session 25's first call (~8-9 minutes, H200): the whole gpu_attention suite and gpu_quant on the
# final tree of session 24 (e34bf32: the K test's new values, the V test's shared helper, the
# mode-1 removal had not run as one suite), then an A/B of the operand transposes made inside the
# backward forced on (kv1 = FLAMIA_BWD_KD_XPOSE=1 + FLAMIA_BWD_VT_XPOSE=1) where the per-plan rule
# leaves them off (4x16384, 8x8192: mean key tiles per query tile >= 32), and the precision
# options' cost today (`--causally-safe` beside the default, alternately, twice).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage kv1=@FLAMIA_BWD_KD_XPOSE=1,FLAMIA_BWD_VT_XPOSE=1; carry .device-carry/bwd4 and
#   .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the whole gpu_attention suite"; date
timeout 400 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
echo "=== A/B kv1"; date
VARS=kv1 TESTS=0 WL="--workload 8x8192 --workload 4x16384" OUT=$O/ab timeout 120 bash bench/device_ab.sh 2>&1 | tail -1
echo "=== precision options"; date
for r in 1 2; do
  for s in "" --causally-safe; do
    echo "--- ${s:-default} ($r)"
    timeout 60 $C/flamia bench attention $s --workload 1x65536 --workload 16x4096 --workload 256x256 2>&1 | grep -E "^[0-9]|^workload"
  done
done
date
} 2>&1 | tee "$O/s25.log"
