#!/bin/bash
# Session 17, device call 2 (~8 minutes): the new defaults (BWD_CVT4 on, 6 early column
# constants in the walk-up build) under the GPU tests that check them; the turn-taking
# warpgroups (FLAMIA_BWD_TURN=1) and the redux block maxima (FLAMIA_BWD_REDUX=1) under their
# bitwise test, the ordering and accuracy tests, and in the A/B at d = 128 and 64 (variants
# turn, redux, tr = both); the quantiser variants staged in .device-carry/var/q* (gpu_quant's
# bitwise tests on each, then the A/B); and the SM clock and power sampled every 20 ms during
# one 1x65536 bench (is the forward at the 700 W cap?).
# Stage here:
#   bash bench/device_bwd4.sh --stage && strip .device-carry/bwd4/* && bash bench/device_s17b.sh --stage
# (keeps .device-carry/var/q* staged by the quantiser work), carry .device-carry/bwd4 and
# .device-carry/var, run from the repo root on the device.
set -u
V=.device-carry/var
if [ "${1:-}" = "--stage" ]; then
  mkdir -p $V
  for d in $V/*; do case $(basename $d) in q*) ;; *) rm -rf $d ;; esac; done
  mkdir -p $V/turn $V/redux $V/tr
  echo FLAMIA_BWD_TURN=1 > $V/turn/env; echo FLAMIA_BWD_REDUX=1 > $V/redux/env
  printf 'FLAMIA_BWD_TURN=1\nFLAMIA_BWD_REDUX=1\n' > $V/tr/env
  du -sh $V/*; exit 0
fi
C=.device-carry/bwd4
. "$(dirname "$0")/device-env.sh"
O=${OUT:-/tmp/flamia-out}; mkdir -p "$O"
QV=$(cd $V && ls -d q* 2>/dev/null | tr '\n' ' ')
T="^test |test result|panicked"
{
echo "=== GPU tests, defaults and the knobs' bitwise test"; date
timeout 150 $C/gpu_attention --ignored --test-threads=1 mxfp8_causal_gqa walking_up repeated_runs backward_four_code 2>&1 | grep -E "$T"
timeout 200 $C/gpu_attention --ignored --test-threads=1 backward_redux_maxima_and_turns 2>&1 | grep -E "$T"
echo "=== GPU tests, turn + redux"; date
FLAMIA_BWD_TURN=1 FLAMIA_BWD_REDUX=1 timeout 200 $C/gpu_attention --ignored --test-threads=1 walking_up dq_is_bitwise 2>&1 | grep -E "$T"
for q in $QV; do
  echo "=== gpu_quant on $q"; date
  FLAMIA_CUDA_DIR=$V/$q timeout 100 $C/gpu_quant --ignored --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED"
done
echo "=== clocks during one 1x65536 bench"; date
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.sw_power_cap --format=csv,noheader -lms 20 > $O/smi.csv 2>&1 &
SMI=$!
sleep 1; timeout 60 $C/flamia bench attention --workload 1x65536 2>&1 | grep -E "^[0-9]|workload"
sleep 1; kill $SMI
python3 - $O/smi.csv <<'PY'
import sys
rows=[[x.strip() for x in l.split(',')] for l in open(sys.argv[1]) if l.count(',')>=3]
num=lambda x: float(x.split()[0]) if x.split() and x.split()[0].replace('.','').isdigit() else None
ck=[num(r[1]) for r in rows if num(r[1]) is not None]
pw=[num(r[2]) for r in rows if num(r[2]) is not None]
if not ck: sys.exit('no samples: ' + open(sys.argv[1]).read()[:300])
cap=sum(1 for r in rows if r[3] == 'Active')
print(f"samples {len(rows)}; SM clock MHz min {min(ck):.0f} median {sorted(ck)[len(ck)//2]:.0f} max {max(ck):.0f}; power W max {max(pw):.0f}; power cap active in {cap}")
busy=[(num(r[1]), num(r[2])) for r in rows if num(r[2]) is not None and num(r[2]) > 300]
print("samples over 300 W (MHz/W):", ' '.join(f"{c:.0f}/{p:.0f}" for c, p in busy))
PY
echo "=== A/B d = 128"; date
VARS="turn redux tr $QV" TESTS=0 REPS=2 OUT=$O/a WL=" " timeout 300 bash bench/device_ab.sh > /dev/null 2>&1
for col in bwd train; do python3 bench/ab_table.py $O/a/device_ab.log --col $col; done
[ -n "$QV" ] && python3 bench/ab_table.py $O/a/device_ab.log --col quant
echo "=== A/B d = 64 (turn, redux, tr)"; date
VARS="turn redux tr" TESTS=0 REPS=2 OUT=$O/b WL="--head-dim 64 --workload 1x65536 --workload 16x4096 --workload 64x1024 --workload 256x256" timeout 100 bash bench/device_ab.sh > /dev/null 2>&1
python3 bench/ab_table.py $O/b/device_ab.log --col bwd
date
} 2>&1 | tee "$O/s17b.log"
