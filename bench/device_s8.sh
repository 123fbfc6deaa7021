#!/bin/bash
# The device call prepared in session 8 (which had no device time left): the bwd-diet branch's
# backward and the fwd-overlap branch's forward, checked and timed against main's kernels with
# one binary (this branch's), kernel sources swapped through FLAMIA_CUDA_DIR.
#   1. every GPU test on this branch's kernels (incl. folded_key_factors_give_bitwise_the_per_row_backward);
#   2. a mutation the new test must catch (keys past the document left unmasked in the folded
#      form): that test and the non-causal accuracy test must FAIL on it;
#   3. the forward overlap (FWD_OVERLAP=1): accuracy, repeat and leakage tests;
#   4. `flamia bench attention`, nine workloads: d = 128 diet / main / nopipe (diet without the
#      dV/dK piece pipeline, BWD_KV_PIPE 0) / fwdov, twice (VARS128, ROUNDS); d = 64 diet / main /
#      fwdov once (VARS64).
# PHASE=tests runs 1-3, PHASE=bench 4 (two calls: all of it may pass one call's 600 s);
# PHASE=anchors: `flamia bench attention`, bench/anchors.py (BF16, ~5 min), ours again.
# Stage here (after `cargo build --release -p flamia-trainer -p flamia-dist` and
# `cargo test --release --no-run -p flamia-kernels -p flamia-trainer`):
#   bash bench/device_s8.sh --stage MAIN_REV FWDOV_REV
# then carry .device-carry/bwd4 and .device-carry/var and run `bash bench/device_s8.sh` there.
set -u
C=.device-carry/bwd4; V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  main_rev=${2:?main revision}; fwdov_rev=${3:?fwd-overlap revision}
  bash bench/device_bwd4.sh --stage >/dev/null
  rm -rf $V && mkdir -p $V/main $V/mut $V/fwdov $V/nopipe
  for f in $(git ls-tree --name-only "$main_rev" flamia-kernels/cuda/ | grep -E '\.(cu|cuh)$'); do
    git show "$main_rev:$f" > $V/main/$(basename "$f")
  done
  cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/mut/
  # the mutation: keys past the document's end no longer masked in the folded (BWD_KEY_BLOCKS) form
  python3 - "$V/mut/attn_bwd_v4.cu" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = "thr[r] = r0 + 8 * r <= lim ? r0 + 8 * r - off - 2 * qd : 1 << 20;"
assert old in s, "mutation site not found"
open(p, "w").write(s.replace(old, "thr[r] = r0 + 8 * r - off - 2 * qd;"))
EOF
  cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/nopipe/
  sed -i '1i #define BWD_KV_PIPE 0' $V/nopipe/attn_bwd_v4.cu
  for f in attn_fwd_v4.cu wgmma.cuh; do git show "$fwdov_rev:flamia-kernels/cuda/$f" > $V/fwdov/$f; done
  sed -i '1i #define FWD_OVERLAP 1' $V/fwdov/attn_fwd_v4.cu
  du -sh $C $V; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
clock() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader; }
res() { grep -E "test result|panicked at|FAILED|^test .* \.\.\. (ok|FAILED)"; }
PHASE=${PHASE:-all}  # tests | bench | all (all may pass the 600 s limit of one call: ~4 + ~6 min) | anchors
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv
if [ "$PHASE" != bench ]; then
  echo "=== 1. GPU tests, this branch's kernels"; date
  for t in gpu_attention gpu_quant bridge_cuda; do
    timeout 240 $C/$t --ignored --test-threads=1 > "$O/$t.log" 2>&1; echo "$t rc=$?"; res < "$O/$t.log"
  done
  echo "=== 2. mutation (must FAIL)"; date
  FLAMIA_CUDA_DIR=$V/mut timeout 120 $C/gpu_attention --ignored --test-threads=1 --exact \
    folded_key_factors_give_bitwise_the_per_row_backward mxfp8_non_causal_mha_is_as_accurate_as_the_reference \
    > "$O/mutation.log" 2>&1; echo "mutation rc=$? (nonzero expected)"; res < "$O/mutation.log"
  echo "=== 3. forward overlap: accuracy, repeat, leakage"; date
  FLAMIA_CUDA_DIR=$V/fwdov timeout 200 $C/gpu_attention --ignored --test-threads=1 accurate repeat leakage isolated \
    > "$O/fwdov_tests.log" 2>&1; echo "fwdov tests rc=$?"; res < "$O/fwdov_tests.log"
fi
if [ "$PHASE" != tests ]; then
  run() {  # head dim, variant, round
    echo "=== 4. d=$1 $2 ($3)   clock $(clock)"
    if [ "$2" = diet ]; then timeout 100 $B bench attention --head-dim $1 --json "$O/b_$1_$2_$3.json" 2>&1 | grep -E "^[0-9]|^lognormal|^workload"
    else FLAMIA_CUDA_DIR=$V/$2 timeout 100 $B bench attention --head-dim $1 --json "$O/b_$1_$2_$3.json" 2>&1 | grep -E "^[0-9]|^lognormal|^workload"; fi
  }
  for r in $(seq ${ROUNDS:-2}); do for v in ${VARS128:-diet main nopipe fwdov}; do run 128 $v $r; done; done
  for v in ${VARS64:-diet main fwdov}; do run 64 $v 1; done
fi
if [ "$PHASE" = anchors ]; then  # the issue's comparison, same call: ours, BF16 anchors, ours
  B=$B O=$O bash bench/vs-anchors.sh  # ours (A), bench/anchors.py, ours (B), the table
fi
date
} 2>&1 | tee "$O/s8_$PHASE.log"
