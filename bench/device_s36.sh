#!/bin/bash
# Session 35 (H200; named s36 because device_s35.sh is the script session 33 prepared for session 34; staged as device_bwd4.sh --stage plus kernel-source variants under $C/cuda-*,
# carried as .device-carry/z/bwd4.tgz).
#   a: the forward's interior loop under ncu at 1x65536 (stall samples per SASS line:
#      scripts/ncu-stalls.py attn_fwd_v4.sass.csv.gz --regions); the two quantiser mutations
#      session 34 updated and added (quant-chunk-nozero, quant-chunk-allfull) on the GPU; then
#      what the L2 -> SM bytes cost at the power cap: timing-only builds that skip part of the
#      K/V loads (FWD_L2_PROBE 1: every other key tile, 2: all but each item's first
#      FWD_STAGES; $C/cuda-l2a, cuda-l2b) or every other backward step's Q / dO loads
#      (BWD_L2_PROBE, $C/cuda-l2bwd) against the default, two rounds, with the SM clock after
#      each phase's loop (the JSON's fwd_mhz / bwd_mhz).
#   b (commit 661ee81 has the knob and the test): the forward's deferred O update (FLAMIA_FWD_O_LATE=1: each key tile's O = O alpha + PV
#      under the next tile's S product, consumers at 240 registers at d = 128; =2 also Q's S
#      operand from shared memory): the bitwise test, then both against the default, two
#      rounds, five workloads at d = 128 and two at d = 64.
#   c: what the backward's L2 traffic costs: the dQ reduces left out ($C/cuda-nored:
#      BWD_PROF_NORED), every other step's Q / dO loads left out ($C/cuda-l2bwd), both
#      ($C/cuda-nored-l2), against the default, two rounds, 1x65536 and 4x16384 (timing only:
#      wrong results); and the forward's register split alone (consumers 240, producer 24:
#      $C/cuda-r240), which FWD_O_LATE needed at d = 128.
#   d: the L2 traffic a pair of CTAs sharing Q / dO (multicast) and adding up their dQ partials
#      first would leave: BWD_L2_PROBE 1 (half the Q / dO loads, $C/cuda-l2q), 2 (half the dQ
#      reduces, $C/cuda-l2r), 3 (both, $C/cuda-l2qr) against the default, two rounds, 1x65536,
#      4x16384 and 16x4096 (timing only: wrong results).
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s36.sh a|b|c|d}
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
a)
  KERNELS=attn_fwd_v4 B=$C/flamia bash bench/ncu-kernels.sh
  T=$C/gpu_attention ONLY=quant-chunk-nozero bash bench/gpu_mutations.sh
  T=$C/gpu_attention ONLY=quant-chunk-allfull bash bench/gpu_mutations.sh
  ab_dirs cuda-l2a cuda-l2b cuda-l2bwd -- --workload 1x65536 --workload 4x16384 --workload 16x4096
  ;;
b)
  timeout 240 $C/gpu_attention --ignored --exact --test-threads=1 forward_late_o_update_gives_bitwise_the_same 2>&1 \
    | grep -E "^test |test result|panicked|differ"
  W5=(--workload 1x65536 --workload 4x16384 --workload 16x4096 --workload 64x1024 --workload 256x256)
  for r in 1 2; do
    for v in - FLAMIA_FWD_O_LATE=1 FLAMIA_FWD_O_LATE=2; do
      run_bench "$v round $r" "$v" "${W5[@]}"
      run_bench "d=64 $v round $r" "$v" --head-dim 64 --workload 64x1024 --workload 16x4096
    done
  done
  ;;
c)
  ab_dirs cuda-nored cuda-l2bwd cuda-nored-l2 cuda-r240 -- --workload 1x65536 --workload 4x16384
  ;;
d)
  ab_dirs cuda-l2q cuda-l2r cuda-l2qr -- --workload 1x65536 --workload 4x16384 --workload 16x4096
  ;;
*) echo "device_s36.sh: unknown mode '$mode' (a, b, c, d)"; exit 2 ;;
esac
date
} 2>&1 | tee "$O/s36-$mode.log"
