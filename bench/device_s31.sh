#!/bin/bash
# Session 31 (H200; staged as device_bwd4.sh --stage, carried as .device-carry/z/bwd4.tgz).
#   a: the half tiles (FWD_HALF_TILES, on by default since this session for the build without the
#      consumer copies) in the copies' build too (FLAMIA_FWD_HALF=all) against the default on the
#      four workloads that build serves, two rounds; then the whole GPU suite on the new default
#      (device_suite.sh 1 and 2, ~7 minutes).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s31.sh a}
# One `flamia bench attention` run, its table rows only: label, the environment assignments
# (space-separated; "-" for none), then the bench's arguments.
run_bench() {
  local label=$1 e=$2; shift 2
  [ "$e" = - ] && e=X=1
  echo "=== $label"
  # (the assignments split on purpose)
  env $e timeout 100 $C/flamia bench attention "$@" 2>&1 | grep -E "^[0-9]|^lognormal"
}
LONG=(--workload 1x65536 --workload 4x16384 --workload 8x8192 --workload 16x4096)
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  for r in 1 2; do
    run_bench "d=128 default round $r" - "${LONG[@]}"
    run_bench "d=128 FLAMIA_FWD_HALF=all round $r" FLAMIA_FWD_HALF=all "${LONG[@]}"
  done
  ;;
*) echo "device_s31.sh: unknown mode '$mode' (a)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s31-$mode.log"
if [ "$mode" = a ]; then
  bash "$(dirname "$0")/device_suite.sh" 1
  bash "$(dirname "$0")/device_suite.sh" 2
fi
