#!/bin/bash
# Session 18, call 5 (~4 minutes): the producer's early key factors (BWD_EARLY_FACTORS, default
# on; early0 = FLAMIA_BWD_EARLY_FACTORS=0): GPU tests (the new bitwise knob test, ordering, the
# walk, head dim 64), the A/B base / early0 on five workloads, two rounds, then the producer's
# clocks with it (BWD_PROF_PHASES, 64x1024 and 256x256).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*, then .device-carry/var/early0/env
# (FLAMIA_BWD_EARLY_FACTORS=0) and .device-carry/var/prof (kernel sources with BWD_PROF_PHASES).
set -u
C=.device-carry/bwd4; V=.device-carry/var
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_attention"; date
timeout 170 $C/gpu_attention --ignored --test-threads=1 key_factors_loaded_early mxfp8_causal_gqa dq_is_bitwise walking_up head_dim_64_is_bitwise 2>&1 \
  | grep -E "test result|panicked|FAILED|^test "
echo "=== A/B base / early0"; date
VARS=early0 TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 8192+224x256" \
  OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -24
echo "=== phases and producer clocks with early factors"; date
for wl in 64x1024 256x256; do
  echo "--- $wl"
  FLAMIA_CUDA_DIR=$V/prof timeout 40 $C/flamia bench attention --workload $wl 2>&1 | grep -E "bwd4 (phases|producer)" | tail -6
done
date
} 2>&1 | tee "$O/s18e.log"
