#!/bin/bash
# Session 23, call 4 (~1 minute, H200): the per-plan choice of K's transpose (kd_xpose_auto: the
# consumers' below 32 key tiles per query tile, the quantiser's copy above). gpu_quant (its
# caller-buffer test asserts the choice per plan), then the bench at 256x256 (transposed: the Q/K/V
# quantiser ~0.445 ms) and 1x65536 (the quantiser's copy: ~0.49 ms).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*; carry .device-carry/bwd4.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
timeout 90 $C/flamia bench attention --workload 256x256 --workload 1x65536 2>&1 | grep -E "^[0-9]|^workload|quant"
} 2>&1 | tee "$O/s23d.log"
