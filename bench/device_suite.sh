#!/bin/bash
# The whole GPU suite in device calls of under 600 s: `bash bench/device_suite.sh K` runs part K
# of PARTS (default 4 since session 44: 48 tests, part 1's 24 did not finish in 480 s on a
# fresh H100) of gpu_attention's GPU tests (sorted by name, split evenly by count), the
# last part gpu_quant too. Session 27's suite did not fit one call (33 of its 36 tests in 525 s),
# session 28 split it in three; in session 29 all 36 took about 390 s (11 contract tests 57 s,
# the other 25 330 s) and gpu_quant 7 s, so two parts leave each call half its time spare. Binaries staged by `bash bench/device_bwd4.sh --stage` (T overrides the test
# binary's directory); `--list` prints a part without running it (no GPU needed).
# `bash bench/device_suite.sh all` (session 45) runs the whole suite in one call instead:
# gpu_attention's tests split over JOBS processes (default 6; device-bench.sh par_tests: separate
# CUDA contexts, compiling on the machine's cores) beside gpu_quant, bridge_cuda and model_cuda
# (where staged); session 45 ran it in 205 s on an H100, its kernel caches warm.
set -u
C=${T:-.device-carry/bwd4}
[ -e "$(dirname "$0")/device-env.sh" ] && . "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
if [ "${1:-}" = all ]; then
  . "$(dirname "$0")/device-bench.sh"
  mapfile -t all < <($C/gpu_attention --ignored --list 2>/dev/null | sed -n 's/: test$//p' | sort)
  {
  nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
  echo "=== gpu_attention: ${#all[@]} tests in ${JOBS:-6} processes"; date
  par_tests ${JOBS:-6} suite $C/gpu_attention "${all[@]}" &
  for t in gpu_quant bridge_cuda model_cuda; do
    if [ -x $C/$t ]; then
      (timeout 400 $C/$t --ignored --test-threads=1 > "$O/suite-$t.log" 2>&1
       echo "=== $t: rc=$?"; grep -E "^test .*(ok|FAILED)$|test result|panicked" "$O/suite-$t.log") &
    else
      echo "=== $t: not staged (skipped)"
    fi
  done
  wait
  date
  } 2>&1 | tee "$O/suite-all.log"
  exit 0
fi
P=${PARTS:-4}
part=${1:?usage: device_suite.sh K|all [--list]  (K = 1..PARTS, PARTS=4 unless set)}
if ! [[ "$part" =~ ^[0-9]+$ ]] || [ "$part" -lt 1 ] || [ "$part" -gt "$P" ]; then
  echo "device_suite.sh: the part is 1..$P (PARTS=$P), not '$part'" >&2; exit 2
fi
mapfile -t all < <($C/gpu_attention --ignored --list 2>/dev/null | sed -n 's/: test$//p' | sort)
n=${#all[@]}
if [ "$n" = 0 ]; then echo "device_suite.sh: no tests listed by $C/gpu_attention" >&2; exit 1; fi
a=$(((part - 1) * n / P)); b=$((part * n / P))
sel=("${all[@]:$a:$((b - a))}")
if [ "${2:-}" = --list ]; then printf '%s\n' "${sel[@]}"; echo "(${#sel[@]} of $n)"; exit 0; fi
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_attention, part $part: ${#sel[@]} of $n tests"; date
# (the whole output into a log under $O and grep line-buffered, so a call cut by its limit still
# brings back every result so far: session 44's part 1 ran 480 s on a fresh H100, the kernels
# compiling within it, and its results, held in grep's buffer, were lost)
timeout 540 $C/gpu_attention --ignored --exact --test-threads=1 "${sel[@]}" 2>&1 | tee "$O/suite-$part-tests.log" \
  | grep --line-buffered -E "test result|panicked|FAILED|^test |exceeds|differs"
[ "${PIPESTATUS[0]}" = 124 ] && echo "=== part $part: cut by the 540 s timeout (the tests without a result did not finish)"
if [ "$part" = "$P" ]; then timeout 50 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"; fi
date
} 2>&1 | tee "$O/suite-$part.log"
