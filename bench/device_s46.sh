#!/bin/bash
# Session 46's device calls (the first three ran session 45's staged modes: device_s45.sh n1, p,
# then p2 and cs in one call). Stage as device_s45.sh's header says; an older binary for the
# regression hunt goes in $C/old/flamia (built from that commit's worktree, stripped).
#   r: the long documents' backward against session 43's binary (354b87a: 587-590 TFLOP/s on
#      the H200 then, 557-562 in session 45 and 46 calls): today's default, FLAMIA_BWD_KEYS_TMA=0,
#      both FLAMIA_BWD_KEYS_TMA=0 and FLAMIA_BWD_BULK_ST=0, and the old binary, two rounds,
#      1x65536, 4x16384, 16x4096 (d = 128)
#   w: after r (BWD_BULK_ST now only where tiles walk up): the new default, FLAMIA_BWD_BULK_ST=1
#      (session 45's default), FLAMIA_BWD_PAIR=1 (CTA pairs at d = 128: session 38 measured no
#      gain, before the key records) and session 43's binary, two rounds, 1x65536 and 2x32768
#      (both walk down; ~4 minutes)
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s46.sh r|w}
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
r) rounds_vs_old regression - FLAMIA_BWD_KEYS_TMA=0 "FLAMIA_BWD_KEYS_TMA=0 FLAMIA_BWD_BULK_ST=0" old -- \
     --workload 1x65536 --workload 4x16384 --workload 16x4096 ;;
w) rounds_vs_old "walk-down bulk" - FLAMIA_BWD_BULK_ST=1 FLAMIA_BWD_PAIR=1 old -- \
     --workload 1x65536 --workload 2x32768 ;;
*) echo "device_s46.sh: unknown mode '$mode' (r, w)"; exit 2 ;;
esac
kcache_pack
date
} 2>&1 | tee "$O/s46-$mode.log"
