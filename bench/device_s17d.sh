#!/bin/bash
# Session 17, device call 4 (~6 minutes): the landed state (BWD_CVT4, 6 early column constants in
# the walk-up build, BWD_REDUX, the quantiser's conflict-free layouts) against the BF16 anchors in
# one call (bench/vs-anchors.sh: ours, anchors.py, ours again; cuDNN FP8 only if .whl is carried),
# then gpu_quant on the landed quantiser and the two quantiser mutations whose patterns changed.
# Stage here: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*; carry .device-carry/bwd4.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== vs anchors"; date
B=$C/flamia O=$O/va timeout 400 bash bench/vs-anchors.sh 2>&1 | tail -40
echo "=== gpu_quant"; date
timeout 60 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
echo "=== mutations"; date
for m in quant-chunk-slot bwd-qperm-plain-q; do ONLY=$m OUT=$O/mut timeout 100 bash bench/gpu_mutations.sh 2>&1 | grep -E "caught"; done
date
} 2>&1 | tee "$O/s17d.log"
