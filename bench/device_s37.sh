#!/bin/bash
# Prepared in session 36 (no device was lent then); run in session 38. Staged as
# device_bwd4.sh --stage, carried as .device-carry/z/bwd4.tgz.
#   a: the backward's CTA pairs' GPU tests, each under a timeout (a hang is their failure):
#      FLAMIA_BWD_PAIR=1 (kernel BWD_PAIR 1: clusters of two CTAs on adjacent key tiles, Q / dO
#      multicast) against the unpaired backward bit for bit, both walks; the long-document
#      accuracy test with each mode; then the default suite's repeatability and jitter tests
#      (unchanged kernels when the knob is unset).
#   e: FLAMIA_BWD_PAIR=2 (also the pair's dQ partials summed through DSMEM before one
#      reduce-add): against the CPU reference, repeatable, ordered, isolated, causal before the
#      block, both walks.
#   b: pairs off / 1 / 2, two rounds, at 1x65536 (every tile walks down), 4x16384, 16x4096,
#      64x1024 and 256x256 (walking up), d = 128, and 1x65536 and 16x4096 at d = 64, with the
#      SM clock after each loop; and mode 2 with FLAMIA_BWD_PAIR_STRICT=0 at 1x65536 and 16x4096.
#   c: the pairs' three GPU mutations (bench/gpu_mutations.sh 35-37): each must be caught.
#   (session 38 ran a, b, e, f; d's variants were measured through device_s38.sh h and FWD_EARLY_CF
#   was removed after it: staging them now gives the default kernels)
#   d: the forward's tile factors before S's wait (kernel FWD_EARLY_CF in softmax.cuh, in the tree
#      since session 37 with 0 the default; 2 also takes 2^-fe and O's change of units there):
#      stage with bench/stage_variant.sh
#        earlycf   -  softmax.cuh:FWD_EARLY_CF=1
#        earlycf2  -  softmax.cuh:FWD_EARLY_CF=2
#      accuracy and leakage tests on earlycf and earlycf2, then the default and the two, two
#      rounds, three workloads at d = 128 and one at d = 64 (forward ms and MHz; ~24 bench runs,
#      sized for one 600 s call).
#   f: session 37's dS exponents in three instructions (the default backward's block exponents and
#      row dS's both copies) and row dS's dQ codes without their re-packing (census, d = 128
#      interior step: default 1,013 -> 1,001 SASS, row dS 1,242 -> 1,175, --causally-safe 1,302 ->
#      1,239): the bitwise A/B test against session 36's sources, staged as cuda-s36
#        mkdir -p .device-carry/bwd4/cuda-s36 && git archive d12883c flamia-kernels/cuda \
#          | tar -x --strip-components=2 -C .device-carry/bwd4/cuda-s36
#      then the tree (embedded) against cuda-s36, two rounds: default, row dS alone and
#      --causally-safe (~16 bench runs, sized for one 600 s call).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s37.sh a|b|c|d|e|f}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  export FLAMIA_BWD_HANG_TRAP=1  # (a hang traps after ~4.5 s and prints where: BWD_HANG_TRAP)
  T="timeout 420 $C/gpu_attention --ignored --exact --test-threads=1"
  $T cta_pairs_give_bitwise_the_unpaired_backward 2>&1 | grep -E "^test |test result|panicked|differ|rror|hang" | head -20
  date
  for m in 1 2; do
    for up in 0 128; do
      FLAMIA_BWD_PAIR=$m FLAMIA_BWD_UP_TILES=$up timeout 120 $C/gpu_attention --ignored --exact --test-threads=1 \
        long_documents_gqa_are_as_accurate_as_the_reference 2>&1 | grep -E "^test |test result|panicked|rror" \
        | sed "s|^|pair $m, up to $up tiles up: |" | head -10
    done
  done
  timeout 200 $C/gpu_attention --ignored --test-threads=1 repeated_runs_are_bitwise_identical \
    dq_is_bitwise_the_same_whatever_order 2>&1 | grep -E "^test |test result|panicked" | head
  ;;
