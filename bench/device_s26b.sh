#!/bin/bash
# Session 26, call 3 (~8 minutes, H200): the tree with BWD_ST8 on for the walk-up and d = 64
# builds and BWD_DS_STSM the host's default with block dS (K's dim-major operand interleaved: the
# consumers' transpose for short and mid-length plans, the quantiser's copy, QUANT_ILEAVE_MASK,
# for long ones). The whole GPU suite (gpu_attention with the new
# ds_tile_by_stmatrix_gives_bitwise_the_same, gpu_quant with the interleaved order), the
# mutations quant-ileave, ds-stsm-sel and st8-swap, then FLAMIA_BWD_DS_STSM=0 against the default
# on long documents (the plans that now read the quantiser's interleaved K), two rounds.
# Stage here: `bash bench/device_bwd4.sh --stage`, then
#   tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4      (carry .device-carry/z)
# and on the device: tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s26b.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the whole GPU suite"; date
timeout 460 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
timeout 60 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
echo "=== mutations"; date
for m in quant-ileave ds-stsm-sel st8-swap; do
  ONLY=$m T=$C/gpu_attention OUT=$O/mut timeout 200 bash bench/gpu_mutations.sh 2>&1 | grep -v "^$"
done
echo "=== FLAMIA_BWD_DS_STSM=0 against the default, long documents"; date
for r in 1 2; do
  for v in new stsm0; do
    e=(X=1); [ $v = stsm0 ] && e=(FLAMIA_BWD_DS_STSM=0)
    echo "--- $v"
    env "${e[@]}" timeout 90 $C/flamia bench attention --workload 1x65536 --workload 4x16384 \
      --workload 8x8192 --workload 16x4096 2>&1 | grep -E "^[0-9]"
    env "${e[@]}" timeout 60 $C/flamia bench attention --head-dim 64 --workload 1x65536 --workload 8x8192 2>&1 | grep -E "^[0-9]"
  done
done
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s26b.log"
