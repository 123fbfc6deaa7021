#!/bin/bash
# Session 24's last call (~2.5 minutes, H200): the accuracy, isolation, leakage and repeatability
# GPU tests on the final tree's defaults (V's token-major tile and K's dim-major tile by the
# backward's consumers, Q's copy by the forward at d = 64: all on for these short documents).
# Stage: bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/*; carry .device-carry/bwd4.
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
timeout 150 $C/gpu_attention --ignored --test-threads=1 --exact \
  mxfp8_causal_gqa_is_as_accurate_as_the_reference head_dim_64_is_as_accurate_as_the_reference \
  documents_are_isolated_bitwise repeated_runs_are_bitwise_identical \
  head_dim_64_documents_are_isolated_and_default_mxfp8_is_causal_before_the_block \
  causal_leakage_has_the_reference_properties \
  2>&1 | grep -E "test result|panicked|FAILED|^test "
date
} 2>&1 | tee "$O/s24d.log"
