#!/bin/bash
# One device call for the v4 forward (docs/perf.md "v4"): GPU correctness tests on the embedded
# kernels (v4 forward by default), then `flamia bench attention` A B A: v4, v3.1 forward
# (FLAMIA_ATTN_FWD=v3, same binary), v4 again; optionally the BF16 anchors and cuDNN FP8 between.
# Carry target/release/flamia and the test executables (copied by `bash bench/device_v4.sh --stage`
# into .device-carry/v4/), run from the repo root:  bash bench/device_v4.sh   (logs under $OUT)
# ANCHORS=1 adds bench/anchors.py (about 5 min); CUDNN_FP8=1 adds bench/cudnn_fp8.py (needs .whl);
# VARIANT_DIRS="d1 d2" adds runs on other kernel sources (FLAMIA_CUDA_DIR; each dir holds every
# cuda/ file and a REVISION line); STAGES_AB="2 3" adds v4 runs with other ring depths; TESTS=0 skips the tests; BENCH_ARGS narrows the benchmark (e.g. "--workload 1x65536").
set -u
C=.device-carry/v4
if [ "${1:-}" = "--stage" ]; then
  rm -rf $C && mkdir -p $C
  cp target/release/flamia $C/
  for t in gpu_quant gpu_attention bridge_cuda; do
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
if [ "${TESTS:-1}" = 1 ]; then
  echo "=== GPU tests (v4 forward)"
  timeout 120 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
  timeout 300 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|error|assert|left|right"
  [ -x $C/bridge_cuda ] && timeout 120 $C/bridge_cuda --ignored --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|relative L2|error"
fi
echo "=== A: v4 forward   clock $(clock)"
timeout 200 $B bench attention --json "$O/v4a.json" ${BENCH_ARGS:-} || echo "bench v4 rc=$?"
for dir in ${VARIANT_DIRS:-}; do  # other kernel source sets, same binary (FLAMIA_CUDA_DIR)
  echo "=== variant $(cat $dir/REVISION 2>/dev/null) ($dir)   clock $(clock)"
  FLAMIA_CUDA_DIR=$dir timeout 200 $B bench attention --json "$O/$(basename $dir).json" ${BENCH_ARGS:-} || echo "bench $dir rc=$?"
done
for st in ${STAGES_AB:-}; do  # ring depths to A/B (FLAMIA_FWD_STAGES)
  echo "=== v4 forward, $st stages   clock $(clock)"
  FLAMIA_FWD_STAGES=$st timeout 200 $B bench attention --json "$O/v4s$st.json" ${BENCH_ARGS:-} || echo "bench stages $st rc=$?"
done
echo "=== B: v3.1 forward (FLAMIA_ATTN_FWD=v3)   clock $(clock)"
FLAMIA_ATTN_FWD=v3 timeout 200 $B bench attention --json "$O/v3.json" ${BENCH_ARGS:-} || echo "bench v3 rc=$?"
if [ "${ANCHORS:-0}" = 1 ]; then
  echo "=== BF16 anchors   clock $(clock)"
  timeout 330 python3 bench/anchors.py > "$O/anchors.log" 2>&1 || echo "anchors rc=$?"
  tail -14 "$O/anchors.log"
fi
if [ "${CUDNN_FP8:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  echo "=== cuDNN FP8   clock $(clock)"
  timeout 200 python3 bench/cudnn_fp8.py > "$O/cudnn_fp8.log" 2>&1 || echo "cudnn_fp8 rc=$?"
  tail -12 "$O/cudnn_fp8.log"
fi
echo "=== A again: v4 forward   clock $(clock)"
timeout 200 $B bench attention --json "$O/v4b.json" ${BENCH_ARGS:-} || echo "bench v4 (2nd) rc=$?"
echo "clock after: $(clock)"
} 2>&1 | tee "$O/device_v4.log"
