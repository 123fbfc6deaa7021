#!/bin/bash
# Session 30 (H200; staged as device_bwd4.sh --stage, carried as .device-carry/z/bwd4.tgz).
#   a: the disk cache's GPU test (first run on a GPU), the 11 contract tests, the nine workloads
#      (d = 128) twice: today's standing per part (quant, fwd, bwd, dO quant, dq).
#   b: the forward's O by bulk tensor stores (FWD_O_TMA): its bitwise test and the contract tests
#      it touches, then A/B against FLAMIA_FWD_O_TMA=0, three rounds at d = 128, two at 64.
#   c: FWD_O_TMA's default rule (d = 128, short items) against =0 on the nine, two rounds; then
#      why it lost elsewhere: the single consumer body (FLAMIA_FWD_CW=0) at 1x65536 / 4x16384
#      with and without it, and d = 64 without Q's copy by the forward (FLAMIA_FWD_QD=0).
#   d: the consumer-copy threshold with FWD_O_TMA (FLAMIA_FWD_CW=0, whose single body now stores O
#      by TMA, against the default at 16x4096 / 8x8192 / 32x2048, two rounds), then the standing:
#      bench/vs-anchors.sh (ours, anchors.py, cuDNN FP8 with .whl carried, ours again).
#   e: the whole GPU suite (device_suite.sh 1 and 2).
#   f: (prepared for session 31, not yet run) the forward's half tiles (FWD_HALF_TILES): their
#      bitwise test, the two new mutations (fwd-o-tma-rows, fwd-half-limit: each must be caught),
#      then FLAMIA_FWD_HALF=1 against the default, two rounds, d = 128 on the nine and d = 64 on
#      five (~4 minutes).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s30.sh a|b|c|d|e|f}
CONTRACT=(causal_leakage_has_the_reference_properties documents_are_isolated_bitwise repeated_runs_are_bitwise_identical
  mxfp8_causal_gqa_is_as_accurate_as_the_reference long_documents_gqa_are_as_accurate_as_the_reference
  head_dim_64_documents_are_isolated_and_default_mxfp8_is_causal_before_the_block
  head_dim_64_is_bitwise_repeatable_whatever_the_reduce_order_and_chunking head_dim_64_is_as_accurate_as_the_reference
  precision_options_and_no_hadamard_are_as_accurate_as_the_reference nvfp4_is_as_accurate_as_the_reference
  walking_up_is_accurate_repeatable_and_ordered)
. "$(dirname "$0")/device-bench.sh"  # run_bench, D64, ab_both_dims
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  echo "=== kcache GPU test (fresh cache dir)"
  export FLAMIA_KERNEL_CACHE=/tmp/flamia-kcache-s30; rm -rf "$FLAMIA_KERNEL_CACHE"
  timeout 100 $C/gpu_quant --ignored --exact --test-threads=1 a_module_from_the_disk_cache_loads_with_its_kernels 2>&1 \
    | grep -E "^test |test result|panicked|cache"
  echo "=== contract tests"
  timeout 200 $C/gpu_attention --ignored --exact --test-threads=1 "${CONTRACT[@]}" 2>&1 | grep -E "^test |test result|panicked"
  ls "$FLAMIA_KERNEL_CACHE" | wc -l
  for r in 1 2; do
    echo "=== nine workloads, round $r"
    timeout 100 $C/flamia bench attention 2>&1 | grep -E "^[0-9]|^lognormal|^workload"
  done
  ;;
b)
  timeout 300 $C/gpu_attention --ignored --exact --test-threads=1 forward_o_by_tma_gives_bitwise_the_same \
    documents_are_isolated_bitwise causal_leakage_has_the_reference_properties repeated_runs_are_bitwise_identical \
    head_dim_64_documents_are_isolated_and_default_mxfp8_is_causal_before_the_block 2>&1 | grep -E "^test |test result|panicked"
  for r in 1 2 3; do
    run_bench "d=128 otma round $r" -
    run_bench "d=128 off round $r" FLAMIA_FWD_O_TMA=0
  done
  for r in 1 2; do
    run_bench "d=64 otma round $r" - "${D64[@]}"
    run_bench "d=64 off round $r" FLAMIA_FWD_O_TMA=0 "${D64[@]}"
  done
  ;;
c)
  for r in 1 2; do
    run_bench "d=128 rule round $r" -
    run_bench "d=128 off round $r" FLAMIA_FWD_O_TMA=0
  done
  for r in 1 2; do
    for v in 1 0; do
      for cw in 0 1; do
        run_bench "d=128 FLAMIA_FWD_CW=$cw FLAMIA_FWD_O_TMA=$v round $r" "FLAMIA_FWD_CW=$cw FLAMIA_FWD_O_TMA=$v" \
          --workload 1x65536 --workload 4x16384
      done
      run_bench "d=64 FLAMIA_FWD_QD=0 FLAMIA_FWD_O_TMA=$v round $r" "FLAMIA_FWD_QD=0 FLAMIA_FWD_O_TMA=$v" \
        --head-dim 64 --workload 256x256 --workload 64x1024
    done
  done
  ;;
d)
  for r in 1 2; do
    run_bench "d=128 default round $r" - --workload 16x4096 --workload 8x8192 --workload 32x2048
    run_bench "d=128 cw0 round $r" FLAMIA_FWD_CW=0 --workload 16x4096 --workload 8x8192 --workload 32x2048
  done
  B=$C/flamia bash bench/vs-anchors.sh
  ;;
e)
  T=$C bash bench/device_suite.sh 1
  T=$C bash bench/device_suite.sh 2
  ;;
f)
  timeout 150 $C/gpu_attention --ignored --exact --test-threads=1 forward_half_tiles_give_bitwise_the_same \
    2>&1 | grep -E "^test |test result|panicked"
  T=$C/gpu_attention ONLY=fwd-o-tma-rows bash bench/gpu_mutations.sh 2>&1 | tail -3
  T=$C/gpu_attention ONLY=fwd-half-limit bash bench/gpu_mutations.sh 2>&1 | tail -3
  ab_both_dims FLAMIA_FWD_HALF=1
  ;;
esac
date
} 2>&1 | tee "$O/s30-$mode.log"
