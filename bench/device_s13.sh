#!/bin/bash
# The device calls prepared in session 12 for the next one (docs/perf.md "Next"). Stage once, here,
# on main (the late claim and the upward walk for documents of up to 8,192 tokens are main's
# defaults since session 12):
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*     (38 MB)
#   bash bench/device_ab.sh --stage fold=bwd-fold64b
#   bash bench/device_s13.sh --stage-extra     (var/cf, var/walk1, var/wfold, var/foldcf,
#                                               var/phases, var/reducer, var/q_*: main's or
#                                               bwd-fold64b's sources with one define each)
# then carry .device-carry/bwd4 and .device-carry/var and run, one call each, chained (the machine
# goes back 30 s after a call; all four ~25 min with the cold start, inside the 30):
#   PHASE=t bash bench/device_s13.sh   tests first (~6.5 min): the mutations bwd4-unordered-dq
#                                      (session 12 saw it pass once the tests' 8,192-token document
#                                      walked up; the tests now run both walks: must be caught),
#                                      bwd4-warpfold-factor, bwd4-dq-store-second, quant-rows-no-tail
#                                      (new); then
#                                      the whole gpu_attention suite on main's sources (with the
#                                      new first_dq_partials_stored_... test) and on cwcwf (the warp
#                                      fold and the per-warpgroup consumers together: both new code
#                                      paths in one run)
#   PHASE=a bash bench/device_s13.sh   d = 128 A/B (~6 min): base / cf / walk1 / wfold / dqstore / cwc / cwcwf
#                                      on the nine workloads, twice. cf = BWD_CONSTS_FIRST 1 (the
#                                      producer's per-query loads before the slot wait); wfold =
#                                      BWD_WARP_FOLD 1 (the key factors folded once per warp in
#                                      interior steps: 1,278 -> 1,247 SASS per step; the walk-up
#                                      build's interior loop gets 2 LDL + 2 STL, the other none);
#                                      walk1 = the kernel built with BWD_WALK_UP 1 even where no
#                                      tile walks up (if it equals base at 1x65536 and 4x16384,
#                                      the #else copy of the downward loops in attn_bwd_v4.cu can
#                                      go); dqstore = FLAMIA_BWD_DQ_STORE=1 (no dQ accumulator
#                                      memset: padded rows, each query tile's first partial stored);
#                                      cwc = BWD_CW_CONST + FWD_CW_CONST (the consumers inlined per
#                                      warpgroup, descriptors in uniform registers: backward 1,278
#                                      -> 1,184 SASS per interior step with 3 LDL of invariants,
#                                      forward 633 -> 606 per key tile; d = 64 backward 1,040 ->
#                                      941, no spills); cwcwf = cwc + the warp fold (1,164)
#   PHASE=b bash bench/device_s13.sh   d = 64 (~7.5 min): base / cf / fold / foldcf / dqstore / cwc / foldcwc (fold =
#                                      BWD_PRODUCER_FOLD on top of the late claim and the walk,
#                                      branch bwd-fold64b; session 12 measured it -3.3% at 1x65536
#                                      and +12..16% at mid lengths walking down); the whole
#                                      gpu_attention suite on cf, head_dim_64 tests on fold and
#                                      foldcwc (fold + BWD_CW_CONST: 1,040 -> 878 SASS per interior
#                                      step at d = 64, no spills)
#   PHASE=c bash bench/device_s13.sh   where the per-item time goes (~5 min): BWD_PROF_PHASES at
#                                      1x65536, 16x4096, 64x1024, 256x256 (session 12's timers
#                                      imply ~18,000 clocks per item against ~5,700 per step, i.e.
#                                      9% of 16x4096 and ~30% of 64x1024); the reducer's waits
#                                      (BWD_PROF_REDUCER, which failed with rc 1 in session 12:
#                                      its log's tail is kept this time); the Q/K/V quantiser's
#                                      knock-outs (no dim-major copy, no token-major stores, no
#                                      rotation, no block barrier: where its 55% of the copy
#                                      bandwidth goes) and the row-per-lane quantiser
#                                      (FLAMIA_QUANT_ROWS=1, quant_e4m3_rows: one warp per item, no
#                                      shuffle stages or CTA barrier; gpu_quant first); the forward's waits per item and per key
#                                      tile (FWD_PROF_TIMERS) at 1x65536, 64x1024, 256x256 (its
#                                      256x256 forward is even with cuDNN's BF16); ncu DRAM/L2 at
#                                      64x1024
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage-extra" ]; then
  [ -d $V/fold ] || { echo "stage fold with: bash bench/device_ab.sh --stage fold=bwd-fold64b"; exit 2; }
  # the branch must be main's kernels but for its one define (the host's parameter structs must
  # match): merge main into it when main's kernels move
  n=$(git diff main bwd-fold64b -- flamia-kernels/cuda flamia-kernels/src | grep -cE '^[-+][^-+]')
  [ "$n" = 2 ] || { echo "bwd-fold64b differs from main's kernels in $n lines (2 expected): merge main into it"; exit 2; }
  for p in cf:main:"#define BWD_CONSTS_FIRST 1" foldcf:fold:"#define BWD_CONSTS_FIRST 1" \
           foldcwc:fold:"#define BWD_CW_CONST 1" \
           wfold:main:"#define BWD_WARP_FOLD 1" \
           phases:main:"#define BWD_PROF_PHASES 1" reducer:main:"#define BWD_PROF_REDUCER 1"; do
    name=${p%%:*}; rest=${p#*:}; from=${rest%%:*}; def=${rest#*:}
    d=$V/$name; rm -rf $d; mkdir -p $d
    if [ "$from" = main ]; then cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/; else cp $V/$from/* $d/; fi
    sed -i "1i $def" $d/attn_bwd_v4.cu
  done
  for k in NODIM NOTOK NOHAD NOBAR; do
    d=$V/q_$(echo $k | tr A-Z a-z); rm -rf $d; mkdir -p $d; cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
    sed -i "1i #define QUANT_PROF_$k 1" $d/quant.cu
  done
  for name in cwc cwcwf; do  # the consumers inlined per warpgroup (BWD_CW_CONST, FWD_CW_CONST), + warp fold
    d=$V/$name; rm -rf $d; mkdir -p $d; cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
    sed -i "1i #define BWD_CW_CONST 1" $d/attn_bwd_v4.cu
    sed -i "1i #define FWD_CW_CONST 1" $d/attn_fwd_v4.cu
    [ $name = cwcwf ] && sed -i "1i #define BWD_WARP_FOLD 1" $d/attn_bwd_v4.cu
  done
  d=$V/fwdprof; rm -rf $d; mkdir -p $d; cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
  sed -i "1i #define FWD_PROF_TIMERS 1" $d/attn_fwd_v4.cu
  d=$V/dqstore; rm -rf $d; mkdir -p $d; echo FLAMIA_BWD_DQ_STORE=1 > $d/env
  d=$V/walk1; rm -rf $d; mkdir -p $d; cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
  sed -i 's/^#define BWD_WALK_UP 0$/#define BWD_WALK_UP 1/' $d/attn_bwd_v4.cu
  cmp -s $d/attn_bwd_v4.cu flamia-kernels/cuda/attn_bwd_v4.cu && { echo "walk1: pattern not found"; exit 2; }
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-t}" in
  t)
    for m in bwd4-unordered-dq bwd4-warpfold-factor bwd4-dq-store-second quant-rows-no-tail; do
      echo "=== bench/gpu_mutations.sh $m (must be caught)"
      ONLY=$m OUT=$O/mut bash bench/gpu_mutations.sh
    done
    for v in base cwcwf; do
      echo "=== gpu_attention on $v"
      ( [ $v = base ] || export FLAMIA_CUDA_DIR=$V/$v; timeout 280 $C/gpu_attention --ignored --test-threads=1 2>&1 \
        | grep -E "test result|panicked|FAILED|zeros of the other sign" )
    done ;;
  a)
    VARS="cf walk1 wfold dqstore cwc cwcwf" TESTS=0 REPS=2 OUT=$O WL="--head-dim 128" bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log --col fwd
    python3 bench/ab_table.py $O/device_ab.log; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  b)
    echo "=== gpu_attention on cf"
    FLAMIA_CUDA_DIR=$V/cf timeout 280 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    VARS="cf fold foldcf dqstore fwdcw" TEST_VARS="fold fwdcw" TEST_FILTER=head_dim_64 REPS=2 OUT=$O WL="--head-dim 64" \
      bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log --col fwd
    python3 bench/ab_table.py $O/device_ab.log; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  c)
    for w in 1x65536 16x4096 64x1024 256x256; do
      echo "=== phases $w"
      FLAMIA_CUDA_DIR=$V/phases timeout 120 $B bench attention --workload $w > "$O/p.log" 2>&1 || echo "rc=$?"
      grep -E "^bwd4 phases" "$O/p.log" | tail -4; grep -E "^$w " "$O/p.log"
    done
    # the Q/K/V quantiser's knock-outs (quant.cu QUANT_PROF_*: timing only): what the dim-major
    # copy, the token-major stores, the rotation and the block-amax barrier each cost
    # and the row-per-lane quantiser (FLAMIA_QUANT_ROWS=1: quant_e4m3_rows), its bytes first
    echo "=== gpu_quant (with the_row_per_lane_quantiser_is_bitwise_the_cpu_reference)"
    timeout 120 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    for v in base q_nodim q_notok q_nohad q_nobar rows base rows; do
      echo "=== quantiser $v"
      ( case $v in base) ;; rows) export FLAMIA_QUANT_ROWS=1 ;; *) export FLAMIA_CUDA_DIR=$V/$v ;; esac
        timeout 120 $B bench attention --workload 1x65536 --workload 64x1024 2>&1 | grep -E "^1x65536|^64x1024" )
    done
    echo "=== quantiser rows, d = 64"
    for v in base rows; do
      ( [ $v = rows ] && export FLAMIA_QUANT_ROWS=1
        timeout 120 $B bench attention --head-dim 64 --workload 1x65536 2>&1 | grep -E "^1x65536" | sed "s/^/$v /" )
    done
    for w in 1x65536 64x1024 256x256; do
      echo "=== forward timers $w"
      FLAMIA_CUDA_DIR=$V/fwdprof timeout 120 $B bench attention --workload $w > "$O/f.log" 2>&1 || echo "rc=$?"
      grep -E "^fwd4 prof" "$O/f.log" | tail -4; grep -E "^$w " "$O/f.log"
    done
    echo "=== reducer 16x4096"
    FLAMIA_CUDA_DIR=$V/reducer timeout 120 $B bench attention --workload 16x4096 > "$O/reducer.log" 2>&1 || echo "rc=$?"
    grep -E "^bwd4 reducer" "$O/reducer.log" | tail -4; grep -E "^16x4096 " "$O/reducer.log" || tail -15 "$O/reducer.log"
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    echo "=== ncu attn_bwd_v4 64x1024"
    timeout 120 $NCU --clock-control none \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
      -k attn_bwd_v4 --launch-skip 3 --launch-count 1 $B bench attention --workload 64x1024 2>&1 \
      | grep -E "dram__|lts__|gpu__time" || echo "ncu rc=$?" ;;
  v)
    # session 13, after landing (dQ first store, producer fold at d = 64, the warp fold, consts-first,
    # per-warpgroup backward consumers and the row-per-lane quantiser removed): the mutations of
    # the changed tests, the suites on the new defaults, the per-item phases, the quantiser's
    # memory behaviour with and without its dim-major copy, and the new defaults' timings
    for m in bwd4-unordered-dq bwd4-prodfold-factor bwd4-dq-store-second; do
      echo "=== bench/gpu_mutations.sh $m (must be caught)"
      ONLY=$m OUT=$O/mut bash bench/gpu_mutations.sh
    done
    echo "=== gpu_attention"
    timeout 280 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|zeros of the other sign"
    echo "=== gpu_quant"
    timeout 120 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    for hd in 128 64; do
      echo "=== bench d = $hd"
      timeout 200 $B bench attention --head-dim $hd 2>&1 | grep -E "^[0-9a-z+]+ +[0-9]+ \|"
    done
    for w in 1x65536 16x4096 64x1024 256x256; do
      echo "=== phases $w"
      FLAMIA_CUDA_DIR=$V/phases timeout 120 $B bench attention --workload $w > "$O/p.log" 2>&1 || { echo "rc=$?"; tail -5 "$O/p.log"; }
      grep -E "^bwd4 phases" "$O/p.log" | tail -4; grep -E "^$w " "$O/p.log"
    done
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
    for v in base q_nodim; do
      echo "=== ncu quant_e4m3 $v 1x65536"
      ( [ $v = base ] || export FLAMIA_CUDA_DIR=$V/$v
        timeout 150 $NCU --clock-control none -k quant_e4m3 --launch-skip 2 --launch-count 2 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy \
          --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum \
          $B bench attention --workload 1x65536 > "$O/ncu_quant_$v.txt" 2>&1 || echo "ncu rc=$?" )
      grep -E "quant_e4m3|dram__bytes|lts__t_sectors_op|Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles Per Issued" "$O/ncu_quant_$v.txt" | head -40
    done ;;
  w)
    # the forward's consumer copies chosen by the plan (fwd_cw_const: d = 128, 16+ key tiles per
    # query tile on average): its bitwise test, the whole suite (the long test documents now run
    # them), and the A/B against FLAMIA_FWD_CW=0 (var/fwdcw0/env) on the nine workloads
    echo "=== gpu_attention"
    timeout 280 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "^test .*forward_consumer|test result|panicked|FAILED"
    VARS="fwdcw0" TESTS=0 REPS=2 OUT=$O WL="--head-dim 128" bash bench/device_ab.sh > /dev/null 2>&1
    python3 bench/ab_table.py $O/device_ab.log --col fwd; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  *) echo "PHASE is t, a, b, c, v or w"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s13_${PHASE:-t}.log"
