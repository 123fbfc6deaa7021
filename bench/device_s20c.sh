#!/bin/bash
# Session 20, call 3 (short: what the last ~2 minutes of the budget allow, H200): two K/V slots
# in the d = 64 backward (FLAMIA_BWD_KV_SLOTS=2, prepared this session): its bitwise test, the
# mutation that reads slot 0 always, then one round of base / kv2 at d = 64 on three workloads.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage kv2=@FLAMIA_BWD_KV_SLOTS=2; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== two_kv_slots_give_bitwise_the_same"; date
timeout 90 $C/gpu_attention --ignored --exact two_kv_slots_give_bitwise_the_same 2>&1 | grep -E "test result|panicked"
echo "=== A/B base / kv2, d = 64, one round"; date
VARS=kv2 TESTS=0 REPS=1 WL="--head-dim 64 --workload 256x256 --workload 64x1024 --workload 16x4096" \
  OUT=$O/ab timeout 60 bash bench/device_ab.sh 2>&1 | tail -8
echo "=== mutation bwd-kv-slot-zero"; date
ONLY=bwd-kv-slot-zero OUT=$O/mut timeout 60 bash bench/gpu_mutations.sh 2>&1 | tail -2
date
} 2>&1 | tee "$O/s20c.log"
