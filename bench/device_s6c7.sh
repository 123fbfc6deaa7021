#!/bin/bash
# Session 6, call 7 (issues 15 and 13, trainer): the fused-AdamW CUDA test, 125M bf16 / mxfp8 on
# configs/h200-125m.toml (60 steps each, median tokens/s of steps 3+), then bench/trainer_1b.sh
# (1B at 16,384- and 65,536-token rows, bf16 and mxfp8, short and row-long documents, and the
# out-of-memory run), all on the committed kernels (.device-carry/var/committed: FLAMIA_CUDA_DIR);
# first the GPU attention tests and an A B A B of the embedded (working-tree) kernels against them.
# Carry .device-carry/bwd4 and .device-carry/var; repo root on the device.
set -u
C=.device-carry/bwd4; B=$C/flamia
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$SP/torch/lib:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
WL="--workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256 --workload 8192+224x256"
{
timeout 200 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
for r in 1 2; do
  echo "=== embedded ($r)"; timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]"
  echo "=== committed ($r)"; FLAMIA_CUDA_DIR=.device-carry/var/committed timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]"
done
export FLAMIA_CUDA_DIR=.device-carry/var/committed
timeout 100 $C/trainer_lib --ignored --exact optim::tests::cuda_fused_update_matches_the_cpu_one_and_shards_keep_the_bits --nocapture > "$O/cuda_fused.log" 2>&1
echo "cuda_fused rc=$?"; grep -vE "^\s+[0-9]+: |^\s+at |^\s*$" "$O/cuda_fused.log" | tail -12
for p in ${P125:-bf16 mxfp8}; do
  t0=$SECONDS
  timeout 150 $B train --config configs/h200-125m.toml --set training.steps=60 --set attention.path=$p \
    --set run.log_every=1 --set run.progress=false --set run.checkpoint_every=0 --set run.final_checkpoint=false \
    --set training.val_every=0 --set wandb.enabled=false --set run.dir=/tmp/m125-$p > "$O/125m-$p.log" 2>&1
  echo "125m $p rc=$? ($((SECONDS - t0)) s)"
  python3 - /tmp/m125-$p/metrics.jsonl 125m-$p <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
warm = [r for r in rows if r["step"] > 2]
med = lambda k: statistics.median(r[k] for r in warm if r.get(k) is not None)
print(f'{sys.argv[2]:<12} steps {len(rows)} tok/s {med("tps"):,.0f} MFU {med("mfu_pct"):.1f}% step {med("step_time_s"):.3f} s '
      f'peak {max(r["memory_gib"] for r in rows):.2f} GiB loss {rows[0]["loss"]:.3f} -> {rows[-1]["loss"]:.3f}')
PY
done
B=$B bash bench/trainer_1b.sh
} 2>&1 | tee "$O/device_s6c7.log"
