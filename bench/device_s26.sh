#!/bin/bash
# Prepared in session 25 for the next session (~4 minutes, H200): where the head-dim-64 forward's
# long-document time went (session 25's call 4: 1x65536 21.2 ms against 18.3 in session 19's
# call 3 on e2325f5's sources; d = 128 unchanged). One call, alternately: the current binary
# (new), e2325f5's binary (old), new with the forward's index from threadIdx again (fwg0: session
# 25's uniform index changed this build after the regression), new with FLAMIA_PDL=0 (plain launches), new with
# FLAMIA_FWD_STAGES=3 and =5; d = 64 on 1x65536, 4x16384 and 32x2048, then d = 128 at 1x65536 as
# the control. If old is faster, bisect the commits between e2325f5 and bf9b140 (the launch
# chain) first; if pdl0 recovers it, look at the forward's pdl_trigger placement at d = 64.
# Then (`end`) session 25's CPU-only kernel changes, none run on a GPU when it ended: the
# warpgroup index as a warp-uniform __shfl_sync broadcast in both kernels (commit 2c38845: the
# wgmma descriptors in uniform registers; backward 1,184 -> 1,130 SASS per interior step and its
# step loops' LDL/STL 10 -> 0, forward single body 621 -> 605 per key tile), dK's cross-lane
# Hadamard stages as FFMAs (0ff8549, bitwise the same by construction) and, off by default,
# dK/dV's 8-byte stores (BWD_ST8; the variant st8 turns it on) and the dS tile by stmatrix with
# K's dim-major tile in the matching key order (BWD_DS_STSM; the variant stsm). Four accuracy /
# repeatability tests on new, st8 and stsm, the mutations hadamard-sign, st8-swap and ds-stsm-sel,
# an A/B new / wg0 (the backward's index from threadIdx again) / fwg0 (the forward's single body
# likewise) / st8 / stsm at short lengths,
# and FLAMIA_FWD_CW=0 against new on long documents (the single uniform body may now beat the
# consumer copies, 619 per key tile). Last, why the consumers wait ~1,100 clocks per item for K/V
# (session 25: not DRAM latency, an L2 prefetch did not move it): the phases (BWD_PROF_PHASES) at
# 32x2048 and 256x256 as built, without the dQ stores and reduces (BWD_PROF_NORED: is the K/V TMA
# queued behind them?) and without the item end's stores (BWD_PROF_NOSTORE); timing builds.
# Stage (here): `bash bench/device_s26.sh --stage` (~3 minutes: builds e2325f5's binary in a
# worktree sharing target/, then main's again, the test binary and the kernel-source variants);
# carry .device-carry/bis and .device-carry/var (~61 MB of the 64 MiB cap).
if [ "${1:-}" = --stage ]; then
  set -e
  R=$PWD; B=.device-carry/bis; V=.device-carry/var
  rm -rf $B $V && mkdir -p $B $V
  git worktree add -f /tmp/wt19 e2325f5
  (cd /tmp/wt19 && . $R/scripts/env.sh && CARGO_TARGET_DIR=$R/target cargo build --release -p flamia-trainer)
  cp target/release/flamia $B/old
  git worktree remove --force /tmp/wt19
  # Cargo names a workspace crate's artifacts by a hash that does not depend on the checkout's
  # path and records their inputs relative to the package: after that build, main's `cargo build`
  # takes the old checkout's artifacts as fresh (session 25 got a binary with e2325f5's kernels
  # that way). So main's sources are touched first, and the embedded kernels checked after.
  find . -path ./target -prune -o -path ./.venv -prune -o -path ./.git -prune -o \( -name '*.rs' -o \
    -name '*.cu' -o -name '*.cuh' -o -name Cargo.toml \) -print0 | xargs -0 touch
  . scripts/env.sh
  cargo build --release -p flamia-trainer
  cargo test --release --no-run -p flamia-kernels 2>&1 | grep -q gpu_attention
  cp target/release/flamia $B/new
  cp "$(ls -t target/release/deps/gpu_attention-* | grep -v '\.d$' | head -1)" $B/gpu_attention
  strip $B/*
  [ "$(grep -ac fwd_qd_writer $B/new)" -gt 0 ] && [ "$(grep -ac fwd_qd_writer $B/old)" = 0 ] \
    || { echo "device_s26 --stage: new/old binaries are not main's / e2325f5's"; exit 1; }
  for n in wg0 fwg0 st8 stsm prof pnored pnostore; do mkdir $V/$n && cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh $V/$n/; done
  sed -i 's|^  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);$|  const int wg = threadIdx.x >> 7;|' $V/wg0/attn_bwd_v4.cu
  sed -i 's|^  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);.*$|  const int wg = FWD_CW_CONST ? __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0) : (int)(threadIdx.x >> 7);|' $V/fwg0/attn_fwd_v4.cu
  sed -i 's|^#define BWD_ST8 0$|#define BWD_ST8 (BWD_WALK_UP \|\| HEAD_DIM != 128)|' $V/st8/attn_bwd_v4.cu
  sed -i 's|^#define BWD_DS_STSM 0$|#define BWD_DS_STSM (BWD_KD_XPOSE == 2 \&\& BWD_CVT4 \&\& !BWD_ROW_DS)|' $V/stsm/attn_bwd_v4.cu
  sed -i '1i #define BWD_PROF_PHASES 1' $V/prof/attn_bwd_v4.cu $V/pnored/attn_bwd_v4.cu $V/pnostore/attn_bwd_v4.cu
  sed -i '1i #define BWD_PROF_NORED 1' $V/pnored/attn_bwd_v4.cu
  sed -i '1i #define BWD_PROF_NOSTORE 1' $V/pnostore/attn_bwd_v4.cu
  for n in wg0 fwg0 st8 stsm; do cmp -s $V/$n/attn_bwd_v4.cu flamia-kernels/cuda/attn_bwd_v4.cu \
    && cmp -s $V/$n/attn_fwd_v4.cu flamia-kernels/cuda/attn_fwd_v4.cu && { echo "variant $n unchanged (sed out of date)"; exit 1; }; done
  du -sh $B $V; exit 0
fi
# Two calls' worth (~11 minutes in all): `bash bench/device_s26.sh d64` (the forward's bisect and
# the d = 128 control, ~4.5 minutes), then `bash bench/device_s26.sh end` (the new kernel changes' tests,
# mutations, A/B and the K/V-wait phases, ~9 minutes).
set -u
mode=${1:-}
[ "$mode" = d64 ] || [ "$mode" = end ] || { echo "usage: bash bench/device_s26.sh d64|end"; exit 2; }
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
D=.device-carry/bis
run() {  # name, env..., then the bench arguments after --
  local name=$1; shift; local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "--- $name"
  env "${envs[@]}" timeout 60 "$D/$([ "$name" = old ] && echo old || echo new)" bench attention "$@" 2>&1 | grep -E "^[0-9]"
}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
if [ $mode = d64 ]; then
for r in 1 2; do
  echo "=== d = 64, round $r"; date
  for v in new old fwg0 pdl0 st3 st5; do
    case $v in
      pdl0) e=(FLAMIA_PDL=0) ;; st3) e=(FLAMIA_FWD_STAGES=3) ;; st5) e=(FLAMIA_FWD_STAGES=5) ;;
      fwg0) e=(FLAMIA_CUDA_DIR=.device-carry/var/fwg0) ;; *) e=(X=1) ;;
    esac
    run $v "${e[@]}" -- --head-dim 64 --workload 1x65536 --workload 4x16384 --workload 32x2048
  done
  echo "=== d = 128 control, round $r"
  for v in new old pdl0; do
    case $v in pdl0) e=(FLAMIA_PDL=0) ;; *) e=(X=1) ;; esac
    run $v "${e[@]}" -- --workload 1x65536
  done
done
fi
if [ $mode = end ]; then
echo "=== the item end: tests on new and st8, mutations, A/B new / st8 / hfma0"; date
for v in new st8 stsm; do
  e=(X=1); [ $v != new ] && e=(FLAMIA_CUDA_DIR=.device-carry/var/$v)
  for t in mxfp8_causal_gqa_is_as_accurate_as_the_reference head_dim_64_is_as_accurate_as_the_reference \
    repeated_runs_are_bitwise_identical precision_options_and_no_hadamard_are_as_accurate_as_the_reference; do
    env "${e[@]}" timeout 90 $D/gpu_attention --ignored --exact $t 2>&1 | grep -E "test result|panicked" | sed "s/^/$v: /"
  done
done
ONLY=hadamard-sign T=$D/gpu_attention OUT=$O/mut timeout 100 bash bench/gpu_mutations.sh 2>&1 | tail -1
ONLY=st8-swap SRC=.device-carry/var/st8 T=$D/gpu_attention OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -2
ONLY=ds-stsm-sel SRC=.device-carry/var/stsm T=$D/gpu_attention OUT=$O/mut timeout 150 bash bench/gpu_mutations.sh 2>&1 | tail -2
for r in 1 2; do
  for v in new wg0 fwg0 st8 stsm; do
    e=(X=1); [ $v != new ] && e=(FLAMIA_CUDA_DIR=.device-carry/var/$v)
    run $v "${e[@]}" -- --workload 256x256 --workload 64x1024 --workload 32x2048
    run $v "${e[@]}" -- --head-dim 64 --workload 256x256
  done
  for v in new cw0 wg0; do
    e=(X=1); [ $v = cw0 ] && e=(FLAMIA_FWD_CW=0); [ $v = wg0 ] && e=(FLAMIA_CUDA_DIR=.device-carry/var/wg0)
    run $v "${e[@]}" -- --workload 1x65536 --workload 4x16384
  done
done
echo "=== K/V wait: phases as built, without the dQ reduces, without the item end's stores"; date
for v in prof pnored pnostore; do
  for wl in 32x2048 256x256; do
    echo "--- $v $wl"
    FLAMIA_CUDA_DIR=.device-carry/var/$v timeout 40 $D/new bench attention --workload $wl 2>&1 | grep -E "bwd4 (phases|producer)" | tail -6
  done
done
fi
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader
date
} 2>&1 | tee "$O/s26-$mode.log"
