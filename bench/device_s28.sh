#!/bin/bash
# Prepared in session 27 for the next session (H200). Stage here: `bash bench/device_bwd4.sh
# --stage`, `strip .device-carry/bwd4/*`, `rm .device-carry/bwd4/{bridge_cuda,model_cuda}`,
# `cp -r .whl .device-carry/bwd4/` (the cuDNN frontend wheel, bench/README.md), `mkdir -p
# .device-carry/z && tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4` (carry
# .device-carry/z: the binaries and the wheel pass the 64 MiB cap only compressed).
# Device: tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && mv .device-carry/bwd4/.whl .whl &&
#   bash bench/device_s28.sh va|d64
# `va` (~10 minutes): one backward launch against two head chunks where documents walk down
#   (FLAMIA_BWD_SCRATCH_MIB=512 beside the default at 4x16384 and 1x65536, two rounds), then the
#   standing with BWD_DQ_STSM on by default (bench/vs-anchors.sh: ours, anchors.py, cuDNN FP8,
#   ours again).
# `d64` (~5 minutes): the d = 64 standing (ANCHOR_HEAD_DIM=64 anchors beside ours).
# The whole GPU suite: bench/device_suite.sh 1 and 2 (a call each).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s28.sh va|d64}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ "$mode" = va ]; then
  echo "=== one backward launch (FLAMIA_BWD_SCRATCH_MIB=512) against the default's two head chunks"; date
  for r in 1 2; do
    for v in base one; do
      e=(X=1); [ $v = one ] && e=(FLAMIA_BWD_SCRATCH_MIB=512)
      echo "--- $v r$r"
      env "${e[@]}" timeout 60 $C/flamia bench attention --workload 4x16384 --workload 1x65536 2>&1 | grep -E "^[0-9]"
    done
  done
  echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
  B=$C/flamia O=$O/va timeout 500 bash bench/vs-anchors.sh 2>&1 | tail -40
elif [ "$mode" = d64 ]; then
  echo "=== the d = 64 standing against the anchors"; date
  ANCHOR_HEAD_DIM=64 B=$C/flamia O=$O/va64 timeout 560 bash bench/vs-anchors.sh --head-dim 64 2>&1 | tail -16
else
  echo "device_s28.sh: the mode is va or d64, not '$mode'" >&2; exit 2
fi
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s28-$mode.log"
