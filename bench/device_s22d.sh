#!/bin/bash
# Session 22, call 3 (~7.5 minutes, H200): call 2's A/B again on a freshly built `flamia` (call 2's
# was stale), then the whole gpu_attention suite on the final tree (K's dim-major tile made in
# shared memory, BWD_KD_XPOSE; Q's dim-major copy written by the forward, FWD_QD_WRITE; both
# default). A/B, two rounds: base / xp0 / qd0 / old / vt (FLAMIA_FWD_VT=1) at 256x256 and 16x4096, base / old at 64x1024,
# 1x65536, 8192+224x256 and on two d = 64 workloads. SUITE_T: the suite's time limit (260 s; the
# whole suite takes longer: what it cuts shows in the log). Then FWD_VT's bitwise test.
# Stage: as bench/device_s22c.sh's header says, plus vt=@FLAMIA_FWD_VT=1; carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== V transposed in the forward (FWD_VT, prepared, off by default): its bitwise test"; date
timeout 100 $C/gpu_attention --ignored --exact v_dim_major_tiles_transposed_in_the_forward_give_bitwise_the_same 2>&1 | grep -E "test result|panicked|differs"
echo "=== A/B"; date
TESTS=0 WL="--workload 256x256 --workload 16x4096" OUT=$O/ab timeout 110 bash bench/device_ab.sh 2>&1 | tail -1
VARS=old TESTS=0 WL="--workload 64x1024 --workload 1x65536 --workload 8192+224x256" \
  OUT=$O/ab2 timeout 90 bash bench/device_ab.sh 2>&1 | tail -1
VARS=old TESTS=0 WL="--head-dim 64 --workload 256x256 --workload 16x4096" \
  OUT=$O/ab64 timeout 40 bash bench/device_ab.sh 2>&1 | tail -1
echo "=== the whole gpu_attention suite"; date
timeout ${SUITE_T:-260} $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
timeout 40 $C/bridge_cuda --ignored 2>&1 | grep -E "test result|panicked"
date
} 2>&1 | tee "$O/s22d.log"
