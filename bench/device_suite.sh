#!/bin/bash
# The whole GPU suite in two device calls: `bash bench/device_suite.sh 1` runs the first half of
# gpu_attention's GPU tests (sorted by name), `... 2` the second half and gpu_quant. Since session
# 27 the suite takes more than one call's 600 s (33 of its 36 tests finished in 525 s), so one
# call cut its tail. Binaries staged by `bash bench/device_bwd4.sh --stage` (T overrides the test
# binary's directory); `--list` prints the halves without running them (no GPU needed).
set -u
C=${T:-.device-carry/bwd4}
[ -e "$(dirname "$0")/device-env.sh" ] && . "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
part=${1:?usage: device_suite.sh 1|2 [--list]}
case $part in 1|2) ;; *) echo "device_suite.sh: the part is 1 or 2, not '$part'" >&2; exit 2 ;; esac
mapfile -t all < <($C/gpu_attention --ignored --list 2>/dev/null | sed -n 's/: test$//p' | sort)
n=${#all[@]}
if [ "$n" = 0 ]; then echo "device_suite.sh: no tests listed by $C/gpu_attention" >&2; exit 1; fi
h=$(((n + 1) / 2))
if [ "$part" = 1 ]; then sel=("${all[@]:0:$h}"); else sel=("${all[@]:$h}"); fi
if [ "${2:-}" = --list ]; then printf '%s\n' "${sel[@]}"; echo "(${#sel[@]} of $n)"; exit 0; fi
{
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
echo "=== gpu_attention, part $part: ${#sel[@]} of $n tests"; date
timeout 540 $C/gpu_attention --ignored --exact --test-threads=1 "${sel[@]}" 2>&1 \
  | grep -E "test result|panicked|FAILED|^test |exceeds|differs"
[ "${PIPESTATUS[0]}" = 124 ] && echo "=== part $part: cut by the 540 s timeout (the tests without a result did not finish)"
if [ "$part" = 2 ]; then timeout 50 $C/gpu_quant --ignored 2>&1 | grep -E "test result|panicked"; fi
date
} 2>&1 | tee "$O/suite-$part.log"
