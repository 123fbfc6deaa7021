#!/bin/bash
# Session 44's device calls on the final defaults of session 43 (the forward's cuts at d = 128,
# V's running fold reference at both head dims): the whole GPU suite (a, b), the mutations of
# sessions 40-43 and the bridge / model GPU tests (m), where the short documents' backward spends
# its clocks (p), the standing (c).
# Stage here:
#   rm -rf .device-carry/bwd4 .device-carry/z; bash bench/device_bwd4.sh --stage; strip .device-carry/bwd4/*
#   for v in "phases BWD_PROF_PHASES=1" "nostore BWD_PROF_NOSTORE=1" "nohad BWD_PROF_NOHAD=1" \
#            "nored BWD_PROF_NORED=1" "nodq BWD_PROF_NODQ=1"; do
#     set -- $v; bash bench/stage_variant.sh $1 - attn_bwd_v4.cu:$2; done
#   mkdir -p .device-carry/z; tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4
# (m needs bridge_cuda and model_cuda in the folder: carry them as .device-carry/z2/bm.tgz, made by
#  tar -C .device-carry -czf .device-carry/z2/bm.tgz bwd4/bridge_cuda bwd4/model_cuda, then
#  removed from bwd4 before packing bwd4.tgz, so each tarball stays under the carry's 64 MiB.)
# carry .device-carry/z (and .device-carry/z2 for m), run from the repo root on the device:
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s44.sh MODE
#   s1..s4: the whole GPU suite in quarters (device_suite.sh, PARTS=4; gpu_quant with s4); a, b
#         the halves, which no longer fit a call on a fresh machine (call 5: part 1 of 2 ran out
#         of the call's 560 s, the kernels compiling within it)
#   m:    mutations 38-43 (FWD_VPERM, FWD_DESC_ADD, FWD_TILE_TRIM, FWD_EV_RUN: never run on a GPU
#         since session 40 built them), then the bridge and model GPU tests
#   p:    the backward's phases (BWD_PROF_PHASES: clocks per step phase and per item, CTAs 0-1)
#         at 256x256, 64x1024 and 1x65536, then knock-out timings (wrong results, time only) at
#         256x256 and 64x1024: no dK/dV stores, no dK Hadamard, no dQ reduces, no dQ products,
#         each against the default in the same call: what each part of the short documents'
#         backward costs (issue 13's short-document bar, docs/perf.md "Next")
#   c:    the standing (vs-anchors.sh; carry .whl for cuDNN FP8)
#   e:    BWD_KV_EARLY (the K/V slot released in the item's last product step; FLAMIA_BWD_KV_EARLY=1)
#         and BWD_BULK_ST (the item's dK/dV by bulk copies through the dS tiles;
#         FLAMIA_BWD_BULK_ST=1), both off by default: their bitwise tests and mutations 45, 46
#         (~5 minutes; built in session 44, not yet run)
#   f:    their timings: the default, each and both, six workloads, two rounds (~4 minutes)
#   k:    BWD_KEYS_TMA (the item's key factors by bulk copy from bwd_cols' records): its bitwise
#         test and mutation, model_cuda with its whole message, the A/B against
#         FLAMIA_BWD_KEYS_TMA=0 (six workloads, two rounds) and the 256x256 phases with it
#         (stage cuda-phases from the new sources, as for p)
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s44.sh s1|s2|s3|s4|a|b|c|e|f|k|m|p}
suite_or_standing "$mode"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
m)
  for n in fwd-vperm-vt-rows fwd-vperm-plain-v fwd-desc-add-step fwd-trim-tables fwd-trim-mref fwd-ev-run-init; do
    ONLY=$n T=$C/gpu_attention bash bench/gpu_mutations.sh
  done
  date
  for t in bridge_cuda model_cuda; do
    if [ -x $C/$t ]; then
      echo "=== $t"
      timeout 150 $C/$t --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
    else
      echo "=== $t: not staged (skipped)"
    fi
  done
  ;;
