# Sourced by the session device scripts (device_s30.sh and later), after device-env.sh, with C
# set to the staged binaries' folder: the helpers their A/B runs share.
#
# run_bench LABEL ENV ARGS...: one `flamia bench attention` run, its table rows only; ENV is
# the environment assignments (space-separated; "-" for none), ARGS the bench's arguments.
run_bench() {
  local label=$1 e=$2; shift 2
  [ "$e" = - ] && e=X=1
  echo "=== $label"
  # (the assignments split on purpose)
  env $e timeout 100 "$C/flamia" bench attention "$@" 2>&1 | grep -E "^[0-9]|^lognormal|rror"
}
# The five d = 64 workloads the A/Bs run beside the nine at d = 128.
D64=(--head-dim 64 --workload 256x256 --workload 64x1024 --workload 32x2048 --workload 16x4096 --workload lognormal)
# ab_both_dims ENV: two rounds, each the default then ENV, on the nine at d = 128 and on D64.
ab_both_dims() {
  local r v
  for r in 1 2; do
    for v in - "$1"; do
      run_bench "d=128 $v round $r" "$v"
      run_bench "d=64 $v round $r" "$v" "${D64[@]}"
    done
  done
}
# ab_rounds LABEL ENV ARGS...: two rounds, each the default then ENV, of one bench run with ARGS.
ab_rounds() {
  local label=$1 env=$2 r v; shift 2
  for r in 1 2; do
    for v in - "$env"; do
      run_bench "$label $v round $r" "$v" "$@"
    done
  done
}
# bench_mhz LABEL ENV ARGS...: run_bench's rows (and any error line) plus each workload's fwd /
# bwd / train ms and the SM clock after each loop (MHz), from the bench's JSON.
bench_mhz() {
  local label=$1 e=$2 py
  shift 2
  [ "$e" = - ] && e=X=1
  py=$(command -v python3 || echo /opt/torch/.venv/bin/python)
  echo "=== $label"
  # (a variant that fails or times out writes no JSON: the previous one's must not be read as its)
  rm -f /tmp/b.json
  env $e timeout 150 "$C/flamia" bench attention --json /tmp/b.json "$@" 2>&1 | grep -E "^[0-9]|^lognormal|rror"
  [ -s /tmp/b.json ] || { echo "  (no JSON: the bench of $label failed or timed out)"; return; }
  $py - <<'PY'
import json
d = json.load(open("/tmp/b.json"))
for r in d.get("rows", d.get("results", [])):
    print("  mhz", r.get("workload"), "fwd", r.get("fwd_ms"), "@", r.get("fwd_mhz"), "bwd", r.get("bwd_ms"), "@", r.get("bwd_mhz"),
          "train", r.get("train_ms"), "@", r.get("train_mhz"))
PY
}
# ab_dirs DIR... -- ARGS...: two rounds, each the embedded sources then every kernel-source
# variant $C/DIR (FLAMIA_CUDA_DIR), bench_mhz with ARGS
ab_dirs() {
  local dirs=() r v e
  while [ "$1" != -- ]; do dirs+=("$1"); shift; done
  shift
  for r in 1 2; do
    for v in - "${dirs[@]}"; do
      e=-; [ "$v" != - ] && e=FLAMIA_CUDA_DIR=$C/$v
      bench_mhz "$v round $r" "$e" "$@"
    done
  done
}
# start_power_log FILE: nvidia-smi samples the SM clock, memory clock, power, temperature and the
# clock-event reasons every 20 ms into FILE (CSV without header, UTC timestamps: bench/energy.py
# reads it) in the background; its pid in POWER_LOG_PID (kill it when done).
start_power_log() {
  local f=clocks_event_reasons.active
  nvidia-smi --query-gpu=$f --format=csv,noheader >/dev/null 2>&1 || f=clocks_throttle_reasons.active
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$f \
    --format=csv,noheader -lms 20 > "$1" 2>&1 &
  POWER_LOG_PID=$!
  echo "power log ($f) into $1 from unix $(date +%s.%N)"
}
# suite_or_standing MODE: the modes every session script shares, run and exit: a, b the whole GPU
# suite in halves (device_suite.sh 1, 2 of PARTS=2, on $C's test binaries; a half no longer fits
# a call on a fresh machine, session 44), s1..s4 in quarters (PARTS=4), c the standing against the anchors
# (vs-anchors.sh with $C/flamia); any other mode returns for the script's own.
suite_or_standing() {
  case $1 in
  a | b) PARTS=2 T=$C bash bench/device_suite.sh $([ "$1" = a ] && echo 1 || echo 2); exit ;;
  s1 | s2 | s3 | s4) PARTS=4 T=$C bash bench/device_suite.sh "${1#s}"; exit ;;
  c) B=$C/flamia bash bench/vs-anchors.sh; exit ;;
  esac
}
