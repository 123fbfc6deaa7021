#!/bin/bash
# Session 41's device plan (prepared without a device; see docs/perf.md "Next" 0's first step):
# whether issue 13's "training call under the best BF16 on all nine" survives the anchors'
# corrected gradients (bench/anchors.py clears the inputs' gradients before each timed call since
# session 41; the shared copy's every BF16 backward also added them onto the last call's).
#   s  (~2-3 min): on the four short workloads, ours, anchors.py with ANCHOR_GRADS=none, the same
#      with ANCHOR_GRADS=accumulate (the old method: their difference is the artifact measured),
#      ours again, then bench/compare.py against the corrected anchors.
#   c  (~8 min): the whole standing, bench/vs-anchors.sh (nine workloads, cuDNN FP8 if .whl).
#   t  (~3 min): session 41's new and widened GPU tests (staged test binary from session 41's
#      tree): accuracy with spread block scales and all-zero V tiles (docs/numerics.md "Known
#      deviations": expected to show whether the forward's per-tile V fold overflows or strays
#      from the spec), isolation with GQA, the d = 64 ordering test on spread key tiles.
# From the repo root on the device, after `tar -C .device-carry -xzf .device-carry/z/bwd4.tgz`
# (B defaults to the staged binary); outputs under $OUT.
set -u
. "$(dirname "$0")/device-env.sh"
B=${B:-.device-carry/bwd4/flamia}; O=${OUT:-/tmp/flamia-out}/s41; mkdir -p "$O"
SHORT=(256x256 64x1024 32x2048 16x4096)
case "${1:-s}" in
s)
  wl=(); for w in "${SHORT[@]}"; do wl+=(--workload "$w"); done
  timeout 120 "$B" bench attention --json "$O/ours_a.json" "${wl[@]}" 2>&1 | grep -E "^[0-9]|rror"
  for g in none accumulate; do
    echo "=== anchors.py, ANCHOR_GRADS=$g"
    rows=()
    for w in "${SHORT[@]}"; do
      line=$(ANCHOR_GRADS=$g timeout 120 python3 bench/anchors.py one "$w" 2>"$O/anchors_${g}_${w}.err" | grep '^{' | tail -1)
      echo "$line"; rows+=("$line")
    done
    # (compare.py reads {"env": ..., "rows": [...]}; env records the method and the head dim)
    printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
json.dump({"env": {"grads": sys.argv[1], "head_dim": 128}, "rows": rows}, open(sys.argv[2], "w"))' "$g" "$O/anchors_$g.json"
  done
  timeout 120 "$B" bench attention --json "$O/ours_b.json" "${wl[@]}" 2>&1 | grep -E "^[0-9]|rror"
  for g in none accumulate; do
    echo "=== compare against ANCHOR_GRADS=$g"
    python3 bench/compare.py "$O/ours_a.json" "$O/anchors_$g.json" "$O/ours_b.json"
  done
  ;;
c) B=$B O=$O bash bench/vs-anchors.sh ;;
t)
  for t in spread_block_scales_and_zero_value_tiles_are_as_accurate_as_the_reference \
           forward_ev_running_max_keeps_uniform_exponents_bitwise \
           documents_are_isolated_bitwise \
           head_dim_64_documents_are_isolated_and_default_mxfp8_is_causal_before_the_block \
           head_dim_64_is_bitwise_repeatable_whatever_the_reduce_order_and_chunking; do
    echo "=== $t"; date
    timeout 240 .device-carry/bwd4/gpu_attention --ignored --exact "$t" --nocapture --test-threads=1 \
      > "$O/$t.log" 2>&1; echo "rc=$?"; grep -E "rel L2|panicked|test result|FAILED" "$O/$t.log" | tail -20
  done ;;
*) echo "usage: bench/device_s41.sh s|c|t"; exit 2 ;;
esac