e)
  export FLAMIA_BWD_HANG_TRAP=1
  timeout 560 $C/gpu_attention --ignored --exact --test-threads=1 cta_pair_sums_are_accurate_repeatable_isolated_and_ordered \
    --nocapture 2>&1 | grep -E "^test |test result|panicked|differ|rror|exceeds|bitwise the unpaired|hang" | head -30
  ;;
b)
  # a pair mode that hangs or fails would spend this call in bench timeouts: one quick run of each
  # under the hang trap first, and only the modes that pass are timed
  modes=0
  for p in 1 2; do
    # (both walks: 1x32768's tiles walk down, 16x4096's up)
    if FLAMIA_BWD_PAIR=$p FLAMIA_BWD_HANG_TRAP=1 timeout 150 $C/flamia bench attention --workload 16x4096 \
        --workload 1x32768 > "$O/s37-b-smoke$p.log" 2>&1; then
      modes="$modes $p"
    else
      echo "pair $p: the smoke run failed (rc $?), not timed:"; tail -5 "$O/s37-b-smoke$p.log"
    fi
  done
  echo "modes timed: $modes"
  for r in 1 2; do
    for p in $modes; do
      bench_mhz "pair $p round $r" FLAMIA_BWD_PAIR=$p --workload 1x65536 --workload 4x16384 --workload 16x4096 \
        --workload 64x1024 --workload 256x256
      bench_mhz "pair $p round $r, d = 64" FLAMIA_BWD_PAIR=$p --head-dim 64 --workload 1x65536 --workload 16x4096
    done
    # mode 2's partial handed over at CTA scope (BWD_PAIR_STRICT 0, session 37) against the default
    case " $modes " in *" 2 "*)
      bench_mhz "pair 2 relaxed round $r" "FLAMIA_BWD_PAIR=2 FLAMIA_BWD_PAIR_STRICT=0" --workload 1x65536 --workload 16x4096 ;;
    esac
  done
  ;;
c)
  for m in bwd4-pair-upper-tile bwd4-pairsum-nowait bwd4-pairsum-self; do
    T=$C/gpu_attention ONLY=$m bash bench/gpu_mutations.sh
  done
  ;;
d)
  for v in cuda-earlycf cuda-earlycf2; do
    FLAMIA_CUDA_DIR=$C/$v timeout 200 $C/gpu_attention --ignored --test-threads=1 \
      mxfp8_causal_gqa_is_as_accurate_as_the_reference long_documents_gqa_are_as_accurate_as_the_reference \
      causal_leakage_has_the_reference_properties head_dim_64_is_as_accurate_as_the_reference 2>&1 \
      | grep -E "^test |test result|panicked" | sed "s|^|$v: |" | head
  done
  ab_dirs cuda-earlycf cuda-earlycf2 -- --workload 1x65536 --workload 16x4096 --workload 256x256
  ab_dirs cuda-earlycf cuda-earlycf2 -- --head-dim 64 --workload 1x65536
  ;;
f)
  FLAMIA_AB_CUDA_DIR=$C/cuda-s36 timeout 240 $C/gpu_attention --ignored --exact --test-threads=1 \
    kernel_sources_of_another_directory_give_bitwise_the_same 2>&1 | grep -E "^test |test result|panicked|differs|SKIPPED" | head
  ab_dirs cuda-s36 -- --workload 1x65536 --workload 16x4096 --workload 256x256
  ab_dirs cuda-s36 -- --precision row-ds-exponents --workload 1x65536 --workload 16x4096
  ab_dirs cuda-s36 -- --causally-safe --workload 1x65536 --workload 256x256
  ;;
*) echo "device_s37.sh: unknown mode '$mode' (a, b, c, d, e, f)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s37-$mode.log"
