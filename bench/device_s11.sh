#!/bin/bash
# The device calls prepared in session 10 for the next one (docs/perf.md "Next"). Stage once,
# here, on branch release-qkv (main plus the trainer's q, k, v release under selective
# checkpointing; the kernels are main's, so every phase can use this one staging; merge the
# branch only after PHASE=check and PHASE=mem pass):
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage          (flamia + gpu_attention, gpu_quant, bridge_cuda, model_cuda)
# then carry .device-carry/bwd4 (and .whl for PHASE=anchors: the cuDNN FP8 frontend wheel) and
# run, one call each:
#   PHASE=ab128 / PHASE=ab64 bash bench/device_s11.sh   the backward variants of session 10,
#                                           staged by `bash bench/device_ab.sh --stage
#                                           first4=bwd-first4 first8=bwd-first8 dvearly=bwd-dvearly
#                                           both64=bwd-both64 skip=bwd-skipdead skip128=bwd-skipdead128
#                                           tmax=fwd-tmax`
#                                           (carry .device-carry/var too). first4/first8: P's
#                                           column constants before S^T's and dP^T's products
#                                           (BWD_COLS_FIRST); dvearly: d = 64 dV's product under
#                                           the dS maxima; both64: both at d = 64; skip / skip128:
#                                           dead steps skipped (BWD_SKIP_DEAD) at d = 64 / both
#                                           (d = 128 with 3 spilled dV registers). ab128: the GPU
#                                           tests on first4, first8, skip128, then base and those
#                                           twice (~6 min); ab64: the head_dim_64 tests on first8,
#                                           dvearly, both64, skip, then all twice (~4 min)
#   PHASE=opts bash bench/device_s11.sh     branch fwd-tmax (per-token forward: row maxima scaled
#                                           once per row, bitwise the same; stage it as
#                                           tmax=fwd-tmax with the others): gpu_attention on it,
#                                           then `--causally-safe` base / tmax twice (~4 min)
#   PHASE=check bash bench/device_s11.sh    every GPU test executable staged (model_cuda is the new
#                                           selective-checkpointing test), then every mutation of
#                                           bench/gpu_mutations.sh (bwd4-no-causal was updated in
#                                           session 10 and not yet run); ~4 minutes
#   PHASE=mem bash bench/device_s11.sh      1B and 1B-d64 at 64K rows (selective checkpointing),
#                                           bf16 and mxfp8, short and row-long documents: peak
#                                           memory (session 10 without the release: mxfp8 58.54
#                                           vs bf16 47.95 GiB, d = 64 51.14 vs 43.33) and tok/s;
#                                           ~4 minutes
#   PHASE=anchors bash bench/device_s11.sh  bench/vs-anchors.sh: ours, BF16 anchors, cuDNN FP8
#                                           (with .whl carried), ours; ~8 minutes
#   PHASE=e2e125 bash bench/device_s11.sh   configs/h200-125m.toml bf16 vs mxfp8 (issue 13's
#                                           list; last measured in session 7); ~3 minutes
set -u
C=.device-carry/bwd4; B=$C/flamia
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
res() { grep -E "^[0-9]|^lognormal|^workload"; }
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-check}" in
  check)
    for t in gpu_attention gpu_quant bridge_cuda model_cuda; do
      if [ -x $C/$t ]; then
        echo "=== $t"; timeout 200 $C/$t --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
      else
        echo "=== $t: not staged (skipped)"
      fi
    done
    echo "=== bench/gpu_mutations.sh (each must be caught)"; OUT=$O/mut bash bench/gpu_mutations.sh ;;
  ab128)
    VARS="first4 first8 skip128" REPS=2 OUT=$O \
      WL="--workload 1x65536 --workload 8x8192 --workload 64x1024 --workload 256x256 --workload lognormal" \
      bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log ;;
  ab64)
    VARS="first8 dvearly both64 skip" TEST_FILTER=head_dim_64 REPS=2 OUT=$O \
      WL="--head-dim 64 --workload 1x65536 --workload 8x8192 --workload 64x1024 --workload 256x256 --workload lognormal" \
      bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log ;;
  opts)
    VARS="tmax" REPS=2 OUT=$O WL="--causally-safe" bash bench/device_ab.sh
    python3 bench/ab_table.py $O/device_ab.log --col fwd; python3 bench/ab_table.py $O/device_ab.log --col train ;;
  mem)
    B=$B ROWS=65536 STEPS64=6 OOM_CHECK=0 OUT=$O/d128 bash bench/trainer_1b.sh 2>&1 | grep -E "steps|rc="
    B=$B EXTRA="--set model.size=1b-d64" ROWS=65536 STEPS64=6 OOM_CHECK=0 OUT=$O/d64 bash bench/trainer_1b.sh 2>&1 \
      | grep -E "steps|rc=" ;;
  anchors)
    B=$B O=$O bash bench/vs-anchors.sh ;;
  e2e125)
    B=$B STEPS=60 AGAIN=1 bash bench/trainer_ab.sh ;;
  *) echo "PHASE is ab128, ab64, opts, check, mem, anchors or e2e125"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s11_${PHASE:-check}.log"
