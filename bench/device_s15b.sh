#!/bin/bash
# Session 15's second pair of device calls: the landed defaults checked (quantiser chunks,
# BWD_QPERM on) and the forward variants measured. Stage once, here:
#   source scripts/env.sh
#   cargo build --release -p flamia-trainer -p flamia-dist
#   cargo test --release --no-run -p flamia-kernels -p flamia-trainer
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*
#   bash bench/device_s15b.sh --stage      (.device-carry/var: sp = FLAMIA_FWD_SPLITPV=1,
#                                           pp = the sources with FWD_PINGPONG 1)
# then carry .device-carry/bwd4 and .device-carry/var and run, chained:
#   PHASE=t bash bench/device_s15b.sh   (~8 min) every GPU test of gpu_quant, gpu_attention and
#                                       bridge_cuda on the defaults, and the mutations in MUTS
#   PHASE=b bash bench/device_s15b.sh   (~6 min) base / sp / pp on the nine workloads (fwd, train),
#                                       the precision options (--causally-safe) beside the default,
#                                       one 131,072-token row (peak memory), and the 1B model at
#                                       16K rows, bf16 against mxfp8 (bench/trainer_1b.sh)
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  rm -rf $V; mkdir -p $V/sp $V/pp && echo FLAMIA_FWD_SPLITPV=1 > $V/sp/env
  cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/pp/ && sed -i '1i #define FWD_PINGPONG 1' $V/pp/attn_fwd_v4.cu
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
case "${PHASE:-t}" in
  t)
    for t in gpu_quant gpu_attention bridge_cuda; do
      echo "=== $t (all GPU tests)"; date
      timeout ${TLIM:-300} $C/$t --ignored --test-threads=1 > $O/$t.log 2>&1; echo "rc=$?"
      grep -E "test result|panicked|FAILED|^test .* (ok|FAILED)$" $O/$t.log | tail -40
    done
    echo "=== mutations (must be caught)"; date
    for m in ${MUTS:-quant-chunk-nozero quant-chunk-slot bwd-qperm-plain-q}; do ONLY=$m OUT=$O/mut bash bench/gpu_mutations.sh; done ;;
  b)
    echo "=== A/B base / sp / pp, nine workloads"; date
    VARS="${VARS:-sp pp}" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 240 bash bench/device_ab.sh > /dev/null 2>&1
    for col in fwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
    echo "=== precision options (--causally-safe) beside the default"; date
    for r in 1 2; do
      for o in "" --causally-safe; do echo "--- ${o:-default} ($r)"; timeout 60 $B bench attention $o 2>&1 | grep -E "^[0-9]|^lognormal"; done
    done
    echo "=== one 131,072-token row"; date
    timeout 60 $B bench attention --workload 1x131072 2>&1 | grep -E "^[0-9]|^workload"
    echo "=== 1B at 16K rows, bf16 and mxfp8"; date
    B=$B ROWS=16384 OOM_CHECK=0 OUT=$O/t1b timeout 280 bash bench/trainer_1b.sh 2>&1 | tail -12 ;;
  *) echo "PHASE is t or b"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s15b_${PHASE:-t}.log"
