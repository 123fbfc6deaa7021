#!/bin/bash
# Prepared in session 16 for the next session's first device call (~6 minutes):
# 1. the backward's early column constants in the upward-walk build at d = 128 (session 16 landed
#    all 8 before the S^T / dP^T products only without the walk: -2.2% at 1x65536, while 8 in the
#    walk-up build spilled 8 registers per step and lost 1-3.5%; 4 or 6 keep its spills at 3,
#    kernel-regs): variants c6u / c4u (6 / 4 early, first, in the walk-up build; 8 without);
# 2. the forward's inlined consumer copies (FWD_CW_CONST) against the threshold set in session 13
#    with the old producer (`FWD_CW_MIN_TILES`, 16 key tiles): fwdcw1 = always (FLAMIA_FWD_CW=1),
#    fwdcw0 = never;
# 3. the backward's four-code conversions (FLAMIA_BWD_CVT4=1, variant cvt4: 1,234 -> 1,204 SASS per
#    interior step at d = 128, 939 -> 907 at 64; its bitwise test and mutation bwd-cvt4-tile-half),
#    also at d = 64;
# with the walk-up test on c6u first. Stage here:
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s17.sh --stage
# then run it on the device with carry .device-carry/bwd4 and .device-carry/var.
set -u
V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V
  for n in c6u c4u; do
    mkdir -p $V/$n && cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/$n/
  done
  sed -i '1i #define BWD_EARLY_COLS (HEAD_DIM == 64 || !BWD_WALK_UP ? 8 : 6)\n#define BWD_COLS_FIRST 1' $V/c6u/attn_bwd_v4.cu
  sed -i '1i #define BWD_EARLY_COLS (HEAD_DIM == 64 || !BWD_WALK_UP ? 8 : 4)\n#define BWD_COLS_FIRST 1' $V/c4u/attn_bwd_v4.cu
  mkdir -p $V/cvt4 && echo FLAMIA_BWD_CVT4=1 > $V/cvt4/env
  mkdir -p $V/fwdcw1 $V/fwdcw0
  echo FLAMIA_FWD_CW=1 > $V/fwdcw1/env; echo FLAMIA_FWD_CW=0 > $V/fwdcw0/env
  du -sh $V/*; exit 0
fi
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== walk-up test on c6u"; date
FLAMIA_CUDA_DIR=$V/c6u timeout 150 $C/gpu_attention --ignored --test-threads=1 walking_up mxfp8_causal_gqa 2>&1 | grep -E "^test |test result|panicked"
timeout 120 $C/gpu_attention --ignored --test-threads=1 backward_four_code 2>&1 | grep -E "^test |test result|panicked"
ONLY=bwd-cvt4-tile-half OUT=$O/mut timeout 60 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== A/B d = 128"; date
VARS="c6u c4u cvt4 fwdcw1 fwdcw0" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 240 bash bench/device_ab.sh > /dev/null 2>&1
for col in bwd fwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
echo "=== A/B d = 64 (cvt4)"; date
VARS="cvt4" TESTS=0 REPS=2 OUT=$O/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" timeout 60 bash bench/device_ab.sh > /dev/null 2>&1
python3 bench/ab_table.py $O/b/device_ab.log --col bwd
date
} 2>&1 | tee "$O/s17.log"
