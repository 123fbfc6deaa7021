#!/bin/bash
# Session 43's device call: session 40's forward cuts (FWD_VPERM, FWD_DESC_ADD, FWD_TILE_TRIM)
# and V's running fold reference (FWD_EV_RUN, now also in the per-token producer) made the
# defaults after session 43's first calls measured the cuts (777 -> 803 TFLOP/s at 1x65536) and
# the per-tile reference's non-finite O on spread block scales with an all-zero V tile.
# Run once in session 43 (call 4, docs/perf.md "Session 43"): the spread tests' seed 2 missed the
# dK bound (bound widened for spread inputs since), d = 64's cuts cost 10% (only EV_RUN is on at
# d = 64 since). Next session: `v` again on the final tree (the spread tests' d = 64 halves have
# not run), then the whole suite (`device_s40v.sh a`, `b`).
# Stage here:
#   rm -rf .device-carry/bwd4 .device-carry/z; bash bench/device_bwd4.sh --stage; strip .device-carry/bwd4/*
#   rm -f .device-carry/bwd4/{bridge_cuda,model_cuda}
#   mkdir -p .device-carry/z; tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4
# carry .device-carry/z, run from the repo root on the device:
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s43.sh MODE
#   v (~4 min): the spread and zero-V accuracy tests (one per head dim since session 43's end, each
#      with the defaults and the causally safe options), FWD_EV_RUN bitwise where V's exponents
#      are uniform (both scale modes), gpu_quant, then the accuracy, leakage, isolation and
#      repeatability tests on the new defaults (their filter runs the spread tests again).
#   t (~2 min): d = 128, the new default against FLAMIA_FWD_EV_RUN=0 (the cost of the running
#      maximum) on six workloads; d = 64 against session 42's default on three (since call 5 only EV_RUN
#      is on at d = 64, so this compares EV_RUN on and off); --causally-safe both ways on two.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s43.sh v|t}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
v)
  for t in spread_block_scales_and_zero_value_tiles_are_as_accurate_as_the_reference \
           head_dim_64_spread_block_scales_and_zero_value_tiles_are_as_accurate_as_the_reference \
           forward_ev_running_max_keeps_uniform_exponents_bitwise; do
    echo "=== $t"; date
    FLAMIA_BWD_HANG_TRAP=1 timeout 150 $C/gpu_attention --ignored --exact "$t" --nocapture --test-threads=1 \
      > "$O/$t.log" 2>&1; echo "rc=$?"; grep -E "rel L2|panicked|test result|FAILED|differs|non-finite" "$O/$t.log" | tail -40
  done
  echo "=== gpu_quant"; date
  timeout 60 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  echo "=== accuracy, leakage, isolation, repeatability on the new defaults"; date
  FLAMIA_BWD_HANG_TRAP=1 timeout 200 $C/gpu_attention --ignored --test-threads=1 \
    as_accurate_as_the_reference per_token_scales_with_block_ds repeated_runs_are_bitwise_identical \
    documents_are_isolated_bitwise causal_leakage_has_the_reference_properties head_dim_64_documents_are_isolated \
    head_dim_64_precision_options_are_accurate 2>&1 | grep -E "^test |test result|panicked|differs"
  ;;
t)
  W=(--workload 1x65536 --workload 4x16384 --workload 16x4096 --workload 64x1024 --workload 256x256 --workload lognormal)
  for r in 1 2; do
    for e in - FLAMIA_FWD_EV_RUN=0; do
      bench_mhz "d=128 $e round $r" "$e" "${W[@]}"
    done
  done
  # d = 64: the default (since call 5: EV_RUN alone; DESC_ADD and TILE_TRIM are d = 128 only)
  # against session 42's default (all off)
  for r in 1 2; do
    for e in - "FLAMIA_FWD_DESC_ADD=0 FLAMIA_FWD_TILE_TRIM=0 FLAMIA_FWD_EV_RUN=0"; do
      bench_mhz "d=64 $e round $r" "$e" --head-dim 64 --workload 1x65536 --workload 16x4096 --workload 256x256
    done
  done
  for e in - FLAMIA_FWD_EV_RUN=0; do
    run_bench "d=128 --causally-safe $e" "$e" --causally-safe --workload 1x65536 --workload 16x4096
  done
  ;;
*) echo "device_s43.sh: unknown mode '$mode' (v, t)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s43-$mode.log"
