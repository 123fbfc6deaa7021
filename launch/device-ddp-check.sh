#!/usr/bin/env bash
# One-GPU check of the data-parallel path (run on a CUDA machine from the repository root, with
# release binaries built): the NCCL GPU test, `flamia-dist nccl-check` through launch/local.sh,
# then configs/h200-125m.toml for STEPS steps plain and through launch/local.sh 1 (world size 1,
# rendezvous + NCCL gradient all-reduce + loss mean), printing both loss columns and their
# largest difference. Logs go to ${OUT:-/tmp/flamia-ddp-check}.
#   launch/device-ddp-check.sh [GPU_TEST_BINARY]
set -uo pipefail
out="${OUT:-/tmp/flamia-ddp-check}"; mkdir -p "$out"
steps="${STEPS:-30}"; path="${ATTN_PATH:-mxfp8}"
source launch/nccl-env.sh
if [ -n "${1:-}" ]; then "$1" --ignored --nocapture > "$out/gpu-test.log" 2>&1; echo "gpu test rc=$?"; tail -4 "$out/gpu-test.log"; fi
MASTER_PORT=29531 launch/local.sh 1 target/release/flamia-dist nccl-check --mib 256 > "$out/nccl-check.log" 2>&1
echo "nccl-check rc=$?"; tail -5 "$out/nccl-check.log"
common=(train --config configs/h200-125m.toml --set "training.steps=$steps" --set run.log_every=1
    --set run.progress=false --set run.checkpoint_every=0 --set "attention.path=$path")
env -u RANK -u WORLD_SIZE target/release/flamia "${common[@]}" --set run.dir=/tmp/ddp-plain > "$out/plain.log" 2>&1
echo "plain rc=$?"; tail -2 "$out/plain.log"
MASTER_PORT=29532 launch/local.sh 1 target/release/flamia "${common[@]}" --set run.dir=/tmp/ddp-dist1 > "$out/dist1.log" 2>&1
echo "dist1 rc=$?"; tail -2 "$out/dist1.log"
cp /tmp/ddp-plain/metrics.jsonl "$out/plain-metrics.jsonl"; cp /tmp/ddp-dist1/metrics.jsonl "$out/dist1-metrics.jsonl"
"$(command -v python3 || echo /opt/torch/.venv/bin/python)" - "$out/plain-metrics.jsonl" "$out/dist1-metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
worst = 0.0
for x, y in zip(a, b):
    d = abs(x["loss"] - y["loss"]); worst = max(worst, d)
    print(f'step {x["step"]:3d} plain {x["loss"]:.6f} dist1 {y["loss"]:.6f} diff {d:.2e} tps {x["tps"]:.0f} {y["tps"]:.0f}')
print(f"steps {len(a)} vs {len(b)}; max |loss diff| {worst:.3e}")
PY
