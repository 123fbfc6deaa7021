#!/bin/bash
# Session 26, call 5 (~1.5 minutes, H200): BWD_ST8 off (the variant st8off) against the
# default at short lengths. With BWD_DS_STSM and BWD_ST8 together the d = 128 walk-up build keeps
# 3 of dV's accumulators in local memory across the step loops (3 LDL + 3 STL + 1 LDL per
# interior step, `kernel-regs.py --bwd-per-step`; none with either alone), against ST8's 115 SASS
# fewer per item end: which wins? Stage here: `bash bench/device_bwd4.sh --stage` and
#   tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4        (carry .device-carry/z)
# Run: tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s26c.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
V=/tmp/st8off; rm -rf $V; mkdir -p $V; cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/
sed -i 's|^#define BWD_ST8 (BWD_WALK_UP \|\| HEAD_DIM != 128)$|#define BWD_ST8 0|' $V/attn_bwd_v4.cu
cmp -s $V/attn_bwd_v4.cu flamia-kernels/cuda/attn_bwd_v4.cu && { echo "st8off: sed out of date"; exit 1; }
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
for r in 1 2; do
  for v in new st8off; do
    e=(X=1); [ $v = st8off ] && e=(FLAMIA_CUDA_DIR=$V)
    echo "--- $v"
    env "${e[@]}" timeout 40 $C/flamia bench attention --workload 256x256 --workload 64x1024 --workload 32x2048 2>&1 | grep -E "^[0-9]"
    env "${e[@]}" timeout 30 $C/flamia bench attention --head-dim 64 --workload 256x256 --workload 32x2048 2>&1 | grep -E "^[0-9]"
  done
done
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s26c.log"
