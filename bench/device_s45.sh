#!/bin/bash
# Session 45's device calls. Two changes against session 44's scripts, both about a fresh machine
# spending most of a call compiling kernels (session 44: half the GPU suite did not finish in
# 480 s):
# - the tests run as several processes at once (device-bench.sh par_tests; the whole suite:
#   device_suite.sh all), each its own share of the test names with --test-threads=1: separate
#   CUDA contexts, which the GPU time-slices, so two persistent kernels never share the SMs (threads
#   of one process could, and could deadlock); NVRTC and the driver's compiler use the 16 cores.
# - the kernels' PTX cache is packed into $OUT/kcache.txz at the end and unpacked from
#   .device-carry/kc/kcache.txz when that is carried (device-bench.sh kcache_setup, kcache_pack):
#   copy the file from the reply's files_at there and carry .device-carry/kc beside .device-carry/z.
# Stage as bench/device_s44.sh says; run from the repo root on the device:
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s45.sh MODE
#   ef:    (call 1, on 39063dc's binaries) BWD_KV_EARLY's and BWD_BULK_ST's first version's bitwise
#          tests and mutations 45, 46, then their timings: the default, each knob and both, six
#          workloads, two rounds. BWD_KV_EARLY and mutation 45 were removed after it, and BULK_ST
#          rebuilt (mode b): on today's tree this mode no longer runs as it did
#   suite: the whole GPU suite (device_suite.sh all: gpu_attention in JOBS processes, gpu_quant,
#          bridge_cuda, model_cuda), each process's log in $OUT/suite-jK.log
#   b:     BWD_BULK_ST rebuilt as bulk tensor stores (session 45): its bitwise test and mutation
#          46 (two processes), then the A/B, six workloads at d = 128 and three at d = 64, two
#          rounds (call 4 ran it with the knob off by default: "-" then FLAMIA_BWD_BULK_ST=1; now
#          FLAMIA_BWD_BULK_ST=0 then the default)
#   n1:    (prepared for session 46) suite, then mutation 47 (bwd4-bulk-no-start-wait)
#   p2:    (prepared for session 46) FLAMIA_BWD_STAGES=2, and with FLAMIA_BWD_DQ_BUFS=2, against the
#          default at 256x256, 64x1024 and 32x2048, two rounds (~3 minutes)
#   cs:    (prepared for session 46) the nine workloads by default and with --causally-safe,
#          interleaved, two rounds: the precision options' cost on the new defaults (~4 minutes)
#   c:     the standing (vs-anchors.sh; carry .whl for cuDNN FP8)
#   p:     (prepared for session 46) where the short documents' backward spends its clocks on the
#          new defaults (BWD_BULK_ST at d = 128): the phases (BWD_PROF_PHASES) at 256x256 and
#          64x1024, then knock-outs against the default, two rounds: no K / V transposes at the
#          item's start (BWD_PROF_NOXPOSE: do phase 0's ~1,900 clocks per item belong to them?),
#          no dK/dV stores, no dQ reduces, the reduces unordered (BWD_PROF_NOSEM: is the -5% of
#          no reduces the semaphores' waits or the reduces' traffic?), and the reducers' own
#          clocks (BWD_PROF_REDUCER). Stage the variants after
#          device_bwd4.sh --stage:
#            for v in "phases BWD_PROF_PHASES=1" "noxpose BWD_PROF_NOXPOSE=1" "nostore BWD_PROF_NOSTORE=1" \
#                     "nored BWD_PROF_NORED=1" "nosem BWD_PROF_NOSEM=1" "redprof BWD_PROF_REDUCER=1"; do
#              set -- $v; bash bench/stage_variant.sh $1 - attn_bwd_v4.cu:$2; done
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s45.sh ef|b|p|p2|n1|cs|suite|c}
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
ef) echo "device_s45.sh ef: ran in call 1 on 39063dc's binaries (device_s44.sh e and f, the tests as"
    echo "parallel processes); BWD_KV_EARLY and mutation 45 are gone since"; exit 2 ;;
b)
  (par_tests 1 bulk-test $C/gpu_attention dk_dv_by_bulk_copies_give_bitwise_the_same) &
  p1=$!
  (ONLY=bwd4-bulk-dv-head T=$C/gpu_attention bash bench/gpu_mutations.sh) &
  p2=$!
  wait $p1 $p2
  date
  W=(--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 1x65536 --workload lognormal)
  W64=(--head-dim 64 --workload 256x256 --workload 64x1024 --workload 16x4096)
  for r in 1 2; do
    for e in FLAMIA_BWD_BULK_ST=0 -; do
      bench_mhz "bulk-st $e round $r" "$e" "${W[@]}"
      bench_mhz "bulk-st d=64 $e round $r" "$e" "${W64[@]}"
    done
  done
  ;;
p)
  for w in 256x256 64x1024; do
    prof_log phases cuda-phases $w "^bwd4 |phase" 12
    # the dQ reducers' clocks (BWD_PROF_REDUCER, CTAs 0-1): waiting for a partial, for the
    # semaphore's turn, for the TMA's read, for the reduce to land
    prof_log redprof cuda-redprof $w "^bwd4 reducer" 4
  done
  date
  ab_dirs cuda-noxpose cuda-nostore cuda-nored cuda-nosem -- --workload 256x256 --workload 64x1024
  ;;
suite) T=$C bash bench/device_suite.sh all ;;
p2)
  # (prepared for session 46) a ring stage traded for a second dQ partial buffer per warpgroup at
  # short documents (the 3-stage build has no room for it at d = 128): 2 stages alone, then with
  # two dQ buffers, against the default, two rounds (session 13's timers: ~300 clocks of dQ
  # buffer wait per step at 256x256)
  for r in 1 2; do
    for e in - FLAMIA_BWD_STAGES=2 "FLAMIA_BWD_STAGES=2 FLAMIA_BWD_DQ_BUFS=2"; do
      bench_mhz "stages/dq-bufs $e round $r" "$e" --workload 256x256 --workload 64x1024 --workload 32x2048
    done
  done
  ;;
cs)
  # (prepared for session 46) the precision options' cost on the new defaults: the nine
  # workloads by default and with --causally-safe, interleaved, two rounds (issue 13: <= 5%)
  for r in 1 2; do
    bench_mhz "default round $r" -
    bench_mhz "--causally-safe round $r" - --causally-safe
  done
  ;;
n1)
  # (prepared for session 46's first call) the whole suite on session 45's defaults, then
  # mutation 47 (the stress build's delayed dV boxes without the next item's wait)
  T=$C bash bench/device_suite.sh all
  ONLY=bwd4-bulk-no-start-wait T=$C/gpu_attention bash bench/gpu_mutations.sh
  ;;
c) B=$C/flamia bash bench/vs-anchors.sh ;;
*) echo "device_s45.sh: unknown mode '$mode' (ef, b, p, p2, n1, cs, suite or c)"; exit 2 ;;
esac
kcache_pack
date
} 2>&1 | tee "$O/s45-$mode.log"
