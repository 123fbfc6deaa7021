#!/usr/bin/env bash
# One-GPU check of the data-parallel path (run on a CUDA machine from the repository root, with
# release binaries built): the NCCL GPU test, `flamia-dist nccl-check` through launch/local.sh,
# then configs/h200-125m.toml for STEPS steps plain and through launch/local.sh 1 (world size 1,
# rendezvous + NCCL gradient all-reduce + loss mean) and, with ZERO1=1, a third time with
# distributed.zero1=true (NCCL all-gather of the parameters), printing the loss columns and the
# largest difference to the plain run. Logs go to ${OUT:-/tmp/flamia-ddp-check}.
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
arms=("$out/plain-metrics.jsonl" "$out/dist1-metrics.jsonl")
if [ "${ZERO1:-0}" = 1 ]; then
    MASTER_PORT=29533 launch/local.sh 1 target/release/flamia "${common[@]}" --set run.dir=/tmp/ddp-zero1 \
        --set distributed.zero1=true > "$out/zero1.log" 2>&1
    echo "zero1 rc=$?"; tail -2 "$out/zero1.log"
    cp /tmp/ddp-zero1/metrics.jsonl "$out/zero1-metrics.jsonl"; arms+=("$out/zero1-metrics.jsonl")
fi
"$(command -v python3 || echo /opt/torch/.venv/bin/python)" - "${arms[@]}" <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
names = ["plain", "dist1", "zero1"][: len(runs)]
worst = [0.0] * len(runs)
for rows in zip(*runs):
    for i, r in enumerate(rows):
        worst[i] = max(worst[i], abs(r["loss"] - rows[0]["loss"]))
    cols = " ".join(f'{n} {r["loss"]:.6f}' for n, r in zip(names, rows))
    tps = " ".join(f'{r["tps"]:.0f}' for r in rows)
    print(f'step {rows[0]["step"]:3d} {cols} tps {tps}')
print("steps", [len(r) for r in runs], "; max |loss - plain|", {n: f"{w:.3e}" for n, w in zip(names, worst)})
PY
