#!/bin/bash
# Session 47's device call after the standing (device_s46.sh w, device_s45.sh n1 and c, and
# bench/trainer_1b.sh ran as staged): the host uploads through pinned memory without libtorch
# 2.11's deprecated device argument (six "The argument 'device' of Tensor.pin_memory() is
# deprecated" lines a training step before). Stage as device_s45.sh's header says (or replace
# flamia and bridge_cuda in .device-carry/bwd4 and re-tar it); carry .device-carry/z and
# .device-carry/kc, and run `tar -C .device-carry -xzf .device-carry/z/bwd4.tgz` first.
#   p: bridge_cuda (all four GPU tests, the new upload test among them), then the 1B model at
#      16,384-token rows, short documents, bf16 and mxfp8 (bench/trainer_1b.sh), and the count
#      of deprecation lines in its logs (0 expected); the steps that built kernels (log lines and
#      metrics.jsonl's kernel_build_s)
#   pw: p, then device_s46.sh w (the long documents' default against session 43's binary; for
#      an H200, which has not run session 46's fix)
#   o: where the long documents' remaining 4-6% of cycles against session 43's binary go (calls
#      1 and 5: at 1x65536 only, 2x32768 level, the step loops the same opcodes): the phases
#      (BWD_PROF_PHASES) and the dQ reducers' clocks (BWD_PROF_REDUCER) of today's default and
#      of session 43's binary on its own sources, at 1x65536 and 2x32768. Stage the old builds'
#      profiling sources in $C/old/cuda-phases and $C/old/cuda-redprof (354b87a's cuda/ with the
#      define at the top of attn_bwd_v4.cu: `git archive 354b87a flamia-kernels/cuda`)
#   l: the layout test: session 43's binary on its own sources with `char pad47[24];` before
#      BwdV4Smem's `red` ($C/old/cuda-pad24: today's shared-memory offsets in the interior step
#      loop, checked with kernel-regs.py --step-diff), beside that binary and today's default,
#      and today's sources with `char pad47[104];` there ($C/cuda-pad128: session 43's offsets
#      + 128, the same banks: the candidate fix if the offsets are the cause), and today's sources
#      without item_next and the third tail (dead under BWD_KEYS_TMA; made on the device from the
#      tree's sources: $C/cuda-lean48), two rounds at 1x65536, 16x4096 and 64x1024 (LAYOUT_WL,
#      LAYOUT_ROUNDS); the call starts with one run at 1x131072 for the memory bar
set -u
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
. "$(dirname "$0")/device-bench.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"; export OUT=$O
mode=${1:?usage: device_s47.sh p|pw|o|l}
kcache_setup
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
date
case $mode in
p|pw) $C/bridge_cuda --ignored --test-threads 1 2>&1 | tail -8
   mkdir -p "$O/t1b"
   OUT=$O/t1b B=$C/flamia ROWS=16384 DOCS=short OOM_CHECK=0 bash bench/trainer_1b.sh 2>&1 | grep -v "Memory.cpp" | tail -8
   echo "deprecation lines in the trainer logs: $(cat "$O"/t1b/t1b-*.log | grep -c "is deprecated")"
   grep -h "attention kernel module" "$O"/t1b/t1b-*.log | cut -c1-200
   grep -o '"run":"[^"]*","step":[0-9]*\|"kernel_build_s":[0-9.]*' "$O"/t1b/trainer_1b_metrics.jsonl | paste -sd' ' | fold -w 200
   tar -C "$O" -czf "$O/t1b.tgz" t1b && rm -rf "$O/t1b" ;;
o) c0=$C
   for w in 1x65536 2x32768; do
     for b in new old; do
       [ $b = old ] && C=$c0/old
       prof_log phases-$b cuda-phases $w "^bwd4 |phase" 12
       prof_log redprof-$b cuda-redprof $w "^bwd4 reducer" 4
       C=$c0
     done
   done ;;
l) # is the 24-byte shift the cause? session 43's binary on its own sources with 24 bytes of
   # padding before the block maxima (today's offsets in the interior step loop: kernel-regs.py
   # --step-diff), beside the plain old binary and today's default (device-bench.sh's
   # rounds_vs_old), two rounds at 1x65536, 16x4096 and 64x1024 (the short documents' build has
   # the same shifted arrays, and 16x4096 sits at 1.01x the best BF16)
   # (LAYOUT_WL: the workloads, default "1x65536 16x4096 64x1024"; LAYOUT_ROUNDS, default 2; a
   # short call: LAYOUT_WL=1x65536 LAYOUT_ROUNDS=1)
   # issue 13's memory bar first (<= 2.7 GB for one call at a 131,072-token row; 2,376 MiB in
   # session 25, before BWD_KEYS_TMA's key records, ~40 MiB more at this length): the MiB column
   [ "${LAYOUT_SET:-all}" = lean ] || bench_mhz "memory today's default" - --workload 1x131072
   # today's sources without item_next and the third tail, both dead under BWD_KEYS_TMA (the
   # key records arrive after the K/V slot's release, so two tails suffice): 2,608 bytes less,
   # the small arrays at 96 mod 128 (session 48; kernel-regs.py --smem-offsets), made here from
   # the tree's sources (timing only: the suite has not run it)
   L48=$(make_lean48 "$C/cuda-lean48")
   LW=()
   for w in ${LAYOUT_WL:-1x65536 16x4096 64x1024}; do LW+=(--workload "$w"); done
   # LAYOUT_SET=lean: only today's default, the lean tails and session 43's binary (session 49:
   # the pads settled in call 1, the lean tails' -2.4% at 1x65536 within two rounds' noise)
   if [ "${LAYOUT_SET:-all}" = lean ]; then
     vs=(-)
     [ -n "$L48" ] && vs+=("FLAMIA_CUDA_DIR=$L48")
     vs+=(old)
   else
     vs=(- "FLAMIA_CUDA_DIR=$C/cuda-pad128")
     [ -n "$L48" ] && vs+=("FLAMIA_CUDA_DIR=$L48")
     vs+=(old "old:FLAMIA_CUDA_DIR=$C/old/cuda-pad24")
   fi
   ROUNDS=${LAYOUT_ROUNDS:-2} rounds_vs_old layout "${vs[@]}" -- "${LW[@]}"
   ;;
*) echo "device_s47.sh: unknown mode '$mode' (p, pw, o, l)"; exit 2 ;;
esac
kcache_pack
date
} 2>&1 | tee "$O/s47-$mode.log"
[ "$mode" = pw ] && bash "$(dirname "$0")/device_s46.sh" w
