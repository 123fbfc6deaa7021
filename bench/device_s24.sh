#!/bin/bash
# Prepared in session 23 for the next session's first call (~8 minutes, H200), none of it run yet:
# (1) the per-plan choice of K's transpose (kd_xpose_auto: the consumers' below 32 key tiles per
# query tile, the quantiser's copy above): gpu_quant (its caller-buffer test asserts the choice per
# plan); (2) the opaque lane / addresses in the consumers' transpose (the d = 128 step loop's
# spills 6 -> 2): the K bitwise test and mutation kd-half-dims on that source; (3) an A/B base
# (auto) / m2 (FLAMIA_BWD_KD_XPOSE=2 everywhere) / m0 (=0 everywhere), two rounds: if m2 is at par
# at 1x65536 now, the per-plan choice can go (docs/perf.md "Session 23"); (4) the forward's Q copy
# per plan (FLAMIA_FWD_QD=auto: d = 64, short and mid-length documents), the candidate default
# at d = 64: its bitwise test, then qda at d = 64 against base.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage m2=@FLAMIA_BWD_KD_XPOSE=2 m0=@FLAMIA_BWD_KD_XPOSE=0 qda=@FLAMIA_FWD_QD=auto; carry
#   .device-carry/bwd4 and .device-carry/var. Then bench/device_s22.sh (the whole suite,
#   vs-anchors with cuDNN FP8).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_quant, the K and Q bitwise tests, mutation"; date
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
for t in dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same q_dim_major_copy_written_by_the_forward_gives_bitwise_the_same; do
  timeout 200 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked|differs"
done
ONLY=kd-half-dims OUT=$O/mut timeout 100 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== A/B"; date
VARS="m2 m0" TESTS=0 WL="--workload 1x65536 --workload 16x4096 --workload 256x256" OUT=$O/ab timeout 240 bash bench/device_ab.sh 2>&1 | tail -1
VARS=qda TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 64x1024 --workload 16x4096 --workload 1x65536" \
  OUT=$O/ab64 timeout 120 bash bench/device_ab.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s24.log"
