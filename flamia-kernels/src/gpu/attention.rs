//! FLAMIA attention forward and backward on the GPU, called on raw device pointers and a raw CUDA
//! stream (what the trainer's attention bridge has). Kernels: the v4 forward (`cuda/attn_fwd_v4.cu`)
//! and the v4 fused backward (`cuda/attn_bwd_v4.cu`) for the E4M3-score paths; the v3.1 kernels
//! (`cuda/attn_fwd.cu`, `cuda/attn_bwd.cu`) for the NVFP4 path,
//! FP32-promoted products and the `FLAMIA_ATTN_FWD=v3` / `FLAMIA_ATTN_BWD=v3` A/B switches.
//!
//! Tensors: Q, O, dO, dQ `(tokens, heads_q, d)` BF16; K, V, dK, dV `(tokens, heads_kv, d)`
//! BF16, head dim d = 64 or 128 (the v4 kernels; the v3.1 ones, and so the NVFP4 path and the
//! FP32-promotion / v3 switches, take 128 only: [`check_head_dim`]); LSE `(tokens, heads_q)` FP32
//! natural log (as the CPU reference). Documents packed back to back, `cu_seqlens` given on the
//! host through the [`Plan`].
//!
//! ```ignore
//! let gpu = Gpu::new(0)?;
//! let attn = Attention::new(gpu.clone(), AttnOptions::new(AttnPath::Mxfp8))?;
//! let plan = Plan::new(&gpu, &shape, true)?;              // once per batch
//! let saved = attn.forward(stream, &plan, q, k, v, o, lse)?;   // keep `saved` for the backward
//! attn.backward(stream, &plan, &saved, o, lse, d_o, dq, dk, dv)?;
//! ```
//! `forward` quantises Q, K (Hadamard-rotated), V once and returns them ([`Saved`]); the backward
//! reuses exactly those codes (forward/backward consistency). Everything runs on `stream`; the
//! caller keeps `plan` and `saved` alive until the stream has passed the kernels.
//!
//! Paths: `mxfp8`, `leaky-fp8`, and `nvfp4`, whose NVFP4 score operands are **emulated**: Hopper
//! has no FP4 MMA, so S = Q K^T multiplies the exact NVFP4 values (e2m1 x E4M3 group scale, in
//! BF16) on BF16 wgmma (FP4 numerics, BF16 speed); every other product is E4M3 wgmma.
//!
//! Precision options: `per_token_scales` -> per-token operand exponents; `row_ds_exponents` -> dS
//! exponents per row of each dS product x 32 columns instead of per 32x32 block (two dS copies:
//! dQ's per query row, dK's per key row; `reference/bwd.rs`);
//! `causal_dq_scaling` needs no action here: dQ is accumulated in FP32 (v3.1: registers of the CTA
//! that owns the query tile; v4: an FP32 accumulator added to in a fixed key-tile order), with no
//! FP16 partial sums and so no prescale that could see other rows.

use super::buffer::DeviceBuf;
use super::error::{GpuError, GpuResult};
use super::plan::Plan;
use super::quant::{
    e4m3_bytes, quantize_e4m3_fused, quantize_nvfp4, AmaxScratch, Carver, DeltaOut, DimOrder, Nvfp4Ref,
    Operand, OperandRef, QuantInput, PART_ALIGN,
};
use super::runtime::{
    launch, launch_chained, launch_clustered, launch_dependent, max_active_clusters, Gpu, RawStream, Variant,
};
use super::sched::{BWD_KT, BWD_QT, FWD_QT};
use super::tma::{self, TmaMap};
use crate::options::{AttnOptions, AttnPath};
use crate::quant::ScaleMode;
use std::sync::Arc;

/// Dynamic shared memory of each kernel (1 KB of it is alignment slack): E4M3 score tiles, and
/// the NVFP4 path's BF16 score tiles (twice the bytes).
/// Checked at compile time against the kernels' layouts (`static_assert`s in the .cu files).
/// The forward and dQ budgets have 8 KB to spare (room for a third K/V ring slot, used by the
/// pipelined variants of docs/perf.md v3); the v3 timings were measured with these values.
const SMEM_FWD: [u32; 2] = [52 * 1024, 76 * 1024];
const SMEM_DQ: [u32; 2] = [80 * 1024, 104 * 1024];
const SMEM_DKDV: [u32; 2] = [88 * 1024, 112 * 1024];
/// K/V ring depth of the v4 forward: 4 stages unless `FLAMIA_FWD_STAGES` (2..=5) says otherwise
/// (a kernel-development knob for A/B runs; docs/perf.md "v4").
pub fn forward_v4_stages() -> u32 {
    stages_from_env("FLAMIA_FWD_STAGES", 2..=5, 4)
}

/// A small count knob (a ring depth, a mode) from `var` when it parses and lies in `allowed`,
/// else `default`.
fn stages_from_env(var: &str, allowed: std::ops::RangeInclusive<u32>, default: u32) -> u32 {
    super::env_number(var)
        .filter(|n| allowed.contains(n))
        .unwrap_or(default)
}

/// Dynamic shared memory of the v4 forward (`cuda/attn_fwd_v4.cu`) at head dim `hd`: three item
/// slots (a 128 x hd Q tile, 16 KB at 128, and 0.5 KB of item data each), per stage a K tile and a
/// V tile (128 x hd each) and 1 KB of key exponents, barriers and 1 KB of alignment slack (the
/// kernel's static_assert checks it). Per-token scales add the interior tiles' per-key P folds
/// (0.5 KB per stage).
/// Writing Q's dim-major copy (`qd_write`, `FWD_QD_WRITE`) adds its staging tiles, 64 x hd x 2;
/// O by bulk tensor stores (`o_tma`, `FWD_O_TMA`) its staging tiles, 128 x hd BF16.
fn smem_fwd4(stages: u32, hd: u32, per_token: bool, qd_write: bool, o_tma: bool) -> u32 {
    let fold = if per_token { stages.div_ceil(2) } else { 0 };
    let qd = if qd_write { hd / 8 } else { 0 };
    let os = if o_tma { hd / 4 } else { 0 };
    (3 * hd / 8 + (hd / 4 + 1) * stages + 4 + fold + qd + os) * 1024
}

/// Whether the v4 forward writes O through shared memory and bulk tensor stores (`FWD_O_TMA`,
/// `cuda/attn_fwd_v4.cu`). By default at head dim 128 for plans of short items (the build
/// without the consumer copies, `cw_const` false: [`fwd_cw_const`]): session 30 measured the
/// forward -4..-6% at 32x2048, 64x1024 and 256x256 with it, but +2.5% at 4x16384 and +5% at
/// 1x65536 (the consumer-copy builds) and +1.5..+4% at d = 64's 256x256 and 64x1024, where the
/// forward also bulk-stores Q's dim-major copy (docs/perf.md "Session 30"). `FLAMIA_FWD_O_TMA=1`
/// turns it on wherever the staging tiles fit beside the ring (not with five K/V stages, nor
/// beside Q's dim-major staging, at d = 128), `=0` off (A/B; the outputs are bitwise the same
/// either way: GPU test `forward_o_by_tma_gives_bitwise_the_same`).
fn fwd_o_tma(stages: u32, hd: u32, per_token: bool, qd_write: bool, cw_const: bool) -> bool {
    let fits = smem_fwd4(stages, hd, per_token, qd_write, true) <= SMEM_MAX;
    match std::env::var("FLAMIA_FWD_O_TMA").as_deref().map(str::trim) {
        Ok("1") => fits,
        Ok("0") => false,
        _ => fits && hd == 128 && !cw_const,
    }
}

/// Whether the v4 forward runs a masked key tile that no row of a consumer warpgroup sees past
/// its key 63 over those 64 keys only (`FWD_HALF_TILES`, `cuda/attn_fwd_v4.cu`; the outputs
/// bitwise the same, GPU test `forward_half_tiles_give_bitwise_the_same`). On by default for
/// plans of short items, the build without the consumer copies (`cw_const` false: those have
/// the diagonal tiles that matter, and the copies' build is where `FWD_O_TMA`'s extra code
/// measured slower); session 31 on the H200, same call, two rounds: forward -7% at 32x2048,
/// -4% at 64x1024, -5% lognormal, -2% at 256x256 for d = 64 (docs/perf.md "Session 31").
/// `FLAMIA_FWD_HALF=0` turns it off, `=all` builds it everywhere (the bitwise test).
fn fwd_half_tiles(cw_const: bool) -> bool {
    match std::env::var("FLAMIA_FWD_HALF").as_deref().map(str::trim) {
        Ok("all") => true,
        Ok("0") => false,
        _ => !cw_const,
    }
}

/// Which forward kernel runs: the v4 warp-specialised kernel (default for the E4M3-score paths)
/// or the v3.1 kernel (`FLAMIA_ATTN_FWD=v3`, kept for A/B; the NVFP4 path and FP32-promoted
/// scores always use it).
pub fn forward_v3_forced() -> bool {
    std::env::var("FLAMIA_ATTN_FWD").is_ok_and(|v| v.trim() == "v3")
}

/// Defines of the v4 forward: per-key scale columns (per-token scales) or per-32-key-group
/// folds (token-block and tensor-wide scales), the ring depth, the consumer copies, whether it
/// writes Q's dim-major copy (`qd`: `Some(permuted)`, [`Attention::fwd_writes_qd`]) and the smem
/// budget (returned too).
fn forward_v4_variant(
    per_token: bool,
    stages: u32,
    hd: u32,
    cw_const: bool,
    qd: Option<bool>,
    o_tma: bool,
    half: bool,
) -> (Variant, u32) {
    let smem = smem_fwd4(stages, hd, per_token, qd.is_some(), o_tma);
    let mut v = Variant::new()
        .define("HEAD_DIM", hd)
        .define("PER_TOKEN_COLS", per_token as u32)
        .define("FWD_STAGES", stages)
        .define("SMEM_FWD4_BUDGET", smem);
    if cw_const {
        v = v.define("FWD_CW_CONST", 1);
    }
    if let Some(perm) = qd {
        v = v.define("FWD_QD_WRITE", 1).define("FWD_QD_PERM", perm as u32);
    }
    if o_tma {
        v = v.define("FWD_O_TMA", 1);
    }
    if half {
        v = v.define("FWD_HALF_TILES", 1);
    }
    (v, smem)
}

/// Mean key tiles per query tile from which the v4 forward at head dim 128 runs its consumers
/// inlined once per warpgroup (`FWD_CW_CONST`: descriptors in uniform registers, 621 -> 604 SASS
/// per key tile with the full token-block producer of session 13, 621 -> 619 with the lean one
/// that replaced it, twice the consumer code). Session 13 measured it -5.3% at 1x65536 (mean
/// 256.5), -4.2% at 4x16384 (64.5), -5.1% lognormal, -0.6% at 16x4096 (16.5), but +4.3% at 256x256 (1) and
/// +2.0% at 8192+224x256 (5.4): the longer consumer code costs per item, so short items lose. At
/// head dim 64 it lost on 8 of 9 workloads (+2..+11%).
const FWD_CW_MIN_TILES: f64 = 16.0;

/// Whether the v4 forward of a plan with `mean_tiles` key tiles per query tile at head dim `hd`
/// builds `FWD_CW_CONST`; `FLAMIA_FWD_CW=0|1` (a test and A/B knob) decides instead (the outputs
/// are bitwise the same either way: GPU test `forward_consumer_copies_give_bitwise_the_same`).
fn fwd_cw_const(hd: usize, mean_tiles: f64) -> bool {
    match std::env::var("FLAMIA_FWD_CW").as_deref().map(str::trim) {
        Ok("1") => true,
        Ok("0") => false,
        _ => hd == 128 && mean_tiles >= FWD_CW_MIN_TILES,
    }
}

/// Which backward runs: the v4 fused kernel (default where it applies: E4M3 operands, no FP32
/// promotion of dP or S; block or row dS exponents) or the two v3.1 kernels
/// (`FLAMIA_ATTN_BWD=v3`, kept for A/B; the NVFP4 path always uses them).
pub fn backward_v3_forced() -> bool {
    std::env::var("FLAMIA_ATTN_BWD").is_ok_and(|v| v.trim() == "v3")
}

/// Ring depth of the v4 backward: 3 stages unless `FLAMIA_BWD_STAGES=2` says otherwise; 3 measured 7% faster at 1x65536 (docs/perf.md "v4 backward").
pub fn backward_v4_stages() -> u32 {
    stages_from_env("FLAMIA_BWD_STAGES", 2..=3, 3)
}

/// Dynamic shared memory of the v4 backward (`cuda/attn_bwd_v4.cu`) at head dim `hd`: the item's
/// K, V and dim-major K tiles (3 x 128 x hd: 48 KB at 128) with its per-key factors and two item
/// headers with the end's factors (~3.6 KB), per stage the Q and dO tiles in both layouts
/// (4 x 64 x hd: 32 KB at 128) and 1.5 KB of per-query constants (at head dim 64 with block
/// factors, `key_blocks`, 5 KB more per stage: room for the producer's fold of the key blocks'
/// factors, `BWD_PRODUCER_FOLD`, 6.25 KB of folded constants, which the kernel source decides;
/// budgeted whether it is on or not, so kernel sources with it on run on this host, e.g. an A/B
/// through FLAMIA_CUDA_DIR), the FP32 dQ partials (64 x hd x 4 bytes: 32 KB at 128), four dS
/// code tiles (32 KB: a step's dQ runs one step late), and slack for barriers, exchange slots and
/// the 1 KB alignment (the kernel's static_assert checks the total). Row dS exponents
/// (`row_ds`): 7 KB of exchange slots more.
fn smem_bwd4(stages: u32, hd: u32, key_blocks: bool, row_ds: bool) -> u32 {
    let fold = if hd == 64 && key_blocks { 5 * stages } else { 0 };
    let row = if row_ds { 7 } else { 0 };
    ((3 * hd / 8 + 3) + (hd / 4 + 2) * stages + (hd / 4 + 34) + fold + row) * 1024
}

/// `FLAMIA_BWD_KEY_BLOCKS=0` (a test and A/B knob): the v4 backward multiplies each key row's
/// factors per score even where they are uniform per 32-key block; the result must be bitwise the
/// same (GPU test `folded_key_factors_give_bitwise_the_per_row_backward`).
fn bwd_key_blocks_off() -> bool {
    std::env::var("FLAMIA_BWD_KEY_BLOCKS").is_ok_and(|v| v.trim() == "0")
}

