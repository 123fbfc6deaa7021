#!/bin/bash
# Session 7, device call 8: head dim 64 against the BF16 anchors in one call
# (`flamia bench attention --head-dim 64`, `ANCHOR_HEAD_DIM=64 bench/anchors.py`). Stage as s7c7.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
{
date
timeout 60 $B bench attention --head-dim 64 --json "$O/ours64.json" 2>&1 | grep -E "^[0-9]|^lognormal|^workload"
ANCHOR_HEAD_DIM=64 OUT=$O timeout 330 python3 bench/anchors.py > "$O/anchors64.log" 2>&1 || echo "anchors rc=$?"
tail -11 "$O/anchors64.log"
date
} 2>&1 | tee "$O/s7c8.log"
