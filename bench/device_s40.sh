#!/bin/bash
# (Run in session 40: l, m, t and e, docs/perf.md "Session 40". Its three knobs measured slower
# or within noise and were removed after, so the staging below needs commit 2db3981's sources.)
# Prepared in session 39 for the next device session (docs/perf.md "Next" 0): the late dQ / dS
# hand-offs (BWD_LATE_DQ_ARRIVE 1, 2, 3 in attn_bwd_v4.cu, default 0), dQ's exponents loaded
# before their products' waits (BWD_DQ_EXP_EARLY, default 0) and dS's key factors and first
# constants before dP's wait (BWD_DS_EARLY, default 0). Stage from the repo root here:
#   rm -rf .device-carry/bwd4 .device-carry/z; bash bench/device_bwd4.sh --stage; strip .device-carry/bwd4/*
#   rm -f .device-carry/bwd4/{bridge_cuda,model_cuda}
#   for v in 1 2 3; do bash bench/stage_variant.sh late$v - attn_bwd_v4.cu:BWD_LATE_DQ_ARRIVE=$v; done
#   bash bench/stage_variant.sh early - attn_bwd_v4.cu:BWD_DQ_EXP_EARLY=1
#   bash bench/stage_variant.sh late3e - attn_bwd_v4.cu:BWD_LATE_DQ_ARRIVE=3 attn_bwd_v4.cu:BWD_DQ_EXP_EARLY=1
#   bash bench/stage_variant.sh dse3 - attn_bwd_v4.cu:BWD_DS_EARLY=3
#   bash bench/stage_variant.sh all - attn_bwd_v4.cu:BWD_LATE_DQ_ARRIVE=3 attn_bwd_v4.cu:BWD_DQ_EXP_EARLY=1 attn_bwd_v4.cu:BWD_DS_EARLY=3
#   mkdir -p .device-carry/z; tar -C .device-carry -czf .device-carry/z/bwd4.tgz bwd4
# carry .device-carry/z (and .whl for cuDNN FP8 in `c`), run
#   tar -C .device-carry -xzf .device-carry/z/bwd4.tgz && bash bench/device_s40.sh MODE
#   l:    the variants' outputs bit for bit the embedded sources' (both head dims and walks, block
#         and row dS, the causally safe options), under FLAMIA_BWD_HANG_TRAP=1: all (the three
#         knobs), late1, late2; m: the same for late3e, early, dse3. (The test's time per
#         directory was not logged before: each run prints its start; split further if one call
#         cannot hold three.)
#   t:    the timings, two rounds against the embedded sources: every variant at d = 128, 1x65536
#         and 4x16384 (~6 minutes).
#   u:    late3e and all at d = 128, 16x4096 and 256x256, then early, late3e and all at d = 64
#         (CTA pairs on the long documents), 1x65536 and 16x4096.
#   f:    Nsight Compute (bench/ncu-kernels.sh) on the forward and the backward at d = 128,
#         1x65536, then on cuda-all's backward ($OUT/all/): where the stalls went (~2 minutes).
#   r:    all with row dS exponents and with --causally-safe (d = 128, 1x65536 and 256x256).
#   e:    the trainer end to end at 16,384-token rows, mxfp8 against the BF16 control, short and
#         row-long documents: the 1b-d64 preset (CTA pairs on its long documents since session
#         38), then the 1b preset (d = 128) (bench/trainer_1b.sh, ~5 minutes).
#   a, b: the whole GPU suite (device_suite.sh 1, 2), after a mode became the default.
#   c:    the standing against the anchors (bench/vs-anchors.sh: ours, anchors.py, cuDNN FP8, ours).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s40.sh l|m|t|u|f|r|e|a|b|c}
suite_or_standing "$mode"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
l | m)
  vs="all late1 late2"; [ "$mode" = m ] && vs="late3e early dse3"
  for v in $vs; do
    echo "=== cuda-$v against the embedded sources"; date
    FLAMIA_BWD_HANG_TRAP=1 FLAMIA_AB_CUDA_DIR=$C/cuda-$v timeout 180 $C/gpu_attention --ignored --exact \
      --test-threads=1 kernel_sources_of_another_directory_give_bitwise_the_same 2>&1 \
      | grep -E "^test |test result|panicked|differs|SKIPPED|trap" | head
  done
  ;;
t)
  ab_dirs cuda-early cuda-dse3 cuda-late1 cuda-late2 cuda-late3 cuda-late3e cuda-all -- --workload 1x65536 --workload 4x16384
  ;;
u)
  ab_dirs cuda-late3e cuda-all -- --workload 16x4096 --workload 256x256
  ab_dirs cuda-early cuda-late3e cuda-all -- --head-dim 64 --workload 1x65536 --workload 16x4096
  ;;
f)
  B=$C/flamia KERNELS="attn_fwd_v4 attn_bwd_v4" bash bench/ncu-kernels.sh
  mkdir -p "$O/all"
  OUT=$O/all FLAMIA_CUDA_DIR=$C/cuda-all B=$C/flamia KERNELS=attn_bwd_v4 bash bench/ncu-kernels.sh
  ;;
e)
  B=$C/flamia EXTRA="--set model.size=1b-d64" ROWS=16384 DOCS="short long" OOM_CHECK=0 bash bench/trainer_1b.sh
  B=$C/flamia ROWS=16384 DOCS="short long" OOM_CHECK=0 bash bench/trainer_1b.sh
  ;;
r)
  ab_dirs cuda-all -- --precision row-ds-exponents --workload 1x65536 --workload 256x256
  ab_dirs cuda-all -- --causally-safe --workload 1x65536 --workload 256x256
  ;;
*) echo "device_s40.sh: unknown mode '$mode' (l, m, t, u, f, r, e, a, b, c)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s40-$mode.log"
