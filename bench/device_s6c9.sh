#!/bin/bash
# Session 6, call 9 (last): the trainer changes since call 8 on the GPU (no per-step host waits in
# the data-parallel path; the hand-written cross-entropy gradient of the loss head), and the final
# kernel table.
#  1. trainer lib GPU tests: fused AdamW on CUDA, the one-rank NCCL reduction tests (ddp::), the
#     loss head's bf16 CUDA test (loss::)
#  2. 1B at 16K rows, bf16 and mxfp8, short and 16K-token documents (bench/trainer_1b.sh)
#  3. tests/train_deterministic.rs on the GPU (bitwise repeat and resume)
#  4. world size 1 through the launcher, 100 steps: plain / dist1 / ovl / zero1ovl
#  5. `flamia bench attention` (all nine workloads), the dq_acc L2-prefetch variant, GQA 16:8
# Carry .device-carry/bwd4 (flamia, flamia-dist, trainer_lib, train_deterministic) and .device-carry/var.
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
timeout 120 $C/trainer_lib --ignored --test-threads=1 --nocapture optim:: ddp:: loss:: > "$O/trainer_lib.log" 2>&1; echo "trainer_lib optim+ddp+loss rc=$?"
grep -E "^test |relative gaps|test result|panicked|gap|error" "$O/trainer_lib.log" | head -12
echo "=== 1B 16K"
B=$B ROWS=16384 OOM_CHECK=0 timeout 200 bash bench/trainer_1b.sh 2>&1 | grep -E "steps|rc=[1-9]"
FLAMIA_TEST_BIN=$B FLAMIA_TEST_REPO=$PWD timeout 150 $C/train_deterministic --ignored --test-threads=2 > "$O/train_det.log" 2>&1
echo "train_deterministic rc=$?"; grep -E "^test |test result|panicked" "$O/train_det.log" | head -4
echo "=== ddp check"
OUT=$O/ddp BIN_DIR=$C STEPS=100 ARMS="dist1 ovl zero1ovl" timeout 200 bash launch/device-ddp-check.sh 2>&1 | grep -E "^steps|max \|loss|median tok|wall|trace:|rc=" | head -12
echo "=== bench (HEAD)"
timeout 150 $B bench attention --json "$O/bench-head.json" 2>&1 | grep -E "^[0-9a-z]|^workload"
echo "=== bench dqpf"
FLAMIA_CUDA_DIR=$V/dqpf timeout 100 $B bench attention --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256 --workload 8192+224x256 2>&1 | grep -E "^[0-9]"
echo "=== GQA 16:8 (the 1B preset's)"
timeout 60 $B bench attention --kv-heads 8 --workload 4x16384 --workload 64x1024 2>&1 | grep -E "^[0-9]"
} 2>&1 | tee "$O/device_s6c9.log"
