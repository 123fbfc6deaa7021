#!/usr/bin/env bash
# Tests scripts/setup-libtorch.sh (the real script) against fake tools: a fake python (given as
# PYTHON, and as python3 first on PATH) whose `-m venv` makes a venv holding a fake venv python,
# whose `-m pip install torch==2.11.0` writes torch/version.py and torch/lib/ (or fails on demand),
# and a fake df. No network, no real torch, a few seconds. Each case gets a fresh temporary
# directory with FLAMIA_VENV inside it; the project's own .venv is never touched.
# Prints `ok N description` per case; on the first failure prints what went wrong (with the run's
# stdout, stderr and the fakes' call log) to stderr and exits 1.
# Run: bash scripts/setup_libtorch_test.sh
set -uo pipefail
script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup-libtorch.sh"
[ -f "$script" ] || { echo "setup_libtorch_test: $script not found" >&2; exit 1; }
T="$(mktemp -d "${TMPDIR:-/tmp}/flamia-setup-test.XXXXXX")" || exit 1
T="$(cd "$T" && pwd -P)"
trap 'rm -rf "$T"' EXIT
want=2.11.0
site=lib/python3.12/site-packages

# ---- the fakes ------------------------------------------------------------------------------
stubs="$T/stubs"
mkdir -p "$stubs/bin"
# The base python: the version checks and `-m venv DIR` (FAKE_PY_VERSION: the version it reports;
# FAKE_VENV_FAIL=1: fails like Debian's venv without python3-venv, message on stdout, a partial
# venv left behind).
cat > "$stubs/bin/python3" <<'EOF'
#!/usr/bin/env bash
log() { echo "$*" >> "${FAKE_LOG:?}"; }
ver="${FAKE_PY_VERSION:-3.12}"
if [ "$#" = 2 ] && [ "$1" = -c ]; then
    case "$2" in
        'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)')
            log "version-check"
            major="${ver%%.*}" minor="${ver#*.}"
            [ "$major" -gt 3 ] || { [ "$major" = 3 ] && [ "$minor" -ge 10 ]; }
            exit ;;
        'import sys; print("%d.%d" % sys.version_info[:2])')
            echo "$ver"; exit 0 ;;
    esac
fi
if [ "$#" = 3 ] && [ "$1" = -m ] && [ "$2" = venv ]; then
    log "venv $3"
    mkdir -p "$3/bin" "$3/lib/python3.12/site-packages" || exit 1
    cp "${FAKE_VENV_PYTHON:?}" "$3/bin/python" && chmod +x "$3/bin/python" || exit 1
    echo "home = $(dirname "$0")" > "$3/pyvenv.cfg"
    if [ "${FAKE_VENV_FAIL:-0}" = 1 ]; then
        echo "The virtual environment was not created successfully because ensurepip is not"
        echo "available.  On Debian/Ubuntu systems, you need to install the python3-venv"
        exit 1
    fi
    exit 0
fi
log "unexpected python3 $*"
echo "fake python3: unexpected arguments: $*" >&2
exit 97
EOF
# The venv's python (copied into DIR/bin/python): `-c ""`, `-W ignore -c "import torch"`
# (FAKE_IMPORT_FAIL=1: fails; fails anyway without torch/version.py or with a torch half written
# by a failed pip), `-m pip install ...` (FAKE_PIP_FAIL=1: fails half way, leaving a torch that
# does not import; FAKE_PIP_GATE=FILE: waits until FILE exists, 20 s at most).
cat > "$stubs/venv-python" <<'EOF'
#!/usr/bin/env bash
log() { echo "$*" >> "${FAKE_LOG:?}"; }
venv="$(cd "$(dirname "$0")/.." && pwd)"
torch="$venv/lib/python3.12/site-packages/torch"
if [ "$#" = 2 ] && [ "$1" = -c ] && [ -z "$2" ]; then
    log "run $venv"
    exit 0
fi
if [ "$#" = 4 ] && [ "$1" = -W ] && [ "$2" = ignore ] && [ "$3" = -c ] && [ "$4" = "import torch" ]; then
    log "import $venv"
    if [ "${FAKE_IMPORT_FAIL:-0}" = 1 ]; then echo "ImportError: libtorch_cuda.so: cannot open" >&2; exit 1; fi
    if [ ! -f "$torch/version.py" ]; then echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1; fi
    if grep -qs partial "$torch/__init__.py"; then echo "ImportError: torch is half installed" >&2; exit 1; fi
    exit 0
