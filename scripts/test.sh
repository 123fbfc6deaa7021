#!/usr/bin/env bash
# Runs the whole CPU test suite (what CI runs). First use installs the pinned libtorch
# (PyTorch 2.11.0 in ./.venv) through scripts/env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# The NVRTC compile tests of flamia-kernels must run here, never skip: the venv always has NVRTC 13
# (torch 2.11.0 depends on the nvidia-cuda-nvrtc wheel), and env.sh put it on LD_LIBRARY_PATH.
export FLAMIA_REQUIRE_NVRTC=1
if ! compgen -G "$FLAMIA_VENV/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13" >/dev/null; then
    echo "test.sh: NVRTC 13 (libnvrtc.so.13 of the nvidia-cuda-nvrtc wheel) is not in $FLAMIA_VENV;" \
        "the CUDA compile tests need it. Reinstall the venv (remove it, then run scripts/test.sh again)." >&2
    exit 1
fi
cargo fmt --all -- --check
# the layout models of the kernels' shared-memory transposes and stores (no GPU, < 1 s each)
model() {  # script, what a failure means
    if ! out=$(python3 "scripts/$1"); then
        echo "$out" >&2
        echo "test.sh: scripts/$1 found $2" >&2
        exit 1
    fi
}
model xpose_model.py "a wrong byte or a bank conflict in xpose.cuh's transposes"
model afrag_model.py "the forward's P packing (FWD_VPERM) pairing a score with another key's V row"
model store_model.py "a wrong or missing column in common.cuh's BF16 row stores"
model dq_stsm_model.py "a wrong position, a bank conflict or other bits in BWD_DQ_STSM's dQ partial or its converter"
model pair_sum_model.py "a word of BWD_PAIR 2's dQ pair sum read twice, missed, not the warp's own, or with a bank conflict"
model pair_protocol_model.py "a deadlock, a stale stage, an early dQ read or a partial out of turn in the CTA pairs' protocol"
# the v4 backward's step loops in the d = 128 default builds (attention.rs backward_v4_kernel:
# key blocks, 3 stages, the column and key records, early factors, QPERM, both stmatrix stores)
# carry (almost) nothing through local memory: session 46 found BWD_BULK_ST giving the long
# documents' build (every tile walking down) 18 LDL / STL per step, 5-7% slower at 1x65536;
# the short documents' build (walking up, both transposes, BWD_BULK_ST) holds 2 today, the
# mid-length documents' (walking up without the transposes, e.g. 4x16384) 1
BWD128="-D HEAD_DIM=128 -D BWD_ROW_DS=0 -D BWD_KEY_BLOCKS=1 -D BWD_STAGES=3 -D BWD_COLS_TMA=1 -D BWD_KEYS_TMA=1
 -D BWD_EARLY_FACTORS=1 -D BWD_QPERM=1 -D BWD_DS_STSM=1 -D BWD_DQ_STSM=1 -D SMEM_BWD4_BUDGET=227328"
FWD128="-D HEAD_DIM=128 -D FWD_STAGES=4 -D FWD_VPERM=1 -D FWD_DESC_ADD=1 -D FWD_TILE_TRIM=1 -D FWD_EV_RUN=1"
loops_local() {  # what, max, kernel-regs.py arguments...
    local what=$1 max=$2
    shift 2
    if ! out=$(python3 scripts/kernel-regs.py "$@" --max-step-local "$max"); then
        echo "$out" >&2
        echo "test.sh: $what [$*] hold more than $max local-memory instructions (LDL / STL)" \
            "(kernel-regs.py): measure the build on a GPU before it becomes a default" >&2
        exit 1
    fi
}
# shellcheck disable=SC2086
{
    loops_local "the v4 backward's step loops" 0 $BWD128 -D BWD_WALK_UP=0 --bwd-per-step attn_bwd_v4.cu
    loops_local "the v4 backward's step loops" 2 $BWD128 -D BWD_WALK_UP=1 -D BWD_KD_XPOSE=2 -D BWD_VT_XPOSE=1 \
        -D BWD_VT_VPERM=1 -D BWD_BULK_ST=1 --bwd-per-step attn_bwd_v4.cu
    loops_local "the v4 backward's step loops" 1 $BWD128 -D BWD_WALK_UP=1 -D BWD_BULK_ST=1 --bwd-per-step attn_bwd_v4.cu
    # and the forward's key-tile loops none, in the d = 128 builds of both scale modes
    # (attention.rs forward_v4_build: the three cuts and the running maximum; the long documents'
    # consumer copies, the short ones' half tiles and O by TMA)
    loops_local "the v4 forward's key-tile loops" 0 $FWD128 -D FWD_CW_CONST=1 --per-score --full
    loops_local "the v4 forward's key-tile loops" 0 $FWD128 -D FWD_HALF_TILES=1 -D FWD_O_TMA=1 --per-score --full
}
# the libtorch installer's guards (marker, lock, cleanup, disk and Python checks) against fake
# python/pip/df: no network, a few seconds
if ! out=$(bash scripts/setup_libtorch_test.sh); then
    echo "$out" >&2
    echo "test.sh: scripts/setup_libtorch_test.sh found scripts/setup-libtorch.sh installing twice," \
        "keeping or removing the wrong venv, printing a wrong lib dir, or a check or lock not working" >&2
    exit 1
fi
# every GPU mutation's sed pattern still matches the kernel sources (bench/gpu_mutations.sh)
bash bench/gpu_mutations.sh --patterns >/dev/null || {
    echo "test.sh: bench/gpu_mutations.sh has mutations whose patterns the kernels no longer contain" \
        "(run it with --patterns to see which)" >&2
    exit 1
}
cargo test --workspace --no-fail-fast "$@"
