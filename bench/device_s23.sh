#!/bin/bash
# Prepared in session 22 for the next session's first call (~8 minutes, H200): the ldmatrix
# versions of the two shared-memory transposes (xpose.cuh: K's dim-major tile in the backward,
# FLAMIA_BWD_KD_XPOSE=1; Q's dim-major copy written by the forward, FLAMIA_FWD_QD=1; both off by
# default, model-checked by scripts/xpose_model.py, never run on a GPU). Their bitwise tests and
# gpu_quant (the forward's Q copy byte for byte), three mutations, then an A/B base / xq (both) /
# xp1 / qd1, two rounds: do the kernels still pay for the quantiser's 20%?
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage xq=@FLAMIA_BWD_KD_XPOSE=1,FLAMIA_FWD_QD=1 xp1=@FLAMIA_BWD_KD_XPOSE=1 qd1=@FLAMIA_FWD_QD=1;
#   carry .device-carry/bwd4 and .device-carry/var. Then (if they pay) bench/device_s22e.sh's profile,
#   and bench/device_s22.sh (the whole suite, vs-anchors with cuDNN FP8).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the two bitwise tests, gpu_quant"; date
for t in dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same q_dim_major_copy_written_by_the_forward_gives_bitwise_the_same; do
  timeout 150 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked|differs"
done
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked|wrote|wrong"
echo "=== mutations"; date
for m in kd-xpose-inplace qd-fwd-nozero qd-fwd-noperm; do
  ONLY=$m OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -2
done
echo "=== A/B"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 8192+224x256" \
  OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -1
VARS=xq TESTS=0 WL="--workload 1x65536" OUT=$O/ab65 timeout 60 bash bench/device_ab.sh 2>&1 | tail -1
VARS=xq TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" \
  OUT=$O/ab64 timeout 40 bash bench/device_ab.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s23.log"
