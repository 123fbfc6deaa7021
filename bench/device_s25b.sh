#!/bin/bash
# Session 25's second call (~6-7 minutes, H200): the backward's K/V tiles prefetched into L2 at the
# item's claim (BWD_KV_PREFETCH) and its outputs as streaming stores (BWD_STORE_CS), both on in
# the binary (base): four GPU tests on base, then an A/B against pf0 (prefetch off), cs0
# (streaming stores off) at short and mid lengths, and against old (both off, session 24's
# sources) at 1x65536 and at d = 64; then the backward's phases and producer clocks
# (BWD_PROF_PHASES on base's sources, CTAs 0-1) at 256x256, 32x2048 and 1x65536.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage pf0=ab-s25-pf0 cs0=ab-s25-cs0 old=e34bf32, then mkdir .device-carry/var/prof with base's kernel sources and
#   `#define BWD_PROF_PHASES 1` prepended to attn_bwd_v4.cu (the session's commands); carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== GPU tests on base"; date
for t in repeated_runs_are_bitwise_identical walking_up_is_accurate_repeatable_and_ordered \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference head_dim_64_is_as_accurate_as_the_reference; do
  timeout 60 $C/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked"
done
echo "=== A/B"; date
VARS="pf0 cs0" TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 8192+224x256" OUT=$O/ab timeout 280 bash bench/device_ab.sh 2>&1 | tail -1
VARS=old TESTS=0 WL="--workload 1x65536" OUT=$O/ab1 timeout 90 bash bench/device_ab.sh 2>&1 | tail -1
VARS=old TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 32x2048" OUT=$O/ab64 timeout 70 bash bench/device_ab.sh 2>&1 | tail -1
echo "=== backward phases (prof: base with BWD_PROF_PHASES; the last launch's lines)"; date
for wl in 256x256 32x2048 1x65536; do
  echo "--- $wl"
  FLAMIA_CUDA_DIR=.device-carry/var/prof timeout 40 $C/flamia bench attention --workload $wl 2>&1 | grep -E "bwd4 (phases|producer)" | tail -6
done
date
} 2>&1 | tee "$O/s25b.log"
