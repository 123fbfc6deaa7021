#!/bin/bash
# Prepared in session 17 for the next session's first device call (~8 minutes): where the
# backward's step goes after session 17's landings (CVT4, 6 early column constants in the
# walk-up build, REDUX): ncu of one backward launch at 1x65536 (`python3 scripts/ncu-stalls.py
# attn_bwd_v4.sass.csv.gz --cycles C --regions --smem` here afterwards, C = elapsed cycles /
# steps per consumer warp); the backward's clocks per phase and per item (BWD_PROF_PHASES,
# CTAs 0-1) at 256x256, 64x1024 and 16x4096, where the backward runs at 110-420 TFLOP/s against
# 507 at 1x65536 (session 17: 1.31 ms for 62 items per CTA at 256x256, ~35,000 clocks per item of
# ~3 steps, 2 of them masked, against ~5,000 per interior step at 1x65536;
# which part is the item's end, its waits or the masked steps is not measured); then the landed
# state against the BF16 anchors and cuDNN FP8 in one call (bench/vs-anchors.sh; session 17's
# call 4 ran it without cuDNN FP8).
# Stage here:
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s18.sh --stage
#   (and the cuDNN FP8 wheel in .whl: the pip download line in bench/README.md, device_s17 row)
# carry .device-carry/bwd4, .device-carry/var and .whl, run from the repo root on the device.
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
echo "=== gpu_quant (session 17's review re-expressed the quantiser's layout addresses: same SASS counts, not yet run)"; date
timeout 60 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
echo "=== ncu attn_bwd_v4 (1x65536)"; date
B=$C/flamia KERNELS=attn_bwd_v4 OUT=$O/ncu timeout 150 bash bench/ncu-kernels.sh 2>&1 | tail -6
echo "=== backward phases (BWD_PROF_PHASES, CTAs 0-1, the last launch's lines)"; date
for wl in 256x256 64x1024 16x4096; do
  echo "--- $wl"
  FLAMIA_CUDA_DIR=$V/prof timeout 60 $C/flamia bench attention --workload $wl 2>&1 | grep "bwd4 phases" | tail -4
done
echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
B=$C/flamia O=$O/va timeout 430 bash bench/vs-anchors.sh 2>&1 | tail -30
date
} 2>&1 | tee "$O/s18.log"
