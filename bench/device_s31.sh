#!/bin/bash
# Session 31 (H200; staged as device_bwd4.sh --stage, carried as .device-carry/z/bwd4.tgz).
#   a: the half tiles (FWD_HALF_TILES, on by default since this session for the build without the
#      consumer copies) in the copies' build too (FLAMIA_FWD_HALF=all) against the default on the
#      four workloads that build serves, two rounds; then the whole GPU suite on the new default
#      (device_suite.sh 1 and 2, ~7 minutes).
#   b: the precision options' cost on this tree (`--causally-safe` beside the default, the nine),
#      then the trainer end to end: the 1B preset at 16,384-token rows (bench/trainer_1b.sh, 10
#      steps, short and row-long documents, bf16 and mxfp8) and configs/h200-125m.toml
#      (bench/trainer_ab.sh, 60 steps), ~9 minutes.
#   c: ncu of the Q/K/V quantiser (quant_e4m3, one launch at 1x65536): speed of light, warp
#      state, scheduler and instruction statistics, DRAM bytes: is it issue- or memory-bound
#      (docs/perf.md "Next" item 1's census), ~2 minutes.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s31.sh a|b|c}
. "$(dirname "$0")/device-bench.sh"  # run_bench, D64, ab_rounds
LONG=(--workload 1x65536 --workload 4x16384 --workload 8x8192 --workload 16x4096)
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  ab_rounds d=128 FLAMIA_FWD_HALF=all "${LONG[@]}"
  ;;
b)
  run_bench "d=128 default" -
  run_bench "d=128 --causally-safe" - --causally-safe
  echo "=== 1B at 16,384-token rows"; date
  B=$C/flamia ROWS=16384 OOM_CHECK=0 STEPS16=10 timeout 330 bash bench/trainer_1b.sh 2>&1 | tail -16
  echo "=== 125M, configs/h200-125m.toml"; date
  B=$C/flamia STEPS=60 timeout 170 bash bench/trainer_ab.sh 2>&1 | tail -8
  ;;
c)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
  echo "=== ncu quant_e4m3 1x65536 ($NCU)"
  timeout 150 $NCU --clock-control none -k quant_e4m3 --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section MemoryWorkloadAnalysis --section Occupancy \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg \
    $C/flamia bench attention --workload 1x65536 > "$O/ncu_quant.txt" 2>&1 || echo "ncu rc=$?"
  grep -E "quant_e4m3|dram__bytes|inst_executed|cycles_elapsed|Duration|Throughput|Stall|Warp Cycles|Issue Slots|Issued Ipc|No Eligible|Eligible Warps|Active Warps|Achieved Occupancy|Executed Ipc" "$O/ncu_quant.txt" | head -60
  ;;
*) echo "device_s31.sh: unknown mode '$mode' (a, b, c)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s31-$mode.log"
if [ "$mode" = a ]; then
  bash "$(dirname "$0")/device_suite.sh" 1
  bash "$(dirname "$0")/device_suite.sh" 2
fi
