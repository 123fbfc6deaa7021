#!/bin/bash
# Session 18's first device call (~7 minutes): (1) the review's quantiser refactor and the two
# CODE_KNOB_CASES bitwise tests, which have not run on a GPU in their landed form; (2) every
# launch of one training call timed alone (ncu, duration only) at 256x256, 64x1024 and 1x65536:
# how much of the short-document call is the quantisers, bwd_dv_fold and bwd_dq_convert (two head
# chunks at 65,536 tokens: dq_acc is 512 MiB against the 256 MiB scratch budget); (3) the
# backward's clocks per phase and per item (BWD_PROF_PHASES, CTAs 0-1) at 256x256, 64x1024,
# 16x4096; (4) one head chunk instead of two (FLAMIA_BWD_SCRATCH_MIB=1024), A/B two rounds.
# Stage here:
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s18.sh --stage
# carry .device-carry/bwd4 and .device-carry/var, run from the repo root on the device.
set -u
V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V && mkdir -p $V/prof $V/chunk1 && cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/prof/
  sed -i '1i #define BWD_PROF_PHASES 1' $V/prof/attn_bwd_v4.cu
  echo FLAMIA_BWD_SCRATCH_MIB=1024 > $V/chunk1/env
  du -sh $V/*; exit 0
fi
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_quant (session 17's review re-expressed the quantiser's layout addresses)"; date
timeout 60 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
echo "=== gpu_attention: the CODE_KNOB_CASES tests"; date
timeout 150 $C/gpu_attention --ignored --test-threads=1 backward_four_code backward_redux 2>&1 | grep -E "test result|panicked|FAILED|^test "
echo "=== every launch of a training call, timed alone (ncu gpu__time_duration, clocks not locked)"; date
for wl in 256x256 64x1024 1x65536; do
  echo "--- $wl"
  timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum --launch-count 22 \
    $C/flamia bench attention --workload $wl 2>/dev/null | grep -E "^  [a-z_0-9]+.*\(|gpu__time_duration" | paste - - \
    | awk '{print $1, $(NF-1), $NF}'
done
echo "=== backward phases (BWD_PROF_PHASES, CTAs 0-1, the last launch's lines)"; date
for wl in 256x256 64x1024 16x4096; do
  echo "--- $wl"
  FLAMIA_CUDA_DIR=$V/prof timeout 60 $C/flamia bench attention --workload $wl 2>&1 | grep "bwd4 phases" | tail -4
done
echo "=== one head chunk (chunk1) against two (base)"; date
VARS=chunk1 TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 1x65536 --workload lognormal" \
  OUT=$O/ab timeout 300 bash bench/device_ab.sh 2>&1 | tail -30
date
} 2>&1 | tee "$O/s18.log"
