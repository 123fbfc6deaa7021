#!/bin/bash
# Session 19, call 2 (~7 minutes, H200): the producer loads the next item's K and V once the
# consumers have released the item's last stage (BWD_KV_EARLY, default on; kv0 =
# FLAMIA_BWD_KV_EARLY=0 waits for kv_empty as before). GPU tests (the new bitwise knob test and
# the ordering / repeatability ones), the mutation that drops the wait (must be caught), then an
# A/B on all nine workloads, two rounds.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage kv0=@FLAMIA_BWD_KV_EARLY=0; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_attention on BWD_KV_EARLY"; date
timeout 200 $C/gpu_attention --ignored --test-threads=1 kv_slot_released_early walking_up mxfp8_causal_gqa repeated_runs dq_is_bitwise head_dim_64_is_bitwise_repeatable 2>&1 \
  | grep -E "test result|panicked|FAILED|^test "
echo "=== mutation: no wait before the next K/V"; date
ONLY=bwd-kv-early-nowait OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -3
echo "=== A/B base / kv0, nine workloads"; date
VARS=kv0 TESTS=0 WL=" " OUT=$O/ab timeout 330 bash bench/device_ab.sh 2>&1 | tail -44
date
} 2>&1 | tee "$O/s19b.log"
