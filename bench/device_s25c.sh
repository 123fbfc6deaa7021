#!/bin/bash
# Session 25's third call (~7 minutes, H200): the standing at head dim 64 (the Llama-3.2-1B shape)
# against the BF16 anchors at head dim 64 in one call (ours, anchors.py, ours again; no cuDNN
# FP8: not carried), last measured in session 10 (1.17-1.40x); then an A/B of the forward's
# knobs at d = 128 short and mid lengths: cw1 (FLAMIA_FWD_CW=1: the consumer copies below the
# 16-tile threshold), st3 / st5 (FLAMIA_FWD_STAGES=3 / 5 against 4).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_ab.sh
#   --stage cw1=@FLAMIA_FWD_CW=1 st3=@FLAMIA_FWD_STAGES=3 st5=@FLAMIA_FWD_STAGES=5; carry
#   .device-carry/bwd4 and .device-carry/var (not .whl).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== d = 64 vs anchors at d = 64"; date
ANCHOR_HEAD_DIM=64 B=$C/flamia O=$O/va64 timeout 420 bash bench/vs-anchors.sh --head-dim 64 2>&1 | tail -16
echo "=== A/B forward knobs"; date
VARS="cw1 st3 st5" TESTS=0 WL="--workload 32x2048 --workload 64x1024 --workload 256x256" OUT=$O/ab timeout 130 bash bench/device_ab.sh 2>&1 | tail -1
date
} 2>&1 | tee "$O/s25c.log"
