#!/bin/bash
# One device call: GPU correctness tests of this tree's kernels, then the attention benchmark of
# this tree's kernels (B) against a baseline set of kernel sources (A, loaded through
# FLAMIA_CUDA_DIR by the same binary) and the BF16 anchors, in the order B A anchors B (the
# card's clock drifts with load). Prepare the baseline here first, then carry it:
#   bash bench/ab_kernels.sh --prepare <git-rev>      (writes bench/kernels-base/, git-ignored)
# On the device, from the repo root, with target/release/flamia (or B=path), the gpu_* test
# executables under target/release/deps (or TEST_BIN_DIR=dir) and bench/kernels-base carried:
#   bash bench/ab_kernels.sh                           (logs and JSON under $OUT)
# BENCH_ARGS (e.g. "--workload 4x16384") narrows the benchmark runs; VARIANT_DIRS="dir ..." adds
# more kernel source sets (each with a REVISION line saying what it is) after A.
set -u
if [ "${1:-}" = "--prepare" ]; then
  rev=${2:?usage: bench/ab_kernels.sh --prepare <git-rev>}
  rm -rf bench/kernels-base && mkdir -p bench/kernels-base
  for f in $(git ls-tree --name-only "$rev" flamia-kernels/cuda/); do
    git show "$rev:$f" > "bench/kernels-base/$(basename "$f")"
  done
  echo "$rev" > bench/kernels-base/REVISION
  ls bench/kernels-base; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
B=${B:-target/release/flamia}; O=${OUT:-/tmp/flamia-out}; BASE=${BASE:-bench/kernels-base}; mkdir -p "$O"
D=${TEST_BIN_DIR:-target/release/deps}
exe() { ls -t $D/$1 $D/$1-* 2>/dev/null | grep -v '\.d$' | head -1; }
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
echo "=== GPU tests, this tree's kernels"
$(exe gpu_quant) --ignored --test-threads=1 2>&1 | grep -E "^test |test result"
$(exe gpu_attention) --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|error"
if [ -n "$(exe bridge_cuda)" ]; then
  echo "=== trainer bridge on CUDA (workspace reuse, accuracy vs exact)"
  $(exe bridge_cuda) --ignored --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|relative L2|error"
fi
echo "=== GPU attention tests, FLAMIA_ATTN_PROMOTE=3 (FP32-promoted dP and S variant)"
FLAMIA_ATTN_PROMOTE=3 $(exe gpu_attention) --ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|error"
echo "=== B: this tree's kernels"
$B bench attention --json "$O/new1.json" ${BENCH_ARGS:-} || echo "bench B failed rc=$?"
echo "=== A: kernels of $(cat $BASE/REVISION 2>/dev/null) ($BASE)"
FLAMIA_CUDA_DIR=$BASE $B bench attention --json "$O/base.json" ${BENCH_ARGS:-} || echo "bench A failed rc=$?"
for dir in ${VARIANT_DIRS:-}; do  # more kernel source sets, e.g. one change left out
  echo "=== variant: $(cat $dir/REVISION 2>/dev/null) ($dir)"
  FLAMIA_CUDA_DIR=$dir $B bench attention --json "$O/$(basename $dir).json" ${BENCH_ARGS:-} || echo "bench $dir failed rc=$?"
done
if [ -z "${NO_ANCHORS:-}" ]; then
  echo "=== BF16 anchors"
  timeout ${ANCHOR_TIMEOUT:-300} python3 bench/anchors.py > "$O/anchors.log" 2>&1 || echo "anchors rc=$?"
  tail -12 "$O/anchors.log"
fi
echo "=== B again"
$B bench attention --json "$O/new2.json" ${BENCH_ARGS:-} || echo "bench B (2nd) failed rc=$?"
[ -f "$O/anchors.json" ] && python3 bench/compare.py "$O/new1.json" "$O/anchors.json" "$O/new2.json"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$O/ab.log"
