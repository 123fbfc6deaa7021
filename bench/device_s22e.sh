#!/bin/bash
# Prepared in session 22 for the next session (~1.5 minutes; not run: the device time ran out):
# where BWD_KD_XPOSE's and FWD_QD_WRITE's cost goes at 256x256: the backward's clocks per phase and per item
# (BWD_PROF_PHASES, CTAs 0-1) and the forward's waits per item and key tile (FWD_PROF_TIMERS),
# each knob off and on.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s22e.sh --stage;
#   carry .device-carry/bwd4 and .device-carry/var.
set -u
V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V && mkdir -p $V/prof && cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/prof/
  sed -i '1i #define BWD_PROF_PHASES 1' $V/prof/attn_bwd_v4.cu
  sed -i '1i #define FWD_PROF_TIMERS 1' $V/prof/attn_fwd_v4.cu
  du -sh $V/*; exit 0
fi
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
for x in 0 1; do
  echo "=== 256x256, FLAMIA_BWD_KD_XPOSE=$x FLAMIA_FWD_QD=$x"; date
  FLAMIA_BWD_KD_XPOSE=$x FLAMIA_FWD_QD=$x FLAMIA_CUDA_DIR=$V/prof timeout 40 $C/flamia bench attention --workload 256x256 2>&1 \
    | grep -E "bwd4 phases|bwd4 producer|fwd4 prof|^256" | tail -8
done
date
} 2>&1 | tee "$O/s22e.log"
