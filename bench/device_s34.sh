#!/bin/bash
# Session 34 (H200; staged as device_bwd4.sh --stage, carried as .device-carry/z/bwd4.tgz).
#   a: (1) the training call's slow modes against the GPU's clock: nvidia-smi sampling the SM
#      clock, power and the clock-event reasons every 20 ms in the background while
#      `flamia bench attention` runs the three short workloads three times and the nine once with
#      FLAMIA_BENCH_SAMPLES=1 (every training call's start, Unix ms, and time); (2) gpu_quant and
#      the whole gpu_attention suite on the quantiser's claimed chunk items, the default at
#      d = 128 since session 33 (~8 minutes in all).
#   b: the SM clock right after every training call (FLAMIA_BENCH_SAMPLES=1 also runs the call
#      once more per repetition followed by bench.cu's clock_probe: SM cycles over 20 us of the
#      global timer), the three short workloads three times (~1 minute; only flamia staged).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"  # start_power_log
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s34.sh a|b}
start=$(date +%s)
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  start_power_log "$O/smi.csv"
  for r in 1 2 3; do
    echo "=== short3 round $r (unix $(date +%s.%N))"
    FLAMIA_BENCH_SAMPLES=1 timeout 100 $C/flamia bench attention --workload 32x2048 \
      --workload 64x1024 --workload 256x256 2>&1 | grep -E "^[0-9]|samples"
  done
  echo "=== nine (unix $(date +%s.%N))"
  FLAMIA_BENCH_SAMPLES=1 timeout 100 $C/flamia bench attention 2>&1 | grep -E "^[0-9]|^lognormal|samples"
  kill "$POWER_LOG_PID"
  echo "smi samples: $(wc -l < "$O/smi.csv")"
  timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  left=$((580 - ($(date +%s) - start)))
  echo "=== gpu_attention, all, ${left} s left"
  timeout $left $C/gpu_attention --ignored --test-threads=1 2>&1 \
    | grep -E "test result|panicked|FAILED|^test |exceeds|differs"
  ;;
b)
  for r in 1 2 3; do
    echo "=== short3 round $r"
    FLAMIA_BENCH_SAMPLES=1 timeout 100 $C/flamia bench attention --workload 32x2048 \
      --workload 64x1024 --workload 256x256 2>&1 | grep -E "^[0-9]|samples|MHz"
  done
  nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active --format=csv
  ;;
*) echo "device_s34.sh: unknown mode '$mode' (a|b)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s34-$mode.log"
