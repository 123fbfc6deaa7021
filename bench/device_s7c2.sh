#!/bin/bash
# Session 7, device call 2: the trainer. (1) model.rms_norm GPU tests (fused / fused-f32 against
# composite, bitwise repeats); (2) the 1B preset at 16,384-token rows, short documents: bf16 with
# each model.rms_norm, then mxfp8 with the default (fused), all in this one call; (3) head dim 64 in
# the trainer: model.size=tiny (2 heads of 64) on CUDA, mxfp8 vs bf16, 60 steps on the embedded data.
# Stage: bash bench/device_bwd4.sh --stage, plus target/release/deps/rms_norm-* as
# .device-carry/bwd4/rms_norm; run from the repo root on the device: bash bench/device_s7c2.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
{
echo "=== rms_norm GPU tests"; date
timeout 150 $C/rms_norm --ignored --test-threads=1 --nocapture 2>&1 | grep -E "^test |gap|panicked|test result|assert" | head -40
echo "=== 1B, 16K rows, short documents: bf16 x rms_norm, then mxfp8 (fused)"; date
B=$B ROWS=16384 PATHS=bf16 DOCS=short NORMS="composite fused fused-f32" OOM_CHECK=0 timeout 200 bash bench/trainer_1b.sh 2>&1 | grep -E "steps|rc=[1-9]|rror"
B=$B ROWS=16384 PATHS=mxfp8 DOCS=short NORMS="fused" OOM_CHECK=0 timeout 80 bash bench/trainer_1b.sh 2>&1 | grep -E "steps|rc=[1-9]|rror"
grep -c "Cannot dispatch to fused" /tmp/t1b-*.log
echo "=== head dim 64 in the trainer (model.size=tiny)"; date
for p in bf16 mxfp8; do
  timeout 60 $B train --set model.size=tiny --set attention.path=$p --set run.device=cuda --set training.steps=60 \
    --set run.log_every=20 --set run.progress=false --set run.checkpoint_every=0 --set run.final_checkpoint=false \
    --set wandb.enabled=false --set run.dir=/tmp/tiny-$p > /tmp/tiny-$p.log 2>&1
  echo "tiny $p rc=$?"; grep -E "^run |rror|panicked" /tmp/tiny-$p.log | tail -3
done
date
} 2>&1 | tee "$O/s7c2.log"