fi
if [ "$#" = 6 ] && [ "$1 $2 $3 $4 $5" = "-m pip install --disable-pip-version-check --no-cache-dir" ] &&
    [ "$6" = "torch==2.11.0" ]; then
    tmp_ok=0
    [ -n "${TMPDIR:-}" ] && [ -d "$TMPDIR" ] && tmp_ok=1
    log "pip $venv TMPDIR=${TMPDIR:-} tmpdir_exists=$tmp_ok"
    echo "Collecting torch==2.11.0 (fake pip, on stdout)"
    if [ -n "${FAKE_PIP_GATE:-}" ]; then
        for _ in $(seq 200); do [ -e "$FAKE_PIP_GATE" ] && break; sleep 0.1; done
    fi
    mkdir -p "$torch/lib" && echo "# partial" > "$torch/__init__.py" || exit 1
    if [ "${FAKE_PIP_FAIL:-0}" = 1 ]; then
        echo "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device" >&2
        exit 1
    fi
    echo "__version__ = '2.11.0+cu130'" > "$torch/version.py"
    echo "# complete" > "$torch/__init__.py"
    echo "Successfully installed torch-2.11.0 (fake pip, on stdout)"
    exit 0
fi
log "unexpected venv-python $*"
echo "fake venv python: unexpected arguments: $*" >&2
exit 97
EOF
# df -Pk DIR (FAKE_DF_FREE_KB: the free KiB it reports; plenty by default).
cat > "$stubs/bin/df" <<'EOF'
#!/usr/bin/env bash
echo "df $*" >> "${FAKE_LOG:?}"
echo "Filesystem     1024-blocks      Used Available Capacity Mounted on"
echo "fakefs           999999999         1 ${FAKE_DF_FREE_KB:-104857600}       1% /"
EOF
chmod +x "$stubs/bin/python3" "$stubs/venv-python" "$stubs/bin/df"
export PATH="$stubs/bin:$PATH" FAKE_VENV_PYTHON="$stubs/venv-python"
have_flock=0
command -v flock >/dev/null 2>&1 && have_flock=1
to=()
command -v timeout >/dev/null 2>&1 && to=(timeout 60)

