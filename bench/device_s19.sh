#!/bin/bash
# Prepared in session 18 for the next session's first device call (~8 minutes, H200): the landed
# state (BWD_COLS_TMA, the walk-up scratch budget, BWD_EARLY_FACTORS: the last one measured on an
# H100 only) against the BF16 anchors and cuDNN FP8 in one call (bench/vs-anchors.sh), then the
# call's device memory at a 131,072-token row (issue 13's bar: <= 2.7 GB; session 18 added the
# step constants' table, 24 bytes per padded position and query head: ~48 MiB there, computed);
# then (`bash bench/device_s19.sh dqc`, a second call: both do not fit the 600 s) the whole
# gpu_attention suite and bwd_dq_convert with two rows per thread (FLAMIA_BWD_DQC_ROWS=2,
# prepared in session 18, never run): an A/B on the short workloads, where the two conversions
# are ~9% (256x256) .. 4% (32x2048) of the call.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage dqc2=@FLAMIA_BWD_DQC_ROWS=2, plus the cuDNN FP8 wheel in .whl
#   (bench/README.md's pip download line); carry .device-carry/bwd4, .device-carry/var and .whl.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
if [ "${1:-}" = dqc ]; then
  {
  echo "=== the whole gpu_attention suite on the final session-18 tree (dq_conversion_rows included)"; date
  timeout 300 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
  echo "=== 1x131072: the call's device memory (MiB column)"; date
  timeout 60 $C/flamia bench attention --workload 1x131072 2>&1 | grep -E "^[0-9]|^workload"
  echo "=== bwd_dq_convert rows per thread: A/B base / dqc2"; date
  VARS=dqc2 TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096" \
    OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -20
  date
  } 2>&1 | tee "$O/s19-dqc.log"
  exit 0
fi
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
# (bwd_dq_convert was restructured for DQC_ROWS after session 18's last device call: its default
# one-row form, the same arithmetic, has not run on a GPU before this)
echo "=== gpu_attention: accuracy, repeatability, chunking on the final session-18 tree"; date
timeout 100 $C/gpu_attention --ignored --test-threads=1 mxfp8_causal_gqa head_dim_64_is_as_accurate repeated_runs head_chunked 2>&1 \
  | grep -E "test result|panicked|FAILED|^test "
echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
B=$C/flamia O=$O/va timeout 400 bash bench/vs-anchors.sh 2>&1 | tail -32
echo "=== 1x131072: the call's device memory (MiB column)"; date
timeout 60 $C/flamia bench attention --workload 1x131072 2>&1 | grep -E "^[0-9]|^workload"
date
} 2>&1 | tee "$O/s19.log"
