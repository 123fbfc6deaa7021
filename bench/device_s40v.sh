#!/bin/bash
# Session 40's second staging (not run: no device was lent after it): three v4 forward knobs, off by
# default until measured. FWD_VPERM (FLAMIA_FWD_VPERM=1): P packed by four-code conversions for
# V's permuted dim-major copy (the backward's in-place V transpose undoes the order,
# BWD_VT_VPERM); 594 -> 520 SASS per interior key tile at d = 128. FWD_DESC_ADD
# (FLAMIA_FWD_DESC_ADD=1): the K-slice descriptors by one add each; 520 -> 505 with VPERM.
# FWD_TILE_TRIM (FLAMIA_FWD_TILE_TRIM=1): the interior tile's maxima without the -inf test, the
# group exponents from compact tables; 505 -> 497 with both. Stage
# from the repo root here:
#   rm -rf .device-carry/bwd4 .device-carry/z; bash bench/device_bwd4.sh --stage; strip .device-carry/bwd4/*
#   rm -f .device-carry/bwd4/{bridge_cuda,model_cuda}
#   bash bench/stage_variant.sh ff1 - softmax.cuh:FWD_FACTORS_FIRST=1
#   mkdir -p .device-carry/z; tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4
# carry .device-carry/z, run
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s40v.sh MODE
#   v:    correctness: the three knobs' bitwise tests (=0, =1 and unset; VPERM with both V paths
#         of the backward, both head dims, the causally safe options; DESC_ADD with VPERM both
#         ways; TILE_TRIM with the other two),
#         the backward's V transpose against the token-major copy, gpu_quant (V's permuted copy
#         in the caller's buffer), then the accuracy, leakage, isolation and repeatability tests
#         with all three on, and cuda-ff1 bitwise the embedded sources with them (~5 minutes).
#   t:    the timings, two rounds: the default, VPERM, VPERM + DESC_ADD and all three, d = 128
#         on six workloads (~5 minutes); u: the same at d = 64 on three, and all three with
#         the token-block softmax's other order (cuda-ff1: FWD_FACTORS_FIRST=1, session 38's
#         d = 128 default, 8% slower at d = 64 then, now 459 against 481 SASS a tile with the
#         cuts) (~4 minutes).
#         Predicted: -1..-5% forward (the forward is latency-bound, ~44% of its clocks issue:
#         docs/perf.md "Session 40"; the shuffle round trip VPERM removes sits on each tile's
#         chain before PV's issue); 1x65536 at 800 TFLOP/s needs -3.5%.
#   If they win: make them the default (fwd_vperm and the two defines in forward_v4_build:
#   env_off), then a, b (the whole suite) and c (the standing).
#   a, b: the whole GPU suite (device_suite.sh 1, 2); c: the standing (vs-anchors.sh).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s40v.sh v|t|u|a|b|c}
suite_or_standing "$mode"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
v)
  echo "=== bitwise: FLAMIA_FWD_VPERM and FLAMIA_FWD_DESC_ADD =1 against =0 and unset; V transposed against token-major"; date
  FLAMIA_BWD_HANG_TRAP=1 timeout 300 $C/gpu_attention --ignored --test-threads=1 forward_vperm_gives_bitwise_the_same \
    forward_slice_descriptors_by_add_give_bitwise_the_same forward_tile_trims_give_bitwise_the_same \
    v_token_major_made_by_the_consumers_gives_bitwise_the_same \
    2>&1 | grep -E "^test |test result|panicked|differs"
  echo "=== gpu_quant"; date
  timeout 60 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  echo "=== accuracy, leakage, isolation, repeatability with all three knobs"; date
  FLAMIA_FWD_VPERM=1 FLAMIA_FWD_DESC_ADD=1 FLAMIA_FWD_TILE_TRIM=1 FLAMIA_BWD_HANG_TRAP=1 timeout 200 $C/gpu_attention --ignored --test-threads=1 \
    as_accurate_as_the_reference per_token_scales_with_block_ds repeated_runs_are_bitwise_identical \
    documents_are_isolated_bitwise causal_leakage_has_the_reference_properties head_dim_64_documents_are_isolated \
    head_dim_64_precision_options_are_accurate 2>&1 | grep -E "^test |test result|panicked|differs"
  echo "=== cuda-ff1 (FWD_FACTORS_FIRST=1 at d = 64, u's last build) bitwise the embedded sources, all three knobs"; date
  FLAMIA_FWD_VPERM=1 FLAMIA_FWD_DESC_ADD=1 FLAMIA_FWD_TILE_TRIM=1 FLAMIA_AB_CUDA_DIR=$C/cuda-ff1 FLAMIA_BWD_HANG_TRAP=1 \
    timeout 150 $C/gpu_attention --ignored --exact --test-threads=1 kernel_sources_of_another_directory_give_bitwise_the_same \
    2>&1 | grep -E "^test |test result|panicked|differs"
  ;;
t | u)
  A="FLAMIA_FWD_VPERM=1 FLAMIA_FWD_DESC_ADD=1"
  for r in 1 2; do
    for e in - FLAMIA_FWD_VPERM=1 "$A" "$A FLAMIA_FWD_TILE_TRIM=1"; do
      if [ $mode = t ]; then
        bench_mhz "d=128 $e round $r" "$e" --workload 1x65536 --workload 4x16384 --workload 16x4096 --workload 64x1024 \
          --workload 256x256 --workload lognormal
      else
        bench_mhz "d=64 $e round $r" "$e" --head-dim 64 --workload 1x65536 --workload 16x4096 --workload 256x256
      fi
    done
    if [ $mode = u ]; then
      e="$A FLAMIA_FWD_TILE_TRIM=1 FLAMIA_CUDA_DIR=$C/cuda-ff1"
      bench_mhz "d=64 $e round $r" "$e" --head-dim 64 --workload 1x65536 --workload 16x4096 --workload 256x256
    fi
  done
  ;;
*) echo "device_s40v.sh: unknown mode '$mode' (v, t, u, a, b, c)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s40v-$mode.log"
