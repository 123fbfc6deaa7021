#!/bin/bash
# Session 18, call 3 (~9 minutes): the landed candidates — the step constants by bulk copy
# (BWD_COLS_TMA, default on; cols0 = FLAMIA_BWD_COLS_TMA=0) and one backward launch when every
# document walks up (BWD_SCRATCH_BUDGET_UP; b256 = FLAMIA_BWD_SCRATCH_MIB=256, the old budget).
# GPU tests first (the new bitwise knob test, chunking, ordering, the upward walk), then the A/B
# on the five short-document workloads (two rounds), then bench/vs-anchors.sh (ours, the BF16
# anchors, ours again; cuDNN FP8 where .whl was carried).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage b256=@FLAMIA_BWD_SCRATCH_MIB=256 cols0=@FLAMIA_BWD_COLS_TMA=0
# carry .device-carry/bwd4 and .device-carry/var (and .whl for cuDNN FP8).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_attention: bulk-copied constants (bitwise), chunking, ordering, walk, accuracy"; date
timeout 150 $C/gpu_attention --ignored --test-threads=1 step_constants head_chunked dq_is_bitwise walking_up mxfp8_causal_gqa 2>&1 \
  | grep -E "test result|panicked|FAILED|^test "
echo "=== A/B: base (both) / cols0 / b256"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 8192+224x256" \
  OUT=$O/ab timeout 170 bash bench/device_ab.sh 2>&1 | tail -24
echo "=== vs anchors"; date
B=$C/flamia O=$O/va timeout 360 bash bench/vs-anchors.sh 2>&1 | tail -32
date
} 2>&1 | tee "$O/s18c.log"
