#!/bin/bash
# Prepared in session 17 for the next session's first device call (~8 minutes): where the
# backward's step goes after session 17's landings (CVT4, 6 early column constants in the
# walk-up build, REDUX): ncu of one backward launch at 1x65536 (`python3 scripts/ncu-stalls.py
# attn_bwd_v4.sass.csv.gz --cycles C --regions --smem` here afterwards, C = elapsed cycles /
# steps per consumer warp), then the landed state against the BF16 anchors and cuDNN FP8 in one
# call (bench/vs-anchors.sh; session 17's call 4 ran it without cuDNN FP8).
# Stage here:
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*
#   (and the cuDNN FP8 wheel in .whl: the pip download line in bench/README.md, device_s17 row)
# carry .device-carry/bwd4 and .whl, run from the repo root on the device.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== ncu attn_bwd_v4 (1x65536)"; date
B=$C/flamia KERNELS=attn_bwd_v4 OUT=$O/ncu timeout 150 bash bench/ncu-kernels.sh 2>&1 | tail -6
echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
B=$C/flamia O=$O/va timeout 430 bash bench/vs-anchors.sh 2>&1 | tail -30
date
} 2>&1 | tee "$O/s18.log"
