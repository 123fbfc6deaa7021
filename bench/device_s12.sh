#!/bin/bash
# The device calls prepared in session 11 for the next one (docs/perf.md "Next"). Stage once, here,
# on main (the upward walk is in main behind FLAMIA_BWD_UP_TILES, default off; the d = 64 producer
# fold is branch bwd-fold64's kernel sources):
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*    (38 MB: leaves room for .whl)
#   bash bench/device_ab.sh --stage late=bwd-lateclaim lateup=bwd-lateclaim lateup64=bwd-lateclaim \
#     fold=bwd-fold64
#   bash bench/device_s12.sh --stage-extra    (the walk-up environment of lateup / lateup64, and
#                                              var/timers, var/reducer, var/timers_late,
#                                              var/reducer_late: main's sources with
#                                              BWD_PROF_TIMERS / BWD_PROF_REDUCER, and
#                                              BWD_LATE_CLAIM for the _late ones)
# Branch bwd-lateclaim = main with BWD_LATE_CLAIM 1 (the producer claims the next item near the
# current one's end; bench/sched_model.py: the claim at the start is what makes the upward walk 2x
# slower, and costs the downward walk ~2% at 1x65536).
# then carry .device-carry/bwd4 and .device-carry/var and run, one call each:
#   PHASE=up bash bench/device_s12.sh     the late claim and the upward walk: gpu_attention on
#                                         late and on lateup (every causal document walking up:
#                                         all accuracy, leakage, isolation, repeatability tests on
#                                         it; the suite has the walk's own test); then base /
#                                         late / lateup / lateup64 on the nine workloads, twice
#                                         (~8-9 min: keep the call's limit at 600 s)
#   PHASE=prof bash bench/device_s12.sh   where mid-length documents lose (16x4096: 300 TFLOP/s
#                                         against 477 at 1x65536, session 11): the consumers'
#                                         waits (BWD_PROF_TIMERS) and the dQ reducers' (semaphore,
#                                         TMA read, landed; BWD_PROF_REDUCER) at 1x65536 and
#                                         16x4096, down and up, claims early and late; first the mutation
#                                         bwd4-up-ascending-turn (must be caught: its one-CTA run
#                                         hangs until the 120 s timeout); last an ncu DRAM/L2
#                                         count of one backward launch at 16x4096, down (early
#                                         claim) and up (late claim) (~5 min)
#   PHASE=d64 bash bench/device_s12.sh    d = 64: the producer-side fold (fold) and late against
#                                         base, the head_dim_64 tests on fold (~4 min)
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage-extra" ]; then
  [ -d $V/lateup ] && [ -d $V/lateup64 ] || { echo "stage late/lateup/lateup64 with device_ab.sh --stage first"; exit 2; }
  echo FLAMIA_BWD_UP_TILES=100000 > $V/lateup/env
  echo FLAMIA_BWD_UP_TILES=64 > $V/lateup64/env
  for p in timers:BWD_PROF_TIMERS reducer:BWD_PROF_REDUCER timers_late:BWD_PROF_TIMERS reducer_late:BWD_PROF_REDUCER; do
    d=$V/${p%%:*}; rm -rf $d; mkdir -p $d
    cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
    sed -i "1i #define ${p#*:} 1" $d/attn_bwd_v4.cu
    [ "${d%_late}" != "$d" ] && sed -i "1i #define BWD_LATE_CLAIM 1" $d/attn_bwd_v4.cu
  done
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-up}" in
  up)
    VARS="late lateup lateup64" TEST_VARS="late lateup" REPS=2 OUT=$O WL="--head-dim 128" bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  prof)
    echo "=== bench/gpu_mutations.sh bwd4-up-ascending-turn (must be caught: the one-CTA run hangs)"
    ONLY=bwd4-up-ascending-turn OUT=$O/mut bash bench/gpu_mutations.sh
    for v in timers reducer timers_late reducer_late; do
      for up in 0 100000; do
        for w in 1x65536 16x4096; do
          echo "=== $v up=$up $w"
          FLAMIA_BWD_UP_TILES=$up FLAMIA_CUDA_DIR=$V/$v timeout 120 $B bench attention --workload $w > "$O/p.log" 2>&1 || echo "rc=$?"
          grep -E "^bwd4 " "$O/p.log" | tail -4; grep -E "^$w " "$O/p.log"
        done
      done
    done
    # DRAM bytes and L2 hit rate of one backward launch at 16x4096 (session 6 counted 64x1024 only):
    # down with the early claim (today), up with the late claim (the candidate)
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    for v in "down 0 " "up 100000 late"; do
      set -- $v
      echo "=== ncu attn_bwd_v4 16x4096, walk $1"
      env FLAMIA_BWD_UP_TILES=$2 ${3:+FLAMIA_CUDA_DIR=$V/$3} timeout 120 $NCU --clock-control none \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
        -k attn_bwd_v4 --launch-skip 3 --launch-count 1 $B bench attention --workload 16x4096 2>&1 \
        | grep -E "dram__|lts__|gpu__time" || echo "ncu rc=$?"
    done ;;
  d64)
    VARS="fold late" TEST_VARS="fold" TEST_FILTER=head_dim_64 REPS=2 OUT=$O WL="--head-dim 64" bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  *) echo "PHASE is up, prof or d64"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s12_${PHASE:-up}.log"
