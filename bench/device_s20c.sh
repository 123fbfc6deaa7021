#!/bin/bash
# Prepared in session 20 for the next session's first device call (~6 minutes, H200): the d = 64
# backward's ring variants, both prepared and never run on a GPU: two K/V slots
# (FLAMIA_BWD_KV_SLOTS=2: the next item's K and V load while this item runs) and four Q / dO
# stages (FLAMIA_BWD_STAGES=4). Their bitwise tests, the slot mutation, then an A/B at d = 64,
# two rounds: base / kv2 / s4 / s4kv2.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage kv2=@FLAMIA_BWD_KV_SLOTS=2 s4=@FLAMIA_BWD_STAGES=4 \
#     s4kv2=@FLAMIA_BWD_STAGES=4,FLAMIA_BWD_KV_SLOTS=2; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the ring variants' bitwise tests"; date
timeout 150 $C/gpu_attention --ignored --test-threads=1 two_kv_slots_give_bitwise_the_same four_stages_give_bitwise_the_same \
  2>&1 | grep -E "test result|panicked|^test "
echo "=== mutations"; date
ONLY=bwd-kv-slot-zero OUT=$O/mut timeout 90 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== mutation fold-warp-suffix (session 20's launch_chain_knobs test, never broken on a GPU yet)"; date
ONLY=fold-warp-suffix OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== A/B base / kv2 / s4 / s4kv2 at d = 64"; date
TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 64x1024 --workload 16x4096 --workload 4x16384 --workload 1x65536" \
  OUT=$O/ab timeout 330 bash bench/device_ab.sh 2>&1 | tail -42
date
} 2>&1 | tee "$O/s20c.log"
