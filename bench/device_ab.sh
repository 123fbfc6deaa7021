#!/bin/bash
# A/B of kernel-source variants in .device-carry/var (FLAMIA_CUDA_DIR, one binary): the GPU
# attention tests on each variant, then `flamia bench attention` base / variants, twice.
# Carry .device-carry/bwd4 and .device-carry/var; run from the repo root on the device.
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$SP/torch/lib:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
WL=${WL:---workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256 --workload 8192+224x256}
VARS=${VARS:-$(ls $V)}
{
if [ "${TESTS:-1}" = 1 ]; then
  for v in $VARS; do
    echo "=== gpu_attention on $v"
    FLAMIA_CUDA_DIR=$V/$v timeout 200 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
  done
fi
for r in $(seq ${REPS:-2}); do
  for v in base $VARS; do
    echo "=== $v ($r)"
    if [ $v = base ]; then timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]"
    else FLAMIA_CUDA_DIR=$V/$v timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]"; fi
  done
done
} 2>&1 | tee "$O/device_ab.log"
