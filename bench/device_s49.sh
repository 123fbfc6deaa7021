#!/bin/bash
# Session 49's device calls. Carry .device-carry/s49 and .device-carry/kc (the PTX cache).
# .device-carry/s49/s49.txz holds flamia (the tree's release build, stripped) and old/flamia
# (session 43's binary, as in .device-carry/z) and gpu_quant (the tree's test binary); it is
# unpacked into .device-carry/s49 here; a carried .device-carry/s50 (flamia.xz, tests.txz: session
# 50's final tree) goes over it.
#   l: the lean tails (make_lean48: today's sources without item_next and the third tail)
#      beside today's default and session 43's binary, LEAN_ROUNDS (default 4) rounds at
#      1x65536 and 2x32768 (call 1 of session 49: -2.4% cycles at 1x65536 in two rounds, within
#      the default's own spread; with the lean tails in the source, the default against
#      session 43's binary)
#   c: the per-SM ceiling of bulk copies (FLAMIA_BENCH_SMCOPY: bench.cu's sm_copy on k SMs,
#      the Q/K/V quantiser's bytes in and out at 256x256) for k = SMCOPY_KS (default
#      8,16,32,48,132) and 4, 8 and 12 stages of 16 KB: can a quantiser on ~32 SMs keep up?
#   a: the standing (bench/vs-anchors.sh: ours, the BF16 anchors, cuDNN FP8 where .whl is
#      carried too, ours again; ~8-9 minutes) on the staged binary: for an H200, which has not
#      run since session 46
#   w: a warm-up before a: flamia bench attention on the nine, so the PTX cache holds the
#      tree's kernels (vs-anchors.sh gives each of its runs 100 s; session 50)
#   s: the whole GPU suite on the tree (device_suite.sh all: gpu_attention in JOBS processes,
#      gpu_quant, bridge_cuda, model_cuda; s49.txz then holds those test binaries too), then the
#      default against session 43's binary, two rounds at 1x65536, 16x4096 and 64x1024
#   t: the whole GPU suite alone (s without the rounds; session 50: the test binaries of
#      .device-carry/s50/tests.txz, the tree after the beside path's removal)
#   (b, the quantiser beside the forward, went with that path in session 50)
set -u
C=.device-carry/s49
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; export OUT=$O
mode=${1:?usage: device_s49.sh l|s|t|c|a|w}
tar -C $C -xJf $C/s49.txz || { echo "device_s49.sh: $C/s49.txz did not unpack"; exit 1; }
if [ -f .device-carry/s50/flamia.xz ]; then # a newer flamia carried beside (session 50)
  xz -dc .device-carry/s50/flamia.xz > $C/flamia && chmod +x $C/flamia && echo "flamia from .device-carry/s50"
fi
if [ -f .device-carry/s50/tests.txz ]; then # and newer test binaries (gpu_attention, gpu_quant, ...)
  tar -C $C -xJf .device-carry/s50/tests.txz && echo "test binaries from .device-carry/s50"
fi
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
l) ;;
t) T=$C JOBS=${JOBS:-6} bash "$(dirname "$0")/device_suite.sh" all ;;
s) T=$C JOBS=${JOBS:-6} bash "$(dirname "$0")/device_suite.sh" all
   ROUNDS=2 rounds_vs_old final - old -- --workload 1x65536 --workload 16x4096 --workload 64x1024 ;;
c) bench_mhz "sm_copy" "FLAMIA_BENCH_SMCOPY=${SMCOPY_KS:-8,16,32,48,132} FLAMIA_BENCH_SMCOPY_STAGES=4,8,12" \
     --workload 256x256 ;;
a) B=$C/flamia bash "$(dirname "$0")/vs-anchors.sh" ;;
w) echo "=== warm-up: flamia bench attention on the nine (compiles what the PTX cache lacks)"
   timeout 400 $C/flamia bench attention > "$O/warm.log" 2>&1; echo "rc $?"
   grep -E "^[0-9]|^lognormal|^workload" "$O/warm.log" ;;
*) echo "device_s49.sh: unknown mode '$mode' (l, s, t, c, a, w)"; exit 2 ;;
esac
if [ "$mode" = l ]; then
  vs=(-)
  L48=$(make_lean48 "$C/cuda-lean48")
  [ -n "$L48" ] && vs+=("FLAMIA_CUDA_DIR=$L48")
  vs+=(old)
  ROUNDS=${LEAN_ROUNDS:-4} rounds_vs_old lean "${vs[@]}" -- --workload 1x65536 --workload 2x32768
fi
kcache_pack
date
} 2>&1 | tee "$O/s49-$mode.log"
