#!/bin/bash
# Session 16's device call 3: the backward's shared-memory traffic and waits (ncu of call 2): dS
# code tile as 32-bit words (FLAMIA_BWD_DS_ST32=1: bitwise test, mutation), the hand-off's tid read
# early (var tid: BWD_TID_EARLY 1), P's column constants before the S/dP products at d = 128
# (var c8f: BWD_EARLY_COLS 8, BWD_COLS_FIRST 1), st32 + tid; A/B on the nine workloads, d = 64 too.
# Stage: device_bwd4.sh --stage; var dirs st32 (env), tid, c8f (sources with the define on line
# 1), st32tid (both). Carry .device-carry/bwd4, .device-carry/var (~5 minutes).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
echo "=== tests"; date
timeout 120 $C/gpu_attention --ignored --test-threads=1 backward_word_stores 2>&1 | grep -E "^test |test result|panicked"
FLAMIA_CUDA_DIR=.device-carry/var/tid timeout 100 $C/gpu_attention --ignored --test-threads=1 dq_is_bitwise mxfp8_causal_gqa 2>&1 | grep -E "^test |test result|panicked"
ONLY=bwd-ds-st32-sel OUT=$O/mut timeout 60 bash bench/gpu_mutations.sh 2>&1 | tail -2
echo "=== A/B d = 128"; date
VARS="st32 tid c8f st32tid" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 200 bash bench/device_ab.sh > /dev/null 2>&1
for col in bwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
echo "=== A/B d = 64"; date
VARS="st32 tid st32tid" TESTS=0 REPS=2 OUT=$O/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" timeout 80 bash bench/device_ab.sh > /dev/null 2>&1
python3 bench/ab_table.py $O/b/device_ab.log --col bwd
date
} 2>&1 | tee "$O/s16b.log"
