#!/bin/bash
# Session 29, last call (H200; staged as device_s29.sh says, binaries of the tree with
# FWD_GROUP_ROW_BYTES): the GPU tests the forward's four-head groups at d = 64 touch (the head
# groups' bitwise test, the d = 64 accuracy / isolation / repeatability tests), then the default
# forward at d = 64 against FLAMIA_FWD_HEAD_GROUP=2 (session 28's default) on the workloads of
# device_s29c.sh, one round. About 2.5 minutes.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
timeout 150 $C/gpu_attention --ignored --exact --test-threads=1 head_groups_of_the_work_lists_give_bitwise_the_same \
  head_dim_64_is_as_accurate_as_the_reference head_dim_64_documents_are_isolated_and_default_mxfp8_is_causal_before_the_block \
  head_dim_64_is_bitwise_repeatable_whatever_the_reduce_order_and_chunking 2>&1 | grep -E "^test |test result|panicked"
for v in default g2; do
  e=(X=1); [ $v = g2 ] && e=(FLAMIA_FWD_HEAD_GROUP=2)
  echo "--- d=64 $v"
  env "${e[@]}" timeout 60 $C/flamia bench attention --head-dim 64 --workload lognormal --workload 64x1024 \
    --workload 16x4096 --workload 4x16384 --workload 1x65536 2>&1 | grep -E "^[0-9]|^lognormal"
done
date
} 2>&1 | tee "$O/s29d.log"
