#!/bin/bash
# Session 51's device calls. Carry .device-carry/s49, .device-carry/s50 and .device-carry/kc (the
# PTX cache); s50 holds session 50's final tree (flamia.xz, tests.txz), put over s49's.
#   p: the short documents' phases on today's default (the bench's dkdv column: the v4
#      backward's dQ conversion alone, never run in a benchmark before) at 256x256, 64x1024,
#      32x2048 and 16x4096, beside head chunks small enough for one chunk's FP32 dQ accumulator
#      to fit the L2 (FLAMIA_BWD_SCRATCH_MIB=32: one head a chunk, 32 MiB; =128: four heads),
#      two rounds; then on an H200 only the quantiser's knock-outs (device_s48.sh q) and its 8
#      CTAs per SM (device_s50.sh k): perf.md Next 5
# Modes t, k, h and s measured BWD_DQ_LAST (dQ converted by its last contributor), which lost
# everywhere and was removed: they need the sources of commits 7faf460 (t, k's knock-outs from
# 2374071), 9492420 / f5ddd3f (h) and ebb8717 (s); docs/perf.md "Session 51".
#   t: dQ converted by its last contributor (BWD_DQ_LAST; carry .device-carry/s51 and kc: the
#      tree's flamia and test binaries): the new GPU test first (FLAMIA_BWD_HANG_TRAP=1, so a
#      protocol hang fails at once), then the nine workloads by default against
#      FLAMIA_BWD_DQ_LAST=0 (bwd_dq_convert after the fused kernel), two rounds, then the whole
#      GPU suite (device_suite.sh all)
#   k: BWD_DQ_LAST's knock-outs (the tree's sources with BWD_PROF_DQL_NOCONV: the barriers and
#      the release alone; BWD_PROF_DQL_NOWAIT: no wait for the turn, wrong sums) beside the
#      default and FLAMIA_BWD_DQ_LAST=0, two rounds at 256x256, 64x1024 and 4x16384
#   h: the tree's kernel sources (FLAMIA_CUDA_DIR=flamia-kernels/cuda: BWD_DQ_LAST with each
#      row's scale and sum loaded before the rows' arithmetic) under the new GPU test, then the
#      nine beside FLAMIA_BWD_DQ_LAST=0, two rounds
#   s: the tree's sources (the conversion stage by stage over each thread's rows, out of line)
#      under the new GPU test, then beside FLAMIA_BWD_DQ_LAST=0 and the same sources inlined
#      (BWD_DQL_INLINE 1), two rounds at 256x256, 64x1024, 16x4096 and 4x16384
#   x: for the next structural choice (carry .device-carry/s50 and kc: session 50's flamia, whose
#      kernels are today's): the fused backward on fewer SMs (FLAMIA_BWD_CTAS=116 and 100: what
#      converter CTAs beside it would cost) and without its dQ work (the tree's sources with
#      BWD_PROF_NODQ, NORED and NOSEM: no dQ products, reduces or turns, wrong dQ: the floor of a
#      dK/dV-only kernel), two rounds at 256x256, 64x1024, 32x2048 and 16x4096
#   r: bwd_dq_convert with 1, 2, 4 and 8 rows per thread (FLAMIA_DQ_CONVERT_ROWS; carry
#      .device-carry/s51 restaged with the tree's flamia and gpu_attention, and kc): the GPU tests
#      that run the conversion, then the bench's dkdv column (the conversion alone) per value, two
#      rounds at 256x256, 64x1024, 16x4096 and 1x65536
#   f: the final tree's binaries (carry .device-carry/s50 and kc): the contract tests (bitwise
#      repeatability whatever the reduce order, isolation, leakage, accuracy, walking up, d = 64)
#      and the conversion's, in four processes
#   c: (prepared for session 52; carry .device-carry/s50, restaged from the final tree, and kc)
#      the conversion's rate on a few SMs, what converter CTAs beside the fused backward would
#      move: bwd_dq_convert alone (the bench's dkdv column) on 8, 16, 33 and 66 CTAs of 256
#      threads (FLAMIA_DQ_CONVERT_CTAS) with 2 and 8 rows a thread, beside the full grid, at
#      256x256 and 64x1024 (0.806 GB: GB/s per SM = 806 / ms / CTAs); one round, ~1.5 minutes
#   v: (prepared for session 52, as c) dQ converted beside the fused kernel (bwd_dq_follow,
#      FLAMIA_BWD_FOLLOWERS): its GPU test (hang trap on), the same test on the tree's sources
#      with the follower waiting for one partial less (must fail: it then reads sums still being
#      added), then the short workloads by default against 8, 16 and 24 follower SMs, two rounds
set -u
C=.device-carry/s49
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; export OUT=$O
mode=${1:?usage: device_s51.sh p|t|k|h|s|x|r|f|c|v}
if [ "$mode" = x ]; then
  C=.device-carry/s50
  xz -dc $C/flamia.xz > $C/flamia && chmod +x $C/flamia || { echo "no s50 flamia"; exit 1; }
