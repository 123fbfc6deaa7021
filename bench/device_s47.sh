#!/bin/bash
# Session 47's device call after the standing (device_s46.sh w, device_s45.sh n1 and c, and
# bench/trainer_1b.sh ran as staged): the host uploads through pinned memory without libtorch
# 2.11's deprecated device argument (six "The argument 'device' of Tensor.pin_memory() is
# deprecated" lines a training step before). Stage: .device-carry/pin/{flamia,bridge_cuda}
# (release builds, stripped); carry .device-carry/pin and .device-carry/kc.
#   p: bridge_cuda (all four GPU tests, the new upload test among them), then the 1B model at
#      16,384-token rows, short documents, bf16 and mxfp8 (bench/trainer_1b.sh), and the count
#      of deprecation lines in its logs (0 expected)
set -u
C=.device-carry/pin
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; export OUT=$O
mode=${1:?usage: device_s47.sh p}
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
p) $C/bridge_cuda --ignored --test-threads 1 2>&1 | tail -8
   B=$C/flamia ROWS=16384 DOCS=short OOM_CHECK=0 bash bench/trainer_1b.sh 2>&1 | grep -v "Memory.cpp" | tail -8
   echo "deprecation lines in the trainer logs: $(cat "$O"/t1b-*.log | grep -c "is deprecated")" ;;
*) echo "device_s47.sh: unknown mode '$mode' (p)"; exit 2 ;;
esac
kcache_pack
date
} 2>&1 | tee "$O/s47-$mode.log"
