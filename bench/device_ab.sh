#!/bin/bash
# A/B of kernel-source variants in .device-carry/var (FLAMIA_CUDA_DIR, one binary): the GPU
# attention tests on each variant, then `flamia bench attention` base / variants, twice.
# Stage here: `bash bench/device_bwd4.sh --stage` (the binaries), then
#   bash bench/device_ab.sh --stage NAME=REV [NAME=REV ...]
# writes each git revision's kernel sources (flamia-kernels/cuda/*.cu, *.cuh) to
# .device-carry/var/NAME (the folder is emptied first); NAME=@VAR=VALUE[,VAR=VALUE] stages a
# variant of the binary's own sources run with those environment variables (a host knob, e.g.
# up32=@FLAMIA_BWD_UP_TILES=32). Carry .device-carry/bwd4 and
# .device-carry/var; run from the repo root on the device. "base" is the binary's own sources.
# Knobs: VARS (the variants, default all staged), WL (bench arguments), REPS (2), TESTS=0 skips
# the tests, TEST_VARS (the variants the tests run on, default VARS), TEST_FILTER (gpu_attention's
# test-name filter, e.g. head_dim_64).
set -u
C=.device-carry/bwd4; B=$C/flamia; V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  shift
  rm -rf $V && mkdir -p $V
  for spec in "$@"; do
    name=${spec%%=*}; rev=${spec#*=}
    [ "$name" = "$spec" ] && { echo "--stage takes NAME=REV or NAME=@VAR=VALUE, got '$spec'"; exit 2; }
    if [ "${rev#@}" != "$rev" ]; then
      mkdir -p $V/$name && echo "${rev#@}" | tr ',' '\n' > $V/$name/env; continue
    fi
    git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "no git revision '$rev'"; exit 2; }
    mkdir -p $V/$name
    for f in $(git ls-tree --name-only "$rev" flamia-kernels/cuda/ | grep -E '\.(cu|cuh)$'); do
      git show "$rev:$f" > $V/$name/$(basename "$f")
    done
  done
  du -sh $V/*; exit 0
fi
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
WL=${WL:---workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256 --workload 8192+224x256}
VARS=${VARS:-$(ls $V)}
# run "$@" as variant $1 (its kernel sources and/or environment), "base" as the binary is
as_var() {
  local v=$1; shift
  if [ "$v" = base ]; then "$@"; return; fi
  local envs=()
  [ -f $V/$v/env ] && mapfile -t envs < $V/$v/env
  if ls $V/$v/*.cu >/dev/null 2>&1; then envs+=("FLAMIA_CUDA_DIR=$V/$v"); fi
  env "${envs[@]}" "$@"
}
{
if [ "${TESTS:-1}" = 1 ]; then
  for v in ${TEST_VARS:-$VARS}; do
    echo "=== gpu_attention on $v"
    as_var $v timeout 200 $C/gpu_attention --ignored --test-threads=1 ${TEST_FILTER:-} 2>&1 | grep -E "test result|panicked|FAILED"
  done
fi
for r in $(seq ${REPS:-2}); do
  for v in base $VARS; do
    echo "=== $v ($r)"
    as_var $v timeout 200 $B bench attention $WL 2>&1 | grep -E "^[0-9]|^lognormal"
  done
done
} 2>&1 | tee "$O/device_ab.log"
