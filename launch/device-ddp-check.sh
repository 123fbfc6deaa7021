#!/usr/bin/env bash
# One-GPU check of the data-parallel path (run on a CUDA machine from the repository root, with
# release binaries built): `flamia-dist nccl-check` through launch/local.sh, then
# configs/h200-125m.toml for STEPS steps (default 60, no validation) in ROUNDS rounds (default 2)
# of these arms:
#   plain        the process alone (no launcher variables), always run;
#   dist1        through launch/local.sh (world size 1), reduction after the backward;
#   ovl          the same with distributed.overlap=true;
#   zero1        the same with distributed.zero1=true;
#   zero1ovl     distributed.zero1=true and distributed.overlap=true;
#   NAME-force   NAME with distributed.force_collectives=true: at world size 1 the per-step
#                collectives (identities) run anyway: NCCL reductions on the compute stream or,
#                with overlap, launched by the gradient hooks during the backward on a side stream
#                (ZeRO-1: each piece reduced to its owner), the ZeRO-1 parameter all-gather, the
#                f64 metric mean. Without -force they are skipped (the trainer logs it once).
# ARMS (default "dist1 zero1ovl dist1-force zero1ovl-force") picks the launcher arms. The order
# alternates: odd rounds plain then ARMS, even rounds the reverse (A B C C B A: a linear drift of
# the GPU's clock over the call cancels in each arm's mean over two rounds). No run starts once
# DEADLINE_S seconds (default 210) have passed since the start, or when the last run's wall time
# would not fit before it; what ran is still analysed.
# It prints, per run, its wall time, median tokens/s over steps 3..STEPS and whether the trainer
# skipped the identity collectives; per arm the mean of its runs' medians (and the change against
# plain's), the largest |loss - plain| over every step of every run (plain: against round 1's), and
# from the first round's overlapped -force runs' FLAMIA_DDP_TRACE how many bucket launches came
# from the hooks inside the backward. Logs go to ${OUT:-/tmp/flamia-ddp-check}.
# CONFIG and BIN_DIR (default target/release) change the config and the binaries (a CPU smoke
# run: CONFIG=configs/tiny-cpu.toml BIN_DIR=target/debug ATTN_PATH=bf16 EXTRA="run.device=cpu";
# nccl-check then fails). EXTRA: more `section.key=value` settings for every run (space-separated).
#   launch/device-ddp-check.sh [GPU_TEST_BINARY [TEST_FILTER]]
# GPU_TEST_BINARY runs with --ignored (e.g. the trainer lib tests, filter "ddp::"), after
# `source launch/nccl-env.sh` (its NCCL tests need libnccl.so on LD_LIBRARY_PATH).
# Staged binaries: `launch/device-ddp-check.sh --stage` here copies target/release/flamia and
# flamia-dist into .device-carry/ddp/ (39 MB); carry that folder and run on the device with
#   BIN_DIR=.device-carry/ddp bash launch/device-ddp-check.sh
set -uo pipefail
if [ "${1:-}" = "--stage" ]; then # here, after cargo build --release -p flamia-trainer -p flamia-dist
    mkdir -p .device-carry/ddp && cp target/release/flamia target/release/flamia-dist .device-carry/ddp/ && exit 0
fi
t_start=$(date +%s)
# The device's libtorch and CUDA libraries (as bench/device_18_17.sh), unless already on the path.
SP=/opt/torch/.venv/lib/python3.12/site-packages
if [ -d "$SP/torch/lib" ] && [[ "${LD_LIBRARY_PATH:-}" != *torch/lib* ]]; then
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$SP/torch/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr "\n" ":")${LD_LIBRARY_PATH:-}
fi
out="${OUT:-/tmp/flamia-ddp-check}"; mkdir -p "$out"
steps="${STEPS:-60}"; path="${ATTN_PATH:-mxfp8}"; arms="${ARMS:-dist1 zero1ovl dist1-force zero1ovl-force}"
rounds="${ROUNDS:-2}"; deadline="${DEADLINE_S:-210}"
config="${CONFIG:-configs/h200-125m.toml}"; bin="${BIN_DIR:-target/release}"
source launch/nccl-env.sh
if [ -n "${1:-}" ]; then
    "$1" --ignored --nocapture --test-threads=1 ${2:+"$2"} > "$out/gpu-test.log" 2>&1
    echo "gpu test rc=$?"; grep -E "^test |test result" "$out/gpu-test.log" | tail -8
fi
MASTER_PORT=29531 launch/local.sh 1 "$bin/flamia-dist" nccl-check --mib 256 > "$out/nccl-check.log" 2>&1
echo "nccl-check rc=$?"; tail -2 "$out/nccl-check.log"
common=(train --config "$config" --set "training.steps=$steps" --set run.log_every=1
    --set run.progress=false --set run.checkpoint_every=0 --set training.val_every=0
    --set "attention.path=$path")
