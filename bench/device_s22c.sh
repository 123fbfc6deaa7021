#!/bin/bash
# Session 22, call 2 (~9 minutes, H200): the dim-major K made in shared memory from a second TMA
# load of the token-major tile during the previous item's end (BWD_KD_XPOSE, second design: the
# first, transposing the K/V slot's tile after kv_full with the consumers waiting after their first
# step, measured the backward +3..+6% slower in call 1) and Q's dim-major copy written by the
# forward (FWD_QD_WRITE). Both bitwise tests, gpu_quant (the forward's Q copy byte for byte
# against the CPU reference), three mutations, then an A/B base / xp0 (FLAMIA_BWD_KD_XPOSE=0) /
# qd0 (FLAMIA_FWD_QD=0) / old (both 0) on five d = 128 workloads and base / old on two d = 64 ones.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage xp0=@FLAMIA_BWD_KD_XPOSE=0 qd0=@FLAMIA_FWD_QD=0 old=@FLAMIA_BWD_KD_XPOSE=0,FLAMIA_FWD_QD=0;
#   carry .device-carry/bwd4 and .device-carry/var. `bash bench/device_s22c.sh ab`: the A/B alone
#   (call 2's A/B ran a stale `flamia`, built before these changes: device_bwd4.sh --stage builds now).
set -u
mode=${1:-all}
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ "$mode" != ab ]; then
echo "=== the two bitwise tests, gpu_quant"; date
for t in dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same q_dim_major_copy_written_by_the_forward_gives_bitwise_the_same; do
  timeout 150 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked|differs"
done
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked|wrote|wrong"
echo "=== mutations"; date
for m in qd-fwd-nozero kd-xpose-inplace qd-fwd-noperm; do
  ONLY=$m OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -2
done
fi
echo "=== A/B, d = 128"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 1x65536 --workload 8192+224x256" \
  OUT=$O/ab timeout 220 bash bench/device_ab.sh 2>&1 | tail -3
echo "=== A/B, d = 64"; date
VARS=old TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" \
  OUT=$O/ab64 timeout 60 bash bench/device_ab.sh 2>&1 | tail -3
date
} 2>&1 | tee "$O/s22c-$mode.log"
