#!/bin/bash
# Session 36 (H200; staged as device_bwd4.sh --stage, carried as .device-carry/z/bwd4.tgz).
#   a: the backward's CTA pairs (FLAMIA_BWD_PAIR=1, kernel BWD_PAIR: clusters of two CTAs on
#      adjacent key tiles, Q / dO multicast): the bitwise GPU test against the unpaired
#      backward (under a timeout: a hang is its failure), the long-document accuracy test with
#      pairs, then pairs off / on, two rounds, at 1x65536 and 2x32768 (every tile walks down)
#      and 4x16384 with FLAMIA_BWD_UP_TILES=0 (walking down, where pairs apply), with the SM
#      clock after each loop.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s37.sh a}
PY=$(command -v python3 || echo /opt/torch/.venv/bin/python)
# bench_mhz LABEL ENV ARGS...: the bench rows plus each workload's fwd / bwd / train ms and MHz
bench_mhz() {
  local label=$1 e=$2; shift 2
  [ "$e" = - ] && e=X=1
  echo "=== $label"
  env $e timeout 150 "$C/flamia" bench attention --json /tmp/b.json "$@" 2>&1 | grep -E "^[0-9]|^lognormal|rror"
  $PY - <<'PY'
import json
d = json.load(open("/tmp/b.json"))
for r in d.get("rows", d.get("results", [])):
    print("  mhz", r.get("workload"), "fwd", r.get("fwd_ms"), "@", r.get("fwd_mhz"), "bwd", r.get("bwd_ms"), "@", r.get("bwd_mhz"),
          "train", r.get("train_ms"), "@", r.get("train_mhz"))
PY
}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  timeout 300 $C/gpu_attention --ignored --exact --test-threads=1 cta_pairs_give_bitwise_the_unpaired_backward 2>&1 \
    | grep -E "^test |test result|panicked|differ|rror" | head -20
  FLAMIA_BWD_PAIR=1 FLAMIA_BWD_UP_TILES=0 timeout 120 $C/gpu_attention --ignored --exact --test-threads=1 long_documents_gqa_are_as_accurate_as_the_reference 2>&1 \
    | grep -E "^test |test result|panicked|rror" | head -10
  date
  for r in 1 2; do
    for p in 0 1; do
      bench_mhz "pair $p round $r" FLAMIA_BWD_PAIR=$p --workload 1x65536 --workload 2x32768
      bench_mhz "pair $p round $r, walking down" "FLAMIA_BWD_PAIR=$p FLAMIA_BWD_UP_TILES=0" --workload 4x16384
    done
  done
  ;;
*) echo "device_s37.sh: unknown mode '$mode' (a)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s37-$mode.log"
