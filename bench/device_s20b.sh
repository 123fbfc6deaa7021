#!/bin/bash
# Session 20, call 2 (~8 minutes, H200): the final tree against the BF16 anchors and cuDNN FP8
# in one call (bench/vs-anchors.sh: ours, anchors.py, cudnn_fp8.py, ours again; the issues' same-
# call measurement, last run with cuDNN FP8 in session 16).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*, plus the cuDNN FP8
#   wheel in .whl (bench/README.md's pip download line); carry .device-carry/bwd4 and .whl.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
B=$C/flamia O=$O/va timeout 500 bash bench/vs-anchors.sh 2>&1 | tail -40
date
} 2>&1 | tee "$O/s20b.log"
