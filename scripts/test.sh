#!/usr/bin/env bash
# Runs the whole CPU test suite (what CI runs). First use installs the pinned libtorch
# (PyTorch 2.11.0 in ./.venv) through scripts/env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo fmt --all -- --check
cargo test --workspace --no-fail-fast "$@"