/// `FLAMIA_BWD_SKIP_DEAD` (a test and A/B knob): `1` or `0` builds the v4 backward with its
/// dead steps (a warpgroup's keys see none of the step's queries) skipped or run as masked
/// steps, instead of the source's default (`BWD_SKIP_DEAD`); the result must be bitwise the same
/// (GPU test `dead_steps_skipped_give_bitwise_the_full_backward`).
fn bwd_skip_dead() -> Option<bool> {
    match std::env::var("FLAMIA_BWD_SKIP_DEAD").as_deref().map(str::trim) {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

/// `FLAMIA_LAUNCH_MEMSETS=1` (an A/B and test knob): the host zeroes the v4 kernels' work
/// counter and the backward's semaphores with memsets before each launch, as before session 20.
/// By default the counter resets itself at the end of each launch (`sched_done`, sched.cuh) and
/// `bwd_dv_fold` zeroes the semaphores, so nothing but kernels runs between the chained launches
/// (GPU test `one_plan_and_workspace_serve_call_after_call`).
fn launch_memsets() -> bool {
    super::env_on("FLAMIA_LAUNCH_MEMSETS")
}

/// Longest document for which the dV fold exponents take one warp per (document, head)
/// (`bwd_dv_fold_warp`, at most 64 tokens a lane) instead of one 1,024-thread CTA.
const FOLD_WARP_MAX_LEN: usize = 2048;

/// Whether `bwd_dv_fold_warp` computes the fold exponents for documents of at most `max_len`
/// tokens: on unless `FLAMIA_BWD_FOLD_WARP=0` (A/B and the bitwise test; the same integers).
fn bwd_fold_warp(max_len: usize) -> bool {
    max_len <= FOLD_WARP_MAX_LEN && !super::env_off("FLAMIA_BWD_FOLD_WARP")
}

/// `FLAMIA_BWD_CTAS=n` (a test knob): the v4 backward's persistent grid capped at `n` CTAs (at
/// least 1, and never more than run at once: one per SM, or with CTA pairs the clusters of two
/// that fit) instead of one per SM. With one CTA the items run strictly in list order, so a
/// semaphore turn that waits for an item listed later hangs the kernel instead of passing by luck
/// of timing (GPU test `walking_up_is_accurate_repeatable_and_ordered`).
fn bwd_ctas() -> Option<usize> {
    super::env_number::<usize>("FLAMIA_BWD_CTAS").map(|n| n.max(1))
}

/// The v4 forward's persistent grid: one CTA per SM (`sms`), no more than the `items`; at
/// least 1.
fn fwd_v4_grid(items: usize, sms: usize) -> usize {
    items.min(sms).max(1)
}

/// The fused backward's persistent grid in CTAs: one per SM (`resident` = the SMs), or with CTA
/// pairs one cluster of two per cluster that fits at once (`resident` = those clusters); a
/// `FLAMIA_BWD_CTAS` cap lowers it, never above what runs at once (each CTA's first item is its
/// block index, so a CTA or cluster waiting to start would hold an item the resident ones wait
/// for), and never to zero.
fn fused_bwd_grid(pairs: bool, cap: Option<usize>, resident: usize) -> usize {
    let resident = resident.max(1);
    match (pairs, cap) {
        (false, cap) => cap.map_or(resident, |c| c.clamp(1, resident)),
        (true, cap) => 2 * cap.map_or(resident, |c| (c / 2).clamp(1, resident)),
    }
}

/// The v4 backward's CTA pairs ([`super::sched::BwdSchedule::pairs`]), the kernel's
/// `BWD_PAIR`: 0 one CTA per key tile; 1
/// adjacent key tiles of one (document, head) in a cluster of two whose producers multicast the
/// Q / dO tiles both walk (bitwise the unpaired gradients); 2 also the pair's dQ partials added
/// up before one reduce-add (dQ's bits then differ from the unpaired backward's, fixed run to
/// run). The mode a plan gets when `FLAMIA_BWD_PAIR` is unset: 1 for a causal plan at head dim 64
/// whose tiles all walk down (every document longer than [`super::sched::BWD_UP_TILES`] key
/// tiles), else 0. Measured (session 38, H200, same calls, two rounds each), backward ms:
/// - d = 64: mode 1 54.82-54.85 against 59.15-59.20 at 1x65536 and 28.04-28.05 against 29.95 at
///   2x32768; but 4.17 against 3.89 at 16x4096 (its tiles walk up).
/// - d = 128 (the dS block exponents as by default there): mode 1 76.8-77.1 against 74.8-75.6 at
///   1x65536, 39.26-39.40 against 38.78-39.23 at 2x32768; +0.3..+4.6% at 4x16384 .. 256x256.
/// - mode 2 was 1.1-1.8x slower everywhere (1.66x at 1x65536 with its cluster-scope hand-off,
///   1.25x at CTA scope).
fn bwd_pair_default(causal: bool, walks_up: bool, head_dim: usize) -> u32 {
    u32::from(causal && !walks_up && head_dim == 64)
}

/// `FLAMIA_BWD_HANG_TRAP=1` (a test knob): the v4 backward's consumer waits give up after
/// ~4.5 s with a printout of the place and a trap (`BWD_HANG_TRAP`), so a protocol hang fails
/// its test at once, saying where, instead of running into the test's timeout. The same
/// results otherwise.
fn bwd_hang_trap() -> bool {
    super::env_on("FLAMIA_BWD_HANG_TRAP")
}

/// `FLAMIA_BWD_PAIR=0|1|2`: the pair mode (`default`, [`bwd_pair_default`], when unset or
/// anything else). With 2, `FLAMIA_BWD_PAIR_STRICT=0` (an A/B knob) hands the partner's dQ
/// partial to the summer with CTA-scope ordering instead of the memory model's cluster scope (the
/// kernel's `BWD_PAIR_STRICT`).
fn bwd_pair_env(default: u32) -> u32 {
    stages_from_env("FLAMIA_BWD_PAIR", 0..=2, default)
}

/// `FLAMIA_BWD_JITTER` (a test knob, default 0): a nonzero seed makes every dQ reduce of the v4
/// backward wait a pseudo-random few microseconds first, so the reduces reach L2 in another order,
/// and builds the kernel with `BWD_STRESS`, whose consumer warps also wait a pseudo-random while
/// between taking a dQ buffer and storing their partial into it (a partial released before its
/// stores would then be read early); with the ordering semaphores and the hand-off's fence and
/// arrival the result must stay bitwise the same (GPU test
/// `dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in`).
fn bwd_jitter() -> i32 {
    super::env_number("FLAMIA_BWD_JITTER").unwrap_or(0)
}

/// Whether the v4 backward's FP32 dQ accumulator is laid out by padded position (every document
/// starting at a multiple of 64, so no 64-row partial reaches into the next document) with each
/// (query tile, head)'s first partial stored instead of added, so the accumulator is not zeroed
/// before each head chunk (a memset of T x heads x d x 4 bytes: ~0.15 ms per backward at 65,536
/// tokens and 16 heads). The default since session 13 (backward -0.2..-7.9% at d = 128, most on
/// short documents; docs/perf.md). `FLAMIA_BWD_DQ_STORE=0` (a test and A/B knob) zeroes a
/// token-major accumulator and adds every partial instead; the gradients must be bitwise the same
/// but for the sign of zeros (GPU test `first_dq_partials_stored_give_bitwise_the_zeroed_accumulator`).
fn bwd_dq_first_store() -> bool {
    super::env_number::<u32>("FLAMIA_BWD_DQ_STORE") != Some(0)
}

/// With the key-permuted packing, the v4 backward's P~ and dS A fragments converted four codes
/// per register (`BWD_CVT4`: 1,234 -> 1,204 SASS per interior step at d = 128, 939 -> 907 at 64;
/// bitwise the same gradients). On by default since session 17 (training call -0.4..-1.7% on
/// eight of the nine workloads, docs/perf.md); `FLAMIA_BWD_CVT4=0` (A/B and the bitwise test)
/// keeps the code pairs. Read once per [`Attention`] (it decides K's dim-major order too).
fn bwd_cvt4() -> bool {
    !super::env_off("FLAMIA_BWD_CVT4")
}

/// The v4 backward's FP32 dQ partial stored into shared memory by one `stmatrix.x4` per 8-dim
/// block (`BWD_DQ_STSM`: 32 FSEL and 16 8-byte stores -> 8 `stmatrix` per step at d = 128), each
/// block's dims in the order 0, 2, 4, 6, 1, 3, 5, 7 in the partial and in the FP32 accumulator,
/// which `bwd_dq_convert` undoes with the Hadamard's butterflies in the same order: bitwise the
/// same dQ (GPU test `dq_partials_by_stmatrix_give_bitwise_the_same`). On by default since
/// session 27 (backward -0.3..-3.6% on the nine workloads at d = 128, within noise at 64;
/// docs/perf.md); `FLAMIA_BWD_DQ_STSM=0` keeps the 8-byte stores (A/B and the bitwise test).
fn bwd_dq_stsm() -> bool {
    !super::env_off("FLAMIA_BWD_DQ_STSM")
}

/// `v` with [`bwd_dq_stsm`]'s `BWD_DQ_STSM`: the fused backward and `bwd_dq_convert` both take
/// their variant through here, so the partials' dim order and the converter's always agree
/// (session 26 built the converter without it: wrong dQ, caught by the bitwise GPU test).
fn with_dq_stsm(v: Variant) -> Variant {
    if bwd_dq_stsm() {
        v.define("BWD_DQ_STSM", 1)
    } else {
        v
    }
}

/// The v4 backward's dS block maxima reduced over the warp by one `redux.sync` on the maximum's
/// bits and over the thread's 16 values as a tree (`BWD_REDUX`: 1,204 -> 1,186 SASS per interior
/// step at d = 128, 907 -> 891 at 64; bitwise the same gradients). On by default since session 17
/// (training call -0.6..-2.0% on eight of the nine workloads, d = 64 backward -2.6..-3.0%);
/// `FLAMIA_BWD_REDUX=0` keeps the shuffles (A/B and the bitwise test).
fn bwd_redux() -> bool {
    !super::env_off("FLAMIA_BWD_REDUX")
}

/// The v4 backward's per-step query constants by one bulk copy per stage from a table that
/// `bwd_cols` writes before the launch (`BWD_COLS_TMA`), instead of the producer warp loading
/// q_exp, dO's exponents, LSE and D and computing them per stage (its chain then holds no
/// global-load latency; backward -2.8..-5.8% at 16x4096, 32x2048 and mixed lengths, session 18).
/// Bitwise the same gradients. Not where the producer folds the key factors
/// into the constants (`BWD_PRODUCER_FOLD`, the source's default at head dim 64 with key blocks).
/// On unless `FLAMIA_BWD_COLS_TMA=0` (A/B and the bitwise test).
fn bwd_cols_tma(hd: u32, key_blocks: bool) -> bool {
    let producer_fold = hd == 64 && key_blocks;
    !producer_fold && !super::env_off("FLAMIA_BWD_COLS_TMA")
}

/// The v4 backward's per-item key factors (2^eK, 2^eV, 2^-c for the steps, scale 2^-eK and 2^c
/// for the item's end) by two bulk copies with K and V from records that `bwd_cols` writes before
/// the launch (`BWD_KEYS_TMA`, with [`bwd_cols_tma`]; not with CTA pairs, which the kernel
/// source excludes), instead of the producer warp loading the 128 keys' exponents and the dV
/// fold exponents and computing them per item (session 44's profile at 256x256 on an H100:
/// ~6,000-10,000 producer clocks per item, each load spilled at 24 registers, while the
/// consumers waited ~900 clocks per item for the next K and V). Bitwise the same gradients. On unless
/// `FLAMIA_BWD_KEYS_TMA=0` (A/B and the bitwise test).
fn bwd_keys_tma(hd: u32, key_blocks: bool) -> bool {
    bwd_cols_tma(hd, key_blocks) && !super::env_off("FLAMIA_BWD_KEYS_TMA")
}

/// The v4 backward's item end by bulk tensor stores (`BWD_BULK_ST`; not with CTA pairs, which the
/// kernel source excludes): a consumer warpgroup whose 64 keys all lie in the document stages its
/// BF16 dK, then dV, in the dS tiles and sends them as 64-key boxes, instead of 16-byte stores from
/// the fragments, so dV's bytes drain under the next item's start. Measured (session 45, H200, same
/// call, two rounds): the fused backward -2.2% at 256x256, -2.3% at 64x1024, -1.5% at 32x2048,
/// -1.4% at 16x4096, within noise at 1x65536; d = 64 within noise at 256x256 and 64x1024, +2% at
/// 16x4096: on by default at head dim 128 only, and there only for plans with tiles that walk
/// up (below). (Its first version, one bulk copy per key row, each waited for at the item's end,
/// measured +18% at 256x256.) Only where tiles walk up (`walk_up`: documents up to
/// `BWD_UP_TILES`, where items are short) since session 46: in the build whose
/// tiles all walk down, ptxas then carries 9 values through local memory in every step (18
/// LDL / STL, 1,013 -> 1,033 SASS per interior step, `kernel-regs.py --bwd-per-step`), and session
/// 46 measured that default 5-7% slower at 1x65536 on an H100 (fused backward 82.2 / 82.7 ms
/// against 78.4 / 77.8 with `FLAMIA_BWD_KEYS_TMA=0`, whose build does not spill; the walk-up
/// builds spill less with it). `FLAMIA_BWD_BULK_ST=0|1` forces it at both head dims and walks.
/// Bitwise the same gradients: GPU test `dk_dv_by_bulk_copies_give_bitwise_the_same`.
fn bwd_bulk_st(hd: u32, walk_up: bool) -> bool {
    env_choice("FLAMIA_BWD_BULK_ST", &["1"]).unwrap_or(hd == 128 && walk_up)
}

/// The v4 backward's producer loads an item's per-key factors before waiting for the previous
/// item's K/V slot instead of after (`BWD_EARLY_FACTORS`: a third item tail and a staging copy
/// of the step factors, 2 KB of shared memory; session 18's producer clocks put the factors'
/// loads at ~4,600-5,900 clocks per item between that wait and the K/V hand-over; measured on an
/// H100: training call -1.3% at 256x256, noise on longer documents). Bitwise the same gradients.
/// Not with row dS exponents at head dim 128 (no room left in the 227 KB). On unless
/// `FLAMIA_BWD_EARLY_FACTORS=0` (A/B and the bitwise test).
fn bwd_early_factors(hd: u32, row_ds: bool) -> bool {
    let full = row_ds && hd == 128;
    !full && !super::env_off("FLAMIA_BWD_EARLY_FACTORS")
}

/// `v` with [`bwd_early_factors`]' define and its 2 KB more shared memory when `on`.
fn with_early_factors((v, smem): (Variant, u32), on: bool) -> (Variant, u32) {
    if !on {
        return (v, smem);
    }
    let smem = smem + 2048;
    (
        v.define("BWD_EARLY_FACTORS", 1).define("SMEM_BWD4_BUDGET", smem),
        smem,
    )
}

/// `v` with the consumers' transposes of the K/V slot's tiles (no shared memory of their own):
/// `BWD_KD_XPOSE` 2 when `kd` ([`Attention::bwd_kd_xpose`]: K's dim-major tile from the
/// token-major one), `BWD_VT_XPOSE` when `vt` ([`Attention::bwd_vt_xpose`]: V's token-major
/// tile from the dim-major one).
fn with_xposes(v: Variant, kd: bool, vt: bool) -> Variant {
    let v = if kd { v.define("BWD_KD_XPOSE", 2) } else { v };
    if vt {
        v.define("BWD_VT_XPOSE", 1)
    } else {
        v
    }
}

/// An on/off override of a per-plan choice from the environment variable `name`: `Some(false)`
/// when it is exactly `0`, `Some(true)` when it is one of `on`, `None` (unset or anything else:
/// the per-plan rule, [`short_items`]).
fn env_choice(name: &str, on: &[&str]) -> Option<bool> {
    parse_choice(std::env::var(name).ok().as_deref(), on)
}

/// [`env_choice`] of the variable's value `v` (`None`: unset).
fn parse_choice(v: Option<&str>, on: &[&str]) -> Option<bool> {
    match v.map(str::trim) {
        Some("0") => Some(false),
        Some(v) if on.contains(&v) => Some(true),
        _ => None,
    }
}

/// `FLAMIA_BWD_KD_XPOSE`: `0` the quantiser's dim-major K (TMA-loaded), `1` or `2` the consumers'
/// transpose (`2` is the kernel's mode number, which session 23's scripts set; the producer
/// warp's mode 1 was removed in session 24); otherwise per plan.
fn kd_xpose_env() -> Option<bool> {
    env_choice("FLAMIA_BWD_KD_XPOSE", &["1", "2"])
}

/// `FLAMIA_BWD_VT_XPOSE`: `0` the quantiser's token-major V (TMA-loaded), `1` the consumers'
/// transpose of the dim-major tile (`BWD_VT_XPOSE`); otherwise per plan.
fn vt_xpose_env() -> Option<bool> {
    env_choice("FLAMIA_BWD_VT_XPOSE", &["1"])
}

/// `FLAMIA_FWD_QD`: whether the v4 forward writes Q's dim-major copy ([`Attention::fwd_writes_qd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QdFwd {
    /// `0`: the quantiser writes it, for every plan.
    Off,
    /// `1`: the forward, for every plan.
    On,
    /// Unset or anything else (the default since session 24): the forward at head dim 64 for
    /// plans of short and mid-length documents ([`short_items`]), the quantiser
    /// elsewhere. Measured on the H200 with the consumers' K transpose on: training call
    /// -1.3 / -1.4% at 256x256 / 16x4096 (session 23), -1.0% at 256x256, -0.3% at 64x1024,
    /// -1.1% at 16x4096, 1x65536 untouched (session 24, d = 64). At d = 128 it gained nothing
    /// (the forward's extra stores cost as much as the quantiser saves: +4..+12% forward).
    Auto,
}

impl QdFwd {
    fn from_env() -> QdFwd {
        Self::parse(std::env::var("FLAMIA_FWD_QD").ok().as_deref())
    }

    fn parse(v: Option<&str>) -> QdFwd {
        match v.map(str::trim) {
            Some("0") => QdFwd::Off,
            Some("1") => QdFwd::On,
            _ => QdFwd::Auto,
        }
    }

    /// Whether the forward writes Q's copy at head dim `hd` with `mean_tiles` key tiles per
    /// query tile.
    fn writes(self, hd: usize, mean_tiles: f64) -> bool {
        match self {
            QdFwd::Off => false,
            QdFwd::On => true,
            QdFwd::Auto => hd == 64 && short_items(mean_tiles),
        }
    }
}

/// The per-plan operand copies made inside the kernels (the backward's consumers transposing K
/// and V, the forward writing Q's dim-major copy at head dim 64) pay below this many key tiles
/// per query tile on average (the plan's [`FwdSchedule::mean_key_tiles`], a measure of the
/// backward's steps per item too): each saves the quantiser bytes and costs the kernel per item
/// (and ptxas's different spills per step), so long documents lose. Measured on the H200, d = 128,
/// training call against the quantiser's copy, same call:
/// - K (session 23, two calls): -1.2 / -1.4% at 256x256 (1.5 tiles), -1.6 / -1.2% at 64x1024
///   (4.5), -0.8 / -0.2% at 8192+224x256 (5.4), 0.0 / 0.0% at 16x4096 (16.5), +0.9 / +1.1% at
///   1x65536 (256.5); quantiser ~-10%, backward ~+0.8% per step. d = 64: -2.1 / -2.3% at
///   256x256, -0.7 / -0.5% at 16x4096.
/// - V (session 24): -1.3% at 256x256, -0.6% at 64x1024, -0.2% at 16x4096, -0.8% at
///   8192+224x256 (quantiser -8..-9%, backward +0.4..+0.8%); d = 64 within noise (+0.1% /
///   +0.3%); forced on at 1x65536 +1.0%.
/// - Q by the forward: [`QdFwd::Auto`].
const KD_XPOSE_MAX_TILES: f64 = 32.0;

/// Whether a plan with `mean_tiles` key tiles per query tile gets the operand copies made inside
/// the kernels ([`KD_XPOSE_MAX_TILES`]) unless the environment says otherwise.
fn short_items(mean_tiles: f64) -> bool {
    mean_tiles < KD_XPOSE_MAX_TILES
}

/// `FLAMIA_BWD_DQ_BUFS=2` (an A/B knob, default 1): two FP32 dQ partial buffers per consumer
/// warpgroup in the v4 backward (`BWD_DQ_BUFS`), so a step's partial need not wait for the
/// reducer's TMA to have read the previous one; 64 x hd x 4 bytes more per warpgroup (16 KB at
/// d = 64; 32 KB at 128, where only two stages leave room: [`with_dq_bufs`]). Session 13's phases
/// put the dQ store, that wait included, at ~650 clocks of a ~6,200-clock step (830-990 at
/// 256x256); session 5 measured two buffers at d = 128 with two stages 1.6% slower, before the
/// reducer's ordering and the upward walk changed what the wait is.
fn bwd_dq_bufs() -> u32 {
    stages_from_env("FLAMIA_BWD_DQ_BUFS", 1..=2, 1)
}

/// Rows of the FP32 dQ accumulator each thread of `bwd_dq_convert` converts (its `DQC_ROWS`: all
/// their loads in flight before the first row's arithmetic). Measured (session 51, H100, same
/// call, two rounds; the conversion alone, ms, at 256x256 / 64x1024 / 16x4096 / 1x65536): 1 row
/// 0.327-0.331 / 0.331-0.332 / 0.332-0.350 / 0.340-0.342, **2 rows 0.284-0.288 / 0.286-0.288 /
/// 0.292-0.293 / 0.300-0.301** (0.8 GB at ~2.8 TB/s, 94% of the device copy), 4 rows
/// 0.285-0.308, 8 rows 0.332-0.363 (36, 59 and 92 registers at 2, 4 and 8: fewer CTAs per SM
/// past 2). So 2 by default;
/// `FLAMIA_DQ_CONVERT_ROWS=1|2|4|8` (an A/B knob) chooses, bitwise the same dQ whatever the
/// value (GPU test `dq_conversion_alone_rewrites_bitwise_the_backwards_dq`).
fn dq_convert_rows() -> usize {
    // (as the stage knobs: another value, or none, is the default)
    super::env_number::<usize>("FLAMIA_DQ_CONVERT_ROWS")
        .filter(|n| [1, 2, 4, 8].contains(n))
        .unwrap_or(2)
}

/// `FLAMIA_BWD_FOLLOWERS=n` (unset: 0, off until a GPU has measured it): SMs the v4 backward's
/// fused grid leaves to `bwd_dq_follow`, which converts each query tile's dQ beside the fused
/// kernel as soon as its last partial has landed, from L2, instead of `bwd_dq_convert` after it
/// (docs/perf.md, session 51's Next 3: the fused kernel's time follows its SMs, the conversion
/// took 0.28-0.30 ms on the whole card). Only where every tile walks up, without CTA pairs, with
/// the padded accumulator; bitwise the same dQ (GPU test
/// `dq_converted_beside_the_fused_kernel_gives_bitwise_the_same`).
fn bwd_followers() -> usize {
    super::env_number::<usize>("FLAMIA_BWD_FOLLOWERS").unwrap_or(0)
}

/// `bwd_dq_follow` CTAs per SM left to it (256 threads; 79 registers at d = 128 fit three, 40
/// at 64 six; more wait for the fused kernel's SMs).
const FOLLOWER_CTAS_PER_SM: usize = 4;

/// `FLAMIA_DQ_CONVERT_CTAS=n` (a measurement knob, unset by default): `bwd_dq_convert` as a grid
/// of at most n CTAs of 256 threads whose warps stride over the rows (`DQC_PERSIST`), so the
/// benchmark's conversion alone (`dkdv`) times what the conversion moves on about n SMs: the rate
/// converter CTAs beside the fused backward's workers would have (docs/perf.md, session 51's Next
/// 3). The same bits whatever n (GPU test `dq_conversion_alone_rewrites_bitwise_the_backwards_dq`).
fn dq_convert_ctas() -> Option<usize> {
    super::env_number::<usize>("FLAMIA_DQ_CONVERT_CTAS").filter(|&n| n > 0)
}

/// The most dynamic shared memory a CTA may have on sm_90 (227 KB).
const SMEM_MAX: u32 = 227 * 1024;

/// A [`backward_v4_variant`] with `dq_bufs` dQ partial buffers per warpgroup: the budget grows by
/// hd / 4 KB per buffer past the first; an error past [`SMEM_MAX`].
fn with_dq_bufs((v, smem): (Variant, u32), hd: u32, dq_bufs: u32) -> GpuResult<(Variant, u32)> {
    if dq_bufs <= 1 {
        return Ok((v, smem));
    }
    let smem = smem + (dq_bufs - 1) * hd / 4 * 1024;
    if smem > SMEM_MAX {
        return Err(GpuError::NotSupported(format!(
            "FLAMIA_BWD_DQ_BUFS={dq_bufs} at head dim {hd} needs {} KB of shared memory per CTA, more \
             than the 227 KB allowed: use it with FLAMIA_BWD_STAGES=2 there",
            smem / 1024
        )));
    }
    Ok((
        v.define("BWD_DQ_BUFS", dq_bufs).define("SMEM_BWD4_BUDGET", smem),
        smem,
    ))
}

/// Defines of the v4 backward: head dim, ring depth, `row_ds_exponents` (two dS copies with row
/// exponents, `BWD_ROW_DS`: 7 KB more shared memory for its exchange slots), whether the key
/// factors are uniform per 32-key block (`BWD_KEY_BLOCKS`: token-block and tensor-wide scales,
/// not per-token ones; each consumer thread then folds them into its column constants once per
/// step, or the producer for them, `BWD_PRODUCER_FOLD`, a choice of the kernel source that the
/// budget leaves room for at head dim 64), the consumers' stress delays (`BWD_STRESS`, test
/// builds alone: `bwd_jitter`), the dead steps' skip where it is set (`BWD_SKIP_DEAD`, else the
/// source's default: `bwd_skip_dead`), whether tiles may walk up (`BWD_WALK_UP`: the plan flags
/// some, `BwdSchedule::walks_up`) and the smem budget.
fn backward_v4_variant(
    stages: u32,
    hd: u32,
    row_ds: bool,
    key_blocks: bool,
    stress: bool,
    skip_dead: Option<bool>,
    walk_up: bool,
) -> (Variant, u32) {
    let smem = smem_bwd4(stages, hd, key_blocks, row_ds);
    let mut v = Variant::new()
        .define("HEAD_DIM", hd)
        .define("BWD_ROW_DS", row_ds as u32)
        .define("BWD_KEY_BLOCKS", key_blocks as u32)
        .define("BWD_STAGES", stages)
        .define("SMEM_BWD4_BUDGET", smem);
    if stress {
        v = v.define("BWD_STRESS", 1);
    }
    if let Some(on) = skip_dead {
        v = v.define("BWD_SKIP_DEAD", on as u32);
    }
    if walk_up {
        v = v.define("BWD_WALK_UP", 1);
    }
    (v, smem)
}

/// The v4 backward's fused kernel as one call launches it (`Attention::backward_v4_fused`).
struct FusedBwd {
    function: cudarc::driver::CudaFunction,
    smem: u32,
    /// `BWD_PAIR` (0: one CTA per key tile).
    pair_mode: u32,
    /// The persistent grid's CTAs (with pairs: twice the clusters).
    ctas: usize,
}

/// Mirrors `struct BwdV4Params` of `cuda/attn_bwd_v4.cu`.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default)]
struct BwdV4Params {
    k_map: TmaMap,
    v_map: TmaMap,
    kd_map: TmaMap,
    q_map: TmaMap,
    do_map: TmaMap,
    qd_map: TmaMap,
    dod_map: TmaMap,
    dq_map: TmaMap,
    a: AttnParams,
    items: u64,
    tiles: u64,
    cexp: u64,
    dkv_acc: u64,
    counter: u64,
    dq_sem: u64,
    kv_sem: u64,
    colc: u64,
    keys: u64,
    nitems: i32,
    nqt: i32,
    nkt: i32,
    h0: i32,
    hk0: i32,
    hkc: i32,
    jitter: i32,
    dq_first_store: i32,
    tpad: i32,
    dk_map: TmaMap,
    dv_map: TmaMap,
}

/// Mirrors `struct DvFoldParams` of `cuda/attn_bwd_v4.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DvFoldParams {
    do_exp: u64,
    cu: u64,
    cexp: u64,
    sems: u64,
    nsems: i32,
    docs: i32,
    hq: i32,
    causal: i32,
}

