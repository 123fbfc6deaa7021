#!/bin/bash
# Where the v4 kernels' time goes: Nsight Compute (full set, source counters) on one launch of
# each kernel in KERNELS during `flamia bench attention --workload WL`, written under $OUT as
# KERNEL.details.txt (ncu's details page) and KERNEL.sass.csv.gz (per-SASS-instruction counters
# and warp-stall samples; summarise it here with `python3 scripts/ncu-stalls.py FILE`).
# On the device, from the repo root, with the release binary carried:
#   bash bench/ncu-kernels.sh                      (~1 minute for the three kernels)
# Knobs: B (binary, target/release/flamia), KERNELS ("attn_bwd_v4 attn_fwd_v4 quant_e4m3"),
# WL (1x65536), HEAD_DIM (128), FLAMIA_CUDA_DIR (kernel sources to profile instead of the
# embedded ones), SKIP (launches of the kernel to skip first: 3, past the warm-up's first
# compiles). At 1x65536 the backward runs in two head chunks: one launch is half the call.
# The clocks are left alone (--clock-control none, as the device notes ask).
set -u
B=${B:-target/release/flamia}
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null) || { echo "ncu not found"; exit 1; }
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
for k in ${KERNELS:-attn_bwd_v4 attn_fwd_v4 quant_e4m3}; do
  echo "=== ncu $k (${WL:-1x65536}, d = ${HEAD_DIM:-128})"; date
  timeout 200 $NCU --clock-control none --set full --import-source no -k "$k" --launch-skip "${SKIP:-3}" \
    --launch-count 1 -f -o "/tmp/$k" $B bench attention --workload "${WL:-1x65536}" --head-dim "${HEAD_DIM:-128}" \
    > "/tmp/$k.run.log" 2>&1
  echo "ncu rc=$?"; tail -2 "/tmp/$k.run.log"
  $NCU -i "/tmp/$k.ncu-rep" --page details > "$O/$k.details.txt" 2>&1
  $NCU -i "/tmp/$k.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "$O/$k.sass.csv.gz"
  grep -E "Duration|Issue Slots Busy|Registers Per Thread|Local Memory Spilling Requests " "$O/$k.details.txt"
done
date
} 2>&1 | tee "$O/ncu-kernels.log"
