#!/usr/bin/env bash
# One Slurm task (= one GPU, one flamia rank), run by srun on every node:
#
#   srun [srun options] launch/slurm-task.sh PROGRAM [ARGS...]     # what launch/slurm.sbatch runs
#
# (also usable directly inside an `salloc` allocation). On the node it runs on, it
#  1. drops launcher variables inherited from the submitting shell: torchrun's RANK, WORLD_SIZE,
#     LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ... take precedence over Slurm's in flamia, so a stale
#     `RANK=0` or `MASTER_ADDR=127.0.0.1` from a login shell would give every task the same rank
#     (flamia then reads SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST (else SLURM_NODELIST, SLURM_JOB_NODELIST); to
#     override rank 0's address or the port use FLAMIA_DIST_ADDR / FLAMIA_DIST_PORT);
#  2. sources launch/nccl-env.sh, which links libnccl.so in *this node's* TMPDIR and puts it first
#     on LD_LIBRARY_PATH (a link made on the batch node does not exist on the other nodes);
#  3. execs PROGRAM (its exit status is the task's).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: srun launch/slurm-task.sh PROGRAM [ARGS...]" >&2; exit 2; }

unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE \
    ROLE_RANK ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT
for v in "${!TORCHELASTIC_@}"; do unset "$v"; done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/nccl-env.sh
source "$here/nccl-env.sh"

exec "$@"
