#!/bin/bash
# Session 24's second call (~7 minutes, H200): V's token-major tile made by the v4 backward's
# consumers (BWD_VT_XPOSE, on per plan with K's transpose: short and mid-length documents) and
# Q's copy by the forward at d = 64 by default (FLAMIA_FWD_QD unset = auto). gpu_quant (the
# quantiser without V's token-major copy; the caller-buffer test's per-plan layout), the new
# bitwise test and the Q copy's, bridge_cuda (the trainer's FFI path on the new saved layout),
# mutation vt-half-keys (then vt-no-barrier, a race), then an A/B base / vt0
# (FLAMIA_BWD_VT_XPOSE=0) on short and mid lengths at d = 128 and 64, and vt1 (=1) at 1x65536.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage vt0=@FLAMIA_BWD_VT_XPOSE=0 vt1=@FLAMIA_BWD_VT_XPOSE=1; carry .device-carry/bwd4 and
#   .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_quant, bitwise tests, bridge_cuda"; date
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
for t in v_token_major_made_by_the_consumers_gives_bitwise_the_same q_dim_major_copy_written_by_the_forward_gives_bitwise_the_same; do
  timeout 240 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked|differs"
done
timeout 90 $C/bridge_cuda --ignored 2>&1 | grep -E "test result|panicked"
echo "=== A/B"; date
VARS=vt0 TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 8192+224x256" OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -1
VARS=vt0 TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" OUT=$O/ab64 timeout 60 bash bench/device_ab.sh 2>&1 | tail -1
VARS=vt1 TESTS=0 WL="--workload 1x65536" OUT=$O/ab1 timeout 60 bash bench/device_ab.sh 2>&1 | tail -1
echo "=== mutations"; date
ONLY=vt-half-keys OUT=$O/mut timeout 100 bash bench/gpu_mutations.sh 2>&1 | tail -1
ONLY=vt-no-barrier OUT=$O/mut timeout 130 bash bench/gpu_mutations.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s24b.log"
