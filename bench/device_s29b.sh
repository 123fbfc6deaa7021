#!/bin/bash
# Session 29, after device_s29.sh (H200). Staged as device_s29.sh says.
# `sweep` (~4 minutes): the head groups not yet measured at long documents, d = 128, two
#   rounds: the forward one head at a time (FLAMIA_FWD_HEAD_GROUP=1) and the backward eight heads
#   (FLAMIA_BWD_HEAD_GROUP=8) against the default (forward 2, backward 4 at 1x65536 and 2 at
#   4x16384); then ours alone at d = 64 on the nine workloads (the standing against session 28's
#   cuDNN BF16 figures: the anchors do not change between calls on one tree).
# `e2e` (~5 minutes): the trainer end to end on today's kernels, issue 13's "Measure": the 1B
#   preset at 16,384-token rows (bench/trainer_1b.sh, short and row-long documents, bf16 and
#   mxfp8), then configs/h200-125m.toml (bench/trainer_ab.sh, 60 steps: bf16, mxfp8, bf16, mxfp8).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s29b.sh sweep|e2e}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ "$mode" = sweep ]; then
  echo "=== head groups at long documents, d = 128"; date
  for r in 1 2; do
    for v in default fwd1 bwd8; do
      e=(X=1)
      [ $v = fwd1 ] && e=(FLAMIA_FWD_HEAD_GROUP=1)
      [ $v = bwd8 ] && e=(FLAMIA_BWD_HEAD_GROUP=8)
      echo "--- $v r$r"
      env "${e[@]}" timeout 60 $C/flamia bench attention --workload 1x65536 --workload 4x16384 \
        --workload 8x8192 2>&1 | grep -E "^[0-9]"
    done
  done
  echo "=== ours at d = 64, the nine workloads"; date
  timeout 90 $C/flamia bench attention --head-dim 64 2>&1 | grep -E "^[0-9]|^lognormal|^workload"
elif [ "$mode" = e2e ]; then
  echo "=== 1B at 16,384-token rows"; date
  B=$C/flamia ROWS=16384 OOM_CHECK=0 STEPS16=6 timeout 330 bash bench/trainer_1b.sh 2>&1 | tail -14
  echo "=== 125M, configs/h200-125m.toml"; date
  B=$C/flamia STEPS=60 timeout 200 bash bench/trainer_ab.sh 2>&1 | tail -8
else
  echo "device_s29b.sh: the mode is sweep or e2e, not '$mode'" >&2; exit 2
fi
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s29b-$mode.log"
