#!/bin/bash
# One device call: the 1B preset (configs/h200x8-1b.toml's model) on ONE GPU at 16,384- and
# 65,536-token rows, bf16 control and mxfp8, with short (1,024-token) and row-long documents;
# per run the median tokens/s, MFU and peak GPU memory, then one deliberate out-of-memory run
# (64K rows without activation checkpointing) to show the error the trainer gives.
# From the repo root on the device, with target/release/flamia carried:
#   bash bench/trainer_1b.sh          (about 4-5 minutes; logs and metrics under $OUT)
# Data, byte tokenizer: short documents = the embedded shard cut at 1,024 tokens; long documents
# = this repository's .rs/.md text (about 1 MB) made into ~70,000-character documents with
# `flamia data make-shard`, cut at the row length (every row one document). The model's
# vocabulary is padded to 128,256 (model.vocab_size) so the embedding and output head are
# Llama-3's size; TOKENIZER=path/to/llama3.json uses a real tokenizer instead. Knobs: PATHS ("bf16 mxfp8"), STEPS16 (8), STEPS64
# (5), CKPT16 (none), CKPT64 (selective), ROWS ("16384 65536"), DOCS ("short long"), NORMS
# (model.rms_norm values, each its own run named after it, a repeated value gets "-again";
# default: the preset's, no suffix), OOM_CHECK (1), EXTRA (more
# --set arguments, last wins; e.g. a CPU dry run of the script itself:
# B=target/debug/flamia ROWS="128 512" OOM_CHECK=0 EXTRA="--set run.device=cpu
# --set run.compute=fp32 --set model.size=tiny --set model.vocab_size=0" bash bench/trainer_1b.sh).
# RMSNorm A/B, bf16 at 16K rows with short documents only (three runs, about 2 minutes):
#   ROWS=16384 PATHS=bf16 DOCS=short NORMS="composite fused fused-f32" OOM_CHECK=0 bash bench/trainer_1b.sh
# Tokens/s and MFU are medians over the steps after the first two (allocator warm-up, kernel
# compiles); MFU is per GPU from the batch's document lengths (docs/training.md); memory is the
# driver's view (total - free: libtorch's cache included).
set -u
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
B=${B:-target/release/flamia}; O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
if [ -n "${TOKENIZER:-}" ]; then
  DATA=(--set "data.tokenizer=$TOKENIZER")
else
  DATA=(--set data.tokenizer=bytes --set model.vocab_size=128256)
fi
LONG=/tmp/t1b-long.parquet
DOCS=${DOCS:-short long}
need_long=0  # row-long documents, or rows no longer than the short documents' 1,024 tokens
[[ " $DOCS " == *" long "* ]] && need_long=1
for len in ${ROWS:-16384 65536}; do [ "$len" -le 1024 ] && need_long=1; done
if [ $need_long = 1 ]; then
  find trainer data distributed eval flamia-kernels docs launch bench \( -name '*.rs' -o -name '*.md' \) | sort | xargs cat > /tmp/t1b-text.txt
  $B data make-shard --from /tmp/t1b-text.txt --out $LONG --doc-chars 70000 > /dev/null || exit 1