/// Mirrors `struct ColsParams` of `cuda/attn_bwd_v4.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ColsParams {
    q_exp: u64,
    do_exp: u64,
    lse: u64,
    delta: u64,
    pad_tok: u64,
    colc: u64,
    tiles: u64,
    keys: u64,
    k_exp: u64,
    v_exp: u64,
    cexp: u64,
    scale_log2: f32,
    scale: f32,
    hq: i32,
    tpad: i32,
    hkv: i32,
    nkt: i32,
}

/// Bytes of one column pair of the v4 backward's step constants (`struct BwdColPair`).
const BWD_COL_PAIR_BYTES: usize = 48;

/// Bytes of one item's key factors (`struct BwdKeyRec`: five arrays of 128 floats).
const BWD_KEY_REC_BYTES: usize = 5 * BWD_KT * 4;

/// Mirrors `struct DqConvertParams` of `cuda/attn_bwd_v4.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DqConvertParams {
    acc: u64,
    q_exp: u64,
    dq: u64,
    pad_tok: u64,
    rows: i64,
    scale: f32,
    hadamard: i32,
    hc: i32,
    hq: i32,
    h0: i32,
}

/// Mirrors `struct DqFollowParams` of `cuda/attn_bwd_v4.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DqFollowParams {
    c: DqConvertParams,
    units: u64,
    qtiles: u64,
    sems: u64,
    counter: u64,
    nunits: i32,
    nqt: i32,
}

/// Scratch of the v4 backward, part of [`GradWorkspace`]: the FP32 dQ accumulator, the dQ and
/// dK/dV semaphores, dV's per-token fold exponents, the step constants' table (`BWD_COLS_TMA`:
/// 24 bytes per padded position and query head) and (GQA only) the dK/dV partial sums.
#[derive(Debug)]
pub struct BwdScratch {
    dq_acc: DeviceBuf<f32>,
    sems: DeviceBuf<i32>,
    cexp: DeviceBuf<i32>,
    cols: DeviceBuf<u8>,
    /// `BWD_KEYS_TMA`'s records, one per item code (key tile x query head); empty where the
    /// step constants' table is never built (head dim 64 with key blocks: the producer's fold).
    keys: DeviceBuf<u8>,
    dkv: Option<DeviceBuf<f32>>,
}

impl BwdScratch {
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.dq_acc.bytes()
            + self.sems.bytes()
            + self.cexp.bytes()
            + self.cols.bytes()
            + self.keys.bytes()
            + self.dkv.as_ref().map_or(0, |b| b.bytes())
    }
}

/// A v4 forward build ([`Attention::forward_v4_build`]).
struct FwdBuild {
    variant: Variant,
    smem: u32,
    /// writes Q's dim-major copy (`FWD_QD_WRITE`)
    qd: bool,
    /// O by bulk tensor stores (`FWD_O_TMA`)
    o_tma: bool,
}

/// Mirrors `struct FwdV4Params` of `cuda/attn_fwd_v4.cu` (passed as a `__grid_constant__`, so the
/// tensor maps live in the parameter space where TMA reads them).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default)]
struct FwdV4Params {
    q_map: TmaMap,
    k_map: TmaMap,
    v_map: TmaMap,
    qd_map: TmaMap,
    o_map: TmaMap,
    a: AttnParams,
    items: u64,
    tiles: u64,
    counter: u64,
    nitems: i32,
}

/// Which E4M3 K = 128 products sum their four K = 32 wgmma steps in FP32 instead of chaining one
/// FP8 accumulator (which truncates to 13 fraction bits per step, wgmma-fp8-notes.md 7):
/// bit 0 = dP = dO V^T (backward), bit 1 = the score product S = Q K^T (forward and both backward
/// kernels alike). Default 0 (both chained: a 4-8% faster training step, and no accuracy gap left to
/// close, docs/kernels.md); `FLAMIA_ATTN_PROMOTE=0|1|2|3` selects another choice.
pub fn promote_mask() -> u32 {
    parse_promote(std::env::var("FLAMIA_ATTN_PROMOTE").ok().as_deref())
}

fn parse_promote(v: Option<&str>) -> u32 {
    v.and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|m| *m <= 3)
        .unwrap_or(0)
}

/// The defines of one attention module: NVFP4 or E4M3 scores, the FP32 promotion mask, and each
/// kernel's shared-memory budget (checked by the kernels' `static_assert`s at compile time).
fn attention_variant(nvfp4: bool, promote: u32) -> Variant {
    let i = nvfp4 as usize;
    Variant::new()
        .define("NVFP4", i)
        .define("PROMOTE_DP", promote & 1)
        .define("PROMOTE_S", (promote >> 1) & 1)
        .define("SMEM_FWD_BUDGET", SMEM_FWD[i])
        .define("SMEM_DQ_BUDGET", SMEM_DQ[i])
        .define("SMEM_DKDV_BUDGET", SMEM_DKDV[i])
}

/// Mirrors `struct AttnParams` of `cuda/attn_common.cuh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnParams {
    q_tok: u64,
    q_dim: u64,
    q_exp: u64,
    k_tok: u64,
    k_dim: u64,
    k_exp: u64,
    v_tok: u64,
    v_dim: u64,
    v_exp: u64,
    do_tok: u64,
    do_dim: u64,
    do_exp: u64,
    tiles: u64,
    o: u64,
    lse: u64,
    delta: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    t: i32,
    tpad: i32,
    hq: i32,
    hkv: i32,
    scale: f32,
    scale_log2: f32,
    causal: i32,
    row_ds: i32,
    hadamard: i32,
    q4: u64,
    q4_exp: u64,
    k4: u64,
    k4_exp: u64,
}

/// The quantised Q, K, V of one forward call, kept for its backward: pointers into one device
/// buffer of [`Attention::saved_bytes`] bytes that this value owns ([`Attention::alloc_saved`])
/// or the caller does ([`Attention::saved_in`], e.g. a libtorch tensor autograd keeps).
#[derive(Debug)]
pub struct Saved {
    pub q: OperandRef,
    pub k: OperandRef,
    pub v: OperandRef,
    /// NVFP4 path: the score operands (the E4M3 `q`, `k` feed dK and dQ).
    pub q4: Option<Nvfp4Ref>,
    pub k4: Option<Nvfp4Ref>,
    /// The buffer behind the pointers when this side allocated it.
    storage: Option<DeviceBuf<u8>>,
}

/// The backward kernels, for [`Attention::backward_kernel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwdKernel {
    /// `attn_bwd_dq`: dQ, one CTA per (query tile, query head).
    Dq,
    /// `attn_bwd_dkdv`: dK and dV, one CTA per (key tile, KV head).
    DkDv,
    /// The v4 backward: `bwd_dv_fold`, `attn_bwd_v4`, `bwd_dq_convert` (where
    /// [`Attention::uses_backward_v4`]).
    Fused,
    /// The v4 backward's dQ conversion alone (`bwd_dq_convert`, once per head chunk), on the
    /// accumulator the last `Fused` call with this workspace left: a timing of its bytes only
    /// (with several head chunks the accumulator holds the last chunk's sums, so the dQ it
    /// writes is not the call's).
    DqConvert,
}

