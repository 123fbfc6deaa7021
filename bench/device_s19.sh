#!/bin/bash
# Prepared in session 18 for the next session's first device call (~8 minutes, H200): the landed
# state (BWD_COLS_TMA, the walk-up scratch budget, BWD_EARLY_FACTORS: the last one measured on an
# H100 only) against the BF16 anchors and cuDNN FP8 in one call (bench/vs-anchors.sh), then the
# call's device memory at a 131,072-token row (issue 13's bar: <= 2.7 GB; session 18 added the
# step constants' table, 24 bytes per padded position and query head: ~48 MiB there, computed).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*, plus the cuDNN FP8
# wheel in .whl (bench/README.md's pip download line); carry .device-carry/bwd4 and .whl.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
B=$C/flamia O=$O/va timeout 430 bash bench/vs-anchors.sh 2>&1 | tail -32
echo "=== 1x131072: the call's device memory (MiB column)"; date
timeout 60 $C/flamia bench attention --workload 1x131072 2>&1 | grep -E "^[0-9]|^workload"
date
} 2>&1 | tee "$O/s19.log"
