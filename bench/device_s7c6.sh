#!/bin/bash
# Session 7, device call 6: (1) the quantiser with one CTA barrier per item (QUANT_DEFER_DIM, kernel
# copies in .device-carry/var: qbase = the committed code, qdefer7 = deferred dim-major copy at 7
# CTAs/SM, qdefer6 = the same at 6 CTAs/SM for the Q/K/V launch, no spill), A B C D D C B A on the
# quant column of `flamia bench attention` (1x65536 and 64x1024, d = 128 and 64), gpu_quant bitwise
# on each; (2) data parallel at world size 1 (launch/device-ddp-check.sh; DDP_ARGS from the helper's
# note). Stage: device_bwd4.sh --stage (+ flamia-dist, trainer_lib) and the var dirs.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia; V=.device-carry/var
bq() {  # label, then bench args
  local label=$1; shift
  timeout 60 $B bench attention --workload 1x65536 --workload 64x1024 "$@" 2>&1 | grep -E "^(1x|64x)" |
    awk -v l="$label" '{printf "%-16s %-8s quant %s ms %s GB/s   train %s ms\n", l, $1, $4, $5, $8}'
}
{
date
for d in 128 64; do
  for v in qbase qdefer7 qdefer6 qdefer6 qdefer7 qbase; do
    FLAMIA_CUDA_DIR=$V/$v bq "d$d $v" --head-dim $d
  done
done
for v in qbase qdefer7 qdefer6; do
  echo "gpu_quant on $v: $(FLAMIA_CUDA_DIR=$V/$v timeout 60 $C/gpu_quant --ignored --test-threads=4 2>&1 | grep -E "test result|panicked" | tr '\n' ' ')"
done
if [ -n "${DDP_CMD:-}" ]; then
  echo "=== data parallel at world size 1: $DDP_CMD"; date
  eval "$DDP_CMD"
fi
date
} 2>&1 | tee "$O/s7c6.log"
