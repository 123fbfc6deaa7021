#!/bin/bash
# Session 38's device steps (after device_s37.sh a, b, f had run in the same lease).
#   g: the default backward measured 4% slower at 1x65536 than session 36's sources (f): the
#      block exponents' branch-free e4m3_scale_exp_nn reverted alone (staged as cuda-blkexp from
#      .device-carry/v) against the tree and cuda-s36, two rounds, d = 128 and d = 64.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s38.sh g|h|i|j}
[ -d .device-carry/v ] && cp -r .device-carry/v/* $C/
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
g)
  ab_dirs cuda-s36 cuda-blkexp -- --workload 1x65536 --workload 4x16384 --workload 16x4096
  ab_dirs cuda-s36 cuda-blkexp -- --head-dim 64 --workload 1x65536
  ;;
h)
  # g found the d = 64 forward 8% slower than session 36's (19.0 ms against 17.6 at 1x65536):
  # session 36's forward files (softmax.cuh, attn_fwd_v4.cu) on cuda-blkexp (cuda-fwd36), and the
  # early tile factors (FWD_EARLY_CF 1, 2), each checked for accuracy and leakage first
  for v in cuda-fwd36 cuda-earlycf cuda-earlycf2; do
    FLAMIA_CUDA_DIR=$C/$v timeout 200 $C/gpu_attention --ignored --test-threads=1 \
      mxfp8_causal_gqa_is_as_accurate_as_the_reference causal_leakage_has_the_reference_properties \
      head_dim_64_is_as_accurate_as_the_reference 2>&1 | grep -E "^test |test result|panicked" | sed "s|^|$v: |" | head
  done
  ab_dirs cuda-blkexp cuda-fwd36 cuda-earlycf cuda-earlycf2 -- --head-dim 64 --workload 1x65536 --workload 16x4096
  ab_dirs cuda-blkexp cuda-fwd36 cuda-earlycf cuda-earlycf2 -- --workload 1x65536 --workload 16x4096
  ;;
i)
  # (staged from the tree with BWD_BLOCK_EXP_NN at d = 64 only and CTA pairs by default where every
  # tile walks down) h: session 36's forward files win at d = 64 on 1x65536 (17.6 ms against
  # 19.0) and lose at d = 128 (23.0 against 22.7): two halves of session 37's token-block softmax
  # reverted alone, the groups' maxima as a chain (cuda-notree) and V's folds' 2^-fe by exp2i
  # (cuda-noinrange); then the pairs' default against FLAMIA_BWD_PAIR=0 where they now apply
  # (1x65536, 2x32768) and where they do not (4x16384); then the pair tests on the new default
  for v in cuda-notree cuda-noinrange; do
    FLAMIA_CUDA_DIR=$C/$v timeout 100 $C/gpu_attention --ignored --test-threads=1 \
      head_dim_64_is_as_accurate_as_the_reference 2>&1 | grep -E "^test |test result|panicked" | sed "s|^|$v: |" | head -3
  done
  ab_dirs cuda-fwd36 cuda-notree cuda-noinrange -- --head-dim 64 --workload 1x65536 --workload 4x16384
  for r in 1 2; do
    for p in - FLAMIA_BWD_PAIR=0; do
      bench_mhz "$p round $r" "$p" --workload 1x65536 --workload 2x32768 --workload 4x16384
      bench_mhz "$p round $r, d = 64" "$p" --head-dim 64 --workload 1x65536 --workload 2x32768
    done
  done
  export FLAMIA_BWD_HANG_TRAP=1
  timeout 200 $C/gpu_attention --ignored --test-threads=1 cta_pairs_give_bitwise_the_unpaired_backward \
    long_documents_gqa_are_as_accurate_as_the_reference repeated_runs_are_bitwise_identical 2>&1 \
    | grep -E "^test |test result|panicked|differ" | head
  ;;
j)
  # i: V's folds' 2^-fe by exp2i recovered half the d = 64 forward's loss; cuda-latefe (from
  # .device-carry/v2) also makes fe after the tile's maxima, as session 36 did (fewer registers
  # live across them), against the tree and session 36's forward files
  [ -d .device-carry/v2 ] && cp -r .device-carry/v2/* $C/
  FLAMIA_CUDA_DIR=$C/cuda-latefe timeout 60 $C/gpu_attention --ignored --test-threads=1 \
    head_dim_64_is_as_accurate_as_the_reference 2>&1 | grep -E "^test |test result|panicked" | head -3
  for r in 1 2; do
    for v in - cuda-fwd36 cuda-latefe; do
      e=-; [ "$v" != - ] && e=FLAMIA_CUDA_DIR=$C/$v
      bench_mhz "$v round $r, d = 64" "$e" --head-dim 64 --workload 1x65536 --workload 4x16384
      bench_mhz "$v round $r" "$e" --workload 1x65536
    done
  done
  ;;
*) echo "device_s38.sh: unknown mode '$mode' (g, h, i, j)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s38-$mode.log"
