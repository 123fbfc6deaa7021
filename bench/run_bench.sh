#!/bin/bash
# One device call: our attention benchmark, the BF16 anchors (bench/anchors.py), ours again
# (A B A: the card's clock drifts with load), then the comparison table. From the repo root:
#   bash bench/run_bench.sh        (B=path/to/flamia; logs and JSON under $OUT)
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
B=${B:-target/release/flamia}; O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
ldd $B | grep "not found" && echo "missing libraries for $B"
$B bench attention --json "$O/ours.json" ${BENCH_ARGS:-} || echo "flamia bench failed rc=$?"
timeout ${ANCHOR_TIMEOUT:-400} python3 bench/anchors.py > "$O/anchors.log" 2>&1 || echo "anchors rc=$?"
tail -12 "$O/anchors.log"
$B bench attention --json "$O/ours2.json" ${BENCH_ARGS:-} || echo "flamia bench (2nd) failed rc=$?"
python3 bench/compare.py "$O/ours.json" "$O/anchors.json" "$O/ours2.json"
} 2>&1 | tee "$O/bench.log"
