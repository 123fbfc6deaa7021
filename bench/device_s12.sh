#!/bin/bash
# The device calls prepared in session 11 for the next one (docs/perf.md "Next"). Stage once, here,
# on main (the upward walk is in main behind FLAMIA_BWD_UP_TILES, default off; the d = 64 producer
# fold is branch bwd-fold64's kernel sources):
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*    (38 MB: leaves room for .whl)
#   bash bench/device_ab.sh --stage up16=@FLAMIA_BWD_UP_TILES=16 up64=@FLAMIA_BWD_UP_TILES=64 \
#     upall=@FLAMIA_BWD_UP_TILES=100000 fold=bwd-fold64
#   bash bench/device_s12.sh --stage-prof     (adds var/timers and var/reducer: main's sources
#                                              with BWD_PROF_TIMERS / BWD_PROF_REDUCER)
# then carry .device-carry/bwd4 and .device-carry/var and run, one call each:
#   PHASE=up bash bench/device_s12.sh     the upward walk: gpu_attention with every causal document
#                                         walking up (upall: all accuracy, leakage, isolation,
#                                         repeatability tests on it) and its own test; then base /
#                                         up16 / up64 / upall on the nine workloads, twice (~8 min)
#   PHASE=prof bash bench/device_s12.sh   where mid-length documents lose (16x4096: 300 TFLOP/s
#                                         against 477 at 1x65536, session 11): the consumers'
#                                         waits (BWD_PROF_TIMERS) and the dQ reducers' (semaphore,
#                                         TMA read, landed; BWD_PROF_REDUCER) at 1x65536, 16x4096,
#                                         64x1024, down and up; first the mutation
#                                         bwd4-up-ascending-turn (must be caught: its one-CTA run
#                                         hangs until the 120 s timeout) (~4 min)
#   PHASE=d64 bash bench/device_s12.sh    d = 64: the producer-side fold (fold) and upall against
#                                         base, the head_dim_64 tests on fold (~4 min)
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage-prof" ]; then
  for p in timers:BWD_PROF_TIMERS reducer:BWD_PROF_REDUCER; do
    d=$V/${p%%:*}; rm -rf $d; mkdir -p $d
    cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
    sed -i "1i #define ${p#*:} 1" $d/attn_bwd_v4.cu
  done
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-up}" in
  up)
    echo "=== gpu_attention, its own walking-up test"
    timeout 200 $C/gpu_attention --ignored --test-threads=1 walking_up 2>&1 | grep -E "test result|panicked|FAILED"
    VARS="up16 up64 upall" TEST_VARS="upall" REPS=2 OUT=$O WL="--head-dim 128" bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  prof)
    echo "=== bench/gpu_mutations.sh bwd4-up-ascending-turn (must be caught: the one-CTA run hangs)"
    ONLY=bwd4-up-ascending-turn OUT=$O/mut bash bench/gpu_mutations.sh
    for v in timers reducer; do
      for up in 0 100000; do
        for w in 1x65536 16x4096 64x1024; do
          echo "=== $v up=$up $w"
          FLAMIA_BWD_UP_TILES=$up FLAMIA_CUDA_DIR=$V/$v timeout 120 $B bench attention --workload $w > "$O/p.log" 2>&1 || echo "rc=$?"
          grep -E "^bwd4 " "$O/p.log" | tail -4; grep -E "^$w " "$O/p.log"
        done
      done
    done ;;
  d64)
    VARS="fold upall" TEST_VARS="fold" TEST_FILTER=head_dim_64 REPS=2 OUT=$O WL="--head-dim 64" bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  *) echo "PHASE is up, prof or d64"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s12_${PHASE:-up}.log"
