#!/bin/bash
# Session 33 (prepared in session 32; H200; staged as device_bwd4.sh --stage, carried as
# .device-carry/z/bwd4.tgz, with .whl inside for the standing's cuDNN FP8).
#   a: the standing on session 32's defaults (plain launches, the upward walk to 16,384 tokens):
#      bench/vs-anchors.sh with cuDNN FP8 (~6 minutes).
#   b: the quantiser's claimed chunk items (QUANT_DYN, FLAMIA_QUANT_DYN=1; prepared, never run on
#      a GPU): its GPU test, the whole gpu_quant with the knob on 3 CTAs (FLAMIA_QUANT_CTAS=3: the
#      delta test's dO launches claim too), its two mutations (quant-dyn-noreset,
#      quant-dyn-skip: each must be caught); then A/B against the default, two rounds, d = 128
#      on the nine and d = 64 on five; then the PDL chain with and without it on the three short
#      workloads (the chain cost 2-3% there in session 32; the fixed grid-stride shares are the
#      suspect), and the training call's phases inside one call (FLAMIA_BENCH_HOST=1) three times
#      (the slow modes of 256x256 and of 64x1024 queued); then the in-kernel operand copies
#      (FLAMIA_BWD_KD_XPOSE=2, FLAMIA_BWD_VT_XPOSE=1, both) at 4x16384 and 8x8192, whose plans
#      are just past KD_XPOSE_MAX_TILES and now walk up (~6 minutes).
# The whole GPU suite on session 32's defaults: bash bench/device_suite.sh 1, then 2.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s33.sh a|b}
. "$(dirname "$0")/device-bench.sh"  # run_bench, D64, ab_both_dims, ab_rounds
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  B=$C/flamia bash bench/vs-anchors.sh
  ;;
b)
  timeout 120 $C/gpu_quant --ignored --exact claimed_chunk_items_give_bitwise_the_grid_stride_shares 2>&1 \
    | grep -E "^test |test result|panicked|differ"
  FLAMIA_QUANT_DYN=1 FLAMIA_QUANT_CTAS=3 timeout 120 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  for m in quant-dyn-noreset quant-dyn-skip; do
    T=$C/gpu_attention ONLY=$m bash bench/gpu_mutations.sh 2>&1 | tail -1
  done
  ab_both_dims FLAMIA_QUANT_DYN=1
  SHORT3=(--workload 32x2048 --workload 64x1024 --workload 256x256)
  for r in 1 2; do
    for e in X=1 FLAMIA_QUANT_DYN=1 FLAMIA_PDL=1 "FLAMIA_PDL=1 FLAMIA_QUANT_DYN=1"; do
      run_bench "$e round $r" "$e" "${SHORT3[@]}"
    done
  done
  for r in 1 2 3; do
    run_bench "phases $r" FLAMIA_BENCH_HOST=1 "${SHORT3[@]}"
  done
  # the operand copies made inside the backward (KD_XPOSE_MAX_TILES: plans under 32 key tiles
  # per query tile) again, now that 16,384-token documents walk up
  for k in FLAMIA_BWD_KD_XPOSE=2 FLAMIA_BWD_VT_XPOSE=1 "FLAMIA_BWD_KD_XPOSE=2 FLAMIA_BWD_VT_XPOSE=1"; do
    ab_rounds "mid" "$k" --workload 4x16384 --workload 8x8192
  done
  ;;
*) echo "device_s33.sh: unknown mode '$mode' (a|b)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s33-$mode.log"
