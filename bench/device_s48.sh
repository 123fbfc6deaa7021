#!/bin/bash
# Session 48's prepared device call (no device started in session 48; the first call of the next
# session is still `bash bench/device_s47.sh l`). Carry .device-carry/z and .device-carry/kc and
# run `tar -C .device-carry -xzf .device-carry/z/bwd4.tgz` first (the staged flamia binary).
#   q: what the Q/K/V quantiser's parts cost where documents are short, before a forward that
#      quantises its own inputs is built (perf.md "Next", session 47's item 2): the quantiser's
#      knock-outs (quant.cu: QUANT_PROF_NOHAD the rotation's arithmetic, NOTOK the token-major
#      code stores, NOBAR the block-amax barrier; NODIM the dim-major copy, which needs the
#      static item split, so beside FLAMIA_QUANT_DYN=0 alone), each a copy of the tree's kernel
#      sources with the define at the top of quant.cu (timing only: wrong codes), two rounds at
#      256x256, 64x1024 and 1x65536. The table rows' quant and fwd columns are what to read
#      (the quantiser alone, and the forward that reads its codes); the dO launch is built from
#      the same quant.cu, so the bwd and train columns carry its knock-out too. Every knock-out
#      build compiles here (kernel-regs.py --dir: Q/K/V with QUANT_DYN, NODIM without, the dO
#      launch's DELTA builds). ~3-4 minutes warm.
set -u
C=${C:-.device-carry/bwd4}  # (session 50: C=.device-carry/s50 after unpacking its flamia.xz there)
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
mode=${1:?usage: device_s48.sh q}
# knockout NAME: $C/cuda-q-NAME, the tree's kernel sources with `#define QUANT_PROF_NAME` at the
# top of quant.cu; prints the directory, or nothing (and why, on stderr) if it was not made
knockout() {
  local d=$C/cuda-q-$1
  rm -rf "$d" && cp -r flamia-kernels/cuda "$d" || return
  { echo "#define QUANT_PROF_$1"; cat flamia-kernels/cuda/quant.cu; } > "$d/quant.cu"
  if grep -q "QUANT_PROF_$1" flamia-kernels/cuda/quant.cu; then
    echo "$d"
  else
    echo "knockout $1: quant.cu has no QUANT_PROF_$1 (skipped)" >&2
  fi
}
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
q) QW=(--workload 256x256 --workload 64x1024 --workload 1x65536)
   vs=(-)
   for k in NOHAD NOTOK NOBAR; do
     d=$(knockout $k) && [ -n "$d" ] && vs+=("FLAMIA_CUDA_DIR=$d")
   done
   vs+=(FLAMIA_QUANT_DYN=0)
   d=$(knockout NODIM) && [ -n "$d" ] && vs+=("FLAMIA_QUANT_DYN=0 FLAMIA_CUDA_DIR=$d")
   for r in 1 2; do
     for v in "${vs[@]}"; do bench_mhz "quantiser $v round $r" "$v" "${QW[@]}"; done
   done ;;
*) echo "device_s48.sh: unknown mode '$mode' (q)"; exit 2 ;;
esac
kcache_pack
date
} 2>&1 | tee "$O/s48-$mode.log"
