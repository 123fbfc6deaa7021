#!/bin/bash
# Prepared in session 23 for the next session's first call (~6 minutes, H200), none of it run yet:
# (1) the per-plan choice of K's transpose (kd_xpose_auto: the consumers' below 32 key tiles per
# query tile, the quantiser's copy above): gpu_quant (its caller-buffer test asserts the choice per
# plan); (2) the opaque lane / addresses in the consumers' transpose (the d = 128 step loop's
# spills 6 -> 2): the K bitwise test and mutation kd-half-dims on that source; (3) an A/B base
# (auto) / m2 (FLAMIA_BWD_KD_XPOSE=2 everywhere) / m0 (=0 everywhere), two rounds: if m2 is at par
# at 1x65536 now, the per-plan choice can go (docs/perf.md "Session 23").
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage m2=@FLAMIA_BWD_KD_XPOSE=2 m0=@FLAMIA_BWD_KD_XPOSE=0; carry .device-carry/bwd4 and
#   .device-carry/var. Then bench/device_s22.sh (the whole suite, vs-anchors with cuDNN FP8).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_quant, the K bitwise test, mutation"; date
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
timeout 200 $C/gpu_attention --ignored --exact dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same 2>&1 | grep -E "test result|panicked|differs"
ONLY=kd-half-dims OUT=$O/mut timeout 100 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== A/B"; date
TESTS=0 WL="--workload 1x65536 --workload 16x4096 --workload 256x256" OUT=$O/ab timeout 240 bash bench/device_ab.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s24.log"
