#!/bin/bash
# RUN in session 15 (docs/perf.md "Session 15"): FLAMIA_QUANT_CHUNKS and QUANT_TOK_LINES are gone
# since (chunks are the default), FLAMIA_BWD_QPERM is on by default and FLAMIA_FWD_VPERM removed,
# so the variants below no longer mean what they did; kept as the record of the calls.
# The device calls prepared in session 14 for the next one (docs/perf.md "Next"). Stage once, here:
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*     (~39 MB)
#   bash bench/device_s15.sh --stage     (.device-carry/var: qc = FLAMIA_QUANT_CHUNKS=1, tl = the
#                                         sources with QUANT_TOK_LINES 1, qctl = both)
# then carry .device-carry/bwd4 and .device-carry/var (and .whl for PHASE=x: check du, the cap
# is 64 MiB with the tree) and run, chained (the machine goes back 30 s after a call):
#   PHASE=t, c, c2, c64                (~5 + ~6 + ~3 + ~3 min) the quantiser chunks (FLAMIA_QUANT_CHUNKS=1: each
#                                      dim-major row written a full 128-byte line at a time):
#                                      gpu_quant (its chunked test included), the two chunk
#                                      mutations, attention tests with the knob on, gpu_quant on
#                                      the tl sources (QUANT_TOK_LINES: token-major rows as full
#                                      lines from the shared tile), the FLAMIA_FWD_VPERM bitwise
#                                      and FLAMIA_BWD_QPERM bitwise tests and their mutations (t);
#                                      then the A/B (c: base / qc / tl / qctl, twice, nine
#                                      workloads at d = 128; c2: base / vp / qp on five; c64: four
#                                      at d = 64). If all win, a last A/B of everything together.
#   PHASE=x bash bench/device_s15.sh   (~6 min) bench/vs-anchors.sh at d = 128 (BF16 anchors and,
#                                      with the wheel, cuDNN FP8, in the same call); add
#                                      FLAMIA_QUANT_CHUNKS=1 to it if PHASE=c made it the default
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V; mkdir -p $V/qc $V/tl $V/qctl && echo FLAMIA_QUANT_CHUNKS=1 > $V/qc/env
  for d in tl qctl; do cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/$d/; sed -i '1i #define QUANT_TOK_LINES 1' $V/$d/quant.cu; done
  echo FLAMIA_QUANT_CHUNKS=1 > $V/qctl/env
  mkdir -p $V/vp $V/qp && echo FLAMIA_FWD_VPERM=1 > $V/vp/env && echo FLAMIA_BWD_QPERM=1 > $V/qp/env
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-t}" in
  t)
    echo "=== gpu_quant (default, and the chunked test)"
    timeout 150 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    echo "=== forward_vperm, backward_qperm (bitwise with FLAMIA_FWD_VPERM=1 / FLAMIA_BWD_QPERM=1)"
    timeout 150 $C/gpu_attention --ignored --test-threads=1 forward_vperm backward_qperm 2>&1 | grep -E "test result|panicked|FAILED"
    echo "=== mutations (must be caught)"
    for m in quant-chunk-nozero quant-chunk-slot quant-toklines-noswap fwd-vperm-plain-v bwd-qperm-plain-q; do ONLY=$m OUT=$O/mut bash bench/gpu_mutations.sh; done
    echo "=== attention tests with FLAMIA_QUANT_CHUNKS=1"
    FLAMIA_QUANT_CHUNKS=1 timeout 150 $C/gpu_attention --ignored --test-threads=1 mxfp8_causal long_documents \
      documents_are_isolated head_dim_64_is_as_accurate repeated_runs 2>&1 | grep -E "test result|panicked|FAILED"
    echo "=== gpu_quant on the QUANT_TOK_LINES sources (the chunked test runs both together)"
    FLAMIA_CUDA_DIR=$V/tl timeout 150 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
    echo "=== ncu of the forward (per-SASS stalls: the forward has none on record)"
    B=$B KERNELS=attn_fwd_v4 OUT=$O/ncu timeout 150 bash bench/ncu-kernels.sh 2>&1 | tail -4
    echo "=== ncu pipe utilisation of the forward (is it MUFU / conversion bound?)"
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
    timeout 120 $NCU --clock-control none -k attn_fwd_v4 --launch-skip 3 --launch-count 1 \
      --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,sm__cycles_elapsed.avg,sm__inst_executed.avg.per_cycle_active' \
      $B bench attention --workload 1x65536 > $O/ncu/fwd_pipes.txt 2>&1; echo "rc=$?"
    grep -E "pipe|inst_executed|cycles" $O/ncu/fwd_pipes.txt | grep -v "  0$" | head -60 ;;
  ab)  # c and c2 in one call (session 15: the budget holds three calls plus one)
    VARS="qc qctl vp qp" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 560 bash bench/device_ab.sh > /dev/null 2>&1
    for col in quant fwd bwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done ;;
  c)
    VARS="qc tl qctl" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 500 bash bench/device_ab.sh > /dev/null 2>&1
    for col in quant fwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done ;;
  c2)
    VARS="vp qp" TESTS=0 REPS=2 OUT=$O/a2 timeout 300 bash bench/device_ab.sh > /dev/null 2>&1
    for col in fwd bwd train; do python3 bench/ab_table.py $O/a2/device_ab.log --col $col; done ;;
  c64)
    VARS="qc qctl vp qp" TESTS=0 REPS=2 OUT=$O/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" \
      timeout 200 bash bench/device_ab.sh > /dev/null 2>&1
    for col in quant fwd train; do python3 bench/ab_table.py $O/b/device_ab.log --col $col; done ;;
  x)
    B=$B O=$O bash bench/vs-anchors.sh ;;
  *) echo "PHASE is t, ab, c, c2, c64 or x"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s15_${PHASE:-t}.log"
