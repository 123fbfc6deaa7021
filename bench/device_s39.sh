#!/bin/bash
# Prepared in session 38 for the next device session (docs/perf.md "Next" 0). Stage from the repo
# root here:
#   rm -rf .device-carry/bwd4 .device-carry/z; bash bench/device_bwd4.sh --stage; strip .device-carry/bwd4/*
#   rm -f .device-carry/bwd4/{bridge_cuda,model_cuda}
#   bash bench/stage_variant.sh expnn - attn_bwd_v4.cu:BWD_BLOCK_EXP_NN=1
#   mkdir -p .device-carry/z; tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4
# carry .device-carry/z (and .whl for cuDNN FP8 in `c`), run
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s39.sh MODE
#   a, b: the whole GPU suite (device_suite.sh 1, 2) on session 38's defaults (CTA pairs at d = 64
#         on documents that walk down, the per-head-dim forward order and block exponents).
#   c:    the standing against the anchors (bench/vs-anchors.sh: ours, anchors.py, cuDNN FP8, ours).
#   d:    why CTA pairs pay at d = 128 only with the three-instruction block exponents (session 38:
#         unpaired 74.3-75.6 ms, paired 76.8-77.1, both with e4m3_scale_exp_nn 76.5-77.3 / 75.1):
#         Nsight Compute on one backward launch at 1x65536 for the four builds, all in one tarball
#         ($OUT/ncu-s39.tgz: details pages and per-SASS stall samples; `scripts/ncu-stalls.py`
#         summarises a .sass.csv.gz), then the four timed, two rounds.
#   e:    the pairs' three GPU mutations (bench/gpu_mutations.sh 35-37): each must be caught.
#   p:    (ran in session 39; the knobs are gone, so it no longer stages) the code-placement
#         sweep: the d = 128 backward and forward with the interior loops moved by 16 N bytes
#         (BWD_CODE_PAD / FWD_CODE_PAD = N: N `nanosleep.u32 0` before the loop, cuda-pN, N = 1..7)
#         and the backward with the three-instruction block exponents at N = 0, 2, 4, 6 (cuda-nnN),
#         against the embedded sources, two rounds at 1x65536 (docs/perf.md "Session 39").
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s39.sh a|b|c|d|e|p}
suite_or_standing "$mode"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
d)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null) || { echo "ncu not found"; exit 1; }
  mkdir -p /tmp/ncu
  for v in "unpaired -" "paired FLAMIA_BWD_PAIR=1" "expnn FLAMIA_CUDA_DIR=$C/cuda-expnn" \
      "expnn-paired FLAMIA_CUDA_DIR=$C/cuda-expnn FLAMIA_BWD_PAIR=1"; do
    set -- $v; name=$1; shift; [ "$1" = - ] && set -- X=1
    echo "=== ncu $name"; date
    env "$@" timeout 150 $NCU --clock-control none --set full --import-source no -k attn_bwd_v4 --launch-skip 3 \
      --launch-count 1 -f -o /tmp/ncu/$name $C/flamia bench attention --workload 1x65536 > /tmp/ncu/$name.run.log 2>&1
    echo "ncu rc=$?"
    $NCU -i /tmp/ncu/$name.ncu-rep --page details > /tmp/ncu/$name.details.txt 2>&1
    $NCU -i /tmp/ncu/$name.ncu-rep --page source --print-source sass --csv 2>&1 | gzip > /tmp/ncu/$name.sass.csv.gz
    grep -E "Duration|Issue Slots Busy|Registers Per Thread|L2 Cache Throughput|No Eligible|No Instruction|Stall" /tmp/ncu/$name.details.txt | head -20
  done
  tar -C /tmp/ncu -czf "$O/ncu-s39.tgz" $(cd /tmp/ncu && ls *.details.txt *.sass.csv.gz)
  for r in 1 2; do
    for v in - FLAMIA_BWD_PAIR=1 FLAMIA_CUDA_DIR=$C/cuda-expnn "FLAMIA_CUDA_DIR=$C/cuda-expnn FLAMIA_BWD_PAIR=1"; do
      bench_mhz "$v round $r" "$v" --workload 1x65536
    done
  done
  ;;
p)
  ab_dirs cuda-p1 cuda-p2 cuda-p3 cuda-p4 cuda-p5 cuda-p6 cuda-p7 cuda-nn0 cuda-nn2 cuda-nn4 cuda-nn6 -- --workload 1x65536
  ;;
e)
  for m in bwd4-pair-upper-tile bwd4-pairsum-nowait bwd4-pairsum-self; do
    T=$C/gpu_attention ONLY=$m bash bench/gpu_mutations.sh
  done
  ;;
*) echo "device_s39.sh: unknown mode '$mode' (a, b, c, d, e, p)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s39-$mode.log"
