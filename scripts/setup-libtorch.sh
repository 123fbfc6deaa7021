#!/usr/bin/env bash
# Makes the pinned libtorch available: tch 0.24.0 needs PyTorch 2.11.0 exactly. Creates the
# project-local virtualenv ./.venv (git-ignored) with `pip install torch==2.11.0` on first use
# (about 4.7 GB: it carries libtorch, its CUDA libraries and headers); later runs find it again
# and return at once. Prints the torch lib directory on success.
#
# An install counts only once `import torch` has worked: then the marker file
# `$venv/.flamia-torch-$want` is written, and later runs accept the venv only with that marker and
# a Python that still runs (an install cut short, by a kill or a full disk, is redone). Two
# scripts started together (demo.sh and test.sh) take turns: the install holds a lock
# (`$venv.lock`, flock) and the second one finds the first one's finished venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FLAMIA_VENV:-$root/.venv}"
# (absolute: PATH and LD_LIBRARY_PATH entries are used from other directories by builds and tests)
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
want="2.11.0"
marker="$venv/.flamia-torch-$want"

# Linux only: the binaries find libtorch through LD_LIBRARY_PATH (no rpath), which macOS ignores.
case "$(uname -s)" in
    Linux) ;;
    *) echo "setup-libtorch: $(uname -s) is not supported; flamia's scripts run on Linux (x86_64 or aarch64)" >&2
       exit 1 ;;
esac

# The torch lib directory of the venv, if torch $want is installed there (no import: fast).
torch_dir() {
    local v
    for v in "$venv"/lib/python3*/site-packages/torch/version.py; do
        if [ -f "$v" ] && grep -Eq "^__version__ = '$want(\+[^']*)?'" "$v"; then
            echo "$(dirname "$v")/lib"
            return 0
        fi
    done
    return 1
}

# The lib directory of a complete install: torch $want, the marker, and a Python that runs. A
# venv from before the marker existed is checked once by importing torch, then marked.
torch_lib() {
    local lib
    lib="$(torch_dir)" || return 1
    "$venv/bin/python" -c "" 2>/dev/null || return 1
    if [ ! -f "$marker" ]; then
        "$venv/bin/python" -W ignore -c "import torch" 2>/dev/null || return 1
        : > "$marker"
    fi
    echo "$lib"
}

if ! torch_lib >/dev/null; then
    parent="$(dirname "$venv")"
    if [ ! -d "$parent" ]; then
        echo "setup-libtorch: the venv's parent directory $parent does not exist (FLAMIA_VENV=$venv)" >&2
        exit 1
    fi
    # One install at a time: a second script waits here, then finds the first one's venv.
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$venv.lock"
        if ! flock -n 9; then
            echo "setup-libtorch: another process is installing torch into $venv; waiting for it" >&2
            flock 9
        fi
    fi
fi
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
    if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
        echo "setup-libtorch: $py is Python $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo '?');" \
            "PyTorch $want needs >= 3.10 (set PYTHON to a newer one)" >&2
        exit 1
    fi
    # The install needs about 4.7 GB where the venv goes, and pip keeps the downloaded wheels
    # (about 3 GB) in its temporary directory until it ends: that directory is put beside the venv
    # (one filesystem to check, not a small /tmp), and the wheel cache is off (it would keep them).
    # Refuse early, with the numbers, rather than fail half way with ENOSPC.
    need_kb=$((8000 * 1024))
    free_kb="$(df -Pk "$parent" 2>/dev/null | awk 'NR == 2 { print $4 }' || true)"
    if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
        echo "setup-libtorch: $parent has $((free_kb / 1024)) MiB free; installing torch==$want" \
            "needs about $((need_kb / 1024)) MiB while it runs (4.7 GB stay). Free space there, or" \
            "set FLAMIA_VENV to a venv path on a larger disk." >&2
        exit 1
    fi
    echo "setup-libtorch: installing torch==$want into $venv (first use only, ~4.7 GB;" \
        "the download takes a few minutes)" >&2
    created=0
    [ -e "$venv" ] || created=1
    rm -f "$marker"
    tmp="$venv.pip-tmp"
    fail() {
        echo "setup-libtorch: $1" >&2
        rm -rf "$tmp"
        # Only a venv this run created is removed (FLAMIA_VENV may name the user's own).
        if [ "$created" = 1 ]; then rm -rf "$venv"; echo "setup-libtorch: removed the partial $venv" >&2; fi
        exit 1
    }
    # Its output to stderr: stdout is the lib dir, which env.sh drops on failure, and Debian's venv
    # without python3-venv says so on stdout (leaving a venv without pip behind).
    "$py" -m venv "$venv" >&2 || fail "$py could not create a venv at $venv (see above)"
    rm -rf "$tmp" && mkdir -p "$tmp"
    TMPDIR="$tmp" "$venv/bin/python" -m pip install --disable-pip-version-check --no-cache-dir \
        "torch==$want" >&2 || fail "pip could not install torch==$want into $venv (see above)"
    rm -rf "$tmp"
    "$venv/bin/python" -W ignore -c "import torch" 2>/dev/null ||
        fail "torch $want did not import from $venv"
    : > "$marker"
fi
torch_lib || { echo "setup-libtorch: torch $want not found in $venv after install" >&2; exit 1; }