/// Device pointers the backward kernels read (`lse`) and write (the BF16 gradients).
#[derive(Debug, Clone, Copy)]
pub struct BwdOutputs {
    pub lse: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

/// Backward workspace: the quantised dO and `D = rowsum(dO_hat * O)`.
#[derive(Debug)]
pub struct GradWorkspace {
    pub d_o: Operand,
    pub delta: DeviceBuf<f32>,
    /// The v4 backward's scratch (`None` when the v3.1 kernels run).
    pub v4: Option<BwdScratch>,
}

impl GradWorkspace {
    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        self.d_o.bytes() + self.delta.bytes() + self.v4.as_ref().map_or(0, |v| v.bytes())
    }
}

/// Errors unless attention with `opts` runs at head dim `hd` on the GPU: 64 and 128 on the v4
/// kernels, 128 only where a v3.1 kernel runs: the NVFP4 path, or `v3`
/// (the FP32-promotion and `FLAMIA_ATTN_FWD=v3` / `FLAMIA_ATTN_BWD=v3` switches, which
/// [`Attention::check_head_dim`] reads). The error says what is allowed.
pub fn check_head_dim(opts: &AttnOptions, hd: usize, v3: bool) -> GpuResult<()> {
    if !super::GPU_HEAD_DIMS.contains(&hd) {
        return Err(GpuError::NotSupported(format!(
            "head_dim {hd} on the GPU; the kernels are built for head_dim {:?}",
            super::GPU_HEAD_DIMS
        )));
    }
    if hd == 128 {
        return Ok(());
    }
    let why = if opts.path == AttnPath::Nvfp4 {
        "path `nvfp4`"
    } else if v3 {
        "FLAMIA_ATTN_PROMOTE / FLAMIA_ATTN_FWD=v3 / FLAMIA_ATTN_BWD=v3"
    } else {
        return Ok(());
    };
    Err(GpuError::NotSupported(format!(
        "{why} at head_dim {hd}: it runs the v3.1 kernels, built for head_dim 128 only; at head_dim {hd} \
         use path `mxfp8` or `leaky-fp8`"
    )))
}

/// FLAMIA attention with fixed options on one GPU.
#[derive(Debug)]
pub struct Attention {
    gpu: Arc<Gpu>,
    opts: AttnOptions,
    amax: AmaxScratch,
    /// The development switches, read once here (not per call): `FLAMIA_ATTN_PROMOTE`,
    /// `FLAMIA_ATTN_FWD`, `FLAMIA_FWD_STAGES`, `FLAMIA_ATTN_BWD`, `FLAMIA_BWD_STAGES`,
    /// `FLAMIA_BWD_KD_XPOSE`, `FLAMIA_FWD_QD`, `FLAMIA_FWD_VPERM`, `FLAMIA_BWD_QPERM`,
    /// `FLAMIA_BWD_CVT4` and `FLAMIA_BWD_DS_STSM` (they decide the saved operands' layout and
    /// writer, so they may not change between a forward and its backward).
    promote: u32,
    fwd_v3: bool,
    fwd_stages: u32,
    bwd_v3: bool,
    bwd_stages: u32,
    kd_xpose_env: Option<bool>,
    vt_xpose_env: Option<bool>,
    qd_fwd: QdFwd,
    /// `FLAMIA_FWD_VPERM`: `0` off, `1` on, otherwise per head dim ([`Attention::fwd_vperm`]).
    vperm_env: Option<bool>,
    /// `FLAMIA_BWD_QPERM`, `FLAMIA_BWD_CVT4`, `FLAMIA_BWD_DS_STSM` not set to 0.
    qperm_env: bool,
    cvt4_env: bool,
    ds_stsm_env: bool,
    /// Clusters of two of the paired backward that run at once, per kernel and shared memory
    /// (`cuOccupancyMaxActiveClusters`, asked once).
    clusters: std::sync::Mutex<std::collections::HashMap<(usize, u32), usize>>,
}

impl Attention {
    /// Checks that the options are implemented on the GPU.
    pub fn new(gpu: Arc<Gpu>, opts: AttnOptions) -> GpuResult<Attention> {
        match opts.path {
            AttnPath::Mxfp8 | AttnPath::LeakyFp8 | AttnPath::Nvfp4 => {}
            AttnPath::Exact => return Err(GpuError::NotSupported(
                "path `exact` has no FLAMIA kernel: the trainer runs libtorch's BF16 flash attention for it"
                    .into(),
            )),
        }
        let amax = AmaxScratch::new(&gpu)?;
        Ok(Attention {
            gpu,
            opts,
            amax,
            promote: promote_mask(),
            fwd_v3: forward_v3_forced(),
            fwd_stages: forward_v4_stages(),
            bwd_v3: backward_v3_forced(),
            bwd_stages: backward_v4_stages(),
            kd_xpose_env: kd_xpose_env(),
            vt_xpose_env: vt_xpose_env(),
            vperm_env: env_choice("FLAMIA_FWD_VPERM", &["1"]),
            qperm_env: !super::env_off("FLAMIA_BWD_QPERM"),
            cvt4_env: bwd_cvt4(),
            ds_stsm_env: !super::env_off("FLAMIA_BWD_DS_STSM"),
            qd_fwd: QdFwd::from_env(),
            clusters: Default::default(),
        })
    }

    /// The options.
    pub fn options(&self) -> &AttnOptions {
        &self.opts
    }

    /// The exponent rule of every E4M3 operand under these options.
    pub fn scale_mode(&self) -> ScaleMode {
        match (self.opts.path, self.opts.precision.per_token_scales) {
            (AttnPath::LeakyFp8, _) => ScaleMode::TensorFloor,
            (_, true) => ScaleMode::PerToken,
            (_, false) => ScaleMode::TokenBlock,
        }
    }

    /// Whether the v4 backward may take each thread's key factors as one value per 32-key block:
    /// token-block and tensor-wide scales, unless `FLAMIA_BWD_KEY_BLOCKS=0`.
    fn bwd_key_blocks(&self) -> bool {
        self.scale_mode() != ScaleMode::PerToken && !bwd_key_blocks_off()
    }

    /// The v4 backward's variant and smem budget for this call's options at head dim `hd`, with
    /// the test knobs of the environment (`FLAMIA_BWD_JITTER`, `FLAMIA_BWD_SKIP_DEAD`); `walk_up`:
    /// the plan has tiles that walk up.
    /// `kd`: [`Attention::bwd_kd_xpose`]; `vt`: [`Attention::bwd_vt_xpose`].
    fn backward_v4_kernel(&self, hd: u32, walk_up: bool, kd: bool, vt: bool) -> GpuResult<(Variant, u32)> {
        let mut v = backward_v4_variant(
            self.bwd_stages,
            hd,
            self.opts.precision.row_ds_exponents,
            self.bwd_key_blocks(),
            bwd_jitter() != 0,
            bwd_skip_dead(),
            walk_up,
        );
        if self.bwd_qperm() {
            v.0 = v.0.define("BWD_QPERM", 1);
            if !self.cvt4_env {
                v.0 = v.0.define("BWD_CVT4", 0);
            }
        }
        if self.bwd_ds_stsm() {
            v.0 = v.0.define("BWD_DS_STSM", 1);
        }
        if !bwd_redux() {
            v.0 = v.0.define("BWD_REDUX", 0);
        }
        if bwd_hang_trap() {
            v.0 = v.0.define("BWD_HANG_TRAP", 1);
        }
        v.0 = with_dq_stsm(v.0);
        if bwd_cols_tma(hd, self.bwd_key_blocks()) {
            v.0 = v.0.define("BWD_COLS_TMA", 1);
        }
        if bwd_keys_tma(hd, self.bwd_key_blocks()) {
            v.0 = v.0.define("BWD_KEYS_TMA", 1);
        }
        if bwd_bulk_st(hd, walk_up) {
            v.0 = v.0.define("BWD_BULK_ST", 1);
        }
        let v = with_early_factors(v, bwd_early_factors(hd, self.opts.precision.row_ds_exponents));
        let mut xposed = with_xposes(v.0, kd, vt);
        if vt && self.fwd_vperm(hd as usize) {
            // (V's dim-major copy in the forward's permuted key order: the transpose undoes it)
            xposed = xposed.define("BWD_VT_VPERM", 1);
        }
        with_dq_bufs((xposed, v.1), hd, bwd_dq_bufs())
    }

    fn check_plan(&self, plan: &Plan) -> GpuResult<()> {
        if plan.causal != self.opts.causal {
            return Err(GpuError::Input(crate::Error::Invalid(format!(
                "plan built with causal = {}, attention options say causal = {}",
                plan.causal, self.opts.causal
            ))));
        }
        self.check_head_dim(plan.shape().head_dim)
    }

    /// Errors unless these options run at head dim `hd` on the GPU ([`check_head_dim`], with this
    /// value's development switches).
    pub fn check_head_dim(&self, hd: usize) -> GpuResult<()> {
        let v3 = !(self.uses_forward_v4() && self.uses_backward_v4());
        check_head_dim(&self.opts, hd, v3)
    }

    /// One call's operands laid out from `base` ([`Carver`]), and the bytes they take.
    fn carve_saved(&self, plan: &Plan, base: u64) -> (Saved, usize) {
        let s = plan.shape();
        let nv = self.opts.path == AttnPath::Nvfp4;
        let mut c = Carver::new(base);
        let saved = Saved {
            q: c.operand(plan, s.heads_q),
            k: c.operand_with(plan, s.heads_kv, true, !self.bwd_kd_xpose(plan)),
            v: c.operand_with(plan, s.heads_kv, !self.bwd_vt_xpose(plan), true),
            q4: nv.then(|| c.nvfp4(plan, s.heads_q)),
            k4: nv.then(|| c.nvfp4(plan, s.heads_kv)),
            storage: None,
        };
        (saved, c.bytes())
    }

    /// Bytes of one forward call's quantised operands under these options ([`Attention::saved_in`]).
    pub fn saved_bytes(&self, plan: &Plan) -> usize {
        self.carve_saved(plan, 0).1
    }

    /// Allocates the quantised-operand buffer of one forward call.
    pub fn alloc_saved(&self, plan: &Plan) -> GpuResult<Saved> {
        let buf = DeviceBuf::<u8>::zeros(&self.gpu, self.saved_bytes(plan))?;
        let (mut saved, _) = self.carve_saved(plan, buf.ptr());
        saved.storage = Some(buf);
        Ok(saved)
    }

    /// The quantised operands of one forward call in the caller's device buffer at `base` of
    /// `len` bytes ([`PART_ALIGN`]-aligned, at least [`Attention::saved_bytes`]): the forward's
    /// [`Attention::quantize_inputs`] writes it, the backward reads it. The caller keeps the
    /// buffer alive until the stream has run every kernel given this [`Saved`].
    pub fn saved_in(&self, plan: &Plan, base: u64, len: usize) -> GpuResult<Saved> {
        let (saved, need) = self.carve_saved(plan, base);
        if base == 0 || base & (PART_ALIGN as u64 - 1) != 0 || len < need {
            return Err(GpuError::Input(crate::Error::Invalid(format!(
                "saved-operand buffer at {base:#x} of {len} bytes; need {need} bytes at a multiple of {PART_ALIGN}"
            ))));
        }
        Ok(saved)
    }

    /// Allocates the backward workspace.
    pub fn alloc_grad(&self, plan: &Plan) -> GpuResult<GradWorkspace> {
        let s = plan.shape();
        let v4 = if self.uses_backward_v4() {
            let t = s.tokens();
            let nkt = plan.tables.bwd.tiles.len();
            // dQ semaphores, dK/dV semaphores, one bwd_dq_follow counter per head chunk
            let sems = s.heads_q * plan.tables.bwd.query_tiles + s.heads_kv * nkt + plan.tables.bwd.chunks;
            // one head chunk's accumulators (BwdSchedule::chunks launches reuse them)
            let chunks = plan.tables.bwd.chunks;
            let hd = s.head_dim;
            let dkv = (s.heads_q != s.heads_kv)
                .then(|| DeviceBuf::zeros(&self.gpu, nkt * (s.heads_kv / chunks) * 2 * BWD_KT * hd))
                .transpose()?;
            // (rows: the padded positions, at least the tokens: enough for either layout,
            // FLAMIA_BWD_DQ_STORE)
            let rows = plan.tpad();
            Some(BwdScratch {
                dq_acc: DeviceBuf::zeros(&self.gpu, rows * (s.heads_q / chunks) * hd)?,
                sems: DeviceBuf::zeros(&self.gpu, sems)?,
                cexp: DeviceBuf::zeros(&self.gpu, t * s.heads_q)?,
                cols: DeviceBuf::zeros(&self.gpu, rows / 2 * s.heads_q * BWD_COL_PAIR_BYTES)?,
                keys: DeviceBuf::zeros(
                    &self.gpu,
                    if hd == 64 && self.bwd_key_blocks() {
                        0
                    } else {
                        nkt * s.heads_q * BWD_KEY_REC_BYTES
                    },
                )?,
                dkv,
            })
        } else {
            None
        };
        Ok(GradWorkspace {
            d_o: Operand::alloc(&self.gpu, plan, s.heads_q)?,
            delta: DeviceBuf::zeros(&self.gpu, s.heads_q * s.tokens())?,
            v4,
        })
    }

    /// Quantises Q, K (rotated when `hadamard`), V into `saved` in ONE fused launch (the leaky
    /// control adds its tensor-wide amax launch, the `nvfp4` path two NVFP4 launches).
    pub fn quantize_inputs(
        &self,
        stream: RawStream,
        plan: &Plan,
        q: u64,
        k: u64,
        v: u64,
        saved: &Saved,
    ) -> GpuResult<()> {
        self.check_plan(plan)?;
        let had = self.opts.precision.hadamard;
        let m = self.scale_mode();
        let g = &self.gpu;
        let inputs = self.qkv_inputs(plan, [q, k, v], saved);
        quantize_e4m3_fused(g, stream, plan, &inputs, m, None, Some(&self.amax))?;
        if let (Some(q4), Some(k4)) = (saved.q4, saved.k4) {
            quantize_nvfp4(g, stream, plan, q, had, q4)?;
            quantize_nvfp4(g, stream, plan, k, had, k4)?;
        }
        Ok(())
    }

    /// The Q/K/V quantiser's inputs `x` = [q, k, v] into `saved` (no dim-major Q when the
    /// forward writes it).
    fn qkv_inputs(&self, plan: &Plan, x: [u64; 3], saved: &Saved) -> [QuantInput; 3] {
        let had = self.opts.precision.hadamard;
        let mut qo = saved.q;
        if self.fwd_writes_qd(plan) {
            qo.dim = 0;
        }
        [
            QuantInput::new(x[0], had, qo).with_dim_order(self.q_dim_order()),
            QuantInput::new(x[1], had, saved.k).with_dim_order(self.k_dim_order()),
            QuantInput::new(x[2], false, saved.v).with_dim_order(self.v_dim_order(plan.shape().head_dim)),
        ]
    }

    /// Variant of the attention modules: the NVFP4 switch, the dynamic shared memory each
    /// kernel gets (the kernels `static_assert` that their layout fits it) and the FP32 promotion
    /// of the dP and score products ([`promote_mask`]).
    fn variant(&self) -> (Variant, usize) {
        let i = (self.opts.path == AttnPath::Nvfp4) as usize;
        (attention_variant(i == 1, self.promote), i)
    }

    fn params(&self, plan: &Plan, saved: &Saved) -> AttnParams {
        let s = plan.shape();
        let scale = self.opts.scale(s.head_dim);
        AttnParams {
            q_tok: saved.q.tok,
            q_dim: saved.q.dim,
            q_exp: saved.q.exps,
            k_tok: saved.k.tok,
            k_dim: saved.k.dim,
            k_exp: saved.k.exps,
            v_tok: saved.v.tok,
            v_dim: saved.v.dim,
            v_exp: saved.v.exps,
            tiles: plan.tiles.ptr(),
            t: s.tokens() as i32,
            tpad: plan.tpad() as i32,
            hq: s.heads_q as i32,
            hkv: s.heads_kv as i32,
            scale,
            scale_log2: scale * std::f32::consts::LOG2_E,
            causal: self.opts.causal as i32,
            row_ds: self.opts.precision.row_ds_exponents as i32,
            hadamard: self.opts.precision.hadamard as i32,
            q4: saved.q4.map_or(0, |o| o.vals),
            q4_exp: saved.q4.map_or(0, |o| o.exps),
            k4: saved.k4.map_or(0, |o| o.vals),
            k4_exp: saved.k4.map_or(0, |o| o.exps),
            ..Default::default()
        }
    }