# ---- helpers --------------------------------------------------------------------------------
n=0 desc="" d="" venv="" rc="" out="" err=""
# A new case: a fresh directory $d, the venv path $venv inside it, the fakes reset.
begin() {
    n=$1 desc=$2
    d="$T/case$n"
    mkdir -p "$d"
    venv="$d/venv"
    export FAKE_LOG="$T/case$n.log"
    : > "$FAKE_LOG"
    unset FAKE_PY_VERSION FAKE_VENV_FAIL FAKE_IMPORT_FAIL FAKE_PIP_FAIL FAKE_PIP_GATE FAKE_DF_FREE_KB
    export PYTHON="$stubs/bin/python3"
}
# Runs the real script with FLAMIA_VENV=$1 (default $venv) from directory $2 (default $d); sets
# rc, out, err. FLAMIA_VENV always names a path under $T.
run() {
    local v="${1:-$venv}" cwd="${2:-$d}"
    case "$v" in "$T"/*|[!/]*) ;; *) echo "setup_libtorch_test: refusing FLAMIA_VENV=$v" >&2; exit 1 ;; esac
    (cd "$cwd" && FLAMIA_VENV="$v" "${to[@]}" bash "$script" >"$T/out" 2>"$T/err")
    rc=$?
    out="$(cat "$T/out")" err="$(cat "$T/err")"
}
die() {
    {
        echo "FAIL $n $desc: $*"
        echo "--- exit status: $rc"
        echo "--- stdout:"; printf '%s\n' "$out"
        echo "--- stderr:"; printf '%s\n' "$err"
        echo "--- fake tools' calls:"; cat "$FAKE_LOG" 2>/dev/null
        echo "setup_libtorch_test: scripts/setup-libtorch.sh failed case $n ($desc)"
    } >&2
    exit 1
}
ok() { echo "ok $n $desc"; }
expect_rc() { [ "$rc" = "$1" ] || die "exit status $rc, expected $1"; }
expect_out() { [ "$out" = "$1" ] || die "stdout is '$out', expected '$1'"; }
expect_err() { grep -qF -- "$1" <<<"$err" || die "stderr lacks '$1'"; }
expect_no_err() { ! grep -qF -- "$1" <<<"$err" || die "stderr has '$1', it should not"; }
calls() { grep -c "^$1 " "$FAKE_LOG"; }
expect_calls() { local c; c="$(calls "$1")"; [ "$c" = "$2" ] || die "$1 ran $c times, expected $2"; }
exists() { [ -e "$1" ] || die "$1 is missing"; }
absent() { [ ! -e "$1" ] || die "$1 exists, it should not"; }
clean_log() { ! grep -q '^unexpected' "$FAKE_LOG" || die "the script called a fake tool in an unexpected way"; }
# Nothing but the lock file (where flock exists) in $d.
nothing_made() {
    local left
    left="$(ls -A "$d" | tr '\n' ' ')"
    [ "$left" = "" ] || [ "$left" = "venv.lock " ] || die "left behind in $d: $left"
}
lib_of() { echo "$1/$site/torch/lib"; }
# A finished install made by the script itself (log reset afterwards).
install() {
    run; expect_rc 0; exists "$venv/.flamia-torch-$want"
    : > "$FAKE_LOG"
}
# A venv made by hand: the fake venv python and torch/version.py with version $1.
old_venv() {
    mkdir -p "$venv/bin" "$venv/$site/torch/lib"
    cp "$FAKE_VENV_PYTHON" "$venv/bin/python"
    echo "__version__ = '$1'" > "$venv/$site/torch/version.py"
}

# ---- the cases ------------------------------------------------------------------------------
begin 1 "fresh install: venv made, pip once, marker written, pip-tmp removed, lib dir printed"
run
expect_rc 0
expect_out "$(lib_of "$venv")"
exists "$venv/.flamia-torch-$want"
exists "$venv/$site/torch/lib"
absent "$venv.pip-tmp"
expect_calls venv 1
expect_calls pip 1
expect_calls import 1
grep -qxF "pip $venv TMPDIR=$venv.pip-tmp tmpdir_exists=1" "$FAKE_LOG" ||
    die "pip did not run with TMPDIR=$venv.pip-tmp (an existing directory)"
expect_err "installing torch==$want into $venv"
expect_err "Collecting torch==2.11.0 (fake pip, on stdout)"   # pip's output goes to stderr
clean_log
ok

begin 2 "second run on the finished venv: same lib dir, no pip, no import, no lock"
install
rm -f "$venv.lock"
run
expect_rc 0
expect_out "$(lib_of "$venv")"
expect_calls pip 0
expect_calls venv 0
expect_calls import 0
absent "$venv.lock"
[ -z "$err" ] || die "stderr should be empty"
clean_log
ok

begin 3 "pip fails on a venv the run created: exit 1, message, partial venv removed"
export FAKE_PIP_FAIL=1
run
expect_rc 1
expect_out ""
expect_err "setup-libtorch: pip could not install torch==$want into $venv (see above)"
expect_err "setup-libtorch: removed the partial $venv"
absent "$venv"
absent "$venv.pip-tmp"
expect_calls pip 1
clean_log
ok

begin 4 "pip fails where FLAMIA_VENV was the user's directory: exit 1, directory kept"
mkdir -p "$venv"
echo mine > "$venv/user-file"
export FAKE_PIP_FAIL=1
run
expect_rc 1
expect_out ""
expect_err "setup-libtorch: pip could not install torch==$want into $venv (see above)"
expect_no_err "removed the partial"
exists "$venv/user-file"
absent "$venv.pip-tmp"
absent "$venv/.flamia-torch-$want"
expect_calls pip 1
clean_log
ok

begin 5 "torch $want present without the marker (an old install): imported once, marked, no pip"
old_venv "2.11.0+cu128"
run
expect_rc 0
expect_out "$(lib_of "$venv")"
exists "$venv/.flamia-torch-$want"
expect_calls import 1
expect_calls pip 0
expect_calls venv 0
absent "$venv.lock"
clean_log
ok

begin 6 "install completes but import torch fails: exit 1, created venv removed, no marker"
export FAKE_IMPORT_FAIL=1
run
expect_rc 1
expect_out ""
expect_err "setup-libtorch: torch $want did not import from $venv"
expect_err "setup-libtorch: removed the partial $venv"
absent "$venv"
absent "$venv.pip-tmp"
expect_calls pip 1
expect_calls import 1
clean_log
ok

begin 7 "Python too old: exit 1 with the >= 3.10 message, nothing created"
export FAKE_PY_VERSION=3.9
run
expect_rc 1
expect_out ""
expect_err "setup-libtorch: $PYTHON is Python 3.9; PyTorch $want needs >= 3.10 (set PYTHON to a newer one)"
absent "$venv"
nothing_made
expect_calls venv 0
expect_calls pip 0
clean_log
ok

begin 8 "too little disk (df): exit 1 with the MiB-free message, nothing created"
export FAKE_DF_FREE_KB=1024000
run
expect_rc 1
expect_out ""
expect_err "setup-libtorch: $d has 1000 MiB free; installing torch==$want needs about 8000 MiB"
expect_err "set FLAMIA_VENV to a venv path on a larger disk"
grep -qxF "df -Pk $d" "$FAKE_LOG" || die "df was not asked about $d"
absent "$venv"
nothing_made
expect_calls venv 0
expect_calls pip 0
clean_log
ok

begin 9 "two runs at once on one fresh venv: both succeed, pip once, the second waits on the lock"
if [ "$have_flock" = 0 ]; then
    echo "SKIPPED: no flock (case $n)"
else
    # pip holds until the test opens the gate: the other run must be waiting on the lock by then
    # (deterministic, unlike a sleep on 2 busy cores)
    export FAKE_PIP_GATE="$d/gate"
    both=("${to[@]}" bash "$script")
    (cd "$d" && FLAMIA_VENV="$venv" "${both[@]}" >"$d.a.out" 2>"$d.a.err"; echo $? >"$d.a.rc") &
    pa=$!
    (cd "$d" && FLAMIA_VENV="$venv" "${both[@]}" >"$d.b.out" 2>"$d.b.err"; echo $? >"$d.b.rc") &
    pb=$!
    for _ in $(seq 150); do
        [ "$(calls pip)" -ge 1 ] && cat "$d.a.err" "$d.b.err" | grep -qF "another process is installing" && break
        sleep 0.1
    done
    touch "$FAKE_PIP_GATE"
    wait "$pa" "$pb"
    rc="$(cat "$d.a.rc") $(cat "$d.b.rc")"
    out="$(cat "$d.a.out"; echo "----"; cat "$d.b.out")"
    err="$(cat "$d.a.err"; echo "----"; cat "$d.b.err")"
    [ "$rc" = "0 0" ] || die "exit statuses '$rc', expected both 0"
    for r in a b; do
        [ "$(cat "$d.$r.out")" = "$(lib_of "$venv")" ] || die "run $r printed '$(cat "$d.$r.out")'"
    done
    expect_calls pip 1
    expect_calls venv 1
    waited="$(grep -lF "setup-libtorch: another process is installing torch into $venv; waiting for it" "$d.a.err" "$d.b.err")"
    [ "$(grep -c . <<<"$waited")" = 1 ] || die "exactly one run should have waited on the lock (waited: '$waited')"
    ! grep -qF "installing torch==$want" "$waited" || die "the run that waited installed too"
    exists "$venv/.flamia-torch-$want"
    absent "$venv.pip-tmp"
    clean_log
    ok
fi

begin 10 "marker present but bin/python no longer runs: reinstalled"
install
rm -f "$venv/bin/python"
run
expect_rc 0
expect_out "$(lib_of "$venv")"
expect_calls venv 1
expect_calls pip 1
exists "$venv/bin/python"
exists "$venv/.flamia-torch-$want"
absent "$venv.pip-tmp"
clean_log
ok

begin 11 "venv creation fails (Debian without python3-venv): message on stderr, partial venv removed"
export FAKE_VENV_FAIL=1
run
expect_rc 1
expect_out ""   # env.sh captures stdout and drops it on failure: the reason must be on stderr
expect_err "ensurepip is not"
expect_err "setup-libtorch: $PYTHON could not create a venv at $venv (see above)"
expect_err "setup-libtorch: removed the partial $venv"
absent "$venv"
absent "$venv.pip-tmp"
expect_calls pip 0
clean_log
ok

begin 12 "no PYTHON: python3 from PATH; a relative FLAMIA_VENV is made absolute"
unset PYTHON
run venv "$d"
expect_rc 0
expect_out "$(lib_of "$venv")"
grep -qxF "venv $venv" "$FAKE_LOG" || die "the venv was not created at the absolute path $venv"
grep -qx "version-check" "$FAKE_LOG" || die "python3 from PATH was not used"
exists "$venv/.flamia-torch-$want"
clean_log
ok

begin 13 "the venv's parent directory is missing: exit 1 with the message, nothing created"
run "$d/missing/venv"
expect_rc 1
expect_out ""
expect_err "setup-libtorch: the venv's parent directory $d/missing does not exist"
absent "$d/missing"
[ -z "$(ls -A "$d")" ] || die "left behind in $d: $(ls -A "$d")"
clean_log
ok

begin 14 "a venv with another torch (2.10.0): torch $want reinstalled into it"
old_venv "2.10.0+cu128"
run
expect_rc 0
expect_out "$(lib_of "$venv")"
expect_calls pip 1
grep -qF "'2.11.0+cu130'" "$venv/$site/torch/version.py" || die "torch was not reinstalled"
exists "$venv/.flamia-torch-$want"
clean_log
ok

begin 15 "a reinstall over a marked venv fails half way: marker gone, venv kept, the next run reinstalls"
install
rm -f "$venv/bin/python"
export FAKE_PIP_FAIL=1
run
expect_rc 1
expect_err "setup-libtorch: pip could not install torch==$want into $venv (see above)"
absent "$venv/.flamia-torch-$want"
exists "$venv/$site/torch/version.py"   # torch 2.11.0's files, half written: only the marker tells
expect_calls pip 1
unset FAKE_PIP_FAIL
run
expect_rc 0
expect_out "$(lib_of "$venv")"
expect_calls pip 2
exists "$venv/.flamia-torch-$want"
clean_log
ok

echo "setup_libtorch_test: all cases passed"
