#!/bin/bash
# Session 7, device call 4: (1) mutation check of row dS exponents on v4: a kernel variant whose
# dQ copy takes one exponent over the whole 32 x 64 block (FLAMIA_CUDA_DIR) must make the causal
# leakage tests FAIL; (2) the 1B preset at 64K rows with 64K-token documents, bf16, RMSNorm
# composite vs fused, 5 steps each, every step's loss (call 3 saw the bf16 loss rise); (3) 125M,
# bf16 vs mxfp8, 100 steps; (4) ncu on the E4M3 quantiser (one launch: speed of light, memory,
# warp stalls); (5) DDP at world size 1 if DDP=1 (launch/device-ddp-check.sh, helper's command).
# Stage as device_s7c2.sh (+ .device-carry/var/rowds_block); run: bash bench/device_s7c4.sh
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; B=$C/flamia
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
{
echo "=== (1) mutation: dQ row-dS exponent over the whole block (expect the leakage tests to FAIL)"; date
FLAMIA_CUDA_DIR=.device-carry/var/rowds_block timeout 120 $C/gpu_attention --ignored --test-threads=2 causal_leakage head_dim_64_precision 2>&1 | grep -E "^test |test result|must give bitwise" | cut -c1-300
echo "=== (2) 1B 64K rows, bf16, rms_norm composite vs fused: losses per step"; date
B=$B ROWS=65536 PATHS=bf16 DOCS=long NORMS="composite fused" OOM_CHECK=0 timeout 150 bash bench/trainer_1b.sh 2>&1 | grep -E "steps|rc=[1-9]|rror"
"$PY" -c "
import json,collections
runs=collections.defaultdict(list)
for l in open('$O/trainer_1b_metrics.jsonl'):
    r=json.loads(l); runs[r['run']].append(round(r['loss'],4))
for k,v in runs.items(): print(k, v)
"
echo "=== (3) 125M, bf16 vs mxfp8, 100 steps"; date
for p in bf16 mxfp8; do
  timeout 100 $B train --config configs/h200-125m.toml --set training.steps=100 --set attention.path=$p \
    --set run.log_every=25 --set run.checkpoint_every=0 --set run.final_checkpoint=false --set wandb.enabled=false \
    --set run.progress=false --set run.dir=/tmp/m125-$p > /tmp/m125-$p.log 2>&1
  echo "125m $p rc=$?"; grep -E "^run |rror" /tmp/m125-$p.log | tail -2 | cut -c1-250
done
echo "=== (4) ncu: quant_e4m3 at 1x65536 (d = 128)"; date
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 120 $NCU --kernel-name quant_e4m3 --launch-skip 3 --launch-count 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
  $B bench attention --workload 1x65536 2>&1 | grep -vE "^(1x|workload|SM clock|kernel|flamia)" | grep -E "[A-Za-z]" | tail -75
if [ "${DDP:-0}" = 1 ]; then
  echo "=== (5) DDP world size 1"; date
  ${DDP_CMD:-true}
fi
date
} 2>&1 | tee "$O/s7c4.log"
