#!/bin/bash
# One device call for the FP32 promotion of the dP and score products (FLAMIA_ATTN_PROMOTE, see
# docs/kernels.md): GPU tests, `flamia check numerics --device cuda` and a short benchmark with
# FLAMIA_ATTN_PROMOTE = 3 (dP and S summed in FP32), 1 (dP only), 0 (chained FP8 accumulators,
# the default). The numerics JSON is printed to stdout too: the device call brings back at most
# 8 files from $OUT. Carry target/release/flamia and the test
# executables (target/release/deps/{flamia_kernels,gpu_quant,gpu_attention}-*).
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
B=${B:-target/release/flamia}; D=target/release/deps; O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
exe() { ls -t $D/$1-* 2>/dev/null | grep -v '\.d$' | head -1; }
W="--workload 4x16384 --workload 64x1024 --workload 256x256"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$O/smi.txt" 2>&1
timeout 60 $(exe flamia_kernels) gpu:: --include-ignored > "$O/lib.txt" 2>&1
timeout 60 $(exe gpu_quant) --ignored --test-threads=1 > "$O/gpu_quant.txt" 2>&1
for m in 0 3; do FLAMIA_ATTN_PROMOTE=$m timeout 90 $(exe gpu_attention) --ignored --test-threads=1 > "$O/gpu_attention_$m.txt" 2>&1; done
for m in 0 3; do FLAMIA_ATTN_PROMOTE=$m timeout 30 $B bench attention $W > "$O/bench_$m.txt" 2>&1; done
for m in 0 1 3; do echo "=== FLAMIA_ATTN_PROMOTE=$m"; FLAMIA_ATTN_PROMOTE=$m timeout 40 $B check numerics --device cuda --no-leakage --json; done
FLAMIA_ATTN_PROMOTE=1 timeout 20 $B bench attention $W > "$O/bench_1.txt" 2>&1
nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv >> "$O/smi.txt" 2>&1
