#!/usr/bin/env bash
# One-GPU check of the data-parallel path (run on a CUDA machine from the repository root, with
# release binaries built): `flamia-dist nccl-check` through launch/local.sh, then
# configs/h200-125m.toml for STEPS steps (default 30, no validation):
#   plain        the process alone (no launcher variables);
#   dist1        through launch/local.sh (world size 1), NCCL all-reduce after the backward;
#   zero1ovl     the same with distributed.zero1=true and distributed.overlap=true:
#                buckets reduced by the gradient hooks during the backward (NCCL on a side
#                stream, in place, each piece reduced to its ZeRO-1 owner), AdamW moments
#                sharded, the gradient norm combined from the ranks' parts, parameters
#                all-gathered.
# It prints every step's loss and tokens/s per arm, the largest |loss - plain| per arm, the median
# tokens/s over steps 3..STEPS, each arm's wall time, and from the overlap arm's FLAMIA_DDP_TRACE
# how many bucket launches came from the hooks inside the backward. ARMS (default
# "dist1 zero1ovl") picks the launcher arms (also: ovl = overlap without ZeRO-1, zero1).
# Logs go to ${OUT:-/tmp/flamia-ddp-check}. Meant to take under 3 minutes on one H200 (125m,
# 3 x 30 steps; not yet timed there: each arm prints its wall time).
# CONFIG and BIN_DIR (default target/release) change the config and the binaries (a CPU smoke
# run: CONFIG=configs/tiny-cpu.toml BIN_DIR=target/debug ATTN_PATH=bf16; nccl-check then fails).
#   launch/device-ddp-check.sh [GPU_TEST_BINARY [TEST_FILTER]]
# GPU_TEST_BINARY runs with --ignored (e.g. the trainer lib tests, filter "ddp::").
# Staged binaries: `launch/device-ddp-check.sh --stage` here copies target/release/flamia and
# flamia-dist into .device-carry/ddp/ (39 MB); carry that folder and run on the device with
#   BIN_DIR=.device-carry/ddp bash launch/device-ddp-check.sh
set -uo pipefail
if [ "${1:-}" = "--stage" ]; then # here, after cargo build --release -p flamia-trainer -p flamia-dist
    mkdir -p .device-carry/ddp && cp target/release/flamia target/release/flamia-dist .device-carry/ddp/ && exit 0
fi
# The device's libtorch and CUDA libraries (as bench/device_18_17.sh), unless already on the path.
SP=/opt/torch/.venv/lib/python3.12/site-packages
if [ -d "$SP/torch/lib" ] && [[ "${LD_LIBRARY_PATH:-}" != *torch/lib* ]]; then
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$SP/torch/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr "\n" ":")${LD_LIBRARY_PATH:-}
fi
out="${OUT:-/tmp/flamia-ddp-check}"; mkdir -p "$out"
steps="${STEPS:-30}"; path="${ATTN_PATH:-mxfp8}"; arms="${ARMS:-dist1 zero1ovl}"
config="${CONFIG:-configs/h200-125m.toml}"; bin="${BIN_DIR:-target/release}"
source launch/nccl-env.sh
if [ -n "${1:-}" ]; then
    "$1" --ignored --nocapture ${2:+"$2"} > "$out/gpu-test.log" 2>&1
    echo "gpu test rc=$?"; grep -E "^test |test result" "$out/gpu-test.log" | tail -8
fi
MASTER_PORT=29531 launch/local.sh 1 "$bin/flamia-dist" nccl-check --mib 256 > "$out/nccl-check.log" 2>&1
echo "nccl-check rc=$?"; tail -2 "$out/nccl-check.log"
common=(train --config "$config" --set "training.steps=$steps" --set run.log_every=1
    --set run.progress=false --set run.checkpoint_every=0 --set training.val_every=0
    --set "attention.path=$path")
run_arm() { # name, then the command; the arm's settings in extra
    local name="$1" t0 rc; shift
    rm -rf "/tmp/ddp-$name"; t0=$(date +%s%N)
    "$@" "${common[@]}" --set "run.dir=/tmp/ddp-$name" "${extra[@]}" > "$out/$name.log" 2>&1; rc=$?
    echo "$name rc=$rc wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    tail -1 "$out/$name.log"
    cp "/tmp/ddp-$name/metrics.jsonl" "$out/$name-metrics.jsonl" && names+=("$name")
}
names=(); extra=()
run_arm plain env -u RANK -u WORLD_SIZE "$bin/flamia"
port=29532
for a in $arms; do
    case "$a" in
        dist1) extra=() ;;
        zero1) extra=(--set distributed.zero1=true) ;;
        ovl) extra=(--set distributed.overlap=true) ;;
        zero1ovl) extra=(--set distributed.zero1=true --set distributed.overlap=true) ;;
        *) echo "unknown arm $a"; continue ;;
    esac
    rm -f "$out/$a-trace.jsonl"
    run_arm "$a" env FLAMIA_DDP_TRACE="$out/$a-trace.jsonl" MASTER_PORT=$port launch/local.sh 1 "$bin/flamia"
    port=$((port + 1))
done
"$(command -v python3 || echo /opt/torch/.venv/bin/python)" - "$out" "${names[@]}" <<'PY'
import json, os, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
runs = [[json.loads(l) for l in open(f"{out}/{n}-metrics.jsonl")] for n in names]
worst = [0.0] * len(runs)
for rows in zip(*runs):
    for i, r in enumerate(rows):
        worst[i] = max(worst[i], abs(r["loss"] - rows[0]["loss"]))
    cols = " ".join(f'{n} {r["loss"]:.6f}' for n, r in zip(names, rows))
    tps = " ".join(f'{r["tps"]:.0f}' for r in rows)
    print(f'step {rows[0]["step"]:3d} {cols} tps {tps}')
print("steps", {n: len(r) for n, r in zip(names, runs)})
print("max |loss - plain|", {n: f"{w:.3e}" for n, w in zip(names, worst)})
med = {n: statistics.median(r["tps"] for r in rows if r["step"] >= 3) for n, rows in zip(names, runs)}
print("median tok/s (steps 3..)", {n: f"{v:.0f} ({100 * (v / med['plain'] - 1):+.1f}%)" for n, v in med.items()})
for n in names:
    p = f"{out}/{n}-trace.jsonl"
    if not os.path.exists(p) or os.path.getsize(p) == 0:
        continue
    ev = [json.loads(l) for l in open(p)]
    later = [e for e in ev if e["step"] >= 2]
    launches = [e for e in later if e["event"] == "launch"]
    hook = [e for e in launches if e["from"] == "hook"]
    firsts = {}
    for e in hook:
        firsts.setdefault(e["step"], e)
    pend = sorted(e["pending_grads"] for e in firsts.values())
    print(f"{n} trace: {len(launches)} bucket launches in steps 2..: {len(hook)} from the hooks during the backward;"
          f" first launch of a step with pending_grads median {pend[len(pend) // 2] if pend else '-'} of"
          f" {launches[0]['params'] if launches else '-'} parameters")
PY
