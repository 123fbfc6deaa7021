#!/bin/bash
# Session 20, call 1 (~9 minutes, H200): the training call's launch chain. By default now no
# memset runs between the v4 kernels (the work counter resets itself, bwd_dv_fold zeroes the
# backward's semaphores), the dV fold exponents take one warp per (document, head) for short
# documents (bwd_dv_fold_warp) and every kernel of the call is launched with programmatic
# dependent launch (griddepcontrol). The new GPU tests and the ones the change could break, the
# counter-reset mutation, then an A/B: base (all of it) / pdl0 (FLAMIA_PDL=0) / old (plain
# launches, the host's memsets, one CTA per document's fold: the session-19 launch sequence),
# two rounds on the short and mid workloads where the fixed costs weigh; last the whole
# gpu_attention suite.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage pdl0=@FLAMIA_PDL=0 old=@FLAMIA_PDL=0,FLAMIA_LAUNCH_MEMSETS=1,FLAMIA_BWD_FOLD_WARP=0
#   carry .device-carry/bwd4 and .device-carry/var.
# `bash bench/device_s20.sh suite` (~4 minutes): the rest of the gpu_attention suite (call 1's
# timeout of 200 s cut the whole suite short: session 19 measured it at 194-230 s for 27-28 tests,
# these five ran above) and the call's memory at a 131,072-token row.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
if [ "${1:-}" = suite ]; then
  {
  echo "=== gpu_attention but the five tests of call 1"; date
  timeout 330 $C/gpu_attention --ignored --test-threads=1 --skip one_plan_and_workspace --skip launch_chain_knobs \
    --skip mxfp8_causal_gqa --skip repeated_runs --skip dq_is_bitwise 2>&1 | grep -E "test result|panicked|FAILED|^test "
  echo "=== 1x131072: the call's device memory (MiB column)"; date
  timeout 60 $C/flamia bench attention --workload 1x131072 2>&1 | grep -E "^[0-9]|^workload"
  date
  } 2>&1 | tee "$O/s20-suite.log"
  exit 0
fi
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== new and affected tests"; date
timeout 150 $C/gpu_attention --ignored --test-threads=1 one_plan_and_workspace launch_chain_knobs mxfp8_causal_gqa \
  repeated_runs dq_is_bitwise 2>&1 | grep -E "test result|panicked|FAILED|^test "
timeout 60 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
timeout 60 $C/bridge_cuda --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
echo "=== mutation sched-noreset"; date
ONLY=sched-noreset OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -3
echo "=== A/B base / pdl0 / old"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload 1x65536" \
  OUT=$O/ab timeout 300 bash bench/device_ab.sh 2>&1 | tail -32
echo "=== the whole gpu_attention suite"; date
timeout 200 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
date
} 2>&1 | tee "$O/s20.log"
