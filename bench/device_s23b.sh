#!/bin/bash
# Session 23, call 2 (~8 minutes, H200): K's dim-major tile made by the consumers at their item's
# start (BWD_KD_XPOSE 2, FLAMIA_BWD_KD_XPOSE=2: xpose_kd_half, each warpgroup its own dims, loads
# in flight before the stores, no second TMA). Call 1 (device_s23.sh) measured the producer-warp
# version (=1) with ldmatrix as costly as with 4-byte LDS/STS (~1,900 clocks per item at
# 256x256: the one warp's serial chain after the second TMA, exposed at the item's start).
# Also the per-step Q / dO transposes (BWD_QD_XPOSE, FLAMIA_BWD_QD_XPOSE=1, the producer
# warpgroup's warp 3; neither quantiser writes their dim-major copies). Both bitwise tests,
# mutations kd-half-dims and qd-step-noperm, then an A/B base / xp1 / xp2 / x2q (xp2 + the
# forward's Q copy) / qdx (BWD_QD_XPOSE alone) / x2d (xp2 + qdx), two rounds; 1x65536 and d = 64.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage xp1=@FLAMIA_BWD_KD_XPOSE=1 xp2=@FLAMIA_BWD_KD_XPOSE=2 x2q=@FLAMIA_BWD_KD_XPOSE=2,FLAMIA_FWD_QD=1
#   qdx=@FLAMIA_BWD_QD_XPOSE=1 x2d=@FLAMIA_BWD_KD_XPOSE=2,FLAMIA_BWD_QD_XPOSE=1;
#   carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the bitwise tests"; date
for t in dim_major_q_and_do_made_per_step_give_bitwise_the_same dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same; do
  timeout 200 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked|differs"
done
echo "=== mutations"; date
for m in qd-step-noperm kd-half-dims; do
  ONLY=$m OUT=$O/mut timeout 100 bash bench/gpu_mutations.sh 2>&1 | tail -2
done
echo "=== A/B"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 8192+224x256" \
  OUT=$O/ab timeout 240 bash bench/device_ab.sh 2>&1 | tail -1
VARS="xp2 x2d" TESTS=0 WL="--workload 1x65536" OUT=$O/ab65 timeout 80 bash bench/device_ab.sh 2>&1 | tail -1
VARS="xp2 x2q x2d" TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" \
  OUT=$O/ab64 timeout 60 bash bench/device_ab.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s23b.log"
