#!/bin/bash
# Prepared in session 20 for the next session's first device calls (H200):
#   bash bench/device_s20c.sh      (~8 minutes) the whole gpu_attention suite first: the dV fold
#     kernels' shared helpers (fold_run_max / warp_suffix_max / fold_write, a refactor of session
#     20's review) were compiled but never run on a GPU; the suite also holds the d = 64 ring
#     variants' bitwise tests (two_kv_slots_..., four_stages_...); then the mutations
#     bwd-kv-slot-zero and fold-warp-suffix (launch_chain_knobs_keep_every_bit, never broken on
#     a GPU yet).
#   bash bench/device_s20c.sh ab   (~5 minutes) A/B at d = 64, two rounds: base / kv2 (two K/V
#     slots, FLAMIA_BWD_KV_SLOTS=2) / s4 (four stages) / s4kv2.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage kv2=@FLAMIA_BWD_KV_SLOTS=2 s4=@FLAMIA_BWD_STAGES=4 \
#     s4kv2=@FLAMIA_BWD_STAGES=4,FLAMIA_BWD_KV_SLOTS=2; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
if [ "${1:-}" = ab ]; then
  TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 64x1024 --workload 16x4096 --workload 4x16384 --workload 1x65536" \
    OUT=$O/ab timeout 560 bash bench/device_ab.sh 2>&1 | tail -42 | tee "$O/s20c-ab.log"
  exit 0
fi
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the whole gpu_attention suite (~270 s)"; date
timeout 360 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
echo "=== mutations"; date
for m in bwd-kv-slot-zero fold-warp-suffix; do
  ONLY=$m OUT=$O/mut timeout 90 bash bench/gpu_mutations.sh 2>&1 | tail -2
done
date
} 2>&1 | tee "$O/s20c.log"
