#!/bin/bash
# Session 28, third call (H200): the head groups by default (src/gpu/sched.rs HEAD_GROUP and the
# makespan rule): their bitwise GPU test and the ordering tests beside it, then the new default
# against the old order (FLAMIA_FWD_HEAD_GROUP=64 FLAMIA_BWD_HEAD_GROUP=64: every head at once)
# on the nine workloads at d = 128 and three at d = 64, two rounds each.
# Staged as device_s28.sh says; on the device:
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s28c.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== GPU tests"; date
for t in head_groups_of_the_work_lists_give_bitwise_the_same dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in \
         long_documents_gqa_are_as_accurate_as_the_reference; do
  timeout 150 $C/gpu_attention --ignored --exact $t --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right"
done
for r in 1 2; do
  for v in new old; do
    e=(X=1); [ $v = old ] && e=(FLAMIA_FWD_HEAD_GROUP=64 FLAMIA_BWD_HEAD_GROUP=64)
    echo "=== d = 128 $v r$r"; date
    env "${e[@]}" timeout 120 $C/flamia bench attention --json "$O/d128-$v-$r.json" 2>&1 | grep -E "^[0-9a-z]"
  done
done
for r in 1 2; do
  for v in new old; do
    e=(X=1); [ $v = old ] && e=(FLAMIA_FWD_HEAD_GROUP=64 FLAMIA_BWD_HEAD_GROUP=64)
    echo "=== d = 64 $v r$r"; date
    env "${e[@]}" timeout 120 $C/flamia bench attention --head-dim 64 --workload 1x65536 --workload 4x16384 \
      --workload 8x8192 --workload 16x4096 --workload 8192+224x256 --workload lognormal 2>&1 | grep -E "^[0-9a-z]"
  done
done
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s28c.log"
