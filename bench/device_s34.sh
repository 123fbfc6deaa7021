#!/bin/bash
# Session 34 (H200; staged as device_bwd4.sh --stage plus kernel-source variants under $C/cuda-*,
# carried as .device-carry/z/bwd4.tgz).
#   a: gpu_quant on the flush without selects (quant.cu: a full chunk's lines stored from one
#      pointer stepped per pass, the hole test only on chunks with an empty slot); the nine
#      workloads with the new same-call device copy reference (`device copy before/after`, the
#      quantiser's share of it); then the quantiser A/B, old sources (FLAMIA_CUDA_DIR=$C/cuda-old)
#      against the new, two rounds, on 1x65536, 16x4096, 64x1024, 256x256 and d = 64 at 64x1024
#      and 16x4096.
#   b: eight Q/K/V quantiser CTAs per SM instead of seven ($C/cuda-c8: QUANT_CTAS_PER_SM 8, 64
#      registers, 36 bytes of spills) against the default, two rounds, the same workloads.
#   c: the forward's product-phase turns (FLAMIA_FWD_TURNS=2: each consumer warpgroup holds the
#      turn from its PV through the next tile's S issue, so the two softmaxes alternate): the
#      bitwise test (turns 0 / 1 / 2, both builds), then default against TURNS=2, two rounds,
#      the same workloads.
#   d: part of the interior tiles' exp2 on the FMA pipe (softmax.cuh FWD_POLY: $C/cuda-poly8 and
#      $C/cuda-poly16, 8 or 16 of a thread's 64 scores per tile): four accuracy / repeatability
#      tests on poly16's sources, then the forward against the default, two rounds.
#   e: the landed tree's kernel sources ($C/cuda-final, FLAMIA_CUDA_DIR: the binary of call 5
#      embeds the sources before cursor_next / cursor_next_dyn shared next_slot): gpu_quant, the
#      nine workloads, and the nine with --causally-safe (the precision options' cost today).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s34.sh a|b|c|d|e}
W4=(--workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256)
ab_env() {  # ab_env ENV: two rounds, ENV against the default
  local r
  for r in 1 2; do
    run_bench "$1 round $r" "$1" "${W4[@]}"
    run_bench "default round $r" - "${W4[@]}"
    run_bench "d=64 $1 round $r" "$1" --head-dim 64 --workload 64x1024 --workload 16x4096
    run_bench "d=64 default round $r" - --head-dim 64 --workload 64x1024 --workload 16x4096
  done
}
ab_src() { ab_env "FLAMIA_CUDA_DIR=$C/$1"; }  # ab_src DIR: the sources in DIR against the embedded ones
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  timeout 150 $C/flamia bench attention 2>&1 | grep -vE "^kernel "
  ab_src cuda-old
  ;;
b)
  ab_src cuda-c8
  ;;
c)
  timeout 200 $C/gpu_attention --ignored --exact forward_turns_give_bitwise_the_same 2>&1 \
    | grep -E "^test |test result|panicked|differ"
  ab_env FLAMIA_FWD_TURNS=2
  ;;
d)
  FLAMIA_CUDA_DIR=$C/cuda-poly16 timeout 200 $C/gpu_attention --ignored --exact --test-threads=1 \
    mxfp8_causal_gqa_is_as_accurate_as_the_reference long_documents_gqa_are_as_accurate_as_the_reference \
    repeated_runs_are_bitwise_identical head_dim_64_is_as_accurate_as_the_reference 2>&1 \
    | grep -E "^test |test result|panicked|exceeds|differ"
  W3=(--workload 1x65536 --workload 16x4096 --workload 64x1024)
  for r in 1 2; do
    for v in - FLAMIA_CUDA_DIR=$C/cuda-poly8 FLAMIA_CUDA_DIR=$C/cuda-poly16; do
      run_bench "$v round $r" "$v" "${W3[@]}"
      run_bench "d=64 $v round $r" "$v" --head-dim 64 --workload 16x4096
    done
  done
  ;;
e)
  export FLAMIA_CUDA_DIR=$C/cuda-final
  timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  timeout 150 $C/flamia bench attention 2>&1 | grep -vE "^kernel "
  timeout 150 $C/flamia bench attention --causally-safe 2>&1 | grep -E "^[0-9]|^lognormal|quantiser:"
  ;;
*) echo "device_s34.sh: unknown mode '$mode' (a, b, c, d, e)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s34-$mode.log"
