#!/bin/bash
# Session 23, call 3 (~8 minutes, H200): the tree with BWD_KD_XPOSE 2 (the consumers' K transpose)
# on by default. The whole gpu_attention suite, gpu_quant and bridge_cuda on the new defaults, then
# an A/B base (new default) / old (FLAMIA_BWD_KD_XPOSE=0: the quantiser's dim-major K), two
# rounds on five workloads, two at d = 64.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage old=@FLAMIA_BWD_KD_XPOSE=0; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the whole gpu_attention suite"; date
timeout 420 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
timeout 60 $C/bridge_cuda --ignored 2>&1 | grep -E "test result|panicked"
echo "=== A/B"; date
TESTS=0 OUT=$O/ab timeout 240 bash bench/device_ab.sh 2>&1 | tail -1
TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" OUT=$O/ab64 timeout 60 bash bench/device_ab.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s23c.log"
