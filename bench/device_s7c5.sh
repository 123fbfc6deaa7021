#!/bin/bash
# Session 7, device call 5: the E4M3 quantiser's prefetch depth and occupancy, A/B in one call.
# Variants: FLAMIA_QUANT_ASYNC=0 (registers, default) / 1 / 2 (cp.async ring of 2 / 3 slots), and
# at d = 64 more CTAs per SM (kernel copies with QUANT_CTAS_PER_SM prepended, FLAMIA_CUDA_DIR);
# `flamia bench attention` quant column (ms, GB/s) at 1x65536 and 64x1024, d = 128 and 64, base
# again at the end; gpu_quant bitwise tests on the async-2 and the 10-CTA variants; ncu of the
# Q/K/V launch. Stage: device_bwd4.sh --stage + .device-carry/var/qctas8, qctas10. (The depth-2
# variant, FLAMIA_QUANT_ASYNC=2, was measured slower and reverted: commit 0fa02f2 has it.)
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia; V=.device-carry/var
bq() {  # label, then bench args; prints the quant ms / GB/s and the training-call ms per workload
  local label=$1; shift
  timeout 60 $B bench attention --workload 1x65536 --workload 64x1024 "$@" 2>&1 | grep -E "^(1x|64x)" |
    awk -v l="$label" '{printf "%-22s %-8s quant %s ms %s GB/s   train %s ms\n", l, $1, $4, $5, $8}'
}
{
date
for d in 128 64; do
  bq "d$d base" --head-dim $d
  FLAMIA_QUANT_ASYNC=1 bq "d$d async1" --head-dim $d
  FLAMIA_QUANT_ASYNC=2 bq "d$d async2" --head-dim $d
done
FLAMIA_CUDA_DIR=$V/qctas10 bq "d64 ctas10" --head-dim 64
FLAMIA_CUDA_DIR=$V/qctas8 FLAMIA_QUANT_ASYNC=2 bq "d64 async2 ctas8" --head-dim 64
bq "d128 base again" --head-dim 128
bq "d64 base again" --head-dim 64
echo "=== gpu_quant on FLAMIA_QUANT_ASYNC=2 and on the 10-CTA copy"; date
FLAMIA_QUANT_ASYNC=2 timeout 60 $C/gpu_quant --ignored --test-threads=4 2>&1 | grep -E "test result|panicked"
FLAMIA_CUDA_DIR=$V/qctas10 timeout 60 $C/gpu_quant --ignored --test-threads=4 2>&1 | grep -E "test result|panicked"
echo "=== ncu: the Q/K/V quant_e4m3 launch at 1x65536, d = 128"; date
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 120 $NCU --kernel-name quant_e4m3 --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats \
  --section ComputeWorkloadAnalysis $B bench attention --workload 1x65536 2>&1 |
  grep -E "^\s+(Memory Throughput|DRAM Throughput|Duration|Compute \(SM\)|Mem Busy|Max Bandwidth|L2 Hit|Warp Cycles Per Issued|Registers|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps|Eligible Warps|Issue Slots Busy|Executed Ipc|SM Busy|Block Limit)|stall|Stall|scoreboard|Est. " | head -40
date
} 2>&1 | tee "$O/s7c5.log"