elif [ "$mode" = p ]; then
  tar -C $C -xJf $C/s49.txz || { echo "device_s51.sh: $C/s49.txz did not unpack"; exit 1; }
  xz -dc .device-carry/s50/flamia.xz > $C/flamia && chmod +x $C/flamia && echo "flamia from .device-carry/s50"
else  # (.device-carry/s51 held each call's binaries; since the session's end .device-carry/s50 holds the final tree's)
  C=.device-carry/s50
  xz -dc $C/flamia.xz > $C/flamia && chmod +x $C/flamia && tar -C $C -xJf $C/tests.txz || { echo "no s50 binaries"; exit 1; }
fi
# src_variant DIR LINE...: the tree's kernel sources in DIR, LINE... (defines) put before attn_bwd_v4.cu's
src_variant() {
  local d=$1; shift
  rm -rf "$d" && cp -r flamia-kernels/cuda "$d" && { printf '%s\n' "$@"; cat flamia-kernels/cuda/attn_bwd_v4.cu; } > "$d/attn_bwd_v4.cu"
}
# dql_test LOG: BWD_DQ_LAST's GPU test on the tree's sources (hang trap on), its lines from LOG
dql_test() {
  echo "=== the new GPU test on the tree's sources (hang trap on)"
  FLAMIA_CUDA_DIR=flamia-kernels/cuda FLAMIA_BWD_HANG_TRAP=1 timeout 200 $C/gpu_attention --ignored --exact \
    dq_converted_by_its_last_contributor_gives_bitwise_the_same --nocapture > "$1" 2>&1
  echo "new test rc=$?"; grep -E "^test |test result|panicked|hang|zeros of" "$1" | head -20
}
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
p) W=(--workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096)
   for r in 1 2; do
     for v in - FLAMIA_BWD_SCRATCH_MIB=32 FLAMIA_BWD_SCRATCH_MIB=128; do
       bench_mhz "short $v round $r" "$v" "${W[@]}"
       cp /tmp/b.json "$O/p-$r-${v##*=}.json" 2>/dev/null
     done
   done ;;
t) echo "=== the new GPU test (hang trap on)"
   FLAMIA_BWD_HANG_TRAP=1 timeout 200 $C/gpu_attention --ignored --exact dq_converted_by_its_last_contributor_gives_bitwise_the_same \
     --nocapture > "$O/t-new.log" 2>&1; rc=$?
   grep -E "^test |test result|panicked|hang|zeros of|left|right" "$O/t-new.log" | head -30; echo "new test rc=$rc"
   for r in 1 2; do
     for v in - FLAMIA_BWD_DQ_LAST=0; do
       bench_mhz "nine $v round $r" "$v"
       cp /tmp/b.json "$O/t-$r-${v##*=}.json" 2>/dev/null
     done
   done
   if [ $rc = 0 ]; then TLIM=${TLIM:-280} T=$C JOBS=${JOBS:-6} bash "$(dirname "$0")/device_suite.sh" all; else echo "(suite skipped: the new test failed)"; fi ;;
k) for k in NOCONV NOWAIT; do src_variant $C/cuda-$k "#define BWD_PROF_DQL_$k 1"; done
   for r in 1 2; do
     for v in FLAMIA_BWD_DQ_LAST=0 FLAMIA_CUDA_DIR=$C/cuda-NOCONV FLAMIA_CUDA_DIR=$C/cuda-NOWAIT -; do
       bench_mhz "knock-outs $v round $r" "$v" --workload 256x256 --workload 64x1024 --workload 4x16384
     done
   done ;;
h) dql_test "$O/h-new.log"
   for r in 1 2; do
     for v in FLAMIA_BWD_DQ_LAST=0 FLAMIA_CUDA_DIR=flamia-kernels/cuda; do
       bench_mhz "nine $v round $r" "$v"
     done
   done ;;
s) dql_test "$O/s-new.log"
   d=$C/cuda-inline; src_variant $d "#define BWD_DQL_INLINE 1"
   for r in 1 2; do
     for v in FLAMIA_BWD_DQ_LAST=0 FLAMIA_CUDA_DIR=flamia-kernels/cuda FLAMIA_CUDA_DIR=$d; do
       bench_mhz "stage-major $v round $r" "$v" --workload 256x256 --workload 64x1024 --workload 16x4096 --workload 4x16384
     done
   done ;;
