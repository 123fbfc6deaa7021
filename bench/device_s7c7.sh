#!/bin/bash
# Session 7, device call 7 (final): the training call against the BF16 anchors in ONE call
# (`flamia bench attention`, bench/anchors.py, `flamia bench attention` again), then data parallel
# at world size 1 again (plain vs zero1ovl, three rounds alternating). Stage as device_s7c6.sh.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
clock() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader; }
{
B=$B O=$O bash bench/vs-anchors.sh  # ours (A), bench/anchors.py, ours (B), the table
echo "=== data parallel at world size 1"; date
OUT=$O/ddp BIN_DIR=$C STEPS=60 ROUNDS=3 DEADLINE_S=120 ARMS="zero1ovl" timeout 150 bash launch/device-ddp-check.sh 2>&1 |
  grep -E "^run |^arm |rc=[1-9]|deadline|total wall"
date
} 2>&1 | tee "$O/s7c7.log"
