#!/bin/bash
# Session 18, call 4 (~5 minutes): where a short item's waits come from — BWD_PROF_PHASES with
# the producer's clocks (claim to first stage, free-stage waits, kv_empty wait, K/V + factors) at
# 256x256, 64x1024 and 16x4096; the precision options' cost (`--causally-safe` beside the
# default, same call); then the 1B preset end to end at 16,384-token rows, bf16 control and
# mxfp8, short and row-long documents (bench/trainer_1b.sh, issue 13's end-to-end figure).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s18d.sh --stage
# carry .device-carry/bwd4 and .device-carry/var.
set -u
V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V && mkdir -p $V/prof && cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/prof/
  sed -i '1i #define BWD_PROF_PHASES 1' $V/prof/attn_bwd_v4.cu
  du -sh $V/*; exit 0
fi
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== backward phases and the producer's clocks (CTAs 0-1, the last launch's lines)"; date
for wl in 256x256 64x1024 16x4096; do
  echo "--- $wl"
  FLAMIA_CUDA_DIR=$V/prof timeout 40 $C/flamia bench attention --workload $wl 2>&1 | grep -E "bwd4 (phases|producer)" | tail -6
done
echo "=== precision options: default, then --causally-safe"; date
for o in "" --causally-safe; do
  timeout 60 $C/flamia bench attention --workload 1x65536 --workload 16x4096 --workload 256x256 $o 2>&1 | grep -E "^[0-9]"
done
echo "=== 1B at 16,384-token rows"; date
B=$C/flamia ROWS=16384 STEPS16=6 OOM_CHECK=0 OUT=$O timeout 330 bash bench/trainer_1b.sh 2>&1 | grep -vE "^name|^[0-9]+ MHz" | tail -12
date
} 2>&1 | tee "$O/s18d.log"
