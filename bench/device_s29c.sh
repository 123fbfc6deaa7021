#!/bin/bash
# Session 29, third script (H200; staged as device_s29.sh says): the forward's head group at
# d = 64, where lognormal's forward measured +3.5..+4% with the default two-head groups against
# every head at once (device_s29.sh va, both rounds) while d = 128 was level. Is it the group's
# width (two heads of d = 64 read 128 contiguous bytes of each token's K/V row, four read 256,
# as two heads do at d = 128)? FLAMIA_FWD_HEAD_GROUP 2, 4 and 16 at d = 64, then 2 and 4 at
# d = 128, two rounds, forward ms (the training call beside it). About 2 minutes.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
for r in 1 2; do
  for hd in 64 128; do
    gs="2 4 16"; [ $hd = 128 ] && gs="2 4"
    for g in $gs; do
      echo "--- d=$hd g$g r$r"
      FLAMIA_FWD_HEAD_GROUP=$g timeout 60 $C/flamia bench attention --head-dim $hd --workload lognormal \
        --workload 64x1024 --workload 16x4096 --workload 4x16384 --workload 1x65536 2>&1 | grep -E "^[0-9]|^lognormal"
    done
  done
done
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s29c.log"
