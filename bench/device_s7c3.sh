#!/bin/bash
# Session 7, device call 3: (1) the GPU tests the per-token forward change touches (per-token
# scales, precision options, causal leakage at d = 128 and 64) and the rms_norm tests in full;
# (2) `flamia bench attention` on all nine workloads: d = 128 default, d = 128 --causally-safe,
# d = 64 default, d = 128 default again (drift check); (3) the 1B preset with 16K-token documents
# at 16,384-token rows, bf16 vs mxfp8 (fused RMSNorm), and at 65,536-token rows (selective
# activation checkpointing). Stage as device_s7c2.sh; run: bash bench/device_s7c3.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
clock() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader; }
{
echo "=== GPU tests (per-token forward change)"; date
timeout 150 $C/gpu_attention --ignored --test-threads=4 per_token precision causal_leakage head_dim_64_precision 2>&1 | grep -E "^test |test result|panicked"
timeout 100 $C/rms_norm --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
for run in "d128:" "d128safe:--causally-safe" "d64:--head-dim 64" "d128again:"; do
  name=${run%%:*}; args=${run#*:}
  echo "=== bench $name ($args)   clock $(clock)"; date
  timeout 100 $B bench attention $args --json "$O/$name.json" 2>&1 | grep -vE "^kernel|^SM clock|^flamia bench"
done
echo "=== 1B: 16K rows with 16K-token documents, 64K rows (selective), bf16 vs mxfp8"; date
B=$B ROWS="16384 65536" PATHS="bf16 mxfp8" DOCS=long OOM_CHECK=0 timeout 260 bash bench/trainer_1b.sh 2>&1 | grep -E "steps|rc=[1-9]|rror"
date
} 2>&1 | tee "$O/s7c3.log"
