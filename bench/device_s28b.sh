#!/bin/bash
# Session 28, second call (H200): the work lists' head groups (src/gpu/sched.rs `head_group`).
# The forward's items run longest first with a tile's 16 heads adjacent, so ~130 CTAs in flight
# span every head's K/V and read each K/V tile ~2x from DRAM; bench/sched_model.py-style replay
# through a 50 MB LRU: 8.2 GB of K/V from DRAM at 8x8192..1x65536 with one group, 3.7 GB with
# groups of 8 heads, 1.2 GB with 4. The backward's walk-down (>64 key tiles) likewise: Q/dO/dQ
# 26 GB at 4x16384 in two chunks of 8 heads, 13.5 GB with 4 heads in flight.
# Staged as device_s28.sh says; on the device:
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s28b.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
W128=${W128:-"1x65536 4x16384 8x8192 16x4096 32x2048"}
W64=${W64:-"1x65536 4x16384 8x8192"}
run() { # label, head dim, workloads, env...
  local l=$1 hd=$2 ws=$3; shift 3
  local a=(); for w in $ws; do a+=(--workload "$w"); done
  echo "--- $l d=$hd"
  env "$@" timeout 120 $C/flamia bench attention --head-dim "$hd" "${a[@]}" 2>&1 | grep -E "^[0-9]"
}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
for r in 1 2; do
  echo "=== d = 128 round $r"; date
  run base 128 "$W128" X=1
  run fwd-g4 128 "$W128" FLAMIA_FWD_HEAD_GROUP=4
  run fwd-g2 128 "$W128" FLAMIA_FWD_HEAD_GROUP=2
  run bwd-g4 128 "$W128" FLAMIA_BWD_HEAD_GROUP=4
  run bwd-g2 128 "$W128" FLAMIA_BWD_HEAD_GROUP=2
  run chunks4 128 "$W128" FLAMIA_BWD_SCRATCH_MIB=128
done
for r in 1 2; do
  echo "=== d = 64 round $r"; date
  run base 64 "$W64" X=1
  run fwd-g4 64 "$W64" FLAMIA_FWD_HEAD_GROUP=4
  run bwd-g4 64 "$W64" FLAMIA_BWD_HEAD_GROUP=4
done
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s28b.log"