    /// True when the forward runs the v4 kernel (E4M3 scores, no FP32 score promotion, not
    /// forced back to v3.1 by `FLAMIA_ATTN_FWD=v3`).
    pub fn uses_forward_v4(&self) -> bool {
        self.opts.path != AttnPath::Nvfp4 && self.promote & 2 == 0 && !self.fwd_v3
    }

    /// Whether Q's and dO's dim-major copies are written permuted for the v4 backward
    /// (`BWD_QPERM`: its dK and dV products, their only readers, pack P~^T and dS~^T without
    /// shuffles; bitwise the same gradients, GPU test `backward_qperm_gives_bitwise_the_same`).
    /// On by default (session 15: backward -0.4..-3.4%, docs/perf.md); `FLAMIA_BWD_QPERM=0` is
    /// the plain order (A/B and that test). Public so a caller reading [`Saved`]'s Q copy knows
    /// its order (`dim_token` in `cuda/quant.cu`).
    pub fn bwd_qperm(&self) -> bool {
        self.uses_backward_v4() && self.qperm_env
    }

    /// The order of Q's and dO's dim-major copies ([`Attention::bwd_qperm`]).
    pub fn q_dim_order(&self) -> DimOrder {
        if self.bwd_qperm() {
            DimOrder::QueryPerm
        } else {
            DimOrder::Plain
        }
    }

    /// Whether the v4 forward packs P' into its PV products' A fragments straight from the
    /// score accumulator by four-code conversions, without the quad shuffles (`FWD_VPERM`,
    /// `cuda/attn_fwd_v4.cu`: 594 -> 520 SASS per interior key tile at d = 128, 548 -> 499 at
    /// d = 64), V's dim-major copy then holding each 32-key block's keys in the matching order
    /// ([`Attention::v_dim_order`]); the v4 backward's in-place V transpose puts them back
    /// (`BWD_VT_VPERM`). The same pairs in every k32 slice: bitwise the same outputs (GPU test
    /// `forward_vperm_gives_bitwise_the_same`). With the v4 forward at head dim `hd`: by default at
    /// d = 128 only, where session 43 measured the forward at 1x65536 777 -> 803 TFLOP/s with the
    /// other two cuts, while at d = 64 it cost 10% (497 -> 447; docs/perf.md "Session 43");
    /// `FLAMIA_FWD_VPERM=1` or `0` sets it for both (read when this value was made: V's copy
    /// written by one call's quantiser must be read in the same order by its backward).
    pub fn fwd_vperm(&self, hd: usize) -> bool {
        self.uses_forward_v4() && self.vperm_env.unwrap_or(hd == 128)
    }

    /// The order of V's dim-major copy: permuted for the v4 forward's P packing
    /// ([`Attention::fwd_vperm`]), else plain. Public so a caller reading [`Saved`]'s V copy
    /// knows its order.
    pub fn v_dim_order(&self, hd: usize) -> DimOrder {
        if self.fwd_vperm(hd) {
            DimOrder::QueryPerm
        } else {
            DimOrder::Plain
        }
    }

    /// Whether the v4 backward writes its dS tile for dQ by `stmatrix` with the keys of each
    /// 16-key group in the order 0, 8, 1, 9, ... (`BWD_DS_STSM`), so K's dim-major operand (the
    /// consumers' transpose, or the quantiser's copy: [`Attention::k_dim_order`]) holds its keys
    /// in that order too; bitwise the same gradients (GPU test
    /// `ds_tile_by_stmatrix_gives_bitwise_the_same`). With the four-code conversions; on by
    /// default since session 26 (backward -0.5..-5.6%, docs/perf.md; row dS exponents' dQ copy
    /// too since later in that session, not yet measured there), `FLAMIA_BWD_DS_STSM=0` is the
    /// old tile (A/B and that test).
    pub fn bwd_ds_stsm(&self) -> bool {
        self.bwd_qperm() && self.cvt4_env && self.ds_stsm_env
    }

    /// The order of K's dim-major copy: interleaved for the backward's stmatrix dS tile
    /// ([`Attention::bwd_ds_stsm`]), else plain. Public so a caller reading [`Saved`]'s K copy
    /// knows its order.
    pub fn k_dim_order(&self) -> DimOrder {
        if self.bwd_ds_stsm() {
            DimOrder::KeyIleave
        } else {
            DimOrder::Plain
        }
    }

    /// Whether the v4 backward transposes K into its dQ products' dim-major operand in shared
    /// memory (`BWD_KD_XPOSE`), so the quantiser writes no dim-major K and [`Saved`] holds none
    /// (`k.dim` 0): a sixth of the Q/K/V quantiser's bytes. With the v4 backward only, for plans
    /// of short and mid-length documents ([`KD_XPOSE_MAX_TILES`]) unless `FLAMIA_BWD_KD_XPOSE`
    /// says (read when this value was made). Session 23 (docs/perf.md): the consumers'
    /// transpose (`BWD_KD_XPOSE` 2) took the quantiser -10% for +1..+2% backward, training call
    /// -1.2..-1.6% at 256x256 and 64x1024 (d = 128), -2.1% at d = 64, +0.9% at 1x65536 (a
    /// producer warp's transpose cost the backward +3..+5% and the call gained nothing: removed
    /// in session 24). A forward and its backward must see the same plan (they do: [`Saved`] is
    /// carved per plan).
    pub fn bwd_kd_xpose(&self, plan: &Plan) -> bool {
        self.kd_xpose_at(plan.tables.fwd.mean_key_tiles())
    }

    /// [`Attention::bwd_kd_xpose`] for a plan of `mean_tiles` key tiles per query tile.
    fn kd_xpose_at(&self, mean_tiles: f64) -> bool {
        self.uses_backward_v4() && self.kd_xpose_env.unwrap_or_else(|| short_items(mean_tiles))
    }

    /// Whether the v4 backward TMA-loads V's dim-major copy (the forward's operand) into its K/V
    /// slot and its consumers transpose it in place into the token-major tile of their dP
    /// products at each item's start (`BWD_VT_XPOSE`), so the quantiser writes no token-major V
    /// and [`Saved`] holds none (`v.tok` 0). With the v4 backward only, for plans of short and
    /// mid-length documents ([`short_items`]) unless `FLAMIA_BWD_VT_XPOSE=0|1` says (read when
    /// this value was made). Session 24 (docs/perf.md): quantiser -8..-9%, training call
    /// -0.2..-1.3% at d = 128.
    pub fn bwd_vt_xpose(&self, plan: &Plan) -> bool {
        self.vt_xpose_at(plan.tables.fwd.mean_key_tiles())
    }

    /// [`Attention::bwd_vt_xpose`] for a plan of `mean_tiles` key tiles per query tile.
    fn vt_xpose_at(&self, mean_tiles: f64) -> bool {
        self.uses_backward_v4() && self.vt_xpose_env.unwrap_or_else(|| short_items(mean_tiles))
    }

    /// Whether the v4 forward writes Q's dim-major copy (the v4 backward's dK operand) from the Q
    /// tiles it loads anyway (`FWD_QD_WRITE`: the producer warpgroup's idle warp transposes each
    /// item's tile in shared memory and bulk-stores it), so the quantiser writes none: a sixth of
    /// its bytes, for `plan`. Needs both v4 kernels; by default at d = 64 for short and
    /// mid-length documents only ([`QdFwd::Auto`]); `FLAMIA_FWD_QD=1` every plan, `=0` none
    /// (read when this value was made): sessions 22-23 measured the quantiser -10% with it but
    /// the forward +4..+14% on short documents at d = 128 (docs/perf.md). [`Saved`]'s Q copy is then complete only after
    /// [`Attention::forward_quantized`].
    pub fn fwd_writes_qd(&self, plan: &Plan) -> bool {
        self.fwd_writes_qd_at(plan.shape().head_dim, plan.tables.fwd.mean_key_tiles())
    }

    /// [`Attention::fwd_writes_qd`] at head dim `hd` for a plan of `mean_tiles` key tiles per
    /// query tile.
    fn fwd_writes_qd_at(&self, hd: usize, mean_tiles: f64) -> bool {
        // (five K/V stages, FLAMIA_FWD_STAGES=5, leave no room for the staging tiles at d = 128)
        self.uses_forward_v4()
            && self.uses_backward_v4()
            && self.fwd_stages <= 4
            && self.qd_fwd.writes(hd, mean_tiles)
    }

    /// [`forward_v4_variant`]'s `qd`: `Some(permuted)` when the forward writes Q's dim-major copy,
    /// in the order the backward reads it ([`Attention::bwd_qperm`]).
    fn fwd_qd_order(&self, writes: bool) -> Option<bool> {
        writes.then(|| self.bwd_qperm())
    }

    /// Bytes the Q/K/V quantiser moves for `plan` under these options ([`e4m3_bytes`]: no
    /// dim-major K with [`Attention::bwd_kd_xpose`], no dim-major Q with
    /// [`Attention::fwd_writes_qd`], no token-major V with [`Attention::bwd_vt_xpose`]).
    pub fn input_quant_bytes(&self, plan: &Plan) -> usize {
        let s = plan.shape();
        e4m3_bytes(
            plan,
            &[
                (s.heads_q, true, !self.fwd_writes_qd(plan)),
                (s.heads_kv, true, !self.bwd_kd_xpose(plan)),
                (s.heads_kv, !self.bwd_vt_xpose(plan), true),
            ],
        )
    }

    /// True when the backward runs the v4 fused kernel (E4M3 operands, no FP32 promotion of dP or
    /// S, not forced back to v3.1 by `FLAMIA_ATTN_BWD=v3`).
    pub fn uses_backward_v4(&self) -> bool {
        self.opts.path != AttnPath::Nvfp4 && self.promote == 0 && !self.bwd_v3
    }

    /// The forward kernel on already quantised inputs: writes O (BF16) and LSE (FP32).
    pub fn forward_quantized(
        &self,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        o: u64,
        lse: u64,
    ) -> GpuResult<()> {
        self.check_plan(plan)?;
        self.gpu.bind()?;
        let mut p = self.params(plan, saved);
        p.o = o;
        p.lse = lse;
        if self.uses_forward_v4() {
            return self.forward_v4(stream, plan, saved, p);
        }
        let (v, i) = self.variant();
        let f = self.gpu.function("attn_fwd.cu", &v, "attn_fwd", SMEM_FWD[i])?;
        let grid = (plan.tables.tiles.len() as u32, plan.shape().heads_q as u32, 1);
        // SAFETY: params mirror AttnParams; buffers sized by `plan` (caller: o, lse).
        unsafe { launch(&f, grid, 128, SMEM_FWD[i], stream, &p, "attn_fwd") }
    }

    /// The v4 forward's build for a plan of `mean_tiles` key tiles per query tile at head dim
    /// `hd`, with the consumer copies or not (`cw`, [`fwd_cw_const`]): whether it writes Q's
    /// dim-major copy and O by bulk tensor stores, its variant and shared memory.
    fn forward_v4_build(&self, hd: usize, mean_tiles: f64, cw: bool) -> FwdBuild {
        let per_token = self.scale_mode() == ScaleMode::PerToken;
        let qd = self.fwd_writes_qd_at(hd, mean_tiles);
        let o_tma = fwd_o_tma(self.fwd_stages, hd as u32, per_token, qd, cw);
        let (mut variant, smem) = forward_v4_variant(
            per_token,
            self.fwd_stages,
            hd as u32,
            cw,
            self.fwd_qd_order(qd),
            o_tma,
            fwd_half_tiles(cw),
        );
        if self.fwd_vperm(hd) {
            variant = variant.define("FWD_VPERM", 1);
        }
        // (session 40's instruction cuts of the key tile, the same values: the K-slice
        // descriptors by one add each, FWD_DESC_ADD; the interior tile's finite maxima and the
        // compact group tables, FWD_TILE_TRIM; by default at d = 128 since session 43 measured
        // them on the H200, 777 -> 803 TFLOP/s at 1x65536 with FWD_VPERM; at d = 64 TILE_TRIM
        // cost 10% (1x65536 forward beside DESC_ADD and EV_RUN: 499.6 without, 452.5 with) and
        // DESC_ADD did not help without it (EV_RUN alone 508.1, with DESC_ADD 499.6; one run
        // each), so neither there; FLAMIA_FWD_DESC_ADD=0|1 and
        // FLAMIA_FWD_TILE_TRIM=0|1 set them for both head dims)
        for (var, define) in [
            ("FLAMIA_FWD_DESC_ADD", "FWD_DESC_ADD"),
            ("FLAMIA_FWD_TILE_TRIM", "FWD_TILE_TRIM"),
        ] {
            if env_choice(var, &["1"]).unwrap_or(hd == 128) {
                variant = variant.define(define, 1);
            }
        }
        // (V's fold reference as a running maximum, FWD_EV_RUN, both scale modes: other O bits
        // where eV varies between key tiles and no overflow after an all-zero V tile, where the
        // tile's own maximum gave non-finite O on the H200 (session 43); on by default since,
        // FLAMIA_FWD_EV_RUN=0 switches it off: docs/numerics.md "Known deviations")
        if !super::env_off("FLAMIA_FWD_EV_RUN") {
            variant = variant.define("FWD_EV_RUN", 1);
        }
        FwdBuild {
            variant,
            smem,
            qd,
            o_tma,
        }
    }

    /// The v4 forward: persistent grid of at most one CTA per SM over the plan's longest-first
    /// work items, TMA maps of this call's code buffers.
    fn forward_v4(&self, stream: RawStream, plan: &Plan, saved: &Saved, a: AttnParams) -> GpuResult<()> {
        let s = plan.shape();
        let (t, hd) = (s.tokens(), s.head_dim);
        let nitems = plan.tables.fwd.items.len();
        let mean_tiles = plan.tables.fwd.mean_key_tiles();
        let b = self.forward_v4_build(hd, mean_tiles, fwd_cw_const(hd, mean_tiles));
        let p = FwdV4Params {
            q_map: tma::token_major(saved.q.tok, t, s.heads_q, hd, FWD_QT as u32)?,
            k_map: tma::token_major(saved.k.tok, t, s.heads_kv, hd, 128)?,
            v_map: tma::dim_major(saved.v.dim, s.heads_kv, hd, plan.tpad())?,
            qd_map: if b.qd {
                tma::dim_major_64(saved.q.dim, s.heads_q, hd, plan.tpad())?
            } else {
                TmaMap::default()
            },
            o_map: if b.o_tma {
                tma::bf16_rows(a.o, t, s.heads_q, hd, 64)?
            } else {
                TmaMap::default()
            },
            a,
            items: plan.fwd_items.ptr(),
            tiles: plan.fwd_tiles.ptr(),
            counter: plan.counter.ptr(),
            nitems: nitems as i32,
        };
        let f = self
            .gpu
            .function("attn_fwd_v4.cu", &b.variant, "attn_fwd_v4", b.smem)?;
        if launch_memsets() {
            self.memset32(stream, plan.counter.ptr(), 2, "work counter")?;
        }
        let sms = self.gpu.sm_count().max(1) as usize;
        let grid = (fwd_v4_grid(nitems, sms) as u32, 1, 1);
        // SAFETY: params mirror FwdV4Params; the maps cover the saved code buffers of `plan`'s
        // shape, the tables and counter belong to `plan` (zero between launches: sched_done), o
        // and lse are the caller's (sized by plan); the kernel waits (pdl_wait) before reading.
        unsafe { launch_chained(&f, grid, 384, b.smem, stream, &p, "attn_fwd_v4") }
    }

