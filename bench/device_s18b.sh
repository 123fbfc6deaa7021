#!/bin/bash
# Session 18, call 2: the backward's head chunks (FLAMIA_BWD_SCRATCH_MIB 64 / 128 / 1024 against
# the default 256: 8 / 4 / 1 chunks against 2 at 65,536 tokens and 16 heads) on the nine
# workloads, two rounds (bench/device_ab.sh). Call 1 (H100) measured one chunk -1..-2% of the
# training call on short documents and +2% at 1x65536; more chunks keep each launch's FP32 dQ
# accumulator (and what bwd_dq_convert reads back) nearer the 50 MB L2.
# Stage: bash bench/device_ab.sh --stage s64=@FLAMIA_BWD_SCRATCH_MIB=64 s128=@FLAMIA_BWD_SCRATCH_MIB=128 s1024=@FLAMIA_BWD_SCRATCH_MIB=1024
# carry .device-carry/bwd4 and .device-carry/var.
set -u
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv | tee "$O/smi.txt"
TESTS=0 WL=" " OUT=$O timeout 560 bash "$(dirname "$0")/device_ab.sh" 2>&1 | tail -45
