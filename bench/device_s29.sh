#!/bin/bash
# Prepared in session 28 for the next session (H200). Stage as device_s28.sh says (strip, drop
# bridge_cuda / model_cuda, copy .whl in, tar to .device-carry/z/bwd4.tgz, carry .device-carry/z).
# Device: tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && mv .device-carry/bwd4/.whl .whl &&
#   bash bench/device_s29.sh va|d64|pt
# `va` (~8 minutes): the forward's head groups at lognormal (+2.3% forward at d = 64 with
#   groups in session 28), 64x1024 (the shortest that groups, FWD_GROUP_MIN_TILES) and 256x256
#   (which no longer groups: the two runs should agree), default against
#   FLAMIA_FWD_HEAD_GROUP=64, d = 128 and 64, two rounds; then the standing on session 28's tree
#   (bench/vs-anchors.sh: ours, anchors.py, cuDNN FP8, ours again).
# `d64` (~5 minutes): the d = 64 standing (ANCHOR_HEAD_DIM=64 anchors beside ours).
# `pt` (~4 minutes): FWD_PT_PREFIX (session 28, CPU only: the per-token masked key tile from
#   prefix maxima, 1,469 -> 1,093 SASS per tile): its bitwise GPU test, then `--causally-safe`
#   with FLAMIA_FWD_PT_PREFIX=1 against without, and the default beside them, two rounds.
# The whole GPU suite: bench/device_suite.sh 1, 2 and 3 (a call each).
# Run in session 29 (docs/perf.md "Session 29"). `pt`'s variant measured no gain and was removed
# (eb76e61 has it), so `pt` now fails at its first step on binaries built after that.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s29.sh va|d64|pt}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ "$mode" = va ]; then
  echo "=== the forward's head groups at lognormal and 256x256"; date
  for r in 1 2; do
    for hd in 128 64; do
      for v in default all; do
        e=(X=1); [ $v = all ] && e=(FLAMIA_FWD_HEAD_GROUP=64)
        echo "--- $v d=$hd r$r"
        env "${e[@]}" timeout 60 $C/flamia bench attention --head-dim $hd --workload lognormal \
          --workload 256x256 --workload 64x1024 2>&1 | grep -E "^[0-9a-z]" | grep -v "^kernel\|^workload\|^flamia"
      done
    done
  done
  echo "=== vs anchors (with cuDNN FP8 where .whl was carried)"; date
  B=$C/flamia O=$O/va timeout 480 bash bench/vs-anchors.sh 2>&1 | tail -40
elif [ "$mode" = d64 ]; then
  echo "=== the d = 64 standing against the anchors"; date
  ANCHOR_HEAD_DIM=64 B=$C/flamia O=$O/va64 timeout 560 bash bench/vs-anchors.sh --head-dim 64 2>&1 | tail -16
elif [ "$mode" = pt ]; then
  echo "=== FWD_PT_PREFIX: bitwise test"; date
  timeout 150 $C/gpu_attention --ignored --exact per_token_masked_tiles_from_prefix_maxima_give_bitwise_the_same \
    --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right"
  for r in 1 2; do
    for v in default safe safe-prefix; do
      e=(X=1); a=(); [ $v != default ] && a=(--causally-safe)
      [ $v = safe-prefix ] && e=(FLAMIA_FWD_PT_PREFIX=1)
      echo "--- $v r$r"
      env "${e[@]}" timeout 90 $C/flamia bench attention "${a[@]}" 2>&1 | grep -E "^[0-9]|^lognormal"
    done
  done
else
  echo "device_s29.sh: the mode is va, d64 or pt, not '$mode'" >&2; exit 2
fi
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s29-$mode.log"
