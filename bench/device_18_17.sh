#!/bin/bash
# One device call for issues 18 and 17 (~8.5 min on an H200): bench/repro_check.sh (reproducibility,
# the deterministic mode's cost, resume; BUDGET_S 270 s), then bench/ab_seeds.sh (3 seeds x bf16 /
# mxfp8 on the rust-doc corpus, `flamia compare`; BUDGET_S 250 s) with the ignored GPU tests of
# tests/train_deterministic.rs beside it (two fresh runs bitwise equal, N/2 + --resume N/2 == N;
# they compare bits only, so sharing the GPU is harmless). Staged with
#   bash bench/device_bwd4.sh --stage && bash bench/stage_repro.sh
# carried: .device-carry/bwd4 .device-carry/repro .device-carry/corpus; from the repo root:
#   bash bench/device_18_17.sh           (everything under $OUT: repro/, ab/, gpu_tests.log)
# QUICK=1 shortens repro_check (~2.5 min); AB_STEPS (default 250) the A/B runs; TESTS=0 skips the
# GPU tests; AB=0 skips ab_seeds.
set -u
C=$PWD/.device-carry
. "$(dirname "$0")/device-env.sh"  # SP, LD_LIBRARY_PATH
export OUT=${OUT:-/tmp/flamia-out}; mkdir -p "$OUT"
T0=$(date +%s)
B=$C/bwd4/flamia STEPS=${REPRO_STEPS:-50} bash bench/repro_check.sh
TP=
if [ "${TESTS:-1}" = 1 ]; then
  ( FLAMIA_TEST_BIN=$C/bwd4/flamia FLAMIA_TEST_REPO=$PWD timeout "${TESTS_S:-240}" \
      "$C/repro/train_deterministic" --ignored --test-threads=2 > "$OUT/gpu_tests.log" 2>&1
    echo "GPU tests rc=$? after $(($(date +%s) - T0)) s" >> "$OUT/gpu_tests.log" ) &
  TP=$!
fi
[ "${AB:-1}" = 1 ] && B=$C/bwd4/flamia STEPS=${AB_STEPS:-250} bash bench/ab_seeds.sh
[ -n "$TP" ] && wait "$TP"
echo "== GPU tests (tests/train_deterministic.rs --ignored)"
grep -E "^test |test result|panicked|step [0-9]+:|differ|GPU tests rc" "$OUT/gpu_tests.log" 2>/dev/null | head -20
echo "device_18_17 total $(($(date +%s) - T0)) s"
