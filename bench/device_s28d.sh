#!/bin/bash
# Session 28, last call (H200, ~4 minutes): the head groups' default against the BF16 anchors on
# the four workloads that were level with the best BF16 (4x16384, 32x2048, 64x1024, 256x256) in
# one call: ours (all nine), anchors.py one per workload, ours again.
# Staged as device_s28.sh says; on the device:
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s28d.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== ours a"; date
timeout 60 $C/flamia bench attention --json "$O/ours_a.json" 2>&1 | grep -E "^[0-9a-z]"
for w in ${WS:-4x16384 32x2048 64x1024 256x256}; do
  echo "=== anchors $w"; date
  PYTHONUNBUFFERED=1 timeout 70 python3 bench/anchors.py one "$w" 2>&1 | grep "^{" | tee -a "$O/anchors-one.jsonl"
done
echo "=== ours b"; date
timeout 60 $C/flamia bench attention --json "$O/ours_b.json" 2>&1 | grep -E "^[0-9a-z]"
date
} 2>&1 | tee "$O/s28d.log"
