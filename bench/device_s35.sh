#!/bin/bash
# Session 35 (prepared in session 33; H200; staged as device_bwd4.sh --stage, carried as
# .device-carry/z/bwd4.tgz).
#   a: joules per call of each phase (session 33 found the slow modes of the short workloads'
#      training call to be the power cap's clock: 64x1024 at 3.1 ms at 1,874 MHz, 4.0 ms at 1,424,
#      measured on the GPU by clock_probe). FLAMIA_BENCH_ENERGY=1 runs each phase alone and the
#      whole call ~1.5 s queued back to back per workload, with nvidia-smi logging power every
#      20 ms beside it; bench/energy.py joins the two: W, mJ per call, the clock after. Four
#      workloads at d = 128 (1x65536, 4x16384, 64x1024, 256x256) and 64x1024 at d = 64 (~2 minutes).
#      The table's new MHz column (the clock right after the training call's loop) rides along.
#      First gpu_quant (10 s) on the final claims default (Q/K/V launch at d = 128 only), which
#      session 33 settled after its last device call.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"  # start_power_log
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s35.sh a}
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "^test |test result|panicked"
  start_power_log "$O/smi.csv"
  FLAMIA_BENCH_ENERGY=1 timeout 200 $C/flamia bench attention --workload 1x65536 --workload 4x16384 \
    --workload 64x1024 --workload 256x256 > "$O/energy-128.log" 2>&1
  FLAMIA_BENCH_ENERGY=1 timeout 100 $C/flamia bench attention --head-dim 64 --workload 64x1024 \
    > "$O/energy-64.log" 2>&1
  kill "$POWER_LOG_PID"
  grep -E "^[0-9]|MHz|energy window" "$O/energy-128.log" "$O/energy-64.log"
  cat "$O/energy-128.log" "$O/energy-64.log" > "$O/energy.log"
  $PY bench/energy.py "$O/energy.log" "$O/smi.csv"
  ;;
*) echo "device_s35.sh: unknown mode '$mode' (a)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s35-$mode.log"
