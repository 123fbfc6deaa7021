#!/bin/bash
# Session 6, call 8: GPU tests of the HEAD binary (kernels, bridge, fused AdamW on CUDA, the
# trainer's bitwise repeat/resume), the unordered-dQ mutation against the jitter test, the
# BWD_DQ_ARRIVE=1 variant (tests, A B A B, phases), and issue 16's world-size-1 tokens/s (A B A B).
# Carry .device-carry/bwd4 (flamia, flamia-dist, test executables) and .device-carry/var.
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
WL="--workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256 --workload 8192+224x256"
{
echo "=== GPU tests (HEAD)"
timeout 100 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
timeout 200 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
timeout 100 $C/bridge_cuda --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
timeout 100 $C/trainer_lib --ignored --test-threads=1 --nocapture optim:: > "$O/trainer_lib.log" 2>&1; echo "trainer_lib optim rc=$?"
grep -E "relative gaps|test result|panicked" "$O/trainer_lib.log" | head -5
FLAMIA_TEST_BIN=$B FLAMIA_TEST_REPO=$PWD timeout 200 $C/train_deterministic --ignored --test-threads=2 > "$O/train_det.log" 2>&1
echo "train_deterministic rc=$?"; grep -E "^test |test result|panicked" "$O/train_det.log" | head -6
echo "=== mutation: unordered dQ"
ONLY=bwd4-unordered-dq bash bench/gpu_mutations.sh
echo "=== gpu_attention on dqarrive"
FLAMIA_CUDA_DIR=$V/dqarrive timeout 200 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
for r in 1 2; do
  echo "=== HEAD ($r)"; timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]"
  echo "=== dqarrive ($r)"; FLAMIA_CUDA_DIR=$V/dqarrive timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]"
done
for v in phases dqarrive-phases; do
  echo "=== $v 1x65536"; FLAMIA_CUDA_DIR=$V/$v timeout 100 $B bench attention --workload 1x65536 2>&1 | grep -E "^bwd4 |^[0-9]" | tail -3
done
for r in 1 2; do
  echo "=== ddp check ($r)"
  OUT=$O/ddp$r BIN_DIR=$C STEPS=${DDP_STEPS:-100} ARMS="dist1 ovl zero1ovl" timeout 300 bash launch/device-ddp-check.sh 2>&1 | grep -E "^steps|max \|loss|median tok|wall|trace:|rc=" | head -12
done
} 2>&1 | tee "$O/device_s6c8.log"
