#!/usr/bin/env bash
# Makes the pinned libtorch available: tch 0.24.0 needs PyTorch 2.11.0 exactly. Creates the
# project-local virtualenv ./.venv (git-ignored) with `pip install torch==2.11.0` on first use
# (about 4.7 GB: it carries libtorch, its CUDA libraries and headers); later runs find it again
# and return at once. Prints the torch lib directory on success.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FLAMIA_VENV:-$root/.venv}"
want="2.11.0"

# The torch lib directory of the venv, if torch $want is installed there (no import: fast).
torch_lib() {
    local v
    for v in "$venv"/lib/python3*/site-packages/torch/version.py; do
        if [ -f "$v" ] && grep -Eq "^__version__ = '$want(\+[^']*)?'" "$v"; then
            echo "$(dirname "$v")/lib"
            return 0
        fi
    done
    return 1
}

if ! torch_lib >/dev/null; then
    py="${PYTHON:-}"
    if [ -z "$py" ]; then
        for c in python3 python; do
            if command -v "$c" >/dev/null 2>&1; then py="$c"; break; fi
        done
    fi
    if [ -z "$py" ]; then
        echo "setup-libtorch: no python3 found; install Python >= 3.10 (needed once to fetch PyTorch $want)" >&2
        exit 1
    fi
    echo "setup-libtorch: installing torch==$want into $venv (first use only, ~4.7 GB)" >&2
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$want" >&2
    "$venv/bin/python" -W ignore -c "import torch" 2>/dev/null ||
        { echo "setup-libtorch: torch $want did not import from $venv" >&2; exit 1; }
fi
torch_lib || { echo "setup-libtorch: torch $want not found in $venv after install" >&2; exit 1; }
