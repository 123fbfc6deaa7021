#!/bin/bash
# Session 21, call 5 (~5.5 minutes, H200): the final tree's whole gpu_attention suite (after the ring
# variants' and BWD_DQ_FUSED's removal), gpu_quant with and without streaming code stores
# (FLAMIA_QUANT_STCS=1: the same bytes), then an A/B base / qcs (FLAMIA_QUANT_STCS=1) / dqcs
# (FLAMIA_DQC_STREAM=1: bwd_dq_convert's loads and stores streaming) on three short-document workloads, two rounds.
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* &&
#   bash bench/device_ab.sh --stage qcs=@FLAMIA_QUANT_STCS=1 dqcs=@FLAMIA_DQC_STREAM=1;
#   carry .device-carry/bwd4 and .device-carry/var.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== the whole gpu_attention suite"; date
timeout 270 $C/gpu_attention --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|^test "
echo "=== gpu_quant, default and FLAMIA_QUANT_STCS=1"; date
timeout 40 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
FLAMIA_QUANT_STCS=1 timeout 40 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"
echo "=== A/B base / qcs / dqcs"; date
TESTS=0 WL="--workload 256x256 --workload 64x1024 --workload 16x4096" \
  OUT=$O/ab timeout 100 bash bench/device_ab.sh 2>&1 | tail -20
date
} 2>&1 | tee "$O/s21b.log"
