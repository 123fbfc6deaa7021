# Sourced by the scripts: puts the project's toolchain environment in place.
# libtorch for the trainer comes from PyTorch 2.11.0 in the project-local ./.venv, installed on
# first use by scripts/setup-libtorch.sh; tch's build finds it through LIBTORCH_USE_PYTORCH=1 and
# the venv's python first on PATH, and binaries/tests find its shared libraries via LD_LIBRARY_PATH.
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-auto}"
_flamia_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_flamia_torch_lib="$("$_flamia_root/scripts/setup-libtorch.sh")" || {
    echo "env.sh: could not set up libtorch (see above)" >&2
    return 1 2>/dev/null || exit 1
}
export FLAMIA_VENV="${FLAMIA_VENV:-$_flamia_root/.venv}"
export LIBTORCH_USE_PYTORCH=1
export PATH="$FLAMIA_VENV/bin:$PATH"
export LD_LIBRARY_PATH="$_flamia_torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NVRTC 13 from the same venv (the nvidia-cuda-nvrtc wheel torch depends on): the CUDA kernels
# then compile for sm_90a on any machine, so the test suite checks every kernel variant (and its
# shared-memory static_asserts) without a GPU. scripts/test.sh (CI) demands it
# (FLAMIA_REQUIRE_NVRTC=1: those tests fail instead of printing SKIPPED when it cannot be loaded).
for _flamia_nvrtc in "$FLAMIA_VENV"/lib/python3*/site-packages/nvidia/cu13/lib; do
    if [ -e "$_flamia_nvrtc/libnvrtc.so.13" ]; then
        export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$_flamia_nvrtc"
    fi
done
unset _flamia_root _flamia_torch_lib _flamia_nvrtc
