#!/bin/bash
# Session 32 (prepared in session 31; H200; staged as device_bwd4.sh --stage, carried as
# .device-carry/z/bwd4.tgz).
#   a: (run in session 32, call 1; QUANT_LEAN is removed since, commit 8202179 has it)
#      the quantiser's lean chunk bookkeeping (QUANT_LEAN, FLAMIA_QUANT_LEAN=1; the same bytes by
#      construction, ~150 SASS fewer in the item loop at d = 128): gpu_quant with it (every byte
#      against the CPU reference), its two mutations (quant-lean-hole, quant-lean-next: each must
#      be caught), three contract tests with it, then A/B against the default, two rounds, d = 128
#      on the nine and d = 64 on five (~4 minutes). If the quantiser gains, turn it on
#      (quant_lean in src/gpu/quant.rs) and rerun gpu_quant without the knob. Then the forward's
#      four-head groups at d = 128 (FLAMIA_FWD_HEAD_GROUP=4: lognormal's forward -5% in session
#      29, 16x4096 / 4x16384 +1..+4%, the rest unmeasured; now with the half tiles) against the
#      default on the five workloads of the build without the consumer copies, two rounds; and
#      the consumer copies' threshold again now that only the other build has the half tiles
#      (FLAMIA_FWD_CW=0 at 16x4096 and 8x8192, the two workloads nearest it, two rounds).
#   b: the quantiser's L2 prefetch of the block after next (QUANT_L2PF, FLAMIA_QUANT_L2PF=1; the
#      same bytes): gpu_quant with it, then A/B against the default, two rounds, d = 128 on the
#      nine and d = 64 on five; then the defaults checked again on four workloads (1x65536,
#      16x4096, 64x1024, 256x256), each knob against the default in two rounds: the cp.async
#      staging (QUANT_ASYNC) and plain code stores (QUANT_STCS=0), forward ring depth 3 and 5,
#      backward ring depth 2, two dQ buffers, no PDL, the step factors after the K/V slot
#      (BWD_EARLY_FACTORS=0); and at 1x65536 / 4x16384 the upward walk (BWD_UP_TILES=512) and the
#      dead-step skip (~4 minutes).
#   c: the backward's upward walk for documents of up to 16,384 tokens (FLAMIA_BWD_UP_TILES=128;
#      call b: 4x16384 backward -1.5%, call -2%) and 32,768 (=256), against the default (64
#      tiles), two rounds, on the workloads they change (4x16384, 2x32768, lognormal: one
#      14,975-token document), d = 128 and 64; the walk's GPU test with 128 (~3 minutes).
#   d: with the threshold at 128 (the default since call 3): the new GPU test of a document of
#      exactly that many key tiles, both walks, and its mutation (bwd4-up-stage: must be
#      caught), then the standing (bench/vs-anchors.sh with cuDNN FP8 when .whl is carried;
#      ~7 minutes).
#   e: the threshold test again (its bound set from call d: 1e-3) and its mutation; the training
#      call's host time at the short workloads (FLAMIA_BENCH_HOST=1: host enqueue per call and
#      the call queued back to back beside the table's synchronised figure; 256x256's training
#      call read 2.41 ms against 2.12 in the same call), three runs; then the walk's contract
#      tests on the new default (~4 minutes).
#   f: call e found 64x1024's training call 3.7-3.9 ms queued back to back against 3.19
#      synchronised, when it follows 32x2048 in the run (3.18 / 3.20 when it follows 256x256):
#      the same three workloads with and without programmatic dependent launch (FLAMIA_PDL=0),
#      two rounds (~1.5 minutes).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s32.sh a|b|c|d|e|f}
. "$(dirname "$0")/device-bench.sh"  # run_bench, D64, ab_both_dims, ab_rounds
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  echo "=== gpu_quant, FLAMIA_QUANT_LEAN=1"
  FLAMIA_QUANT_LEAN=1 timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  FLAMIA_QUANT_LEAN=1 T=$C/gpu_attention ONLY=quant-lean-hole bash bench/gpu_mutations.sh 2>&1 | tail -2
  FLAMIA_QUANT_LEAN=1 T=$C/gpu_attention ONLY=quant-lean-next bash bench/gpu_mutations.sh 2>&1 | tail -2
  echo "=== contract tests, FLAMIA_QUANT_LEAN=1"
  FLAMIA_QUANT_LEAN=1 timeout 150 $C/gpu_attention --ignored --exact --test-threads=1 documents_are_isolated_bitwise \
    repeated_runs_are_bitwise_identical head_dim_64_is_as_accurate_as_the_reference 2>&1 | grep -E "^test |test result|panicked"
  ab_both_dims FLAMIA_QUANT_LEAN=1
  SHORT=(--workload 32x2048 --workload 64x1024 --workload 256x256 --workload 8192+224x256 --workload lognormal)
  ab_rounds "d=128 short" FLAMIA_FWD_HEAD_GROUP=4 "${SHORT[@]}"
  ab_rounds "d=128 mid" FLAMIA_FWD_CW=0 --workload 16x4096 --workload 8x8192
  ;;
