#!/bin/bash
# Session 22, call 3 (~9.5 minutes, H200): call 2's A/B again on a freshly built `flamia` (call 2's
# was stale), then the whole gpu_attention suite on the final tree (K's dim-major tile made in
# shared memory, BWD_KD_XPOSE; Q's dim-major copy written by the forward, FWD_QD_WRITE; both
# default). A/B: base / xp0 / qd0 / old on four d = 128 workloads, base / old at 1x65536 and on
# two d = 64 ones, two rounds.
# Stage: as bench/device_s22c.sh's header says; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== A/B, d = 128"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096 --workload 8192+224x256" \
  OUT=$O/ab timeout 150 bash bench/device_ab.sh 2>&1 | tail -2
VARS=old TESTS=0 WL="--workload 1x65536" OUT=$O/ab65 timeout 80 bash bench/device_ab.sh 2>&1 | tail -2
VARS=old TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" \
  OUT=$O/ab64 timeout 50 bash bench/device_ab.sh 2>&1 | tail -2
echo "=== the whole gpu_attention suite"; date
timeout 300 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
date
} 2>&1 | tee "$O/s22d.log"
