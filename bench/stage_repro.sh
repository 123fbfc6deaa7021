#!/bin/bash
# Stages what bench/device_18_17.sh needs beyond `bash bench/device_bwd4.sh --stage` (which copies
# target/release/flamia into .device-carry/bwd4/): the GPU reproducibility tests' executable
# (tests/train_deterministic.rs, built with `cargo test --release --no-run`) into
# .device-carry/repro/train_deterministic, and a check that the rust-doc corpus is in
# .device-carry/corpus/rust-doc (built once with scripts/make-corpus.py, ~2.3 MB). From the repo
# root, after building target/release/flamia from the same commit:
#   bash bench/device_bwd4.sh --stage && bash bench/stage_repro.sh
# Carry then: .device-carry/bwd4 .device-carry/repro .device-carry/corpus
# CARGO_ARGS (default --release) picks the profile (CARGO_ARGS= stages the debug test build).
set -eu
C=.device-carry
[ -n "${LIBTORCH_USE_PYTORCH:-}" ] || source scripts/env.sh
exe=$(cargo test ${CARGO_ARGS---release} -p flamia-trainer --test train_deterministic --no-run \
        --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "train_deterministic" and m.get("executable"):
        print(m["executable"])')
[ -x "$exe" ] || { echo "stage_repro: no train_deterministic executable built"; exit 1; }
rm -rf $C/repro && mkdir -p $C/repro && cp "$exe" $C/repro/train_deterministic
if ! ls $C/corpus/rust-doc/train-*.parquet $C/corpus/rust-doc/validation-*.parquet > /dev/null 2>&1; then
  echo "stage_repro: no corpus in $C/corpus/rust-doc; build it (about 1-9 min, downloads rust-doc):"
  echo "  python3 scripts/make-corpus.py --out /tmp/corpus-build && mkdir -p $C/corpus && cp -a /tmp/corpus-build/data/rust-doc $C/corpus/"
  exit 1
fi
[ -x $C/bwd4/flamia ] || echo "stage_repro: $C/bwd4/flamia missing: run bash bench/device_bwd4.sh --stage"
ls -la $C/repro $C/corpus/rust-doc
du -shc $C/bwd4 $C/repro $C/corpus
