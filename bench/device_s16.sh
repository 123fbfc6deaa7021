#!/bin/bash
# Session 16's last device call, on the landed defaults (lean forward producer; the backward's
# column constants first at d = 128 on long documents): two GPU tests, the precision options
# beside the default, then vs-anchors.sh (ours, BF16 anchors, cuDNN FP8 from the carried .whl,
# ours). Stage: bash bench/device_bwd4.sh --stage; the nvidia-cudnn-frontend==1.32.0 wheel in
# .whl (device README); carry .device-carry/bwd4 and .whl (~9 minutes).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== tests"; date
timeout 90 $C/gpu_attention --ignored --test-threads=1 mxfp8_causal_gqa repeated_runs 2>&1 | grep -E "^test |test result|panicked"
echo "=== precision options (--causally-safe) beside the default"; date
for p in "" --causally-safe; do
  echo "--- ${p:-default}"; timeout 60 $C/flamia bench attention $p 2>&1 | grep -E "^[0-9]|^lognormal"
done
echo "=== vs-anchors"; date
B=$C/flamia O=$O/va bash bench/vs-anchors.sh
date
} 2>&1 | tee "$O/s16.log"
