#!/bin/bash
# The device calls prepared in session 13 for the next one (docs/perf.md "Next"). Stage once, here:
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*     (38 MB)
#   bash bench/device_s14.sh --stage-extra   (var/timers, var/reducer: main's sources with one
#                                             define each; var/dqb2)
# then carry .device-carry/bwd4 and .device-carry/var (and .whl for PHASE=x) and run, chained
# (the machine goes back 30 s after a call):
#   (PHASE=q, q2, q3, the quantiser knock-outs run in session 14, went with those knock-outs:
#   docs/perf.md "Session 14" has the results, commit 5fe13cf the script and the defines)
#   PHASE=p bash bench/device_s14.sh   (~3.5 min) the backward's waits (BWD_PROF_TIMERS: the dQ
#                                      buffer wait apart from the dQ store) at 1x65536, 16x4096,
#                                      64x1024, 256x256; the reducer's (BWD_PROF_REDUCER, now
#                                      printed by a consumer thread at the end) at 16x4096, 256x256; ncu warp state of the default backward at
#                                      16x4096 (no-instruction stalls: the instruction cache
#                                      question session 13's BWD_CW_CONST loss raised)
#   PHASE=d bash bench/device_s14.sh   (~3.5 min) two dQ buffers per warpgroup at d = 64
#                                      (FLAMIA_BWD_DQ_BUFS=2: the dQ store need not wait for the
#                                      reducer's read of the previous partial; +16 KB), A/B on the
#                                      nine workloads twice, head_dim_64 tests with it. (At d = 128
#                                      it needs two stages: FLAMIA_BWD_STAGES=2, another A/B if the
#                                      timers of PHASE=p show the wait is large there.)
#   PHASE=t2 bash bench/device_s14.sh  (~4 min) branch dim-tiled (the dim-major copies tiled by 128
#                                      tokens, documents padded to 128 there; staged with
#                                      `bash bench/device_s14.sh --stage-tiled`, gzipped into
#                                      .device-carry/tiled: carry it beside bwd4): the new mutation
#                                      quant-dim-tail-short, gpu_quant and gpu_attention on the
#                                      branch's binaries
#   PHASE=ab2 bash bench/device_s14.sh (~6 min) the same call's A/B of main's binary (base) and the
#                                      branch's (tiled), two rounds, d = 128 and 64, nine workloads
#                                      (bench/ab_table.py on $OUT/ab2_<hd>.log, --col quant / train)
#   PHASE=x bash bench/device_s14.sh   (~6 min) bench/vs-anchors.sh at d = 128 with the cuDNN
#                                      frontend wheel: the landed tree against BF16 and cuDNN FP8
#                                      in one call (session 13 could only compare across calls)
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var; X=.device-carry/tiled
if [ "${1:-}" = "--stage-tiled" ]; then
  # the branch's release binary and GPU tests, built in its worktree, gzipped (the carry cap), and
  # its kernel sources and mutation script (run from here on the device)
  W=${TILED_WT:-/work/wt-fold}
  [ "$(git -C "$W" rev-parse --abbrev-ref HEAD)" = dim-tiled ] || { echo "$W is not on branch dim-tiled"; exit 2; }
  ( cd "$W" && cargo build --release -p flamia-trainer && cargo test --release --no-run -p flamia-kernels ) || exit 2
  rm -rf $X; mkdir -p $X/cuda $X/bench
  cp "$W/target/release/flamia" $X/
  for t in gpu_quant gpu_attention; do cp "$(ls -t "$W"/target/release/deps/$t-* | grep -v '\.d$' | head -1)" $X/$t; done
  strip $X/flamia $X/gpu_quant $X/gpu_attention && gzip -9 $X/flamia $X/gpu_quant $X/gpu_attention
  cp "$W"/flamia-kernels/cuda/*.cu "$W"/flamia-kernels/cuda/*.cuh $X/cuda/
  cp "$W"/bench/gpu_mutations.sh "$W"/bench/device-env.sh $X/bench/
  du -sh $X; exit 0
fi
if [ "${1:-}" = "--stage-extra" ]; then
  for p in timers:attn_bwd_v4.cu:"#define BWD_PROF_TIMERS 1" reducer:attn_bwd_v4.cu:"#define BWD_PROF_REDUCER 1"; do
    name=${p%%:*}; rest=${p#*:}; file=${rest%%:*}; def=${rest#*:}
    d=$V/$name; rm -rf $d; mkdir -p $d; cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $d/
    sed -i "1i $def" $d/$file
  done
  mkdir -p $V/dqb2 && echo FLAMIA_BWD_DQ_BUFS=2 > $V/dqb2/env
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-p}" in
  p)
    for w in 1x65536 16x4096 64x1024 256x256; do
      echo "=== timers $w"
      FLAMIA_CUDA_DIR=$V/timers timeout 120 $B bench attention --workload $w > "$O/t.log" 2>&1 || { echo "rc=$?"; tail -5 "$O/t.log"; }
      grep -E "^bwd4 prof" "$O/t.log" | tail -4; grep -E "^$w " "$O/t.log"
    done
    for w in 16x4096 256x256; do
      echo "=== reducer $w (BWD_PROF_REDUCER: its waits for a partial, its turn, the TMA read, the landing)"
      FLAMIA_CUDA_DIR=$V/reducer timeout 120 $B bench attention --workload $w > "$O/r.log" 2>&1 || { echo "rc=$?"; tail -5 "$O/r.log"; }
      grep -E "^bwd4 reducer" "$O/r.log" | tail -4; grep -E "^$w " "$O/r.log"
    done
    echo "=== ncu attn_bwd_v4 16x4096 warp state"
    # (the stall reasons per issued instruction; if a metric name is refused, the sections alone)
    M=no_instruction,long_scoreboard,short_scoreboard,barrier,wait,math_pipe_throttle,mio_throttle,branch_resolving
    M=$(echo $M | tr ',' '\n' | sed 's/.*/smsp__average_warps_issue_stalled_&_per_issue_active.ratio/' | paste -sd,)
    ncu_bwd() { timeout 150 $NCU --clock-control none -k attn_bwd_v4 --launch-skip 3 --launch-count 1 \
      --section WarpStateStats --section SchedulerStats "$@" $B bench attention --workload 16x4096; }
    ncu_bwd --metrics $M > "$O/ncu_bwd_warps.txt" 2>&1 || { echo "ncu rc=$? (metrics refused?): sections alone";
      ncu_bwd > "$O/ncu_bwd_warps.txt" 2>&1 || echo "ncu rc=$?"; }
    grep -E "issue_stalled|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|Eligible Warps" "$O/ncu_bwd_warps.txt" ;;
  d)
    VARS="dqb2" TEST_VARS="dqb2" TEST_FILTER=head_dim_64 REPS=2 OUT=$O WL="--head-dim 64" bash bench/device_ab.sh > /dev/null 2>&1
    grep -E "test result|panicked" $O/device_ab.log
    for col in bwd train; do python3 bench/ab_table.py $O/device_ab.log --col $col; done ;;
  t2|ab2)
    # the branch's binaries, unpacked beside the staged ones (gpu_mutations.sh finds gpu_quant
    # next to $T)
    U=/tmp/tiled; mkdir -p $U
    for f in flamia gpu_quant gpu_attention; do gzip -dc $X/$f.gz > $U/$f; chmod +x $U/$f; done
    if [ "$PHASE" = t2 ]; then
      echo "=== mutation quant-dim-tail-short (must be caught)"
      SRC=$X/cuda T=$U/gpu_attention ONLY=quant-dim-tail-short OUT=$O/mut bash $X/bench/gpu_mutations.sh
      echo "=== gpu_quant (tiled)"
      timeout 120 $U/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
      echo "=== gpu_attention (tiled)"
      timeout 300 $U/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    else
      for hd in 128 64; do
        for r in 1 2; do
          for v in base tiled; do
            echo "=== $v ($r)"
            bin=$B; [ $v = tiled ] && bin=$U/flamia
            timeout 150 $bin bench attention --head-dim $hd 2>&1 | grep -E "^[0-9a-z+]+ +[0-9]+ \|"
          done
        done > "$O/ab2_$hd.log"
        for col in quant fwd bwd train; do python3 bench/ab_table.py "$O/ab2_$hd.log" --col $col; done
      done
    fi ;;
  x)
    B=$B O=$O bash bench/vs-anchors.sh ;;
  *) echo "PHASE is p, d, t2, ab2 or x"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s14_${PHASE:-p}.log"
