#!/bin/bash
# Session 17, device call 3 (~8 minutes): the quantiser variants (QUANT_SWZ, QUANT_AHEAD, both,
# and all three with QUANT_REDUX) under gpu_quant's bitwise tests and in a quantiser A/B; one
# bench of the landed defaults (BWD_REDUX on) on the nine workloads and d = 64; then the whole
# gpu_attention suite on the defaults and the mutation bwd-redux-tree.
# Stage here:
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s17c.sh --stage
# carry .device-carry/bwd4 and .device-carry/var, run from the repo root on the device.
set -u
V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V && mkdir -p $V
  stage() {  # name, defines...
    local n=$1; shift
    mkdir -p $V/$n && cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/$n/
    for d in "$@"; do sed -i "1i #define $d 1" $V/$n/quant.cu; done
  }
  stage qswz QUANT_SWZ; stage qahead QUANT_AHEAD; stage qsa QUANT_SWZ QUANT_AHEAD
  stage qall QUANT_SWZ QUANT_AHEAD QUANT_REDUX
  du -sh $V/*; exit 0
fi
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
QV="qswz qahead qsa qall"
{
for q in $QV; do
  echo "=== gpu_quant on $q"; date
  FLAMIA_CUDA_DIR=$V/$q timeout 90 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
done
echo "=== A/B quantiser"; date
VARS="$QV" TESTS=0 REPS=2 OUT=$O/a WL="--workload 16x4096 --workload 64x1024 --workload 256x256" timeout 120 bash bench/device_ab.sh > /dev/null 2>&1
for col in quant train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
grep -E "^=== |^16x4096" $O/a/device_ab.log | paste - - | awk '{print $2, $3, "dO quant", $(NF-4)}'
echo "=== defaults, nine workloads and d = 64"; date
timeout 40 $C/flamia bench attention 2>&1 | grep -E "^[0-9]|^lognormal|workload"
timeout 30 $C/flamia bench attention --head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256 2>&1 | grep -E "^[0-9]"
echo "=== gpu_attention, all"; date
timeout 240 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
echo "=== mutation"; date
ONLY=bwd-redux-tree OUT=$O/mut timeout 70 bash bench/gpu_mutations.sh 2>&1 | tail -2
date
} 2>&1 | tee "$O/s17c.log"
