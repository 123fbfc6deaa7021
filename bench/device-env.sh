# Sourced by the device scripts (run from the repo root on the device machine): the PyTorch
# virtualenv's site-packages (SP) and a library path holding CUDA, libtorch and the pip-installed
# NVIDIA libraries, so the carried binaries and test executables load there.
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$SP/torch/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr "\n" ":")${LD_LIBRARY_PATH:-}
