#!/bin/bash
# One device call: end-to-end training throughput of configs/h200-125m.toml per attention path,
# and the mxfp8 path once more with a baseline set of kernel sources (FLAMIA_CUDA_DIR, prepared
# with `bash bench/ab_kernels.sh --prepare <rev>` and carried), in one call so the clocks compare.
# From the repo root on the device, with target/release/flamia carried:
#   bash bench/trainer_ab.sh                 (STEPS=60 PATHS="bf16 mxfp8"; logs under $OUT)
# BASE_KERNELS=1 adds mxfp8 with the baseline kernel sources, OLD_BIN=path mxfp8 with another
# flamia build, AGAIN=0 skips the repeat of PATHS at the end.
# Prints, per run, the median tokens/s of the steps after the first 10 (warm-up, kernel compiles)
# and the losses of steps 1 and STEPS.
set -u
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
B=${B:-target/release/flamia}; O=${OUT:-/tmp/flamia-out}; BASE=${BASE:-bench/kernels-base}; mkdir -p "$O"
steps=${STEPS:-60}
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
run() {  # name, then extra flamia args; FLAMIA_CUDA_DIR may be set by the caller
  local name=$1; shift
  $B train --config configs/h200-125m.toml --set training.steps=$steps --set run.log_every=1 \
    --set run.progress=false --set run.checkpoint_every=0 --set run.dir=/tmp/tab-$name --overwrite "$@" > "/tmp/tab-$name.log" 2>&1
  echo "$name rc=$?"; grep -iE "error|warn|kernel sources" "/tmp/tab-$name.log" | head -5
  "$PY" - /tmp/tab-$name/metrics.jsonl "$name" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
tps = [r["tps"] for r in rows if r["step"] > 10]
print(f'{sys.argv[2]:<22} steps {len(rows)}  median tok/s (steps 11+) {statistics.median(tps):,.0f}  '
      f'loss step 1 {rows[0]["loss"]:.4f}  step {rows[-1]["step"]} {rows[-1]["loss"]:.4f}')
PY
  sed "s/^{/{\"run\":\"$name\",/" /tmp/tab-$name/metrics.jsonl >> "$O/trainer_metrics.jsonl" 2>/dev/null
}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv
for p in ${PATHS:-bf16 mxfp8}; do run "$p" --set attention.path=$p; done
[ -n "${BASE_KERNELS:-}" ] && [ -d "$BASE" ] && FLAMIA_CUDA_DIR=$BASE run "mxfp8-base-kernels" --set attention.path=mxfp8
if [ -n "${OLD_BIN:-}" ]; then  # another build of flamia (e.g. before a bridge change)
  B=$OLD_BIN run "mxfp8-old-binary" --set attention.path=mxfp8
fi
[ "${AGAIN:-1}" = 1 ] && for p in ${PATHS:-bf16 mxfp8}; do run "$p-again" --set attention.path=$p; done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$O/trainer_ab.log"