b)
  echo "=== gpu_quant, FLAMIA_QUANT_L2PF=1"
  FLAMIA_QUANT_L2PF=1 timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  FLAMIA_QUANT_L2PF=1 timeout 100 $C/gpu_attention --ignored --exact head_dim_64_is_as_accurate_as_the_reference \
    2>&1 | grep -E "^test |test result|panicked"
  ab_both_dims FLAMIA_QUANT_L2PF=1
  FOUR=(--workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256)
  for k in FLAMIA_QUANT_ASYNC=1 FLAMIA_QUANT_STCS=0 FLAMIA_FWD_STAGES=3 FLAMIA_FWD_STAGES=5 FLAMIA_BWD_STAGES=2 \
    FLAMIA_BWD_DQ_BUFS=2 FLAMIA_PDL=0 FLAMIA_BWD_EARLY_FACTORS=0; do
    ab_rounds "four" $k "${FOUR[@]}"
  done
  for k in FLAMIA_BWD_UP_TILES=512 FLAMIA_BWD_SKIP_DEAD=1; do
    ab_rounds "long" $k --workload 1x65536 --workload 4x16384
  done
  ;;
c)
  FLAMIA_BWD_UP_TILES=128 timeout 150 $C/gpu_attention --ignored --exact walking_up_is_accurate_repeatable_and_ordered \
    repeated_runs_are_bitwise_identical 2>&1 | grep -E "^test |test result|panicked"
  ab_rounds "d=128" FLAMIA_BWD_UP_TILES=128 --workload 4x16384 --workload 2x32768 --workload lognormal
  ab_rounds "d=128" FLAMIA_BWD_UP_TILES=256 --workload 2x32768 --workload 4x16384
  ab_rounds "d=64" FLAMIA_BWD_UP_TILES=128 --head-dim 64 --workload 4x16384 --workload 2x32768 --workload lognormal
  ab_rounds "d=128 gqa" FLAMIA_BWD_UP_TILES=128 --kv-heads 4 --workload 4x16384 --workload lognormal
  ;;
d)
  timeout 150 $C/gpu_attention --ignored --exact documents_at_the_walk_threshold_walking_up_agree_with_walking_down \
    2>&1 | grep -E "^test |test result|panicked|relative"
  T=$C/gpu_attention ONLY=bwd4-up-stage bash bench/gpu_mutations.sh 2>&1 | tail -1
  B=$C/flamia bash bench/vs-anchors.sh
  ;;
e)
  timeout 150 $C/gpu_attention --ignored --exact documents_at_the_walk_threshold_walking_up_agree_with_walking_down \
    2>&1 | grep -E "^test |test result|panicked|relative"
  T=$C/gpu_attention ONLY=bwd4-up-stage bash bench/gpu_mutations.sh 2>&1 | tail -1
  for r in 1 2 3; do
    run_bench "host $r" FLAMIA_BENCH_HOST=1 --workload 32x2048 --workload 64x1024 --workload 256x256
    run_bench "host $r, 256x256 first" FLAMIA_BENCH_HOST=1 --workload 256x256 --workload 64x1024
  done
  timeout 240 $C/gpu_attention --ignored --exact --test-threads=1 repeated_runs_are_bitwise_identical \
    dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in head_chunked_backward_is_bitwise_the_one_launch_backward \
    head_dim_64_is_bitwise_repeatable_whatever_the_reduce_order_and_chunking 2>&1 | grep -E "^test |test result|panicked"
  ;;
f)
  for r in 1 2; do
    for e in FLAMIA_BENCH_HOST=1 "FLAMIA_BENCH_HOST=1 FLAMIA_PDL=0"; do
      run_bench "$e round $r" "$e" --workload 32x2048 --workload 64x1024 --workload 256x256
    done
  done
  ;;
*) echo "device_s32.sh: unknown mode '$mode' (a|b|c|d|e|f)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s32-$mode.log"