x) d=$C/cuda-nodq; src_variant $d "#define BWD_PROF_NODQ 1" "#define BWD_PROF_NORED 1" "#define BWD_PROF_NOSEM 1"
   for r in 1 2; do
     for v in - FLAMIA_BWD_CTAS=116 FLAMIA_BWD_CTAS=100 FLAMIA_CUDA_DIR=$d; do
       bench_mhz "fewer SMs / no dQ: $v round $r" "$v" --workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096
     done
   done ;;
r) echo "=== the conversion's GPU tests"
   FLAMIA_BWD_HANG_TRAP=1 timeout 240 $C/gpu_attention --ignored --exact --test-threads=1 \
     dq_conversion_alone_rewrites_bitwise_the_backwards_dq dq_partials_by_stmatrix_give_bitwise_the_same \
     first_dq_partials_stored_give_bitwise_the_zeroed_accumulator mxfp8_causal_gqa_is_as_accurate_as_the_reference \
     head_dim_64_is_as_accurate_as_the_reference > "$O/r-tests.log" 2>&1
   echo "tests rc=$?"; grep -E "^test |test result|panicked|differ" "$O/r-tests.log" | head -20
   for r in 1 2; do
     for v in FLAMIA_DQ_CONVERT_ROWS=1 FLAMIA_DQ_CONVERT_ROWS=2 FLAMIA_DQ_CONVERT_ROWS=4 FLAMIA_DQ_CONVERT_ROWS=8; do
       bench_mhz "conversion rows $v round $r" "$v" --workload 256x256 --workload 64x1024 --workload 16x4096 --workload 1x65536
     done
   done ;;
f) TLIM=${TLIM:-220} par_tests 4 final $C/gpu_attention repeated_runs_are_bitwise_identical \
     documents_are_isolated_bitwise causal_leakage_has_the_reference_properties \
     dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in walking_up_is_accurate_repeatable_and_ordered \
     head_dim_64_is_bitwise_repeatable_whatever_the_reduce_order_and_chunking \
     long_documents_gqa_are_as_accurate_as_the_reference dq_conversion_alone_rewrites_bitwise_the_backwards_dq
   grep -hE "^test .*(ok|FAILED)$|test result|panicked" "$O"/final-j*.log ;;
c) bench_mhz "conversion: the full grid" - --workload 256x256 --workload 64x1024
   for n in 8 16 33 66; do
     for rows in 2 8; do
       bench_mhz "conversion on $n CTAs, $rows rows a thread" "FLAMIA_DQ_CONVERT_CTAS=$n FLAMIA_DQ_CONVERT_ROWS=$rows" \
         --workload 256x256 --workload 64x1024
     done
   done ;;
v) T1=dq_converted_beside_the_fused_kernel_gives_bitwise_the_same
   echo "=== $T1 (hang trap on)"
   FLAMIA_BWD_HANG_TRAP=1 timeout 200 $C/gpu_attention --ignored --exact $T1 > "$O/v-test.log" 2>&1
   echo "rc=$?"; grep -E "^test |test result|panicked" "$O/v-test.log" | head
   d=$C/cuda-follow-early; rm -rf $d && cp -r flamia-kernels/cuda $d
   sed -i 's|2 \* (q0 / BKT + 1));  // (acquire)|2 * (q0 / BKT + 1) - 1);  // (acquire)|' $d/attn_bwd_v4.cu
   if grep -q "2 \* (q0 / BKT + 1) - 1);" $d/attn_bwd_v4.cu; then
     echo "=== the mutation (one partial less): the test must fail"
     FLAMIA_CUDA_DIR=$d timeout 200 $C/gpu_attention --ignored --exact $T1 > "$O/v-mut.log" 2>&1
     echo "rc=$? (nonzero expected)"; grep -E "test result|panicked|differs" "$O/v-mut.log" | head -4
   else
     echo "(the mutation's pattern did not match: not run)"
   fi
   for r in 1 2; do
     for v in - FLAMIA_BWD_FOLLOWERS=8 FLAMIA_BWD_FOLLOWERS=16 FLAMIA_BWD_FOLLOWERS=24; do
       bench_mhz "followers $v round $r" "$v" --workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096
     done
   done ;;
*) echo "device_s51.sh: unknown mode '$mode' (p, t, k, h, s, x, r, f, c, v)"; exit 2 ;;
esac
kcache_pack
date
} 2>&1 | tee "$O/s51-$mode.log"
if [ "$mode" = p ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  xz -dc .device-carry/s50/flamia.xz > .device-carry/s50/flamia && chmod +x .device-carry/s50/flamia \
    && C=.device-carry/s50 bash "$(dirname "$0")/device_s48.sh" q
  bash "$(dirname "$0")/device_s50.sh" k
fi
