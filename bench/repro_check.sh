#!/bin/bash
# Issue 18 on the GPU, one device call (~4 min; QUICK=1 ~2.5 min): are fresh runs of
# configs/h200-125m.toml bitwise repeatable with the default settings, what makes them so, and
# what does the deterministic mode cost. From the repo root on the device, with the release
# flamia carried (bash bench/device_bwd4.sh --stage puts it in .device-carry/bwd4/):
#   bash bench/repro_check.sh            (logs and runs.tgz under $OUT/repro, table on stdout)
# Runs (each a fresh process, STEPS=50 steps, run.log_every=1, run.checkpoint_every=0):
#   default  mxfp8 with the defaults (run.deterministic = "auto": mode on, NaN fill off)  x4
#   off      mxfp8, run.deterministic=false (the mode off: reproduces the split)           x3
#   cublas   as off, with CUBLAS_WORKSPACE_CONFIG=:4096:8 exported (the variable alone)     x3
#   fill     mxfp8, mode on with libtorch's NaN fill (run.fill_uninitialized_memory=true)  x2
#   bf16det  bf16 control, run.deterministic=true                                         x4
#   resume   mxfp8 default, STEPS/2, stop, --resume STEPS/2; compared with default-1
#   trace-untied / trace-tied: mode off, TRACE_STEPS=10 steps with FLAMIA_TRACE_CHECKSUMS
#            (a line per attention call and per step with every parameter gradient's checksum);
#            untied (model.tied=false) gives the output projection and the embedding their own
#            gradients, so the trace names which of the two differs between runs       x3 / x2
# default-1, off-1, default-2, off-2, fill-1 run alone, one after the other (their tokens/s, median
# of steps 11-50, is the mode's cost); the rest run in waves of 4-5 processes at once
# (repeatability only: tokens/s of those is not comparable), the issue's groups first. A deadline (BUDGET_S, default 270 s)
# bounds the whole script: a run that would start with under 20 s left is skipped and listed.
# Prints per group the distinct bitwise loss trajectories and the first split step
# (bench/repro_check.py), resume vs straight (losses and final model/optimizer files), the traces.
# Knobs: QUICK=1 (default x4, off x3, bf16det x4, resume, untied trace x2: no cublas, fill or
# tied trace; 4 solo runs),
# B=binary, CONFIG=preset, STEPS, TRACE_STEPS, EXTRA="--set k=v ..." (appended to every run: the
# CPU check of this script uses the tiny preset), BUDGET_S, RUNS=dir for the run directories.
set -u
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
B=${B:-.device-carry/bwd4/flamia}; CONFIG=${CONFIG:-configs/h200-125m.toml}
STEPS=${STEPS:-50}; HALF=$((STEPS / 2)); TRACE_STEPS=${TRACE_STEPS:-10}; QUICK=${QUICK:-0}
O=${OUT:-/tmp/flamia-out}/repro; R=${RUNS:-/tmp/repro-runs}; EXTRA=${EXTRA:-}
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$R"; mkdir -p "$R" "$O"
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-270}))
left() { echo $((END - $(date +%s))); }
# run NAME "VAR=value ..." [flamia train args...]: one fresh process into $R/NAME, log $R/NAME.log.
run() {
  local name=$1 envs=$2; shift 2
  local t l; t=$(date +%s); l=$(left)
  if [ "$l" -lt 20 ]; then echo "$name skipped: ${l}s left" | tee -a "$R/runs.txt"; return; fi
  # shellcheck disable=SC2086  # envs and EXTRA are word lists on purpose
  env $envs timeout "$l" "$B" train --config "$CONFIG" --set run.dir="$R/$name" \
    --set training.steps="$STEPS" --set run.log_every=1 --set run.checkpoint_every=0 \
    --set run.progress=false "$@" $EXTRA >> "$R/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall=$(($(date +%s) - t))s at $(($(date +%s) - T0))s" | tee -a "$R/runs.txt"
  [ $rc = 0 ] || tail -5 "$R/$name.log"
}
M="--set attention.path=mxfp8"
OFF="--set run.deterministic=false"
NOCK="--set run.final_checkpoint=false"
TRACE="--set training.steps=$TRACE_STEPS $OFF $NOCK"
# The resumed run: HALF steps and a checkpoint, then --resume to STEPS (both with a final checkpoint).
resume_chain() {
  run resume "" $M --stop-after "$HALF" && run resume "" $M --resume
}
{
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv 2>/dev/null
echo "binary $B ($(stat -c %y "$B" 2>/dev/null | cut -d. -f1)), config $CONFIG, $STEPS steps, QUICK=$QUICK"
# Phase 1, alone on the GPU (tokens/s): A B A B (+ fill).
SOLO="default-1 off-1 default-2 off-2"
run default-1 "" $M
run off-1 "" $M $OFF $NOCK
run default-2 "" $M
run off-2 "" $M $OFF $NOCK
if [ "$QUICK" != 1 ]; then SOLO="$SOLO fill-1"; run fill-1 "" $M --set run.fill_uninitialized_memory=true $NOCK; fi
# Phase 2, waves of concurrent processes (repeatability only).
wave() { local p=(); for c in "$@"; do eval "$c" & p+=($!); done; wait "${p[@]}"; }
BD="--set attention.path=bf16 --set run.deterministic=true $NOCK"
TU="$M $TRACE --set model.tied=false"
# The issue's "done when" groups first (a run the deadline would cut is skipped), then the cause.
wave "run default-3 '' $M" "run default-4 '' $M" "run bf16det-1 '' $BD" "resume_chain"
wave "run bf16det-2 '' $BD" "run bf16det-3 '' $BD" "run bf16det-4 '' $BD" "run off-3 '' $M $OFF $NOCK"
if [ "$QUICK" = 1 ]; then
  wave "run trace-untied-1 FLAMIA_TRACE_CHECKSUMS=$R/trace-untied-1.trace $TU" \
       "run trace-untied-2 FLAMIA_TRACE_CHECKSUMS=$R/trace-untied-2.trace $TU"
else
  CB="CUBLAS_WORKSPACE_CONFIG=:4096:8"
  wave "run trace-untied-1 FLAMIA_TRACE_CHECKSUMS=$R/trace-untied-1.trace $TU" \
       "run trace-untied-2 FLAMIA_TRACE_CHECKSUMS=$R/trace-untied-2.trace $TU" \
       "run trace-untied-3 FLAMIA_TRACE_CHECKSUMS=$R/trace-untied-3.trace $TU" \
       "run trace-tied-1 FLAMIA_TRACE_CHECKSUMS=$R/trace-tied-1.trace $M $TRACE" \
       "run trace-tied-2 FLAMIA_TRACE_CHECKSUMS=$R/trace-tied-2.trace $M $TRACE"
  wave "run cublas-1 $CB $M $OFF $NOCK" "run cublas-2 $CB $M $OFF $NOCK" "run cublas-3 $CB $M $OFF $NOCK" \
       "run fill-2 '' $M --set run.fill_uninitialized_memory=true $NOCK"
fi
echo "== runs: $(($(date +%s) - T0)) s"
# The trace runs have TRACE_STEPS steps: summarised by their traces, not as loss groups of STEPS.
SOLO="$SOLO" "$PY" "$HERE/repro_check.py" "$R" "$STEPS"
echo "== errors in logs"; grep -h -i -E "error|panic" "$R"/*.log | sort | uniq -c | sort -rn | head -8
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null
echo "total $(($(date +%s) - T0)) s"
} 2>&1 | tee "$O/repro_check.log"
(cd "$R" && tar czf "$O/runs.tgz" runs.txt ./*.log ./*/metrics.jsonl ./*.trace 2>/dev/null)