    /// Quantises Q, K, V and runs the forward; returns the quantised operands for the backward.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        stream: RawStream,
        plan: &Plan,
        q: u64,
        k: u64,
        v: u64,
        o: u64,
        lse: u64,
    ) -> GpuResult<Saved> {
        let saved = self.alloc_saved(plan)?;
        self.quantize_inputs(stream, plan, q, k, v, &saved)?;
        self.forward_quantized(stream, plan, &saved, o, lse)?;
        Ok(saved)
    }

    /// Quantises dO (and computes D from O) into `ws`.
    pub fn quantize_grad(
        &self,
        stream: RawStream,
        plan: &Plan,
        d_o: u64,
        o: u64,
        ws: &GradWorkspace,
    ) -> GpuResult<()> {
        self.check_plan(plan)?;
        let delta = DeltaOut {
            o,
            delta: ws.delta.ptr(),
        };
        let input = QuantInput::new(d_o, false, &ws.d_o).with_dim_order(self.q_dim_order());
        quantize_e4m3_fused(
            &self.gpu,
            stream,
            plan,
            &[input],
            self.scale_mode(),
            Some(delta),
            Some(&self.amax),
        )
    }

    /// The two backward kernels on quantised operands: writes dQ, dK, dV (BF16).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_quantized(
        &self,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        ws: &GradWorkspace,
        lse: u64,
        dq: u64,
        dk: u64,
        dv: u64,
    ) -> GpuResult<()> {
        let grads = BwdOutputs { lse, dq, dk, dv };
        if self.uses_backward_v4() {
            return self.backward_v4(stream, plan, saved, ws, grads);
        }
        self.backward_kernel(BwdKernel::Dq, stream, plan, saved, ws, grads)?;
        self.backward_kernel(BwdKernel::DkDv, stream, plan, saved, ws, grads)
    }

    /// The parameters of the backward kernels: the forward's operands, the quantised dO and D
    /// of `ws`, LSE and the gradient pointers of `out`.
    fn bwd_params(&self, plan: &Plan, saved: &Saved, ws: &GradWorkspace, out: BwdOutputs) -> AttnParams {
        AttnParams {
            do_tok: ws.d_o.tok.ptr(),
            do_dim: ws.d_o.dim.ptr(),
            do_exp: ws.d_o.exps.ptr(),
            delta: ws.delta.ptr(),
            lse: out.lse,
            dq: out.dq,
            dk: out.dk,
            dv: out.dv,
            ..self.params(plan, saved)
        }
    }

    fn memset32(&self, stream: RawStream, ptr: u64, n: usize, what: &str) -> GpuResult<()> {
        // SAFETY: `ptr` is a device buffer of at least `n` 32-bit words owned by the caller.
        unsafe { cudarc::driver::sys::cuMemsetD32Async(ptr, 0, n, stream.0) }
            .result()
            .map_err(|err| GpuError::Driver {
                what: format!("cuMemsetD32Async({what})"),
                err,
            })
    }

    /// The v4 backward: dV's fold exponents, the fused kernel (persistent grid over the plan's
    /// longest-first key-tile items), then dQ from its FP32 accumulator.
    fn backward_v4(
        &self,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        ws: &GradWorkspace,
        out: BwdOutputs,
    ) -> GpuResult<()> {
        self.check_plan(plan)?;
        self.gpu.bind()?;
        let Some(sc) = &ws.v4 else {
            return Err(GpuError::Input(crate::Error::Invalid(
                "gradient workspace allocated for the v3.1 backward; allocate it with this Attention's alloc_grad".into(),
            )));
        };
        let s = plan.shape();
        let (t, hd) = (s.tokens(), s.head_dim);
        let a = self.bwd_params(plan, saved, ws, out);
        let bw = &plan.tables.bwd;
        let nkt = bw.tiles.len();
        let v = Variant::new().define("HEAD_DIM", hd);
        // dV's fold exponents (and the fused kernel's semaphores zeroed, unless memsets do it)
        let memsets = launch_memsets();
        let fold = DvFoldParams {
            do_exp: a.do_exp,
            cu: plan.cu.ptr(),
            cexp: sc.cexp.ptr(),
            sems: if memsets { 0 } else { sc.sems.ptr() },
            nsems: sc.sems.len() as i32,
            docs: s.docs() as i32,
            hq: s.heads_q as i32,
            causal: a.causal,
        };
        let max_len = s.cu_seqlens.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let (name, grid, block) = if bwd_fold_warp(max_len) {
            let warps = s.docs() * s.heads_q;
            ("bwd_dv_fold_warp", (warps.div_ceil(8) as u32, 1, 1), 256)
        } else {
            ("bwd_dv_fold", (s.docs() as u32, s.heads_q as u32, 1), 1024)
        };
        let f = self.gpu.function("attn_bwd_v4.cu", &v, name, 0)?;
        // SAFETY: params mirror DvFoldParams; do_exp and cexp are [T, Hq], cu has docs + 1
        // entries, sems nsems words (alloc_grad); the kernel waits (pdl_wait) before reading.
        unsafe { launch_chained(&f, grid, block, 0, stream, &fold, name) }?;
        let vt = self.bwd_vt_xpose(plan);
        let f = self.backward_v4_fused(plan)?;
        let (fused, smem, pair, ctas) = (f.function, f.smem, f.pair_mode > 0, f.ctas);
        // the step constants' table (BWD_COLS_TMA): every query head, padded position pairs; with
        // BWD_KEYS_TMA (not with CTA pairs: the kernel source excludes them) each item's key factors
        let cols_tma = bwd_cols_tma(hd as u32, self.bwd_key_blocks());
        let keys_tma = !pair && bwd_keys_tma(hd as u32, self.bwd_key_blocks());
        let key_threads = if keys_tma { nkt * s.heads_q * 32 } else { 0 };
        if keys_tma && sc.keys.bytes() < nkt * s.heads_q * BWD_KEY_REC_BYTES {
            return Err(GpuError::NotSupported(format!(
                "the v4 backward's key-factor records need {} bytes; this workspace holds {} \
                 (allocated without them: head dim 64 with block scales)",
                nkt * s.heads_q * BWD_KEY_REC_BYTES,
                sc.keys.bytes()
            )));
        }
        if cols_tma {
            let tpad = plan.tpad();
            let cp = ColsParams {
                q_exp: saved.q.exps,
                do_exp: a.do_exp,
                lse: a.lse,
                delta: a.delta,
                pad_tok: plan.pad_tok.ptr(),
                colc: sc.cols.ptr(),
                tiles: plan.bwd_tiles.ptr(),
                keys: if keys_tma { sc.keys.ptr() } else { 0 },
                k_exp: a.k_exp,
                v_exp: a.v_exp,
                cexp: sc.cexp.ptr(),
                scale_log2: a.scale_log2,
                scale: a.scale,
                hq: s.heads_q as i32,
                tpad: tpad as i32,
                hkv: s.heads_kv as i32,
                nkt: nkt as i32,
            };
            let f = self.gpu.function("attn_bwd_v4.cu", &v, "bwd_cols", 0)?;
            let threads = tpad / 2 * s.heads_q + key_threads;
            // SAFETY: params mirror ColsParams; the exponent, LSE and D tables are [T, Hq], pad_tok
            // [Tpad], colc holds Tpad / 2 x Hq column pairs (alloc_grad); one thread per pair; with
            // keys, 32 threads per item code over the plan's nkt key tiles (bwd_tiles) and Hq heads,
            // whose records `keys` holds (checked above), K's and V's exponents [T, Hkv], cexp
            // [T, Hq] (bwd_dv_fold, the launch before).
            unsafe {
                launch_chained(
                    &f,
                    (threads.div_ceil(256) as u32, 1, 1),
                    256,
                    0,
                    stream,
                    &cp,
                    "bwd_cols",
                )
            }?;
        }
        // the fused kernel and the dQ conversion, once per head chunk (BwdSchedule::chunks): the
        // chunk's dQ accumulator and dK/dV partials are the scratch's
        if memsets {
            self.memset32(stream, sc.sems.ptr(), sc.sems.len(), "backward semaphores")?;
        }
        let hc = bw.chunk_heads(s.heads_q);
        let hkc = s.heads_kv / bw.chunks;
        // dQ accumulator rows: padded positions when each query tile's first partial is stored
        // (no zeroing), else tokens
        let first_store = bwd_dq_first_store();
        let bulk_st = bwd_bulk_st(hd as u32, bw.walks_up()) && !pair;
        let acc_rows = if first_store { plan.tpad() } else { t };
        // dQ converted beside the fused kernel (FLAMIA_BWD_FOLLOWERS) on SMs its grid leaves free
        let followers = if bw.all_up() && plan.causal && !pair && first_store {
            bwd_followers().min(ctas / 2)
        } else {
            0
        };
        for c in 0..bw.chunks {
            let range = if pair { bw.pair_range(c) } else { bw.chunk_range(c) };
            if !first_store {
                self.memset32(stream, sc.dq_acc.ptr(), t * hc * hd, "dQ accumulator")?;
            }
            if memsets {
                self.memset32(stream, plan.counter.ptr(), 2, "work counter")?;
            }
            let p = BwdV4Params {
                k_map: tma::token_major(saved.k.tok, t, s.heads_kv, hd, BWD_KT as u32)?,
                // (BWD_VT_XPOSE: the dim-major V in 64-key halves, transposed by the kernel)
                v_map: if vt {
                    tma::dim_major_64(saved.v.dim, s.heads_kv, hd, plan.tpad())?
                } else {
                    tma::token_major(saved.v.tok, t, s.heads_kv, hd, BWD_KT as u32)?
                },
                // (BWD_KD_XPOSE: no dim-major K, the kernel transposes the token-major tile)
                kd_map: if self.bwd_kd_xpose(plan) {
                    TmaMap::default()
                } else {
                    tma::dim_major(saved.k.dim, s.heads_kv, hd, plan.tpad())?
                },
                q_map: tma::token_major(saved.q.tok, t, s.heads_q, hd, BWD_QT as u32)?,
                do_map: tma::token_major(a.do_tok, t, s.heads_q, hd, BWD_QT as u32)?,
                qd_map: tma::dim_major_64(saved.q.dim, s.heads_q, hd, plan.tpad())?,
                dod_map: tma::dim_major_64(a.do_dim, s.heads_q, hd, plan.tpad())?,
                dq_map: tma::f32_rows(sc.dq_acc.ptr(), acc_rows, hc, hd, BWD_QT as u32)?,
                a,
                items: if pair {
                    plan.bwd_pairs.ptr()
                } else {
                    plan.bwd_items.ptr()
                } + 4 * range.start as u64,
                tiles: plan.bwd_tiles.ptr(),
                cexp: sc.cexp.ptr(),
                dkv_acc: sc.dkv.as_ref().map_or(0, |b| b.ptr()),
                counter: plan.counter.ptr(),
                dq_sem: sc.sems.ptr(),
                kv_sem: sc.sems.ptr() + 4 * (s.heads_q * bw.query_tiles) as u64,
                colc: if cols_tma { sc.cols.ptr() } else { 0 },
                keys: if keys_tma { sc.keys.ptr() } else { 0 },
                nitems: range.len() as i32,
                nqt: bw.query_tiles as i32,
                nkt: nkt as i32,
                h0: (c * hc) as i32,
                hk0: (c * hkc) as i32,
                hkc: hkc as i32,
                jitter: bwd_jitter(),
                dq_first_store: first_store as i32,
                tpad: plan.tpad() as i32,
                // (BWD_BULK_ST: dK and dV in boxes of 64 keys by bulk tensor stores)
                dk_map: if bulk_st {
                    tma::bf16_rows(a.dk, t, s.heads_kv, hd, 64)?
                } else {
                    TmaMap::default()
                },
                dv_map: if bulk_st {
                    tma::bf16_rows(a.dv, t, s.heads_kv, hd, 64)?
                } else {
                    TmaMap::default()
                },
            };
            // SAFETY: params mirror BwdV4Params; the maps cover the saved and dO code buffers of
            // `plan`'s shape and the scratch of `ws` (allocated for this plan: one chunk's heads),
            // the items are this chunk's (heads h0..h0 + hc; pairs, with BWD_PAIR, in clusters
            // of two CTAs), the gradients are the caller's.
            unsafe {
                if pair {
                    let grid = (2 * range.len().min(ctas / 2) as u32, 1, 1);
                    launch_clustered(&fused, (grid, 384, smem), stream, &p, "attn_bwd_v4", 2)
                } else {
                    let grid = (range.len().min(ctas - followers) as u32, 1, 1);
                    launch_chained(&fused, grid, 384, smem, stream, &p, "attn_bwd_v4")
                }
            }?;
            if followers > 0 {
                self.dq_follow(stream, plan, saved, sc, &a, c, followers)?;
            } else {
                self.dq_convert(stream, plan, saved, sc, &a, c)?;
            }
        }
        Ok(())
    }

    /// `bwd_dq_convert` of head chunk `c` (chained after the chunk's fused kernel): the FP32 dQ
    /// accumulator of `sc` (positions padded when each query tile's first partial is stored,
    /// else tokens) into BF16 dQ at `a.dq`, scaled by 2^-eQ and rotated back.
    fn dq_convert(
        &self,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        sc: &BwdScratch,
        a: &AttnParams,
        c: usize,
    ) -> GpuResult<()> {
        let hd = plan.shape().head_dim;
        let rpt = dq_convert_rows();
        let persist = dq_convert_ctas();
        let convert = self.dq_module_function(hd, persist.is_some(), "bwd_dq_convert")?;
        let conv = self.dq_convert_params(plan, saved, sc, a, c);
        // every row once (DQC_PERSIST: the warps of at most n CTAs stride over them)
        let full = (conv.rows as usize).div_ceil(rpt * 1024 / hd);
        let ctas = persist.map_or(full, |n| n.min(full)).max(1);
        // SAFETY: params mirror DqConvertParams; acc is [acc_rows, hc, hd] (acc_rows = T, or
        // Tpad with pad_tok [Tpad] mapping its rows to tokens), dq [T, Hq, hd], q_exp [T, Hq],
        // heads h0..h0 + hc; hd / 4 threads per row, 256 per CTA.
        unsafe {
            launch_chained(
                &convert,
                (ctas as u32, 1, 1),
                256,
                0,
                stream,
                &conv,
                "bwd_dq_convert",
            )
        }
    }

    /// A kernel of the dQ conversions' module (`bwd_dq_convert`, `bwd_dq_follow`) at head dim
    /// `hd`: its rows per thread ([`dq_convert_rows`]), `DQC_PERSIST` where asked, and the
    /// partials' dim order of the fused kernel ([`with_dq_stsm`]).
    fn dq_module_function(
        &self,
        hd: usize,
        persist: bool,
        name: &str,
    ) -> GpuResult<cudarc::driver::CudaFunction> {
        let mut v = Variant::new()
            .define("HEAD_DIM", hd)
            .define("DQC_ROWS", dq_convert_rows());
        if persist {
            v = v.define("DQC_PERSIST", 1);
        }
        self.gpu.function("attn_bwd_v4.cu", &with_dq_stsm(v), name, 0)
    }

    /// `bwd_dq_convert`'s parameters for head chunk `c`: the FP32 dQ accumulator of `sc`
    /// (positions padded when each query tile's first partial is stored, else tokens) into BF16
    /// dQ at `a.dq`.
    fn dq_convert_params(
        &self,
        plan: &Plan,
        saved: &Saved,
        sc: &BwdScratch,
        a: &AttnParams,
        c: usize,
    ) -> DqConvertParams {
        let s = plan.shape();
        let hc = plan.tables.bwd.chunk_heads(s.heads_q);
        let first_store = bwd_dq_first_store();
        let acc_rows = if first_store { plan.tpad() } else { s.tokens() };
        DqConvertParams {
            acc: sc.dq_acc.ptr(),
            q_exp: saved.q.exps,
            dq: a.dq,
            pad_tok: if first_store { plan.pad_tok.ptr() } else { 0 },
            rows: (acc_rows * hc) as i64,
            scale: a.scale,
            hadamard: a.hadamard,
            hc: hc as i32,
            hq: s.heads_q as i32,
            h0: (c * hc) as i32,
        }
    }

    /// `bwd_dq_follow` of head chunk `c` beside the chunk's fused kernel (launched right after
    /// it, programmatic dependent launch): on the `followers` SMs the fused grid leaves free it
    /// converts each (query head, query tile) of the chunk once its last partial has landed,
    /// instead of `bwd_dq_convert` afterwards ([`bwd_followers`]). The plan's tiles all walk up
    /// and its accumulator rows are padded positions (the caller checks both).
    #[allow(clippy::too_many_arguments)]
    fn dq_follow(
        &self,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        sc: &BwdScratch,
        a: &AttnParams,
        c: usize,
        followers: usize,
    ) -> GpuResult<()> {
        let s = plan.shape();
        let bw = &plan.tables.bwd;
        let follow = self.dq_module_function(s.head_dim, false, "bwd_dq_follow")?;
        let nunits = bw.chunk_heads(s.heads_q) * bw.query_tiles;
        let dq_sems = s.heads_q * bw.query_tiles;
        let p = DqFollowParams {
            c: self.dq_convert_params(plan, saved, sc, a, c),
            units: plan.dq_units.ptr() + 4 * (c * nunits) as u64,
            qtiles: plan.tiles.ptr(),
            sems: sc.sems.ptr(),
            // (chunk c's counter after the dQ and dK/dV semaphores: alloc_grad)
            counter: sc.sems.ptr() + 4 * (dq_sems + s.heads_kv * bw.tiles.len() + c) as u64,
            nunits: nunits as i32,
            nqt: bw.query_tiles as i32,
        };
        // SAFETY: params mirror DqFollowParams: the accumulator and outputs as bwd_dq_convert's
        // (padded rows), the plan's units (chunk c's nunits of BwdSchedule::dq_units), 64-token
        // tiles [nqt][4] and the scratch's semaphores and counter, which bwd_dv_fold zeroed before
        // the fused kernel; the kernel synchronises with the running fused kernel through the
        // semaphores alone and waits for it (pdl_wait) before it exits.
        unsafe {
            launch_dependent(
                &follow,
                ((followers * FOLLOWER_CTAS_PER_SM) as u32, 1, 1),
                256,
                stream,
                &p,
                "bwd_dq_follow",
            )
        }
    }

    /// The v4 backward's fused kernel for `plan` with this call's options and knobs: its
    /// variant (CTA pairs, `BWD_PAIR`, per `FLAMIA_BWD_PAIR` where the plan has pairs) and its
    /// persistent grid (a CTA per SM, or with pairs as many clusters of two as fit at once;
    /// `FLAMIA_BWD_CTAS` caps either).
    fn backward_v4_fused(&self, plan: &Plan) -> GpuResult<FusedBwd> {
        let bw = &plan.tables.bwd;
        let hd = plan.shape().head_dim as u32;
        let (kd, vt) = (self.bwd_kd_xpose(plan), self.bwd_vt_xpose(plan));
        let (v4, smem) = self.backward_v4_kernel(hd, bw.walks_up(), kd, vt)?;
        let pair_mode = if bw.pairs.is_empty() {
            0
        } else {
            bwd_pair_env(bwd_pair_default(
                plan.causal,
                bw.walks_up(),
                plan.shape().head_dim,
            ))
        };
        if pair_mode == 2 && bwd_dq_bufs() > 1 {
            return Err(GpuError::NotSupported(
                "FLAMIA_BWD_PAIR=2 sums the pair's dQ partials in the one dQ buffer of each warpgroup, so                  it cannot run with FLAMIA_BWD_DQ_BUFS=2: unset FLAMIA_BWD_DQ_BUFS, or use FLAMIA_BWD_PAIR=1"
                    .into(),
            ));
        }
        let v4 = match pair_mode {
            0 => v4,
            2 if super::env_off("FLAMIA_BWD_PAIR_STRICT") => {
                v4.define("BWD_PAIR", 2).define("BWD_PAIR_STRICT", 0)
            }
            m => v4.define("BWD_PAIR", m),
        };
        let function = self.gpu.function("attn_bwd_v4.cu", &v4, "attn_bwd_v4", smem)?;
        let resident = if pair_mode > 0 {
            // (asked of the driver once per kernel: a paired plan is the default on long documents)
            let key = (function.cu_function() as usize, smem);
            let known = self.clusters.lock().ok().and_then(|m| m.get(&key).copied());
            match known {
                Some(n) => n,
                None => {
                    let n = max_active_clusters(&function, 384, smem, 2)?;
                    if let Ok(mut m) = self.clusters.lock() {
                        m.insert(key, n);
                    }
                    n
                }
            }
        } else {
            self.gpu.sm_count().max(0) as usize
        };
        let ctas = fused_bwd_grid(pair_mode > 0, bwd_ctas(), resident);
        Ok(FusedBwd {
            function,
            smem,
            pair_mode,
            ctas,
        })
    }

    /// The v4 backward's CTA pairs for `plan` (`FLAMIA_BWD_PAIR`): the mode and how many
    /// clusters of two run at once, or `None` for one CTA per key tile (a diagnostic that
    /// `flamia bench attention` prints).
    pub fn backward_pairs(&self, plan: &Plan) -> GpuResult<Option<(u32, usize)>> {
        if !self.uses_backward_v4() {
            return Ok(None);
        }
        self.gpu.bind()?;
        let f = self.backward_v4_fused(plan)?;
        Ok((f.pair_mode > 0).then_some((f.pair_mode, f.ctas / 2)))
    }

    /// One backward kernel alone (the benchmark times them apart): one of the two v3.1 kernels
    /// (independent: either order gives the same bits), or the v4 fused backward's launches.
    pub fn backward_kernel(
        &self,
        which: BwdKernel,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        ws: &GradWorkspace,
        out: BwdOutputs,
    ) -> GpuResult<()> {
        if which == BwdKernel::Fused {
            return self.backward_v4(stream, plan, saved, ws, out);
        }
        if which == BwdKernel::DqConvert {
            let Some(sc) = &ws.v4 else {
                return Err(GpuError::NotSupported(
                    "the dQ conversion alone needs the v4 backward's workspace".into(),
                ));
            };
            self.check_plan(plan)?;
            self.gpu.bind()?;
            let a = self.bwd_params(plan, saved, ws, out);
            for c in 0..plan.tables.bwd.chunks {
                self.dq_convert(stream, plan, saved, sc, &a, c)?;
            }
            return Ok(());
        }
        self.check_plan(plan)?;
        self.gpu.bind()?;
        let p = self.bwd_params(plan, saved, ws, out);
        let s = plan.shape();
        let tiles = plan.tables.tiles.len() as u32;
        let (v, i) = self.variant();
        let (name, heads, smem) = match which {
            BwdKernel::Dq => ("attn_bwd_dq", s.heads_q, SMEM_DQ[i]),
            BwdKernel::DkDv => ("attn_bwd_dkdv", s.heads_kv, SMEM_DKDV[i]),
            BwdKernel::Fused | BwdKernel::DqConvert => unreachable!("handled above"),
        };
        let f = self.gpu.function("attn_bwd.cu", &v, name, smem)?;
        // SAFETY: params mirror AttnParams; buffers sized by `plan` (caller: lse and the gradients).
        unsafe { launch(&f, (tiles, heads as u32, 1), 128, smem, stream, &p, name) }
    }

    /// Quantises dO and runs the backward against the operands `forward` returned.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        stream: RawStream,
        plan: &Plan,
        saved: &Saved,
        o: u64,
        lse: u64,
        d_o: u64,
        dq: u64,
        dk: u64,
        dv: u64,
    ) -> GpuResult<()> {
        let ws = self.alloc_grad(plan)?;
        self.quantize_grad(stream, plan, d_o, o, &ws)?;
        self.backward_quantized(stream, plan, saved, &ws, lse, dq, dk, dv)?;
        // `ws` is freed when dropped: wait for the kernels that read it.
        // SAFETY: plain stream synchronisation.
        unsafe { cudarc::driver::sys::cuStreamSynchronize(stream.0) }
            .result()
            .map_err(|err| GpuError::Driver {
                what: "cuStreamSynchronize".into(),
                err,
            })
    }

    /// Registers and local (spill) bytes per thread of the attention kernels of this variant at
    /// head dim `hd`, as the driver loaded them (the v3.1 kernels: head dim 128 only).
    pub fn kernel_resources(&self, hd: usize) -> GpuResult<Vec<(String, i32, i32)>> {
        self.check_head_dim(hd)?;
        let (v, i) = self.variant();
        let hd32 = hd as u32;
        let mut out = Vec::new();
        if self.uses_forward_v4() {
            // (the short items' build: FWD_CW_CONST off, fwd_cw_const, and their Q copy choice;
            // 1.5 key tiles per query tile: 256-token documents)
            let b = self.forward_v4_build(hd, 1.5, false);
            let f = self
                .gpu
                .function("attn_fwd_v4.cu", &b.variant, "attn_fwd_v4", b.smem)?;
            let (r, l) = super::runtime::resources(&f)?;
            out.push(("attn_fwd_v4".to_string(), r, l));
        }
        if self.uses_backward_v4() {
            // (the short documents' build, as for the forward's above)
            let kd = self.kd_xpose_at(1.5);
            let vt = self.vt_xpose_at(1.5);
            let (v4, smem) = self.backward_v4_kernel(hd32, super::sched::bwd_up_tiles() > 0, kd, vt)?;
            let f = self.gpu.function("attn_bwd_v4.cu", &v4, "attn_bwd_v4", smem)?;
            let (r, l) = super::runtime::resources(&f)?;
            out.push(("attn_bwd_v4".to_string(), r, l));
        }
        if hd != 128 {
            return Ok(out);
        }
        for (src, name, smem) in [
            ("attn_fwd.cu", "attn_fwd", SMEM_FWD[i]),
            ("attn_bwd.cu", "attn_bwd_dq", SMEM_DQ[i]),
            ("attn_bwd.cu", "attn_bwd_dkdv", SMEM_DKDV[i]),
        ] {
            let f = self.gpu.function(src, &v, name, smem)?;
            let (r, l) = super::runtime::resources(&f)?;
            out.push((name.to_string(), r, l));
        }
        Ok(out)
    }

    /// The GPU these kernels run on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

