#!/bin/bash
# Profiling variants of the v4 backward (BWD_PROF_PHASES / BWD_PROF_TIMERS / BWD_PROF_REDUCER
# prepended to copies of the kernel sources in .device-carry/var/NAME): per workload, the last
# launch's printout of CTAs 0-1. Carry .device-carry/bwd4 and .device-carry/var; repo root on the device.
set -u
C=.device-carry/bwd4; B=$C/flamia
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$SP/torch/lib:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
for v in ${VARIANTS:-phases timers reducer}; do
  for w in ${WORKLOADS:-1x65536 64x1024 256x256}; do
    echo "=== $v $w"
    FLAMIA_CUDA_DIR=.device-carry/var/$v timeout 120 $B bench attention --workload $w > "$O/$v-$w.log" 2>&1 || echo "rc=$?"
    grep -E "^bwd4 " "$O/$v-$w.log" | tail -${LINES_PER:-4}
    grep -E "^$w " "$O/$v-$w.log"
  done
done
for d in ${BENCH_DIRS:-}; do
  echo "=== bench $d"
  FLAMIA_CUDA_DIR=$d timeout 200 $B bench attention ${WL:-} 2>&1 | grep -E "^[0-9]|^workload"
done
} 2>&1 | tee "$O/device_prof.log"
