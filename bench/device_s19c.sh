#!/bin/bash
# Session 19, call 3 (~6 minutes, H200): the forward's key-tile loop with fewer instructions
# (K and V slice descriptors as base + offset, desc_add, instead of rebuilt from the address;
# group maxima and sums started from their first element instead of -inf / 0: the same values):
# 619 -> 584 SASS per tile at d = 128, 560 -> 531 at d = 64 (kernel-regs.py --per-score). The
# whole gpu_attention suite on it, then an A/B of the forward against the old sources (fwdold =
# the commit before, FLAMIA_CUDA_DIR), two rounds.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage fwdold=<the commit before>; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== A/B base / fwdold"; date
VARS=fwdold TESTS=0 WL="--workload 1x65536 --workload 4x16384 --workload 16x4096 --workload 256x256 --workload lognormal" \
  OUT=$O/ab timeout 200 bash bench/device_ab.sh 2>&1 | tail -24
echo "=== d = 64 forward: base / fwdold"; date
VARS=fwdold TESTS=0 WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 256x256" REPS=1 \
  OUT=$O/ab64 timeout 100 bash bench/device_ab.sh 2>&1 | tail -10
echo "=== the whole gpu_attention suite"; date
timeout 300 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
date
} 2>&1 | tee "$O/s19c.log"
