#!/bin/bash
# Session 16's device call 2: the lean producer as the forward's default (all GPU attention tests,
# its mutation), the backward's piece pipeline (FLAMIA_BWD_PIPE=1, d = 128) and with two dQ
# buffers at two stages, A/B on the nine workloads, then ncu's per-instruction stalls of the
# piped backward at 1x65536 (bench/ncu-kernels.sh). Stage: bash bench/device_bwd4.sh --stage;
# bash bench/device_ab.sh --stage pipe=@FLAMIA_BWD_PIPE=1 pipeq2=@FLAMIA_BWD_PIPE=1,FLAMIA_BWD_DQ_BUFS=2,FLAMIA_BWD_STAGES=2
# carry .device-carry/bwd4 and .device-carry/var (~7 minutes). PHASE=ab skips the tests.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
if [ "${PHASE:-all}" = all ]; then
  echo "=== gpu_attention (default build)"; date
  timeout 230 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  ONLY=fwd-lean-ev OUT=$O/mut timeout 60 bash bench/gpu_mutations.sh 2>&1 | tail -2
fi
echo "=== A/B d = 128"; date
VARS="pipe pipeq2" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 150 bash bench/device_ab.sh > /dev/null 2>&1
for col in bwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
echo "=== ncu, piped backward"; date
FLAMIA_BWD_PIPE=1 B=$C/flamia KERNELS=attn_bwd_v4 OUT=$O/ncu timeout 200 bash bench/ncu-kernels.sh 2>&1 | tail -8
date
} 2>&1 | tee "$O/s16.log"
