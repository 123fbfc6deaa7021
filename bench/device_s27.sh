#!/bin/bash
# Prepared in session 26 for the next session (four calls, ~21 minutes in all, H200): BWD_DQ_STSM, the FP32 dQ
# partial stored by stmatrix (each 8-dim block's dims 0, 2, 4, 6, 1, 3, 5, 7 in the partial and
# in dq_acc, undone by bwd_dq_convert with the Hadamard's butterflies in the same order): census
# 1,093 -> 1,037 SASS per interior step at d = 128 (short plans), 1,083 -> 1,029 (long), d = 64
# 793 -> 762 / 798 -> 769; off by default, on with FLAMIA_BWD_DQ_STSM=1 (one binary).
# 1. Its bitwise test (dq_partials_by_stmatrix_give_bitwise_the_same) and four accuracy /
#    repeatability tests with FLAMIA_BWD_DQ_STSM=1; its mutations dq-stsm-addr, dq-stsm-order.
# 2. FLAMIA_BWD_DQ_STSM=1 against the default on the nine workloads at d = 128, and at d = 64 on
#    four, two rounds (training call and backward), each beside `--causally-safe` on three
#    (issue 13's precision options: +10..+14% in session 25, before row dS's stsm tile).
#    And FLAMIA_BWD_DV_FIRST=1 (the item end stores dV before dK's Hadamard, prepared the same
#    day: the stores are ~45% of the item end) on the nine workloads; its bitwise test and
#    mutation dv-first-rows with `tests`.
# 3. The d = 64 standing: anchors.py with ANCHOR_HEAD_DIM=64 beside ours (the forward's fix and
#    stsm landed since session 25's 1.00-1.22x).
# `suite` (~6 minutes, a call of its own): the whole gpu_attention and gpu_quant suites first, for
# the changes that landed without a GPU: exp2i_inrange (bwd_step's and the dQ products' 2^e
# without the clamp) and row dS's dQ copy by stmatrix (BWD_DS_STSM now with row dS too; its
# mutation ds-stsm-row runs with `tests`).
# Stage here: `bash bench/device_bwd4.sh --stage`, `cp -r .whl .device-carry/bwd4/`,
#   `tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4`            (carry .device-carry/z)
# Session 27 ran `suite` as is and the rest as inline commands (docs/perf.md "Session 27"); since
# then BWD_DQ_STSM is the default and BWD_DV_FIRST / BWD_MASK_BLOCKS are gone, so `tests` and
# `ab` no longer test what they name; `d64` is still to run. It added BWD_MASK_BLOCKS: its mutation
# with `tests`, its A/B on four short/mid workloads with `ab`.
# Device: tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s27.sh suite|tests|ab|d64 (one call each: ~6, ~4-5, ~6 and ~5 minutes)
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:-all}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ "$mode" = suite ]; then
  echo "=== the whole GPU suite (session 26's exp2i_inrange change landed without a GPU)"; date
  timeout 525 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
  timeout 45 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
fi
if [ "$mode" = all ] || [ "$mode" = tests ]; then
  echo "=== BWD_DQ_STSM: its bitwise test, four tests with it on, two mutations"; date
  # (their bitwise tests, dq_partials_by_stmatrix_give_bitwise_the_same,
  # dv_stored_first_gives_bitwise_the_same and diagonal_masks_per_block_give_bitwise_the_same,
  # run in `suite`)
  for t in mxfp8_causal_gqa_is_as_accurate_as_the_reference head_dim_64_is_as_accurate_as_the_reference \
    repeated_runs_are_bitwise_identical precision_options_and_no_hadamard_are_as_accurate_as_the_reference; do
    FLAMIA_BWD_DQ_STSM=1 timeout 90 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked" | sed "s/^/dq-stsm: /"
  done
  for m in dq-stsm-addr dq-stsm-order ds-stsm-row dv-first-rows mask-blocks-diag; do ONLY=$m T=$C/gpu_attention OUT=$O/mut timeout 220 bash bench/gpu_mutations.sh 2>&1 | grep -v "^$"; done
fi
if [ "$mode" = all ] || [ "$mode" = ab ]; then
  echo "=== FLAMIA_BWD_DQ_STSM=1 against the default"; date
  for r in 1 2; do
    for v in base dqstsm dvfirst maskblk; do
      e=(X=1); [ $v = dqstsm ] && e=(FLAMIA_BWD_DQ_STSM=1); [ $v = dvfirst ] && e=(FLAMIA_BWD_DV_FIRST=1)
      [ $v = maskblk ] && e=(FLAMIA_BWD_MASK_BLOCKS=1)
      echo "--- $v"
      if [ $v = maskblk ]; then
        # (the causal diagonal steps' per-block masks: short documents, where a step in 3-8 is one)
        env "${e[@]}" timeout 60 $C/flamia bench attention --workload 32x2048 --workload 64x1024 --workload 256x256 \
          --workload 8x8192 2>&1 | grep -E "^[0-9]"
        env "${e[@]}" timeout 60 $C/flamia bench attention --head-dim 64 --workload 32x2048 --workload 256x256 2>&1 | grep -E "^[0-9]"
        continue
      fi
      env "${e[@]}" timeout 150 $C/flamia bench attention 2>&1 | grep -E "^[0-9l]"
      [ $v = dvfirst ] && continue
      env "${e[@]}" timeout 60 $C/flamia bench attention --head-dim 64 --workload 1x65536 --workload 8x8192 \
        --workload 32x2048 --workload 256x256 2>&1 | grep -E "^[0-9]"
      echo "--- $v --causally-safe"
      env "${e[@]}" timeout 60 $C/flamia bench attention --causally-safe --workload 1x65536 --workload 16x4096 \
        --workload 256x256 2>&1 | grep -E "^[0-9]"
    done
  done
fi
if [ "$mode" = d64 ]; then
  echo "=== the d = 64 standing against the anchors"; date
  ANCHOR_HEAD_DIM=64 B=$C/flamia O=$O/va64 timeout 560 bash bench/vs-anchors.sh --head-dim 64 2>&1 | tail -16
fi
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s27-$mode.log"
