#!/bin/bash
# Session 22, call 1 (~7 minutes, H200): K transposed in shared memory by the v4 backward
# (BWD_KD_XPOSE, the new default: no dim-major K from the quantiser). Its bitwise test against the
# TMA-loaded copy (FLAMIA_BWD_KD_XPOSE=0), gpu_quant (K quantised without a dim-major copy, every
# other byte the reference's), the mutation kd-xpose-noswz, then an A/B base / xp0 on five d = 128
# workloads and two d = 64 ones, two rounds.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage xp0=@FLAMIA_BWD_KD_XPOSE=0; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the new bitwise test, gpu_quant"; date
timeout 200 $C/gpu_attention --ignored --exact dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same 2>&1 | grep -E "test result|panicked|differs"
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
echo "=== mutation"; date
ONLY=kd-xpose-noswz OUT=$O/mut timeout 200 bash bench/gpu_mutations.sh 2>&1 | tail -3
echo "=== A/B base / xp0, d = 128"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 1x65536 --workload 8192+224x256" \
  OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -14
echo "=== A/B base / xp0, d = 64"; date
TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" \
  OUT=$O/ab64 timeout 60 bash bench/device_ab.sh 2>&1 | tail -8
date
} 2>&1 | tee "$O/s22b.log"
