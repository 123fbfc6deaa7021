#!/usr/bin/env bash
# Launch one process per GPU on this node (torchrun-style variables: RANK, WORLD_SIZE,
# LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#
#   launch/local.sh NGPUS PROGRAM [ARGS...]
#   launch/local.sh 8 target/release/flamia train --config configs/h200x8-1b.toml --resume
#   launch/local.sh auto target/release/flamia train --config configs/h200x8-1b.toml --resume
#                                                # NGPUS from nvidia-smi
#
# Rank r's output is prefixed "[r]" (rank 0's unprefixed with FLAMIA_LAUNCH_PREFIX=0). If a rank
# fails, the others get FLAMIA_LAUNCH_GRACE_S seconds (default 30) to exit on their own (they
# detect the failure through heartbeats/NCCL and print why), then SIGTERM, then SIGKILL. The exit
# status is the first failing rank's. SIGTERM or SIGUSR1 to this script is passed to every rank
# (flamia checkpoints and exits with 75; this script then exits with 75 too); Ctrl-C stops the
# ranks at once. Environment: MASTER_PORT (default 29500), MASTER_ADDR (default 127.0.0.1).
set -uo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
n="$1"; shift
if [ "$n" = auto ]; then
    n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" || n=0
    [ "$n" -ge 1 ] || { echo "local.sh: 'auto' found no GPU (nvidia-smi -L)" >&2; exit 2; }
fi
case "$n" in ''|*[!0-9]*) echo "local.sh: NGPUS must be a positive integer or 'auto', got '$n'" >&2; exit 2;; esac
[ "$n" -ge 1 ] || { echo "local.sh: NGPUS must be at least 1" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/nccl-env.sh
source "$here/nccl-env.sh"

# torchrun's agent variables would move flamia's port (MASTER_PORT + 1 under torchrun).
for v in "${!TORCHELASTIC_@}"; do unset "$v"; done
export WORLD_SIZE="$n" LOCAL_WORLD_SIZE="$n"
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}" MASTER_PORT="${MASTER_PORT:-29500}"
# This launch's identity: rank 0 refuses processes of another launch that reach its port (a
# second local.sh on the same default MASTER_PORT) instead of letting them fail its group.
export FLAMIA_RUN_ID="${FLAMIA_RUN_ID:-local-${HOSTNAME:-host}-$$}"
grace="${FLAMIA_LAUNCH_GRACE_S:-30}"

pids=()
for ((r = 0; r < n; r++)); do
    (
        export RANK="$r" LOCAL_RANK="$r"
        if [ "${FLAMIA_LAUNCH_PREFIX:-1}" = 0 ] && [ "$r" = 0 ]; then
            exec "$@"
        fi
        # Prefix every line with the rank; exec keeps the pid (and exit status) the program's.
        exec "$@" > >(sed -u "s/^/[$r] /") 2> >(sed -u "s/^/[$r] /" >&2)
    ) &
    pids+=("$!")
done

terminate() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
}
trap 'echo "local.sh: interrupted, stopping all ranks" >&2; terminate; exit 130' INT
# TERM / USR1 (a scheduler's "stop soon"): every rank gets it, checkpoints and exits by itself.
signalled=0
forward() {
    echo "local.sh: got SIG$1: passing it to every rank" >&2
    signalled=1
    for p in "${pids[@]}"; do kill -s "$1" "$p" 2>/dev/null; done
}
trap 'forward TERM' TERM
trap 'forward USR1' USR1

status=0
failed_rank=""
remaining=$n
declare -A done_rank
while [ "$remaining" -gt 0 ]; do
    finished=""
    wait -n -p finished "${pids[@]}" 2>/dev/null
    rc=$?
    if [ -z "${finished:-}" ]; then
        # `wait` was interrupted by a forwarded signal: keep waiting for the ranks.
        if [ "$signalled" = 1 ]; then signalled=0; continue; fi
        break
    fi
    for r in "${!pids[@]}"; do
        if [ "${pids[$r]}" = "$finished" ] && [ -z "${done_rank[$r]:-}" ]; then
            done_rank[$r]=1; remaining=$((remaining - 1))
            if [ "$rc" = 75 ] && [ -z "$failed_rank" ]; then
                echo "local.sh: rank $r checkpointed and stopped on a signal (status 75)" >&2
                status=75
            elif [ "$rc" -ne 0 ] && [ -z "$failed_rank" ]; then
                failed_rank=$r; status=$rc
                echo "local.sh: rank $r exited with status $rc; waiting up to ${grace}s for the other ranks to stop" >&2
                (
                    # The sleep must die with this reaper (it would hold the terminal/pipe open).
                    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
                    sleep "$grace" & sp=$!
                    wait "$sp"
                    echo "local.sh: ranks still running ${grace}s after rank $r failed: terminating them" >&2
                    terminate; sleep 5
                    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
                ) &
                reaper=$!
            fi
        fi
    done
done
[ -n "${reaper:-}" ] && kill "$reaper" 2>/dev/null
if [ -n "$failed_rank" ]; then
    echo "local.sh: FAILED (first failure: rank $failed_rank, status $status)" >&2
fi
exit "$status"
