#!/bin/bash
# Device call: GPU tests + SASS (device_check.sh), `flamia check numerics` on cuda and cpu (same
# seed), and the benchmark of the nvfp4 path and of mxfp8 with the precision options.
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
B=${B:-target/release/flamia}; O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
bash bench/device_check.sh > /dev/null 2>&1
{
time $B check numerics --device cuda
time $B check numerics --device cpu
} > "$O/numerics.txt" 2>&1
{
$B bench attention --path nvfp4 --json "$O/bench_nvfp4.json"
$B bench attention --causally-safe --json "$O/bench_safe.json"
} > "$O/bench_more.txt" 2>&1
