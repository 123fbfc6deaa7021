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
# rounds_vs_old LABEL VARIANT... -- ARGS: two rounds of bench_mhz with ARGS over the variants, each
# an environment setting ("-": the default), "old" (the staged older binary, $C/old/flamia) or
# "old:ENV" (that binary with ENV, e.g. old:FLAMIA_CUDA_DIR=.device-carry/bwd4/old/cuda-pad24);
# ROUNDS (default 2) rounds
rounds_vs_old() {
  local label=$1 r e c0=$C vs=()
  shift
  while [ "$1" != -- ]; do vs+=("$1"); shift; done
  shift
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for e in "${vs[@]}"; do
      case $e in
      old) C=$c0/old; bench_mhz "$label old binary round $r" - "$@"; C=$c0 ;;
      old:*) C=$c0/old; bench_mhz "$label old binary ${e#old:} round $r" "${e#old:}" "$@"; C=$c0 ;;
      *) bench_mhz "$label $e round $r" "$e" "$@" ;;
      esac
    done
  done
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
# kcache_setup: the kernel caches (FLAMIA_KERNEL_CACHE: NVRTC's PTX; CUDA_CACHE_PATH: the driver's
# SASS) in /tmp/fk-cache, the PTX unpacked from .device-carry/kc/kcache.txz (or .tgz) when that
# is carried (a fresh machine otherwise compiles every kernel inside the tests: session 44's half
# suite ran out of its call). Entries are keyed by source text, options and compiler versions, so
# a stale entry is a miss, never a wrong module. kcache_pack: the PTX into $O/kcache.txz (xz on
# all cores: the whole suite's 125 MB of PTX is 6 MB, 16.5 MB with gzip; the SASS cache, 35-130
# MB, is over what a call brings back) -- copy it from the reply's files_at to .device-carry/kc/
# (that folder holding one of the two) and carry the folder next time.
KC=/tmp/fk-cache
kcache_setup() {
  mkdir -p $KC/ptx $KC/sass
  local f
  for f in .device-carry/kc/kcache.txz .device-carry/kc/kcache.tgz; do
    [ -s $f ] && { tar -C $KC -xf $f || echo "kcache_setup: $f did not unpack (compiling from scratch)"; break; }
  done
  export FLAMIA_KERNEL_CACHE=$KC/ptx CUDA_CACHE_PATH=$KC/sass CUDA_CACHE_MAXSIZE=4294967296
  echo "kernel caches: $(ls $KC/ptx | wc -l) PTX entries, $(du -sh $KC/sass | cut -f1) of SASS"
}
kcache_pack() {
  local o=${O:-/tmp/flamia-out}
  if command -v xz >/dev/null; then
    tar -C $KC -cf - ptx | xz -T0 -6 > "$o/kcache.txz"
  else
    tar -C $KC -czf "$o/kcache.tgz" ptx
  fi
  echo "kernel cache packed: $(ls $KC/ptx | wc -l) PTX entries, $(du -h "$o"/kcache.t?z | cut -f1)"
}
# prof_log NAME DIR WORKLOAD PATTERN N: one `flamia bench attention` at WORKLOAD on the kernel
# sources $C/DIR (a profiling build that prints at the kernel's end: BWD_PROF_PHASES,
# BWD_PROF_REDUCER), its whole output in $O/NAME-WORKLOAD.log, then its last N lines matching PATTERN.
prof_log() {
  local name=$1 dir=$2 w=$3 pat=$4 n=$5 log=${O:-/tmp/flamia-out}/$1-$3.log
  echo "=== $name $w"
  FLAMIA_CUDA_DIR=$C/$dir timeout 120 $C/flamia bench attention --workload $w > "$log" 2>&1 || echo "rc=$?"
  grep -E "$pat" "$log" | tail -$n
}
# par_tests JOBS LABEL BIN TEST...: the tests split round-robin over JOBS processes of BIN (each
# --test-threads=1, FLAMIA_BWD_HANG_TRAP=1, TLIM seconds, default 520), each logged whole to
# $O/LABEL-jK.log; then every test's result line. Separate processes are separate CUDA contexts,
# which the GPU time-slices, so two persistent kernels (whose CTAs wait on each other's
# semaphores) never share the SMs, as threads of one process could; NVRTC and the driver's
# compiler then use the machine's cores (session 45: the whole suite in 205 s on an H100).
par_tests() {
  local jobs=$1 label=$2 bin=$3 j i o=${O:-/tmp/flamia-out}
  shift 3
  local all=("$@") pids=()
  for ((j = 0; j < jobs; j++)); do
    local sel=()
    for ((i = j; i < ${#all[@]}; i += jobs)); do sel+=("${all[$i]}"); done
    [ ${#sel[@]} = 0 ] && continue
    (FLAMIA_BWD_HANG_TRAP=1 timeout ${TLIM:-520} $bin --ignored --exact --test-threads=1 "${sel[@]}" > "$o/$label-j$j.log" 2>&1
     echo "=== $label-j$j: rc=$? (${#sel[@]} tests)") &
    pids+=($!)
  done
  wait "${pids[@]}"
  grep -hE "^test .*(ok|FAILED)$|panicked|exceeds|differs" "$o"/$label-j*.log | sort | uniq
  grep -h "test result" "$o"/$label-j*.log
}
# suite_or_standing MODE: the modes every session script shares, run and exit: suite the whole GPU
# suite at once in parallel processes (device_suite.sh all, on $C's test binaries; session 45),
# a, b in halves (device_suite.sh 1, 2 of PARTS=2; a half no longer fits a call on a fresh
# machine, session 44), s1..s4 in quarters (PARTS=4), c the standing against the anchors
# (vs-anchors.sh with $C/flamia); any other mode returns for the script's own.
suite_or_standing() {
  case $1 in
  a | b) PARTS=2 T=$C bash bench/device_suite.sh $([ "$1" = a ] && echo 1 || echo 2); exit ;;
  s1 | s2 | s3 | s4) PARTS=4 T=$C bash bench/device_suite.sh "${1#s}"; exit ;;
  suite) T=$C bash bench/device_suite.sh all; exit ;;
  c) B=$C/flamia bash bench/vs-anchors.sh; exit ;;
  esac
}
# make_lean48 DIR: the tree's kernel sources in DIR without item_next and the third tail of the
# backward's shared memory (session 48: both dead under BWD_KEYS_TMA; timing only, the suite has
# not run it) by two checked sed edits; prints DIR, or nothing (and why) if they did not apply
make_lean48() {
  local d=$1
  rm -rf "$d" && cp -r flamia-kernels/cuda "$d" || return
  sed -i 's/^#define BWD_TAILS (BWD_EARLY_FACTORS ? 3 : 2)$/#define BWD_TAILS ((BWD_EARLY_FACTORS \&\& !BWD_KEYS) ? 3 : 2)  \/\/ (lean48)/; s/^#if BWD_EARLY_FACTORS \&\& !BWD_FOLD$/#if BWD_EARLY_FACTORS \&\& !BWD_FOLD \&\& !BWD_KEYS  \/\/ (lean48)/' "$d/attn_bwd_v4.cu"
  if [ "$(grep -c '(lean48)' "$d/attn_bwd_v4.cu")" = 2 ]; then
    echo "$d"
  else
    echo "lean48: the two edits did not apply (skipped)" >&2
  fi
}
