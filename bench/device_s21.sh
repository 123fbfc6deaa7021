#!/bin/bash
# Session 21 (H200): the dQ conversion inside the fused backward (BWD_DQ_FUSED, default on).
# Kept as the record of session 21's calls 3-4: BWD_DQ_FUSED measured 2.4x slower at 256x256 and
# was removed (its sources, test and mutations are in commit c54eb13; docs/perf.md session 21).
#   bash bench/device_s21.sh        (~8 minutes) its bitwise test first (alone, under a timeout:
#     a hang would be the converter's hand-off), then the whole gpu_attention suite on the new
#     default, then the mutation dq-fused-first (MUTS="dq-fused-first dq-fused-nohad" for both).
#   bash bench/device_s21.sh ab     (~7 minutes) A/B base / dqc0 (FLAMIA_BWD_DQ_FUSED=0) on five
#     workloads, two rounds, then bench/vs-anchors.sh (ours, anchors.py, ours again).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage dqc0=@FLAMIA_BWD_DQ_FUSED=0; carry .device-carry/bwd4 and
#   .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
NEW=dq_converted_inside_the_backward_gives_bitwise_the_separate_conversion
if [ "${1:-}" = ab ]; then
  {
  nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
  echo "=== A/B base / dqc0"; date
  TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 1x65536 --workload lognormal" \
    OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -24
  echo "=== vs anchors"; date
  B=$C/flamia O=$O/va timeout 330 bash bench/vs-anchors.sh 2>&1 | tail -30
  date
  } 2>&1 | tee "$O/s21-ab.log"
  exit 0
fi
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== $NEW"; date
timeout 150 $C/gpu_attention --ignored --exact $NEW 2>&1 | grep -E "test result|panicked|differs|^test "
echo "rc ${PIPESTATUS[0]}"
echo "=== the rest of the gpu_attention suite (~320 s)"; date
timeout 380 $C/gpu_attention --ignored --test-threads=1 --skip $NEW 2>&1 | grep -E "test result|panicked|FAILED|^test "
echo "=== mutations"; date
for m in ${MUTS:-dq-fused-first}; do
  ONLY=$m OUT=$O/mut timeout 130 bash bench/gpu_mutations.sh 2>&1 | tail -2
done
date
} 2>&1 | tee "$O/s21.log"
