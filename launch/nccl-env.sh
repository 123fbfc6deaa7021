# Sourced by launch/local.sh and, on every node, by launch/slurm-task.sh (inside each srun task):
# NCCL settings and a libnccl.so that cudarc can load. Every variable is only set when the caller
# has not set it.
#
# cudarc (dynamic loading) looks for "libnccl.so"; pip's nvidia-nccl wheel (shipped with
# PyTorch) has only "libnccl.so.2". We link it as libnccl.so in a private directory under this
# node's TMPDIR and put that directory first on LD_LIBRARY_PATH. The link is node-local, so this
# file must be sourced on the node that runs the rank (a link made on the Slurm batch node does
# not exist on the other nodes). FLAMIA_NCCL_LIB names the library explicitly.

# Never use NVLink SHARP multicast on shared hosts: a program using it can take the host's GPUs
# out of service for everyone.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
# Surface NCCL's own reason for a failure (WARN is quiet on success).
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# Links made by an earlier sourcing (possibly on another node: srun exports the batch node's
# LD_LIBRARY_PATH) are dropped before searching.
flamia_ldp=""
IFS=: read -r -a flamia_ldp_parts <<< "${LD_LIBRARY_PATH:-}"
for flamia_d in "${flamia_ldp_parts[@]}"; do
    case "$flamia_d" in ''|*/flamia-nccl-*) ;; *) flamia_ldp="${flamia_ldp:+$flamia_ldp:}$flamia_d";; esac
done
if [ -n "$flamia_ldp" ]; then export LD_LIBRARY_PATH="$flamia_ldp"; else unset LD_LIBRARY_PATH; fi
unset flamia_ldp flamia_ldp_parts flamia_d

flamia_find_nccl() {
    if [ -n "${FLAMIA_NCCL_LIB:-}" ]; then echo "$FLAMIA_NCCL_LIB"; return; fi
    local d
    # The trainer links libtorch, which loads its own libnccl.so.2; a second, different copy
    # loaded by cudarc breaks NCCL ("corrupted comm object detected"), so use libtorch's.
    ldp="${LD_LIBRARY_PATH:-}"; for d in ${ldp//:/ }; do
        if [ -e "$d/libtorch_cuda.so" ]; then
            local t; t="$(ldd "$d/libtorch_cuda.so" 2>/dev/null | awk '/libnccl/ && $3 ~ /^\// {print $3; exit}')"
            if [ -n "$t" ]; then echo "$t"; return; fi
        fi
    done
    ldp="${LD_LIBRARY_PATH:-}"; for d in ${ldp//:/ } /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if [ -e "$d/libnccl.so" ]; then echo "$d/libnccl.so"; return; fi
        if [ -e "$d/libnccl.so.2" ]; then echo "$d/libnccl.so.2"; return; fi
    done
    # The NCCL wheel that PyTorch installs (nvidia-nccl-cu12 / -cu13).
    local py
    for py in "${FLAMIA_PYTHON:-}" python3 /opt/torch/.venv/bin/python; do
        [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
        "$py" - <<'PY' 2>/dev/null && return
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for pat in ("nvidia/nccl/lib/libnccl.so*", "nvidia/cu*/lib/libnccl.so*", "torch/lib/libnccl.so*"):
        hits = sorted(glob.glob(os.path.join(r, pat)))
        if hits:
            print(hits[0]); sys.exit(0)
sys.exit(1)
PY
    done
    return 1
}

if lib="$(flamia_find_nccl)"; then
    # Per user and job (two jobs sharing a node may use different libraries).
    nccl_dir="${TMPDIR:-/tmp}/flamia-nccl-$(id -u)${SLURM_JOB_ID:+-job$SLURM_JOB_ID}"
    mkdir -p "$nccl_dir"
    # The tasks of a node run this at the same moment: make the link under a private name, then
    # rename it into place (atomic), so no task ever sees a missing or half-made link.
    ln -sfn "$lib" "$nccl_dir/.libnccl.so.$$" && mv -fT "$nccl_dir/.libnccl.so.$$" "$nccl_dir/libnccl.so"
    export LD_LIBRARY_PATH="$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    echo "launch: warning: no libnccl found (set FLAMIA_NCCL_LIB=/path/libnccl.so.2); multi-GPU runs will fail" >&2
fi
unset lib nccl_dir