p)
  for w in 256x256 64x1024 1x65536; do prof_log phases cuda-phases $w "^bwd4 |phase" 12; done
  date
  ab_dirs cuda-nostore cuda-nohad cuda-nored cuda-nodq -- --workload 256x256 --workload 64x1024
  ;;
k)
  # BWD_KEYS_TMA (session 44): its bitwise test and mutation, then the A/B against the producer's
  # own factor loads (FLAMIA_BWD_KEYS_TMA=0), two rounds, and the short documents' phases with it;
  # and model_cuda again with its whole message (call 1: failed, the message cut by the grep)
  echo "=== key_factors_by_bulk_copy_give_bitwise_the_same"
  FLAMIA_BWD_HANG_TRAP=1 timeout 240 $C/gpu_attention --ignored --exact key_factors_by_bulk_copy_give_bitwise_the_same \
    --test-threads=1 > "$O/keys-test.log" 2>&1
  echo "rc=$?"; grep -E "test result|panicked|differs|exceeds" "$O/keys-test.log" | head -8
  ONLY=bwd4-keys-kv-head T=$C/gpu_attention bash bench/gpu_mutations.sh
  echo "=== model_cuda"; date
  timeout 150 $C/model_cuda --ignored --nocapture --test-threads=1 > "$O/model_cuda.log" 2>&1
  echo "rc=$?"; grep -v pin_memory "$O/model_cuda.log" | tail -12
  W=(--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 1x65536 --workload lognormal)
  for r in 1 2; do
    for e in - FLAMIA_BWD_KEYS_TMA=0; do bench_mhz "keys $e round $r" "$e" "${W[@]}"; done
  done
  echo "=== phases 256x256 (BWD_KEYS_TMA)"
  FLAMIA_CUDA_DIR=$C/cuda-phases timeout 120 $C/flamia bench attention --workload 256x256 > "$O/phases-keys.log" 2>&1 || echo "rc=$?"
  grep -E "^bwd4 " "$O/phases-keys.log" | head -6
  ;;
e)
  # BWD_KV_EARLY (session 44, built, not yet run): its bitwise test and mutation, then the A/B
  # against the default (the slot released after the step loops), six workloads, two rounds
  echo "=== kv_slot_released_early_gives_bitwise_the_same"
  FLAMIA_BWD_HANG_TRAP=1 timeout 240 $C/gpu_attention --ignored --exact kv_slot_released_early_gives_bitwise_the_same \
    --test-threads=1 > "$O/kv-early-test.log" 2>&1
  echo "rc=$?"; grep -E "test result|panicked|differs|exceeds|hang" "$O/kv-early-test.log" | head -8
  ONLY=bwd4-kv-early-first T=$C/gpu_attention bash bench/gpu_mutations.sh
  echo "=== dk_dv_by_bulk_copies_give_bitwise_the_same"
  FLAMIA_BWD_HANG_TRAP=1 timeout 240 $C/gpu_attention --ignored --exact dk_dv_by_bulk_copies_give_bitwise_the_same \
    --test-threads=1 > "$O/bulk-st-test.log" 2>&1
  echo "rc=$?"; grep -E "test result|panicked|differs|exceeds|hang" "$O/bulk-st-test.log" | head -8
  ONLY=bwd4-bulk-row-stride T=$C/gpu_attention bash bench/gpu_mutations.sh
  ;;
f)
  W=(--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 1x65536 --workload lognormal)
  for r in 1 2; do
    for e in - FLAMIA_BWD_KV_EARLY=1 FLAMIA_BWD_BULK_ST=1 "FLAMIA_BWD_KV_EARLY=1 FLAMIA_BWD_BULK_ST=1"; do
      bench_mhz "kv-early/bulk-st $e round $r" "$e" "${W[@]}"
    done
  done
  ;;
*) echo "device_s44.sh: unknown mode '$mode' (s1..s4, a, b, c, e, f, k, m or p)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s44-$mode.log"