fi
SEEN=" "
run() {  # name, seq_len, max_doc_tokens, path, checkpointing, steps[, model.rms_norm]
  local name=$1 len=$2 doc=$3 path=$4 ckpt=$5 steps=$6 norm=${7:-preset}
  local normset=()
  if [ "$norm" != preset ]; then normset=(--set "model.rms_norm=$norm"); name="$name-$norm"; fi
  [[ "$SEEN" == *" $name "* ]] && name="$name-again"
  SEEN="$SEEN$name "
  local shard='["embedded:train"]'
  [ "$doc" -ge "$len" ] && shard="[\"$LONG\"]"
  local t0=$SECONDS
  $B train --config configs/h200x8-1b.toml "${DATA[@]}" \
    --set "data.train=$shard" --set data.val='["embedded:val"]' --set data.holdout_fraction=0 \
    --set data.seq_len=$len --set data.batch_rows=1 --set data.max_doc_tokens=$doc \
    --set training.grad_accum=1 --set training.steps=$steps --set training.warmup_steps=1 \
    --set training.activation_checkpointing=$ckpt --set attention.path=$path \
    --set run.device=cuda --set run.log_every=1 --set run.progress=false --set run.checkpoint_every=0 \
    --set run.final_checkpoint=false --set wandb.enabled=false --set run.dir=/tmp/t1b-$name \
    ${normset[@]+"${normset[@]}"} ${EXTRA:-} \
    > "/tmp/t1b-$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ($((SECONDS - t0)) s)"
  [ $rc != 0 ] && grep -E "Error|error|memory" "/tmp/t1b-$name.log" | head -4
  cp "/tmp/t1b-$name.log" "$O/" 2>/dev/null
  [ -f /tmp/t1b-$name/metrics.jsonl ] || return
  "$PY" - /tmp/t1b-$name/metrics.jsonl "$name" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
if not rows: sys.exit(0)
# (steps that spent half a second or more building kernels, metrics.jsonl's kernel_build_s, time
# the build, not the kernels: left out of the medians and counted)
built = lambda r: (r.get("kernel_build_s") or 0) >= 0.5
warm = [r for r in rows if r["step"] > 2 and not built(r)] or rows
def med(k):
    v = [r[k] for r in warm if r.get(k) is not None]
    return statistics.median(v) if v else float("nan")
nb = sum(1 for r in rows if r["step"] > 2 and built(r))
print(f'{sys.argv[2]:<28} steps {len(rows)}  tok/s {med("tps"):>9,.0f}  MFU {med("mfu_pct"):5.1f}%  '
      f'step {med("step_time_s"):6.3f} s  peak {max(r["memory_gib"] for r in rows):6.2f} GiB  '
      f'loss {rows[0]["loss"]:.3f} -> {rows[-1]["loss"]:.3f}'
      + (f'  ({nb} later step{"s" if nb > 1 else ""} with kernel builds left out)' if nb else ''))
PY
  sed "s/^{/{\"run\":\"$name\",/" /tmp/t1b-$name/metrics.jsonl >> "$O/trainer_1b_metrics.jsonl"
  rm -rf /tmp/t1b-$name
}
{
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.draw,temperature.gpu --format=csv
for len in ${ROWS:-16384 65536}; do
  if [ "$len" -le 16384 ]; then steps=${STEPS16:-8}; ckpt=${CKPT16:-none}; else steps=${STEPS64:-5}; ckpt=${CKPT64:-selective}; fi
  for p in ${PATHS:-bf16 mxfp8}; do
    for d in $DOCS; do
      [ "$d" = short ] && doc=1024 || doc=$len
      for n in ${NORMS:-preset}; do
        run "$p-$len-$d-$ckpt" $len $doc $p $ckpt $steps $n
      done
    done
  done
done
if [ "${OOM_CHECK:-1}" = 1 ]; then  # expected to fail: a clear out-of-memory error, no panic
  run "bf16-65536-long-none-oom" 65536 65536 bf16 none 1
  grep -A2 "out of memory during" /tmp/t1b-bf16-65536-long-none-oom.log | head -4
  grep -c "panicked" /tmp/t1b-bf16-65536-long-none-oom.log | sed 's/^/panics: /'
fi
# Per step, each mxfp8 run against the bf16 run of the same rows, documents and settings (the
# same data step by step): a medians-only table hides a step that one path spent compiling a
# kernel variant or that held other documents (session 29: 1.062x by medians, 1.14-1.19x by step);
# steps with kernel builds (metrics.jsonl's kernel_build_s, since session 47) are shown, not counted.
[ -f "$O/trainer_1b_metrics.jsonl" ] && "$PY" - "$O/trainer_1b_metrics.jsonl" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault(r["run"], {})[r["step"]] = (r["tps"], r.get("kernel_build_s") or 0)
for name, fp8 in runs.items():
    if not name.startswith("mxfp8-") or "bf16-" + name[6:] not in runs:
        continue
    bf = runs["bf16-" + name[6:]]
    steps = sorted(s for s in fp8 if s in bf and s > 1)
    # (a step either run spent half a second or more building kernels is shown, not counted)
    built = {s for s in steps if max(fp8[s][1], bf[s][1]) >= 0.5}
    ratios = {s: fp8[s][0] / bf[s][0] for s in steps}
    kept = [ratios[s] for s in steps if s not in built]
    if not ratios:
        continue
    per = "  ".join(f"{s}: {fp8[s][0]:,.0f}/{bf[s][0]:,.0f} = {ratios[s]:.3f}" + (" (kernel builds)" if s in built else "")
                    for s in steps)
    note = f", {len(built)} step{'s' if len(built) > 1 else ''} with kernel builds left out" if built else ""
    med = f"{statistics.median(kept):.3f}" if kept else "n/a"
    print(f"per step, mxfp8/bf16 tok/s, {name[6:]}: {per}  (median {med}{note})")
PY
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$O/trainer_1b.log"
