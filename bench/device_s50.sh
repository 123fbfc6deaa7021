#!/bin/bash
# Session 50's prepared call for the next session. Carry .device-carry/s49, .device-carry/s50,
# .device-carry/kc and .whl (47 MB): s49.txz holds session 43's binary (old/flamia) and older
# binaries, s50 the final tree's flamia (flamia.xz) and test binaries (tests.txz), which
# device_s49.sh puts over s49's.
#   n: the standing on the final tree (device_s49.sh a: ours, the BF16 anchors, cuDNN FP8, ours
#      again; ~5 minutes; the table's dkdv column is the v4 backward's dQ conversion alone,
#      which bench/compare.py turns into its share of the call), then on an H200 only the Q/K/V
#      quantiser's knock-outs (device_s48.sh q on s50's binary, ~3-4 minutes: is the H200's
#      quantiser, 78.5-80.7% of the copy in session 45, bound by its own per-SM rate? perf.md
#      Next 5). On an H100 the knock-outs ran in session 48 and are skipped.
#   k: the Q/K/V quantiser with 8 CTAs per SM (QUANT_CTAS_PER_SM=8: 64 registers, 36 bytes of
#      spills, against 7 CTAs at 72 registers and none; the dO launch keeps its 5) beside the default, two rounds at
#      256x256, 64x1024 and 1x65536 (~1.5 minutes): more warps per SM for a quantiser bound by its
#      per-SM latency (the H200 hypothesis of perf.md Next 5; session 7 measured deeper
#      prefetch and more CTAs slower, on the kernel of then).
set -u
mode=${1:?usage: device_s50.sh n|k}
case $mode in
k) C=.device-carry/s50
   xz -dc $C/flamia.xz > $C/flamia && chmod +x $C/flamia
   . "$(dirname "$0")/device-env.sh"
   . "$(dirname "$0")/device-bench.sh"
   O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
   d=$C/cuda-ctas8
   rm -rf $d && cp -r flamia-kernels/cuda $d && { printf '#if !defined(DELTA) || DELTA == 0\n#define QUANT_CTAS_PER_SM 8\n#endif\n'; cat flamia-kernels/cuda/quant.cu; } > $d/quant.cu
   kcache_setup
   {
   nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
   for r in 1 2; do
     for v in - "FLAMIA_CUDA_DIR=$d"; do
       bench_mhz "quantiser CTAs $v round $r" "$v" --workload 256x256 --workload 64x1024 --workload 1x65536
     done
   done
   kcache_pack
   } 2>&1 | tee "$O/s50-k.log" ;;
n) bash "$(dirname "$0")/device_s49.sh" a
   if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
     xz -dc .device-carry/s50/flamia.xz > .device-carry/s50/flamia && chmod +x .device-carry/s50/flamia \
       && C=.device-carry/s50 bash "$(dirname "$0")/device_s48.sh" q
   else
     echo "(not an H200: the quantiser's knock-outs ran on an H100 in session 48; skipped)"
   fi ;;
*) echo "device_s50.sh: unknown mode '$mode' (n, k)"; exit 2 ;;
esac