#[cfg(test)]
mod tests {
    use super::{
        attention_variant, backward_v4_variant, bwd_bulk_st, bwd_cols_tma, bwd_early_factors,
        bwd_pair_default, bwd_pair_env, dq_convert_ctas, dq_convert_rows, forward_v4_variant, fused_bwd_grid,
        fwd_cw_const, fwd_o_tma, fwd_v4_grid, parse_choice, parse_promote, short_items, smem_bwd4, smem_fwd4,
        with_dq_bufs, with_early_factors, with_xposes, QdFwd, FWD_CW_MIN_TILES, KD_XPOSE_MAX_TILES, SMEM_MAX,
    };
    use crate::gpu::runtime::tests::nvrtc_or_skip;
    use crate::gpu::runtime::{compile_ptx, Variant};

    #[test]
    fn the_backwards_producer_options_fit_the_shared_memory_they_are_built_for() {
        // the early key factors' 2 KB fit every build they are on for; with row dS exponents at
        // d = 128 they would not, which is why they are off there (bwd_early_factors)
        for hd in [64, 128] {
            for row_ds in [false, true] {
                for stages in [2, 3] {
                    let (v, smem) = backward_v4_variant(stages, hd, row_ds, !row_ds, false, None, true);
                    let base = smem;
                    let (v, smem) = with_early_factors((v, smem), bwd_early_factors(hd, row_ds));
                    assert!(
                        smem <= SMEM_MAX,
                        "d = {hd}, row dS {row_ds}, {stages} stages: {smem}"
                    );
                    let early = v.key().contains("BWD_EARLY_FACTORS");
                    assert_eq!(early, !(row_ds && hd == 128), "d = {hd}, row dS {row_ds}");
                    assert_eq!(smem, base + if early { 2048 } else { 0 });
                }
            }
        }
        assert!(smem_bwd4(3, 128, false, true) + 2048 > SMEM_MAX);
        // the bulk-copied step constants everywhere but where the producer folds them
        assert!(bwd_cols_tma(128, true) && bwd_cols_tma(128, false) && bwd_cols_tma(64, false));
        assert!(!bwd_cols_tma(64, true));
    }

    #[test]
    fn the_forwards_o_staging_only_at_head_dim_128_for_short_items_where_it_fits() {
        // d = 128 without the consumer copies: beside four K/V stages (184 + 32 KB), not beside
        // five nor beside Q's dim-major staging; not with the copies (long items), nor at d = 64
        for per_token in [false, true] {
            assert!(fwd_o_tma(4, 128, per_token, false, false));
            assert!(fwd_o_tma(2, 128, per_token, false, false));
            assert!(!fwd_o_tma(5, 128, per_token, false, false));
            assert!(!fwd_o_tma(4, 128, per_token, true, false));
            assert!(!fwd_o_tma(4, 128, per_token, false, true));
            for stages in 2..=5 {
                assert!(!fwd_o_tma(stages, 64, per_token, true, false));
                assert!(smem_fwd4(stages, 64, per_token, true, true) <= SMEM_MAX);
            }
        }
        assert_eq!(
            smem_fwd4(4, 128, false, false, true) - smem_fwd4(4, 128, false, false, false),
            32 * 1024
        );
    }

