#!/bin/bash
# Session 15's last device call: the lean producer (FLAMIA_FWD_LEAN_PROD=1) and the forward's
# intra-warpgroup pipeline again (FLAMIA_FWD_OVERLAP=1, 240 / 24 with the lean producer): their
# bitwise tests and the lean producer's mutation, the A/B at d = 128 (nine workloads) and d = 64,
# and the precision options one by one (bench --precision). Stage: the binaries as in
# device_s15b.sh, then .device-carry/var/lean/env = FLAMIA_FWD_LEAN_PROD=1, var/ov/env =
# FLAMIA_FWD_OVERLAP=1; carry .device-carry/bwd4 and .device-carry/var (~6 minutes; LIGHT=1
# WL128='--workload ...' stops after the d = 128 A/B on those workloads).
set -u
C=.device-carry/bwd4; B=$C/flamia
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== bitwise tests (lean producer, overlap) and accuracy"; date
timeout 150 $C/gpu_attention --ignored --test-threads=1 forward_lean_producer forward_overlap mxfp8_causal_gqa 2>&1 | grep -E "^test |test result|panicked"
ONLY=fwd-lean-ev OUT=$O/mut timeout 60 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== A/B d = 128"; date
VARS="lean ov" TESTS=0 REPS=2 OUT=$O/a WL="${WL128- }" timeout 130 bash bench/device_ab.sh > /dev/null 2>&1
for col in fwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
[ "${LIGHT:-0}" = 1 ] && { date; exit 0; }
echo "=== A/B d = 64"; date
VARS="lean ov" TESTS=0 REPS=2 OUT=$O/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" timeout 60 bash bench/device_ab.sh > /dev/null 2>&1
python3 bench/ab_table.py $O/b/device_ab.log --col fwd
echo "=== precision options one by one"; date
for p in "" per-token-scales row-ds-exponents causal-dq-scaling; do
  echo "--- ${p:-default}"; timeout 40 $B bench attention ${p:+--precision $p} --workload 1x65536 --workload 16x4096 --workload 256x256 2>&1 | grep -E "^[0-9]"
done
date
} 2>&1 | tee "$O/s15c.log"
