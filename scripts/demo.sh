#!/usr/bin/env bash
# The main job: trains the `tiny` Llama-3-style model on the embedded shard twice, with the exact
# `bf16` attention control and with FLAMIA `mxfp8`, a few hundred steps each (on the GPU if there
# is one, else the CPU), then prints both runs' losses side by side.
# Extra arguments go to both `flamia train` calls (e.g. --set training.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --release --quiet -p flamia-trainer --bin flamia
bin=target/release/flamia
out="${FLAMIA_DEMO_DIR:-runs/demo}"
for path in bf16 mxfp8; do
    echo "== training tiny with attention.path=$path =="
    "$bin" train --config configs/tiny-cpu.toml \
        --set attention.path="$path" --set run.name="demo-$path" --set run.dir="$out/$path" --overwrite "$@"
done

# Side by side: the loss at every 25th logged step, then the summaries.
loss_by_step() {
    sed -n 's/.*"step":\([0-9]*\),"loss":\([-0-9.eE+naNifty]*\).*/\1 \2/p' "$1/metrics.jsonl"
}
echo
echo "== loss, bf16 control vs FLAMIA mxfp8 (tiny model, embedded shard) =="
printf '%8s  %12s  %12s  %10s\n' step bf16 mxfp8 diff
join <(loss_by_step "$out/bf16") <(loss_by_step "$out/mxfp8") |
    awk 'NR == 1 || $1 % 25 == 0 { printf "%8d  %12.4f  %12.4f  %+10.4f\n", $1, $2, $3, $3 - $2 }'
summary() { sed -n "s/.*\"$2\": \([-0-9.eE+]*\).*/\1/p" "$1/summary.json" | head -1; }
echo
printf '%-22s  %12s  %12s\n' "" bf16 mxfp8
for k in first_loss final_loss tail_mean_loss mean_tps wall_s; do
    printf '%-22s  %12.4f  %12.4f\n' "$k" "$(summary "$out/bf16" $k)" "$(summary "$out/mxfp8" $k)"
done
# The last validation loss logged during training (training.val_every; embedded:val).
last_val() { sed -n 's/.*"val_loss":\([-0-9.eE+naNifty]*\).*/\1/p' "$1/metrics.jsonl" | tail -1; }
if [ -n "$(last_val "$out/bf16")" ] && [ -n "$(last_val "$out/mxfp8")" ]; then
    printf '%-22s  %12.4f  %12.4f\n' "last val_loss" "$(last_val "$out/bf16")" "$(last_val "$out/mxfp8")"
fi
# The mxfp8 run's same validation tokens through exact attention (training.val_exact): the number
# to judge its quality by (bf16's own validation is already exact).
last_exact() { sed -n 's/.*"val_loss_exact":\([-0-9.eE+naNifty]*\).*/\1/p' "$1/metrics.jsonl" | tail -1; }
if [ -n "$(last_val "$out/bf16")" ] && [ -n "$(last_exact "$out/mxfp8")" ]; then
    printf '%-22s  %12.4f  %12.4f\n' "  through exact attn." "$(last_val "$out/bf16")" "$(last_exact "$out/mxfp8")"
fi
echo "(metrics: $out/{bf16,mxfp8}/metrics.jsonl; compare with \`flamia compare\` if built)"
