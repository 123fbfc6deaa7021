#!/bin/bash
# The device calls prepared in session 9 for the next one (docs/perf.md "Next"). Stage here:
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage
#   bash bench/device_ab.sh --stage pre=bwd-next~1 both=bwd-next sexp=bwd-sexp
# then carry .device-carry/bwd4 and .device-carry/var and run, one call each (~5 min each):
#   PHASE=ab bash bench/device_s10.sh        gpu_attention on each variant, base / variants twice
#                                            (5 workloads), d = 64 once
#   PHASE=check bash bench/device_s10.sh     the GPU tests (attention, quantiser, bridge) on the
#                                            binary's kernels, then bench/gpu_mutations.sh (each
#                                            mutation of the kernel sources must fail its tests)
#   PHASE=options bash bench/device_s10.sh   the precision options' cost (`--causally-safe` beside
#                                            the default, nine workloads), the 1x131072 call's
#                                            memory
#   PHASE=anchors bash bench/device_s10.sh   bench/vs-anchors.sh (ours, BF16 anchors, ours, table)
# WIN (a variant name or "base") picks the kernels of the last two phases (default base).
set -u
C=.device-carry/bwd4; V=.device-carry/var; B=$C/flamia
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
WIN=${WIN:-base}
[ "$WIN" != base ] && export FLAMIA_CUDA_DIR=$V/$WIN
res() { grep -E "^[0-9]|^lognormal|^workload"; }
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-ab}" in
  ab)
    WL="--workload 1x65536 --workload 8x8192 --workload 64x1024 --workload 256x256 --workload lognormal" \
      REPS=2 OUT=$O bash bench/device_ab.sh
    for v in base $(ls $V); do
      echo "=== d=64 $v"
      if [ $v = base ]; then timeout 60 $B bench attention --head-dim 64 2>&1 | res
      else FLAMIA_CUDA_DIR=$V/$v timeout 60 $B bench attention --head-dim 64 2>&1 | res; fi
    done ;;
  check)
    for t in gpu_attention gpu_quant bridge_cuda model_cuda; do
      echo "=== $t"; timeout 200 $C/$t --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    done
    echo "=== bench/gpu_mutations.sh (each must be caught)"; OUT=$O/mut bash bench/gpu_mutations.sh ;;
  options)
    for r in 1 2; do
      echo "=== default ($r)"; timeout 60 $B bench attention --json "$O/default_$r.json" 2>&1 | res
      echo "=== causally safe ($r)"; timeout 90 $B bench attention --causally-safe --json "$O/safe_$r.json" 2>&1 | res
    done
    echo "=== 1x131072 (MiB: what the call allocates)"; timeout 120 $B bench attention --workload 1x131072 2>&1 | res ;;
  anchors)
    B=$B O=$O bash bench/vs-anchors.sh ;;
  *) echo "PHASE is ab, check, options or anchors"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s10_${PHASE:-ab}.log"
