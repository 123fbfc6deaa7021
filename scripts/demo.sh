#!/usr/bin/env bash
# The main job on the embedded default: for now the FLAMIA numerics check on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo run --release --quiet -p flamia-trainer --bin flamia -- check numerics "$@"
