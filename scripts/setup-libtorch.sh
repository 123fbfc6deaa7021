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
    # The install needs about 4.7 GB where the venv goes; pip's wheel cache would double the peak
    # (the downloaded wheels stay in ~/.cache/pip), so it is off. Refuse early, with the numbers,
    # rather than fail half way with ENOSPC.
    parent="$(dirname "$venv")"
    need_kb=$((5500 * 1024))
    free_kb="$(df -Pk "$parent" 2>/dev/null | awk 'NR == 2 { print $4 }')"
    if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
        echo "setup-libtorch: $parent has $((free_kb / 1024)) MiB free; installing torch==$want" \
            "needs about $((need_kb / 1024)) MiB. Free space there, or set FLAMIA_VENV to a venv" \
            "path on a larger disk." >&2
        exit 1
    fi
    echo "setup-libtorch: installing torch==$want into $venv (first use only, ~4.7 GB)" >&2
    created=0
    [ -e "$venv" ] || created=1
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
        "torch==$want" >&2 ||
        {
            echo "setup-libtorch: pip could not install torch==$want into $venv (see above)" >&2
            # Only a venv this run created is removed (FLAMIA_VENV may name the user's own).
            if [ "$created" = 1 ]; then rm -rf "$venv"; echo "setup-libtorch: removed the partial $venv" >&2; fi
            exit 1
        }
    "$venv/bin/python" -W ignore -c "import torch" 2>/dev/null ||
        { echo "setup-libtorch: torch $want did not import from $venv" >&2; exit 1; }
fi
torch_lib || { echo "setup-libtorch: torch $want not found in $venv after install" >&2; exit 1; }
