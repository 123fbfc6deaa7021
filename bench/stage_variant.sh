#!/bin/bash
# A kernel-source variant for an FLAMIA_CUDA_DIR A/B on the device (same binary, kernels compiled
# from another source set): .device-carry/bwd4/cuda-NAME = the tree's flamia-kernels/cuda with
# PATCH applied (a path made by `git diff` from the repo root, or - for none) and each
# FILE:NAME=VALUE define put at the top of FILE. Run after `bash bench/device_bwd4.sh --stage`,
# before packing .device-carry/z/bwd4.tgz:
#   bash bench/stage_variant.sh first0 - softmax.cuh:FWD_FACTORS_FIRST=0
set -eu
name=${1:?usage: stage_variant.sh NAME PATCH|- [FILE:NAME=VALUE ...]}
patch=${2:?usage: stage_variant.sh NAME PATCH|- [FILE:NAME=VALUE ...]}
shift 2
d=.device-carry/bwd4/cuda-$name
rm -rf "$d"; mkdir -p "$d"
cp flamia-kernels/cuda/*.cu flamia-kernels/cuda/*.cuh "$d/"
if [ "$patch" != - ]; then patch -p3 --quiet -d "$d" < "$patch"; fi
for fd in "$@"; do
  f=${fd%%:*} def=${fd#*:}
  [ -f "$d/$f" ] || { echo "stage_variant.sh: no $f in $d" >&2; exit 1; }
  sed -i "1i #define ${def%%=*} ${def#*=}" "$d/$f"
done
echo "$d: $(ls "$d" | wc -l) files"
