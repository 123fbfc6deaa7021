#!/bin/bash
# The device calls prepared in session 14 for the next one (docs/perf.md "Next"). Stage once, here:
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*     (~39 MB)
#   bash bench/device_s15.sh --stage     (.device-carry/var/qc: FLAMIA_QUANT_CHUNKS=1)
# then carry .device-carry/bwd4 and .device-carry/var (and .whl for PHASE=x: check du, the cap
# is 64 MiB with the tree) and run, chained (the machine goes back 30 s after a call):
#   PHASE=c bash bench/device_s15.sh   (~5 min) the quantiser chunks (FLAMIA_QUANT_CHUNKS=1: each
#                                      dim-major row written a full 128-byte line at a time):
#                                      gpu_quant (its chunked test included), the two chunk
#                                      mutations, attention tests with the knob on, then the A/B
#                                      (base / qc, twice, nine workloads at d = 128, four at 64)
#   PHASE=x bash bench/device_s15.sh   (~6 min) bench/vs-anchors.sh at d = 128 (BF16 anchors and,
#                                      with the wheel, cuDNN FP8, in the same call); add
#                                      FLAMIA_QUANT_CHUNKS=1 to it if PHASE=c made it the default
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  mkdir -p $V/qc && echo FLAMIA_QUANT_CHUNKS=1 > $V/qc/env
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-c}" in
  c)
    echo "=== gpu_quant (default, and the chunked test)"
    timeout 150 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    echo "=== mutations (must be caught)"
    for m in quant-chunk-nozero quant-chunk-slot; do ONLY=$m OUT=$O/mut bash bench/gpu_mutations.sh; done
    echo "=== attention tests with FLAMIA_QUANT_CHUNKS=1"
    FLAMIA_QUANT_CHUNKS=1 timeout 150 $C/gpu_attention --ignored --test-threads=1 mxfp8_causal long_documents \
      documents_are_isolated head_dim_64_is_as_accurate repeated_runs 2>&1 | grep -E "test result|panicked|FAILED"
    VARS=qc TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 200 bash bench/device_ab.sh > /dev/null 2>&1
    VARS=qc TESTS=0 REPS=2 OUT=$O/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" \
      timeout 80 bash bench/device_ab.sh > /dev/null 2>&1
    for d in a b; do for col in quant train; do python3 bench/ab_table.py $O/$d/device_ab.log --col $col; done; done ;;
  x)
    B=$B O=$O bash bench/vs-anchors.sh ;;
  *) echo "PHASE is c or x"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s15_${PHASE:-c}.log"