for e in ${EXTRA:-}; do common+=(--set "$e"); done
# The settings of an arm (empty for plain and dist1); unknown arms return 1.
arm_sets() {
    local a="${1%-force}"
    case "$a" in
        plain | dist1) ;;
        zero1) echo "distributed.zero1=true" ;;
        ovl) echo "distributed.overlap=true" ;;
        zero1ovl) echo "distributed.zero1=true distributed.overlap=true" ;;
        *) return 1 ;;
    esac
    [ "$a" != "$1" ] && echo "distributed.force_collectives=true"
    return 0
}
for a in $arms; do arm_sets "$a" > /dev/null || { echo "unknown arm $a"; exit 2; }; done
: > "$out/runs.tsv"
port=29532; last_wall=0; n=0
for ((r = 1; r <= rounds; r++)); do
    order=(plain $arms)
    if ((r % 2 == 0)); then
        rev=(); for ((i = ${#order[@]} - 1; i >= 0; i--)); do rev+=("${order[$i]}"); done; order=("${rev[@]}")
    fi
    for a in "${order[@]}"; do
        elapsed=$(($(date +%s) - t_start))
        if ((elapsed + last_wall > deadline)); then
            echo "deadline: ${elapsed}s gone, the last run took ${last_wall}s, DEADLINE_S=$deadline: no more runs"
            break 2
        fi
        n=$((n + 1)); name="r$r-$a"; dir="/tmp/ddp-$name"
        sets=(); for s in $(arm_sets "$a"); do sets+=(--set "$s"); done
        launcher=(env -u RANK -u WORLD_SIZE)
        if [ "$a" != plain ]; then
            launcher=(env MASTER_PORT=$port)
            # the hooks' trace (a line per bucket launch) only where it says something, once
            if [[ $r == 1 && $a == *ovl-force ]]; then launcher+=(FLAMIA_DDP_TRACE="$out/$name-trace.jsonl"); fi
            launcher+=(launch/local.sh 1)
            port=$((port + 1))
        fi
        rm -rf "$dir" "$out/$name-trace.jsonl"; t0=$(date +%s%N)
        "${launcher[@]}" "$bin/flamia" "${common[@]}" --set "run.dir=$dir" "${sets[@]}" > "$out/$name.log" 2>&1
        rc=$?; wall_ms=$((($(date +%s%N) - t0) / 1000000)); last_wall=$(((wall_ms + 999) / 1000))
        skipped=$(grep -c "are identities and are skipped" "$out/$name.log")
        echo "run $n $name rc=$rc wall $wall_ms ms, identity collectives skipped: $skipped"
        [ "$rc" = 0 ] || tail -3 "$out/$name.log"
        cp "$dir/metrics.jsonl" "$out/$name-metrics.jsonl" && printf '%s\t%s\t%s\n' "$n" "$a" "$name" >> "$out/runs.tsv"
    done
done
"$(command -v python3 || echo /opt/torch/.venv/bin/python)" - "$out" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
runs = [l.rstrip("\n").split("\t") for l in open(f"{out}/runs.tsv") if l.strip()]
data = {name: [json.loads(l) for l in open(f"{out}/{name}-metrics.jsonl")] for _, _, name in runs}
med = {name: statistics.median(r["tps"] for r in rows if r["step"] >= 3) for name, rows in data.items()}
arms = list(dict.fromkeys(a for _, a, _ in runs))
ref = next((data[n] for _, a, n in runs if a == "plain"), None)
for i, a, name in runs:
    print(f"run {i:>2} {name:<22} steps {len(data[name]):>3} median tok/s (steps 3..) {med[name]:.0f}")
if ref is None:
    sys.exit("no plain run finished")
base = statistics.mean(med[n] for _, a, n in runs if a == "plain")
for a in arms:
    names = [n for _, b, n in runs if b == a]
    worst = max(abs(x["loss"] - y["loss"]) for n in names for x, y in zip(data[n], ref))
    short = [n for n in names if len(data[n]) != len(ref)]
    m = statistics.mean(med[n] for n in names)
    print(f"arm {a:<16} runs {len(names)} mean of medians {m:.0f} tok/s ({100 * (m / base - 1):+.2f}% vs plain)"
          f"  per run {[round(med[n]) for n in names]}  max |loss - plain| {worst:.3e}"
          + (f"  SHORT: {short}" if short else ""))
for _, a, name in runs:
    p = f"{out}/{name}-trace.jsonl"
    if not os.path.exists(p) or os.path.getsize(p) == 0:
        continue
    ev = [json.loads(l) for l in open(p)]
    launches = [e for e in ev if e["step"] >= 2 and e["event"] == "launch"]
    hook = [e for e in launches if e["from"] == "hook"]
    firsts = {}
    for e in hook:
        firsts.setdefault(e["step"], e)
    pend = sorted(e["pending_grads"] for e in firsts.values())
    print(f"{name} trace: {len(launches)} bucket launches in steps 2..: {len(hook)} from the hooks during the backward;"
          f" first launch of a step with pending_grads median {pend[len(pend) // 2] if pend else '-'} of"
          f" {launches[0]['params'] if launches else '-'} parameters")
PY
echo "total wall $(($(date +%s) - t_start)) s"