    /// Compiles every `(source, variant)` of `jobs` for sm_90a on as many threads as the machine
    /// has cores (NVRTC compiles separate programs concurrently; on CI's two cores the compile
    /// test takes half the time), then fails with every variant that did not compile.
    fn compile_all(jobs: &[(&'static str, Variant)]) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(jobs.len())
            .max(1);
        let next = AtomicUsize::new(0);
        let failures = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while let Some((src, v)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if let Err(e) = compile_ptx(src, v, "sm_90a") {
                            failures.lock().unwrap().push(format!("{src} [{}]: {e}", v.key()));
                        }
                    }
                });
            }
        });
        let failures = failures.into_inner().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {} variants did not compile:\n{}",
            failures.len(),
            jobs.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn every_attention_variant_compiles_within_its_shared_memory_budget() {
        if !nvrtc_or_skip("every_attention_variant_compiles_within_its_shared_memory_budget") {
            return;
        }
        let mut jobs: Vec<(&'static str, Variant)> = Vec::new();
        // The variants the runtime builds: E4M3 or NVFP4 scores, FP32 promotion off or on for
        // dP and S. The budgets' static_asserts and ptxas run inside NVRTC for sm_90a.
        for nvfp4 in [false, true] {
            for promote in [0, 3] {
                let v = attention_variant(nvfp4, promote);
                for src in ["attn_fwd.cu", "attn_bwd.cu"] {
                    jobs.push((src, v.clone()));
                }
            }
        }
        for hd in [64, 128] {
            // (per-token key factors at 3 stages only: the define changes the step, not the ring)
            // (the stress build of the tests once per head dim)
            for (stages, key_blocks, stress) in [
                (2, true, false),
                (3, true, false),
                (3, false, false),
                (3, true, true),
            ] {
                for row_ds in [false, true] {
                    // (the dead steps' skip, FLAMIA_BWD_SKIP_DEAD, with the stress build; the
                    // upward walk, FLAMIA_BWD_UP_TILES, with it and at 2 stages)
                    let skip_dead = stress.then_some(true);
                    let walk_up = stress || stages == 2;
                    let (v, _) =
                        backward_v4_variant(stages, hd, row_ds, key_blocks, stress, skip_dead, walk_up);
                    // (at d = 64 with key blocks the producer's fold both ways: the budget has
                    // room for it whatever the source's default)
                    // (elsewhere the step constants and the key factors by bulk copy,
                    // BWD_COLS_TMA and BWD_KEYS_TMA, as the runtime builds them; the QPERM builds
                    // below keep the producer's own constants and factors)
                    let vs = if key_blocks && hd == 64 {
                        vec![
                            v.clone().define("BWD_PRODUCER_FOLD", 0),
                            v.define("BWD_PRODUCER_FOLD", 1),
                        ]
                    } else {
                        vec![v.define("BWD_COLS_TMA", 1).define("BWD_KEYS_TMA", 1)]
                    };
                    for v in vs {
                        jobs.push(("attn_bwd_v4.cu", v));
                    }
                }
            }
            // the item's dK/dV by bulk tensor stores (BWD_BULK_ST, the default at d = 128 where
            // tiles walk up) in the downward-only build (FLAMIA_BWD_BULK_ST=1 there: key blocks)
            // and the upward walk's, with the dead steps' skip and the key factors' records
            for walk_up in [false, true] {
                let (v, _) = backward_v4_variant(3, hd, false, hd == 128, false, Some(true), walk_up);
                jobs.push((
                    "attn_bwd_v4.cu",
                    v.define("BWD_COLS_TMA", 1)
                        .define("BWD_KEYS_TMA", 1)
                        .define("BWD_BULK_ST", 1),
                ));
            }
            // the key-permuted packing of dV's and dK's A fragments (FLAMIA_BWD_QPERM=1), block and
            // row dS exponents, without and with the four-code conversions (BWD_CVT4) and the
            // redux block maxima (BWD_REDUX), and the defaults with K and V transposed in shared
            // memory by the consumers (BWD_KD_XPOSE 2, BWD_VT_XPOSE)
            for row_ds in [false, true] {
                let (v, _) = with_early_factors(
                    backward_v4_variant(3, hd, row_ds, !row_ds, false, None, true),
                    bwd_early_factors(hd, row_ds),
                );
                let v = v.define("BWD_QPERM", 1);
                let xposed = with_xposes(v.clone(), true, false);
                let xposed2 = with_xposes(v.clone(), true, true);
                // (V's dim-major copy in the forward's permuted order, BWD_VT_VPERM: FWD_VPERM's)
                let vperm = xposed2
                    .clone()
                    .define("BWD_DS_STSM", 1)
                    .define("BWD_DQ_STSM", 1)
                    .define("BWD_VT_VPERM", 1);
                // (the item's dK/dV by bulk tensor stores, BWD_BULK_ST: with the short
                // documents' transposes, as the d = 128 default builds them, block and row dS)
                jobs.push(("attn_bwd_v4.cu", vperm.clone().define("BWD_BULK_ST", 1)));
                let plain = v.clone().define("BWD_CVT4", 0).define("BWD_REDUX", 0);
                // (the dS tile by stmatrix, BWD_DS_STSM, the default: K's dim-major tile from
                // the quantiser and from the consumers' transpose; and the dQ partial by
                // stmatrix, BWD_DQ_STSM, the default: with each)
                let stsm = [v.clone(), xposed2.clone()]
                    .map(|v| v.define("BWD_DS_STSM", 1))
                    .into_iter()
                    .chain([v.clone(), xposed2.clone()].map(|v| v.define("BWD_DQ_STSM", 1)));
                for v in [
                    plain,
                    v.clone().define("BWD_CVT4", 0),
                    v.clone().define("BWD_REDUX", 0),
                    v,
                    xposed,
                    xposed2,
                    vperm,
                ]
                .into_iter()
                .chain(stsm)
                {
                    jobs.push(("attn_bwd_v4.cu", v));
                }
            }
            // the CTA pairs (BWD_PAIR, FLAMIA_BWD_PAIR) on the long documents' defaults (the
            // downward walk) with block and row dS exponents, and on the upward walk's with the
            // consumers' K and V transposes
            for (row_ds, walk_up) in [(false, false), (true, false), (false, true)] {
                let (v, _) = with_early_factors(
                    backward_v4_variant(3, hd, row_ds, !row_ds, false, None, walk_up),
                    bwd_early_factors(hd, row_ds),
                );
                let v = if walk_up { with_xposes(v, true, true) } else { v };
                let v = v
                    .define("BWD_QPERM", 1)
                    .define("BWD_DS_STSM", 1)
                    .define("BWD_DQ_STSM", 1);
                // (BWD_KEYS_TMA as the runtime defines it: the kernel source leaves pairs out)
                let v = if bwd_cols_tma(hd, !row_ds) {
                    v.define("BWD_COLS_TMA", 1).define("BWD_KEYS_TMA", 1)
                } else {
                    v
                };
                for mode in [1, 2] {
                    jobs.push(("attn_bwd_v4.cu", v.clone().define("BWD_PAIR", mode)));
                }
                // (mode 2's CTA-scope hand-off, FLAMIA_BWD_PAIR_STRICT=0)
                let relaxed = v.clone().define("BWD_PAIR", 2).define("BWD_PAIR_STRICT", 0);
                jobs.push(("attn_bwd_v4.cu", relaxed.clone()));
                // (the hang trap of the pairs' tests, FLAMIA_BWD_HANG_TRAP, both hand-offs)
                jobs.push(("attn_bwd_v4.cu", relaxed.define("BWD_HANG_TRAP", 1)));
                jobs.push((
                    "attn_bwd_v4.cu",
                    v.define("BWD_PAIR", 2).define("BWD_HANG_TRAP", 1),
                ));
            }
            // two dQ buffers per warpgroup (FLAMIA_BWD_DQ_BUFS=2): three stages at d = 64, two at 128
            let stages = if hd == 64 { 3 } else { 2 };
            let v = backward_v4_variant(stages, hd, false, true, false, None, true);
            let (v, _) = with_dq_bufs(with_early_factors(v, true), hd, 2).unwrap();
            jobs.push(("attn_bwd_v4.cu", v));
            // the forward's per-warpgroup consumer copies (long items, fwd_cw_const), both
            // producers (token-block and per-token scales)
            // (with Q's dim-major copy written, FWD_QD_WRITE, in the backward's permuted order)
            // (and O by bulk tensor stores where they fit: fwd_o_tma)
            for per_token in [false, true] {
                let o_tma = smem_fwd4(4, hd, per_token, true, true) <= SMEM_MAX;
                let (v, _) = forward_v4_variant(per_token, 4, hd, true, Some(true), o_tma, false);
                jobs.push(("attn_fwd_v4.cu", v));
                let (v, _) = forward_v4_variant(per_token, 4, hd, true, None, true, false);
                jobs.push(("attn_fwd_v4.cu", v));
                // the half tiles (FWD_HALF_TILES), with the copies and without
                let (v, _) = forward_v4_variant(per_token, 4, hd, true, None, false, true);
                jobs.push(("attn_fwd_v4.cu", v));
                let (v, _) = forward_v4_variant(per_token, 4, hd, false, None, true, true);
                jobs.push(("attn_fwd_v4.cu", v.clone()));
                // P packed for V's permuted copy (FWD_VPERM, the default), both builds
                jobs.push(("attn_fwd_v4.cu", v.define("FWD_VPERM", 1)));
                let (v, _) = forward_v4_variant(per_token, 4, hd, true, None, false, true);
                // (with the other cuts, FWD_DESC_ADD and FWD_TILE_TRIM)
                let v = v.define("FWD_VPERM", 1).define("FWD_DESC_ADD", 1);
                jobs.push(("attn_fwd_v4.cu", v.clone()));
                let v = v.define("FWD_TILE_TRIM", 1);
                jobs.push(("attn_fwd_v4.cu", v.clone()));
                // V's fold reference as a running maximum (FWD_EV_RUN): with the three cuts, the
                // d = 128 default build; alone, d = 64's (no consumer copies there)
                jobs.push(("attn_fwd_v4.cu", v.define("FWD_EV_RUN", 1)));
                let (v, _) = forward_v4_variant(per_token, 4, hd, false, None, true, true);
                jobs.push(("attn_fwd_v4.cu", v.define("FWD_EV_RUN", 1)));
            }
            for (per_token, stages) in [
                (false, 2),
                (false, 4),
                (true, 2),
                (true, 4),
                (false, 5),
                (true, 5),
            ] {
                // (the default depth, 4, also writing Q's dim-major copy in plain order)
                let qd = (stages == 4).then_some(false);
                let (v, _) = forward_v4_variant(per_token, stages, hd, false, qd, false, false);
                jobs.push(("attn_fwd_v4.cu", v));
            }
            // the token-block softmax's other order (FWD_FACTORS_FIRST, softmax.cuh: each head
            // dim's default is the one measured faster; the other builds for A/B runs)
            let (v, _) = forward_v4_variant(false, 4, hd, false, None, false, false);
            jobs.push((
                "attn_fwd_v4.cu",
                v.define("FWD_FACTORS_FIRST", u32::from(hd == 64)),
            ));
        }
        compile_all(&jobs);
        // the v3.1 kernels refuse another head dim at compile time
        let v = attention_variant(false, 0).define("HEAD_DIM", 64);
        assert!(compile_ptx("attn_fwd.cu", &v, "sm_90a").is_err());
    }

    #[test]
    fn forward_grids_are_one_cta_per_sm_at_most_and_never_empty() {
        assert_eq!(fwd_v4_grid(5000, 132), 132);
        assert_eq!(fwd_v4_grid(40, 132), 40);
        assert_eq!(fwd_v4_grid(0, 132), 1);
    }

    #[test]
    fn fused_backward_grids_never_exceed_what_runs_at_once() {
        // unpaired: one CTA per SM (132 on the H200), a cap lowers it, never above the SMs or to 0
        assert_eq!(fused_bwd_grid(false, None, 132), 132);
        assert_eq!(fused_bwd_grid(false, Some(3), 132), 3);
        assert_eq!(fused_bwd_grid(false, Some(500), 132), 132);
        assert_eq!(fused_bwd_grid(false, Some(0), 132), 1);
        // pairs: two CTAs per cluster that fits (66), the cap in CTAs, rounded down to pairs
        assert_eq!(fused_bwd_grid(true, None, 66), 132);
        assert_eq!(fused_bwd_grid(true, Some(6), 66), 6);
        assert_eq!(fused_bwd_grid(true, Some(7), 66), 6);
        assert_eq!(fused_bwd_grid(true, Some(1), 66), 2);
        assert_eq!(fused_bwd_grid(true, Some(1000), 66), 132);
        // a driver that reports no room still gets one cluster (the launch then says why it fails)
        assert_eq!(fused_bwd_grid(true, None, 0), 2);
    }

    #[test]
    fn cta_pair_builds_multicast_the_stages_and_sync_the_cluster() {
        // BWD_PAIR's PTX has the multicast loads, the cluster barriers and the remote arrivals
        // (mode 2 also the DSMEM reads of the partner's dQ partial), walking down or up; the
        // unpaired build none of them.
        if !nvrtc_or_skip("cta_pair_builds_multicast_the_stages_and_sync_the_cluster") {
            return;
        }
        let (v, _) = backward_v4_variant(3, 128, false, true, false, None, false);
        let ptx = |v: &Variant| compile_ptx("attn_bwd_v4.cu", v, "sm_90a").unwrap().to_src();
        let paired = [
            "multicast::cluster",
            "barrier.cluster.arrive",
            "mapa.shared::cluster",
        ];
        let plain = ptx(&v);
        for p in paired.iter().chain(&["ld.shared::cluster"]) {
            assert!(!plain.contains(p), "the unpaired build has {p}");
        }
        for (mode, up) in [(1, 0), (2, 0), (1, 1)] {
            let text = ptx(&v.clone().define("BWD_PAIR", mode).define("BWD_WALK_UP", up));
            for p in paired {
                assert!(text.contains(p), "BWD_PAIR {mode} (walk up {up}) lacks {p}");
            }
            assert_eq!(
                text.contains("ld.shared::cluster.v4.f32"),
                mode == 2,
                "BWD_PAIR {mode}"
            );
        }
        // mode 2's hand-off of the partner's partial: by default a release and an acquire at
        // cluster scope beyond mode 1's (the claims'); BWD_PAIR_STRICT 0 a CTA-scope fence and
        // none more
        let n = |t: &str, p: &str| t.matches(p).count();
        let (release, acquire) = (
            "mbarrier.arrive.release.cluster",
            "try_wait.parity.acquire.cluster",
        );
        let one = ptx(&v.clone().define("BWD_PAIR", 1));
        let strict = ptx(&v.clone().define("BWD_PAIR", 2));
        let relaxed = ptx(&v.clone().define("BWD_PAIR", 2).define("BWD_PAIR_STRICT", 0));
        assert!(n(&strict, release) > n(&one, release) && n(&strict, acquire) > n(&one, acquire));
        assert_eq!(
            (n(&relaxed, release), n(&relaxed, acquire)),
            (n(&one, release), n(&one, acquire))
        );
        assert!(relaxed.contains("fence.acq_rel.cta") && !strict.contains("fence.acq_rel.cta"));
    }

    #[test]
    fn two_dq_buffers_fit_at_head_dim_64_and_need_two_stages_at_128() {
        let bwd = |stages, hd| backward_v4_variant(stages, hd, false, true, false, None, true);
        let (v, smem) = with_dq_bufs(bwd(3, 64), 64, 2).unwrap();
        assert_eq!(smem, bwd(3, 64).1 + 16 * 1024);
        assert!(v.key().contains("BWD_DQ_BUFS=2"), "{}", v.key());
        assert!(with_dq_bufs(bwd(2, 128), 128, 2).is_ok());
        let e = with_dq_bufs(bwd(3, 128), 128, 2).unwrap_err().to_string();
        assert!(e.contains("FLAMIA_BWD_STAGES=2"), "{e}");
        // one buffer: the variant as it was
        assert_eq!(with_dq_bufs(bwd(3, 128), 128, 1).unwrap().1, bwd(3, 128).1);
    }

    #[test]
    fn k_and_v_transposed_by_the_consumers_only_for_short_and_mid_documents() {
        // the plans' mean key tiles per query tile: 256x256, 64x1024, 16x4096, 4x16384, 1x65536
        assert!(short_items(1.5));
        assert!(short_items(4.5));
        assert!(short_items(16.5));
        assert!(!short_items(KD_XPOSE_MAX_TILES));
        assert!(!short_items(64.5));
        assert!(!short_items(256.5));
        // the environment's overrides: 0 off, the listed values on, anything else per plan
        assert_eq!(parse_choice(Some("0"), &["1"]), Some(false));
        assert_eq!(parse_choice(Some(" 1 "), &["1"]), Some(true));
        assert_eq!(parse_choice(Some("2"), &["1"]), None);
        assert_eq!(parse_choice(Some("2"), &["1", "2"]), Some(true));
        assert_eq!(parse_choice(Some("yes"), &["1", "2"]), None);
        assert_eq!(parse_choice(None, &["1"]), None);
        // FLAMIA_BWD_PAIR (read by the GPU backward alone, never by another CPU test)
        let pair_mode = |v: Option<&str>| {
            match v {
                Some(v) => std::env::set_var("FLAMIA_BWD_PAIR", v),
                None => std::env::remove_var("FLAMIA_BWD_PAIR"),
            }
            let mode = bwd_pair_env(7);
            std::env::remove_var("FLAMIA_BWD_PAIR");
            mode
        };
        for (v, mode) in [(Some("0"), 0), (Some(" 1"), 1), (Some("2"), 2)] {
            assert_eq!(pair_mode(v), mode);
        }
        for v in [None, Some("3"), Some("yes")] {
            assert_eq!(pair_mode(v), 7);
        }
        // FLAMIA_DQ_CONVERT_CTAS: a positive count, else none (the full grid)
        for (v, n) in [
            (Some("16"), Some(16)),
            (Some("0"), None),
            (Some("x"), None),
            (None, None),
        ] {
            match v {
                Some(v) => std::env::set_var("FLAMIA_DQ_CONVERT_CTAS", v),
                None => std::env::remove_var("FLAMIA_DQ_CONVERT_CTAS"),
            }
            assert_eq!(dq_convert_ctas(), n, "FLAMIA_DQ_CONVERT_CTAS={v:?}");
            std::env::remove_var("FLAMIA_DQ_CONVERT_CTAS");
        }
        // FLAMIA_DQ_CONVERT_ROWS (read by the GPU backward alone): 1, 2, 4 or 8, else 2
        let rows = |v: Option<&str>| {
            match v {
                Some(v) => std::env::set_var("FLAMIA_DQ_CONVERT_ROWS", v),
                None => std::env::remove_var("FLAMIA_DQ_CONVERT_ROWS"),
            }
            let n = dq_convert_rows();
            std::env::remove_var("FLAMIA_DQ_CONVERT_ROWS");
            n
        };
        for (v, n) in [
            (Some("1"), 1),
            (Some("4"), 4),
            (Some("8"), 8),
            (None, 2),
            (Some("3"), 2),
            (Some("16"), 2),
        ] {
            assert_eq!(rows(v), n, "FLAMIA_DQ_CONVERT_ROWS={v:?}");
        }
        // the default: pairs (mode 1) only at d = 64 where every tile walks down, causal
        assert_eq!(bwd_pair_default(true, false, 64), 1);
        assert_eq!(bwd_pair_default(true, true, 64), 0);
        assert_eq!(bwd_pair_default(false, false, 64), 0);
        assert_eq!(bwd_pair_default(true, false, 128), 0);
    }

    #[test]
    fn q_copy_by_the_forward_by_default_only_at_head_dim_64_for_short_and_mid_documents() {
        let auto = QdFwd::parse(None);
        assert_eq!(auto, QdFwd::Auto);
        assert_eq!(QdFwd::parse(Some("auto")), QdFwd::Auto);
        assert_eq!(QdFwd::parse(Some(" 0 ")), QdFwd::Off);
        assert_eq!(QdFwd::parse(Some("1")), QdFwd::On);
        assert!(auto.writes(64, 1.5));
        assert!(auto.writes(64, 16.5));
        assert!(!auto.writes(64, KD_XPOSE_MAX_TILES));
        assert!(!auto.writes(64, 256.5));
        assert!(!auto.writes(128, 1.5));
        assert!(!QdFwd::Off.writes(64, 1.5));
        assert!(QdFwd::On.writes(128, 256.5));
    }

    #[test]
    fn forward_consumer_copies_only_for_long_items_at_head_dim_128() {
        // (FLAMIA_FWD_CW unset here: no other test of this binary sets it)
        assert!(fwd_cw_const(128, 256.5));
        assert!(fwd_cw_const(128, FWD_CW_MIN_TILES));
        assert!(!fwd_cw_const(128, 8.0));
        assert!(!fwd_cw_const(128, 1.5));
        assert!(!fwd_cw_const(64, 256.5));
    }

    #[test]
    fn bulk_stores_by_default_only_at_head_dim_128_where_tiles_walk_up() {
        // (FLAMIA_BWD_BULK_ST unset here: no other test of this binary sets it) session 46: with
        // every tile walking down the build spills in every step (scripts/test.sh's guard)
        assert!(bwd_bulk_st(128, true));
        assert!(!bwd_bulk_st(128, false));
        assert!(!bwd_bulk_st(64, true));
        assert!(!bwd_bulk_st(64, false));
    }

    #[test]
    fn promote_mask_defaults_to_off_and_rejects_junk() {
        assert_eq!(parse_promote(None), 0);
        assert_eq!(parse_promote(Some("3")), 3);
        assert_eq!(parse_promote(Some(" 1 ")), 1);
        assert_eq!(parse_promote(Some("2")), 2);
        assert_eq!(parse_promote(Some("4")), 0);
        assert_eq!(parse_promote(Some("dp")), 0);
    }
}
