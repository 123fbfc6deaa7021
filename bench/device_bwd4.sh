#!/bin/bash
# One device call for the v4 backward (docs/perf.md "v4 backward"): a smoke test of the fused kernel
# (compute-sanitizer on it when it fails), the GPU correctness tests with their measured
# GPU-vs-CPU gaps (--nocapture), then `flamia bench attention` A B A: v4 backward, v3.1 backward
# (FLAMIA_ATTN_BWD=v3, same binary), v4 again; optionally the BF16 anchors between.
# Stage here:  bash bench/device_bwd4.sh --stage   (builds, then copies target/release/flamia and the test
# executables into .device-carry/bwd4/), carry that folder, run from the repo root on the device:
#   bash bench/device_bwd4.sh        (logs under $OUT)
# Knobs: TESTS=0 skips the tests; SMOKE_ONLY=1 stops after the smoke test; BENCH_ARGS narrows the
# benchmark (e.g. "--workload 1x65536"); ANCHORS=1 adds bench/anchors.py (about 5 min); V3=0 skips
# the v3.1 backward run; VARIANT_DIRS="d1 d2" adds runs on other kernel sources (FLAMIA_CUDA_DIR).
set -u
C=.device-carry/bwd4
if [ "${1:-}" = "--stage" ]; then
  # build first: a stale `flamia` embeds stale kernel sources (session 22 measured one by mistake)
  . "$(dirname "$0")/../scripts/env.sh"
  cargo build --release -q -p flamia-trainer && cargo test --release -q --no-run -p flamia-kernels -p flamia-trainer \
    2>/dev/null || { echo "--stage: the build failed"; exit 1; }
  rm -rf $C && mkdir -p $C
  cp target/release/flamia $C/
  for t in gpu_quant gpu_attention bridge_cuda model_cuda; do
    f=$(ls -t target/release/deps/$t-* 2>/dev/null | grep -v '\.d$' | head -1)
    [ -n "$f" ] && cp "$f" $C/$t
  done
  ls -la $C; du -sh $C; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
clock() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader; }
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv
SMOKE=long_documents_gqa_are_as_accurate_as_the_reference
echo "=== smoke: $SMOKE"
timeout 90 $C/gpu_attention --ignored --exact $SMOKE --nocapture > "$O/smoke.log" 2>&1
rc=$?
tail -30 "$O/smoke.log"; echo "smoke rc=$rc"
if [ $rc != 0 ] || [ "${SANITIZE:-0}" = 1 ]; then
  echo "=== compute-sanitizer on the smoke test"
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --print-limit 20 $C/gpu_attention --ignored --exact $SMOKE 2>&1 | tail -40
fi
[ "${SMOKE_ONLY:-0}" = 1 ] && exit 0
if [ "${TESTS:-1}" = 1 ]; then
  echo "=== GPU tests"
  timeout 120 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  timeout 360 $C/gpu_attention --ignored --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|error|assert|left|right|rel L2"
  [ -x $C/bridge_cuda ] && timeout 120 $C/bridge_cuda --ignored --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|relative L2|error"
fi
echo "=== A: v4 backward   clock $(clock)"
timeout 240 $B bench attention --json "$O/bwd4a.json" ${BENCH_ARGS:-} || echo "bench v4 rc=$?"
for dir in ${VARIANT_DIRS:-}; do
  echo "=== variant $(cat $dir/REVISION 2>/dev/null) ($dir)   clock $(clock)"
  FLAMIA_CUDA_DIR=$dir timeout 240 $B bench attention --json "$O/$(basename $dir).json" ${BENCH_ARGS:-} || echo "bench $dir rc=$?"
done
if [ "${V3:-1}" = 1 ]; then
  echo "=== B: v3.1 backward (FLAMIA_ATTN_BWD=v3)   clock $(clock)"
  FLAMIA_ATTN_BWD=v3 timeout 240 $B bench attention --json "$O/bwd3.json" ${BENCH_ARGS:-} || echo "bench v3 rc=$?"
fi
if [ "${ANCHORS:-0}" = 1 ]; then
  echo "=== BF16 anchors   clock $(clock)"
  timeout 330 python3 bench/anchors.py > "$O/anchors.log" 2>&1 || echo "anchors rc=$?"
  tail -14 "$O/anchors.log"
fi
if [ "${AGAIN:-1}" = 1 ]; then
  echo "=== A again: v4 backward   clock $(clock)"
  timeout 240 $B bench attention --json "$O/bwd4b.json" ${BENCH_ARGS:-} || echo "bench v4 (2nd) rc=$?"
fi
echo "clock after: $(clock)"
} 2>&1 | tee "$O/device_bwd4.log"
