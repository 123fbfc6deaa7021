//! GPU quantisers against the CPU reference, byte for byte, on seeded random inputs with awkward
//! document lengths (1, 31, 32, 33, 127, 129, 4095): the single-input launch (dO, with D), the
//! fused Q/K/V launch (different head counts, Hadamard on two inputs of three) and NVFP4. The E4M3
//! tests run at head dims 128 and 64 ([`HEAD_DIMS`], one module each); NVFP4 is 128 only and
//! refuses 64. Seed: `gpu_common::rng` (fixed; `FLAMIA_TEST_SEED` replays another; the 128 cases
//! draw first, so their inputs are those of the 128-only file). Run on the device: `--ignored`.

mod gpu_common;

use flamia_kernels::formats::{e4m3_decode, pow2_f32};
use flamia_kernels::gpu::plan::PlanTables;
use flamia_kernels::gpu::quant::OperandRef;
use flamia_kernels::gpu::quant::{
    quantize_e4m3, quantize_e4m3_fused, quantize_nvfp4, AmaxScratch, DeltaOut, DimOrder, QuantInput,
    NVFP4_HEAD_DIM,
};
use flamia_kernels::gpu::{Attention, DeviceBuf, Gpu, GpuError, Nvfp4Operand, Operand, Plan, Saved};
use flamia_kernels::hadamard::rotate_rows;
use flamia_kernels::quant::{self, ScaleMode};
use flamia_kernels::{AttnOptions, AttnPath, VarlenShape};
use gpu_common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

const LENS: [usize; 7] = [1, 31, 32, 33, 127, 129, 4095];
/// Head dims of the E4M3 tests, in this order (128 first: its inputs stay those drawn before 64
/// was added).
const HEAD_DIMS: [usize; 2] = [128, 64];

/// [`awkward_tensor_d`] with every element also scaled by its own power of two in `2^-12 .. 2^12`:
/// the Hadamard butterfly's partial sums then round in every stage, so a kernel that ran the
/// stages in another order (or fused an add into an FMA) gives other codes. (With one scale per
/// row the sums of a few BF16 values are exact and the order would not show.) One token in
/// eight is also scaled by 2^-120, so blocks with exponents <= -116 (where the kernel keeps the
/// Hadamard normalisation as a separate multiply) and f32 subnormals occur.
fn wide_tensor(rng: &mut ChaCha8Rng, tokens: usize, heads: usize, d: usize) -> Vec<f32> {
    let mut x = awkward_tensor_d(rng, tokens, heads, d, 6);
    let row = heads * d;
    for (i, v) in x.iter_mut().enumerate() {
        *v *= 2f32.powi(rng.random_range(-12..=12));
        if (i / row) % 8 == 5 {
            *v *= 2f32.powi(-120);
        }
    }
    round_bf16(&mut x);
    x
}

/// `x` (rows of `d`) as the quantiser sees it: Hadamard-rotated rows when `hadamard`.
fn rotated(x: &[f32], d: usize, hadamard: bool) -> Vec<f32> {
    if hadamard {
        rotate_rows(x, d).unwrap()
    } else {
        x.to_vec()
    }
}

/// Operand buffers filled with bytes no quantiser writes (NaN codes, exponent 99), so any byte
/// the kernel leaves unwritten shows in [`check_operand`].
fn poisoned_operand(gpu: &flamia_kernels::gpu::Gpu, plan: &Plan, heads: usize) -> Operand {
    let mut op = Operand::alloc(gpu, plan, heads).unwrap();
    op.tok.upload(&vec![0x7Fu8; op.tok.len()]).unwrap();
    op.dim.upload(&vec![0x7Fu8; op.dim.len()]).unwrap();
    op.exps.upload(&vec![99i8; op.exps.len()]).unwrap();
    op
}

/// Checks the token-major codes, exponents and the dim-major copy (with its zero padding), at
/// the shape's head dim.
fn check_operand(tag: &str, shape: &VarlenShape, heads: usize, gpu_op: &Operand, cpu: &quant::E4m3Tensor) {
    let tok = gpu_op.tok.to_host().unwrap();
    let exps = gpu_op.exps.to_host().unwrap();
    let dim = gpu_op.dim.to_host().unwrap();
    check_operand_bytes(tag, shape, heads, [&tok, &dim], &exps, cpu);
}

/// [`check_operand`] of an operand quantised without its dim-major copy (`dim` 0 in its
/// [`OperandRef`]): codes and exponents as the reference, the dim-major buffer untouched (still
/// all `poison`).
fn check_operand_no_dim(tag: &str, heads: usize, gpu_op: &Operand, cpu: &quant::E4m3Tensor, poison: u8) {
    let tok = gpu_op.tok.to_host().unwrap();
    let exps = gpu_op.exps.to_host().unwrap();
    check_tok_exps(tag, &tok, &exps, cpu);
    assert_untouched(&format!("{tag} ({heads} heads), dim-major"), &gpu_op.dim, poison);
}

/// Every byte of `buf` still `poison` (a copy the quantiser was told not to write).
fn assert_untouched(tag: &str, buf: &DeviceBuf<u8>, poison: u8) {
    let written = buf.to_host().unwrap().iter().filter(|&&b| b != poison).count();
    assert_eq!(written, 0, "{tag}: {written} bytes of the buffer written");
}

/// [`check_operand`] on host copies of the token-major codes, dim-major codes and exponents.
fn check_operand_bytes(
    tag: &str,
    shape: &VarlenShape,
    heads: usize,
    [tok, dim]: [&[u8]; 2],
    exps: &[i8],
    cpu: &quant::E4m3Tensor,
) {
    check_tok_exps(tag, tok, exps, cpu);
    check_dim_bytes(tag, shape, heads, dim, cpu, true);
}

/// [`check_operand`] of an operand quantised without its token-major copy (`tok` 0 in its
/// [`OperandRef`]): the dim-major codes and the exponents as the reference, the token-major
/// buffer untouched (still all `poison`).
fn check_operand_no_tok(
    tag: &str,
    shape: &VarlenShape,
    heads: usize,
    gpu_op: &Operand,
    cpu: &quant::E4m3Tensor,
    poison: u8,
) {
    let exps = gpu_op.exps.to_host().unwrap();
    check_exps(tag, &exps, cpu);
    check_dim_bytes(tag, shape, heads, &gpu_op.dim.to_host().unwrap(), cpu, true);
    assert_untouched(
        &format!("{tag} ({heads} heads), token-major"),
        &gpu_op.tok,
        poison,
    );
}

/// The exponents bit for bit the CPU reference's.
fn check_exps(tag: &str, exps: &[i8], cpu: &quant::E4m3Tensor) {
    assert_eq!(exps.len(), cpu.exps.len(), "{tag}: sizes");
    let bad = exps.iter().zip(&cpu.exps).filter(|(a, b)| a != b).count();
    if let Some(i) = exps.iter().zip(&cpu.exps).position(|(a, b)| a != b) {
        eprintln!(
            "{tag}: first exponent mismatch at {i}: gpu {} cpu {}",
            exps[i], cpu.exps[i]
        );
    }
    assert_eq!(bad, 0, "{tag}: {bad} exponents differ from the CPU reference");
}

/// The token-major codes and exponents bit for bit the CPU reference's.
fn check_tok_exps(tag: &str, tok: &[u8], exps: &[i8], cpu: &quant::E4m3Tensor) {
    assert_eq!(tok.len(), cpu.codes.len(), "{tag}: sizes");
    let bad_tok = tok.iter().zip(&cpu.codes).filter(|(a, b)| a != b).count();
    if let Some(i) = tok.iter().zip(&cpu.codes).position(|(a, b)| a != b) {
        eprintln!(
            "{tag}: first code mismatch at {i}: gpu {:#04x} cpu {:#04x}",
            tok[i], cpu.codes[i]
        );
    }
    assert_eq!(
        bad_tok, 0,
        "{tag}: {bad_tok} token-major codes differ from the CPU reference"
    );
    check_exps(tag, exps, cpu);
}

/// The dim-major codes (documents padded to 64 positions, zeros) from the CPU reference's, and
/// (`tail`) the zeros past the last document's padded span (which the quantiser writes; the
/// forward's copy of Q leaves them: no 64-position box of the backward reaches them).
fn check_dim_bytes(
    tag: &str,
    shape: &VarlenShape,
    heads: usize,
    dim: &[u8],
    cpu: &quant::E4m3Tensor,
    tail: bool,
) {
    let d = shape.head_dim;
    let tables = PlanTables::new(shape, true);
    let tpad = tables.tpad;
    let mut pad = 0;
    let mut bad_dim = 0;
    for w in shape.cu_seqlens.windows(2) {
        let (s, len) = (w[0], w[1] - w[0]);
        for h in 0..heads {
            for c in 0..d {
                for tt in 0..len.div_ceil(64) * 64 {
                    let got = dim[(h * d + c) * tpad + pad + tt];
                    let want = if tt < len {
                        cpu.codes[((s + tt) * heads + h) * d + c]
                    } else {
                        0
                    };
                    bad_dim += (got != want) as usize;
                }
            }
        }
        pad += len.div_ceil(64) * 64;
    }
    // the layout's end past the last document (Tpad is a multiple of 128, the quantiser's
    // chunks): zeros too (a 128-key TMA box of the last document reads them)
    for row in (0..heads * d).filter(|_| tail) {
        bad_dim += dim[row * tpad + pad..(row + 1) * tpad]
            .iter()
            .filter(|&&b| b != 0)
            .count();
    }
    assert_eq!(
        bad_dim, 0,
        "{tag}: {bad_dim} dim-major codes (or padding bytes) wrong"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn e4m3_quantiser_is_bitwise_the_cpu_reference() {
    e4m3_reference_cases();
}

/// [`e4m3_quantiser_is_bitwise_the_cpu_reference`]: both head dims, every mode, with and
/// without the rotation.
fn e4m3_reference_cases() {
    let gpu = gpu();
    let mut rng = rng("e4m3_quantiser");
    let heads = 3;
    let amax = AmaxScratch::new(&gpu).unwrap();
    for d in HEAD_DIMS {
        let shape = VarlenShape::from_lens(&LENS, heads, heads, d).unwrap();
        let plan = Plan::new(&gpu, &shape, true).unwrap();
        for mode in [ScaleMode::TokenBlock, ScaleMode::PerToken, ScaleMode::TensorFloor] {
            for hadamard in [false, true] {
                let x = awkward_tensor_d(&mut rng, shape.tokens(), heads, d, 12);
                let dx = upload_bf16(&gpu, &x);
                let op = Operand::alloc(&gpu, &plan, heads).unwrap();
                quantize_e4m3(
                    &gpu,
                    stream(),
                    &plan,
                    dx.ptr(),
                    hadamard,
                    mode,
                    &op,
                    None,
                    Some(&amax),
                )
                .unwrap();
                let xr = rotated(&x, d, hadamard);
                let cpu = quant::quantize_e4m3("x", &xr, &shape.cu_seqlens, heads, d, mode).unwrap();
                let tag = format!("d={d} {mode:?} hadamard={hadamard}");
                check_operand(&tag, &shape, heads, &op, &cpu);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn quantiser_overwrites_poisoned_buffers_and_repeats_bitwise() {
    poisoned_cases();
}

/// [`quantiser_overwrites_poisoned_buffers_and_repeats_bitwise`] at both head dims.
fn poisoned_cases() {
    let gpu = gpu();
    let mut rng = rng("quantiser_poison");
    let heads = 2;
    for d in HEAD_DIMS {
        let shape = VarlenShape::from_lens(&[33, 1, 129], heads, heads, d).unwrap();
        let plan = Plan::new(&gpu, &shape, true).unwrap();
        let x = awkward_tensor_d(&mut rng, shape.tokens(), heads, d, 6);
        let dx = upload_bf16(&gpu, &x);
        let op = poisoned_operand(&gpu, &plan, heads);
        let run = || {
            quantize_e4m3(
                &gpu,
                stream(),
                &plan,
                dx.ptr(),
                true,
                ScaleMode::TokenBlock,
                &op,
                None,
                None,
            )
            .unwrap();
            (
                op.tok.to_host().unwrap(),
                op.dim.to_host().unwrap(),
                op.exps.to_host().unwrap(),
            )
        };
        let first = run();
        assert!(
            first.0.iter().all(|&c| c & 0x7F != 0x7F),
            "d={d}: a NaN code survived in the token-major codes"
        );
        assert!(
            first.2.iter().all(|&e| e != 99),
            "d={d}: an exponent was not written"
        );
        // the dim-major padding and every code are rewritten, as the CPU check shows
        let cpu = quant::quantize_e4m3(
            "x",
            &rotated(&x, d, true),
            &shape.cu_seqlens,
            heads,
            d,
            ScaleMode::TokenBlock,
        )
        .unwrap();
        check_operand(&format!("d={d} poisoned"), &shape, heads, &op, &cpu);
        assert_eq!(first, run(), "d={d}: repeated quantisation differs");
    }
}

/// The token of a 32-token block at position `k` of a dim-major copy in `order` (`dim_token` and
/// `ileave_token_r` in `cuda/quant.cu`; the v4 backward's Q and dO with `BWD_QPERM`, its K with
/// `BWD_DS_STSM`).
fn block_token(order: DimOrder, k: usize) -> usize {
    match order {
        DimOrder::Plain => k,
        DimOrder::QueryPerm => 16 * (k >> 4) + 8 * ((k & 3) >> 1) + 2 * ((k >> 2) & 3) + (k & 1),
        DimOrder::KeyIleave => 16 * (k >> 4) + ((k & 15) >> 1) + 8 * (k & 1),
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn permuted_dim_copy_is_the_plain_one_reordered_in_every_block() {
    // QuantInput::dim_order: the same token-major codes and exponents, and at every position k
    // of every 32-token block of the dim-major copy (padding included) the plain copy's token
    // block_token(order, k) of that block; both orders, both head dims.
    let gpu = gpu();
    let mut rng = rng("dim_perm");
    let heads = 2;
    for order in [DimOrder::QueryPerm, DimOrder::KeyIleave] {
        let perm: Vec<usize> = (0..32).map(|k| block_token(order, k)).collect();
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..32).collect::<Vec<_>>(), "{order:?} is a permutation");
        for d in HEAD_DIMS {
            let shape = VarlenShape::from_lens(&LENS, heads, heads, d).unwrap();
            let plan = Plan::new(&gpu, &shape, true).unwrap();
            let x = awkward_tensor_d(&mut rng, shape.tokens(), heads, d, 12);
            let dx = upload_bf16(&gpu, &x);
            let run = |order: DimOrder| {
                let op = poisoned_operand(&gpu, &plan, heads);
                let input = QuantInput::new(dx.ptr(), false, op.view()).with_dim_order(order);
                quantize_e4m3_fused(&gpu, stream(), &plan, &[input], ScaleMode::TokenBlock, None, None)
                    .unwrap();
                (
                    op.tok.to_host().unwrap(),
                    op.dim.to_host().unwrap(),
                    op.exps.to_host().unwrap(),
                )
            };
            let (plain, permuted) = (run(DimOrder::Plain), run(order));
            let tag = format!("{order:?}, d={d}");
            assert_eq!(plain.0, permuted.0, "{tag}: token-major codes");
            assert_eq!(plain.2, permuted.2, "{tag}: exponents");
            let tpad = plan.tpad();
            let mut bad = 0;
            for row in 0..heads * d {
                for x in 0..tpad {
                    let want = plain.1[row * tpad + x / 32 * 32 + perm[x % 32]];
                    bad += (permuted.1[row * tpad + x] != want) as usize;
                }
            }
            assert_eq!(
                bad, 0,
                "{tag}: {bad} bytes of the permuted dim-major copy misplaced"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn claimed_chunk_items_give_bitwise_the_grid_stride_shares() {
    // QUANT_DYN (the default at d = 128; FLAMIA_QUANT_DYN=1 / =0 force it on / off): the
    // quantiser's CTAs take their chunk items after the first from the plan's counter. On 1, 3
    // and 17 CTAs (FLAMIA_QUANT_CTAS: nearly every item then comes from a claim), twice on one
    // plan (the counter resets itself), in every scale mode, both head dims, one input and the
    // fused Q/K/V launch of GQA heads (slots crossing inputs): every byte as the grid-stride
    // shares' (FLAMIA_QUANT_DYN=0) on poisoned buffers. (The cursor taking the first claim before the
    // loop needs a CTA whose first chunk is the row's last, one-block chunk and whose first claim
    // is still an item: only on a grid of nearly one CTA per item, by the order of the claims'
    // atomics, so no test can make it happen on purpose; the kernel publishes that case's next
    // claim behind its own barrier.)
    let gpu = gpu();
    let mut rng = rng("quant_dyn");
    let amax = AmaxScratch::new(&gpu).unwrap();
    for d in HEAD_DIMS {
        let (hq, hkv) = (4, 2);
        let shape = VarlenShape::from_lens(&LENS, hq, hkv, d).unwrap();
        let plan = Plan::new(&gpu, &shape, true).unwrap();
        let t = shape.tokens();
        let xs = [
            upload_bf16(&gpu, &awkward_tensor_d(&mut rng, t, hq, d, 6)),
            upload_bf16(&gpu, &awkward_tensor_d(&mut rng, t, hkv, d, 6)),
            upload_bf16(&gpu, &awkward_tensor_d(&mut rng, t, hkv, d, 6)),
        ];
        for mode in [ScaleMode::TokenBlock, ScaleMode::PerToken, ScaleMode::TensorFloor] {
            let run = |n_inputs: usize| {
                let ops: Vec<Operand> = [hq, hkv, hkv][..n_inputs]
                    .iter()
                    .map(|&h| poisoned_operand(&gpu, &plan, h))
                    .collect();
                let inputs: Vec<QuantInput> = ops
                    .iter()
                    .zip(&xs)
                    .map(|(op, x)| QuantInput::new(x.ptr(), true, op.view()))
                    .collect();
                quantize_e4m3_fused(&gpu, stream(), &plan, &inputs, mode, None, Some(&amax)).unwrap();
                ops.iter()
                    .map(|op| {
                        (
                            op.tok.to_host().unwrap(),
                            op.dim.to_host().unwrap(),
                            op.exps.to_host().unwrap(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            for n_inputs in [1, 3] {
                let base = {
                    let _grid_stride = EnvGuard::set("FLAMIA_QUANT_DYN", "0");
                    run(n_inputs)
                };
                let _dyn = EnvGuard::set("FLAMIA_QUANT_DYN", "1");
                for ctas in ["1", "3", "17"] {
                    let _ctas = EnvGuard::set("FLAMIA_QUANT_CTAS", ctas);
                    for call in 1..=2 {
                        assert!(
                            run(n_inputs) == base,
                            "d = {d}, {mode:?}, {n_inputs} input(s), {ctas} CTAs, call {call}: \
                             claimed items differ from the grid-stride shares"
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn fused_qkv_launch_is_bitwise_the_cpu_reference_for_every_input() {
    let gpu = gpu();
    let mut rng = rng("fused_qkv");
    let amax = AmaxScratch::new(&gpu).unwrap();
    for d in HEAD_DIMS {
        fused_qkv_case(&gpu, &mut rng, &amax, d);
    }
}

/// [`fused_qkv_launch_is_bitwise_the_cpu_reference_for_every_input`] at head dim `d`.
fn fused_qkv_case(gpu: &Gpu, rng: &mut ChaCha8Rng, amax: &AmaxScratch, d: usize) {
    // GQA head counts, so the kernel's head slots cross from Q to K to V inside a block
    let (hq, hkv) = (4, 2);
    let shape = VarlenShape::from_lens(&LENS, hq, hkv, d).unwrap();
    let t = shape.tokens();
    let plan = Plan::new(gpu, &shape, true).unwrap();
    // (k_dim false: K quantised without its dim-major copy and V without its token-major one, as
    // for the v4 backward's BWD_KD_XPOSE and BWD_VT_XPOSE; those buffers must stay poisoned and
    // every other byte stay the same)
    for (mode, k_dim) in [
        (ScaleMode::TokenBlock, true),
        (ScaleMode::PerToken, true),
        (ScaleMode::TensorFloor, true),
        (ScaleMode::TokenBlock, false),
        (ScaleMode::PerToken, false),
        (ScaleMode::TensorFloor, false),
    ] {
        for wide in [false, true] {
            let gen = |rng: &mut ChaCha8Rng, heads| {
                if wide {
                    wide_tensor(rng, t, heads, d)
                } else {
                    awkward_tensor_d(rng, t, heads, d, 12)
                }
            };
            // (input, heads, Hadamard): Q and K rotated, V not
            let inputs = [
                (gen(rng, hq), hq, true),
                (gen(rng, hkv), hkv, true),
                (gen(rng, hkv), hkv, false),
            ];
            let dev: Vec<_> = inputs.iter().map(|(x, _, _)| upload_bf16(gpu, x)).collect();
            let ops: Vec<_> = inputs
                .iter()
                .map(|(_, h, _)| poisoned_operand(gpu, &plan, *h))
                .collect();
            let launch: Vec<QuantInput> = inputs
                .iter()
                .zip(&dev)
                .zip(&ops)
                .enumerate()
                .map(|(i, (((_, _, had), x), op))| {
                    let mut out = op.view();
                    if i == 1 && !k_dim {
                        out.dim = 0;
                    }
                    if i == 2 && !k_dim {
                        out.tok = 0;
                    }
                    QuantInput::new(x.ptr(), *had, out)
                })
                .collect();
            quantize_e4m3_fused(gpu, stream(), &plan, &launch, mode, None, Some(amax)).unwrap();
            for (i, ((x, heads, had), op)) in inputs.iter().zip(&ops).enumerate() {
                let xr = rotated(x, d, *had);
                let cpu = quant::quantize_e4m3("x", &xr, &shape.cu_seqlens, *heads, d, mode).unwrap();
                let tag = format!(
                    "d={d} {mode:?} wide={wide} k_dim={k_dim} input {i} ({heads} heads, hadamard={had})"
                );
                if i == 1 && !k_dim {
                    check_operand_no_dim(&tag, *heads, op, &cpu, 0x7F);
                } else if i == 2 && !k_dim {
                    check_operand_no_tok(&tag, &shape, *heads, op, &cpu, 0x7F);
                } else {
                    check_operand(&tag, &shape, *heads, op, &cpu);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn quantize_inputs_fills_a_caller_owned_buffer_part_by_part() {
    // What the trainer's bridge does: one uninitialised device buffer per forward call
    // (poisoned here), sized by `saved_bytes`, handed in as a raw pointer.
    // First with K's dim-major and V's token-major copies written by the quantiser
    // (FLAMIA_BWD_KD_XPOSE=0, FLAMIA_BWD_VT_XPOSE=0), then left out (the default for these short
    // documents: the backward's consumers transpose K and V) and Q's
    // written by the forward (FLAMIA_FWD_QD=1; unset, the default: at d = 64 alone for these
    // short documents): the quantiser must leave Q's untouched and the forward write it byte for byte
    // the reference's (both knobs are read when the Attention is made). Each of those with V's
    // dim-major copy in the plain order and in the v4 forward's permuted one (FLAMIA_FWD_VPERM=1).
    let gpu = gpu();
    let mut rng = rng("caller_buffer");
    for ((kd, qd), vperm) in [("0", "0"), ("", "1"), ("", "")]
        .into_iter()
        .flat_map(|c| [(c, "0"), (c, "1")])
    {
        let _p = EnvGuard::set("FLAMIA_FWD_VPERM", vperm);
        let _k = (!kd.is_empty()).then(|| EnvGuard::set("FLAMIA_BWD_KD_XPOSE", kd));
        let _v = (!kd.is_empty()).then(|| EnvGuard::set("FLAMIA_BWD_VT_XPOSE", kd));
        let _q = (!qd.is_empty()).then(|| EnvGuard::set("FLAMIA_FWD_QD", qd));
        let attn = Attention::new(gpu.clone(), AttnOptions::new(AttnPath::Mxfp8)).unwrap();
        for d in HEAD_DIMS {
            let qd_written = qd == "1" || (qd.is_empty() && d == 64);
            caller_buffer_case(&gpu, &mut rng, &attn, d, kd.is_empty(), qd_written);
        }
    }
}

/// [`quantize_inputs_fills_a_caller_owned_buffer_part_by_part`] at head dim `d`.
/// `kd_xposed`: whether the backward transposes K for this plan (no dim-major K carved) and,
/// the same per-plan choice, V (no token-major V carved: `Attention::bwd_vt_xpose`);
/// `qd_written`: whether the forward writes Q's dim-major copy for it.
fn caller_buffer_case(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    attn: &Attention,
    d: usize,
    kd_xposed: bool,
    qd_written: bool,
) {
    let (hq, hkv) = (4, 2);
    let shape = VarlenShape::from_lens(&LENS, hq, hkv, d).unwrap();
    let t = shape.tokens();
    let plan = Plan::new(gpu, &shape, true).unwrap();
    assert_eq!(attn.bwd_kd_xpose(&plan), kd_xposed, "d={d}: K transposed as set");
    assert_eq!(attn.bwd_vt_xpose(&plan), kd_xposed, "d={d}: V transposed as set");
    assert_eq!(
        attn.fwd_writes_qd(&plan),
        qd_written,
        "d={d}: Q's copy by the forward as set"
    );
    let had = attn.options().precision.hadamard;
    let bytes = attn.saved_bytes(&plan);
    let buf = DeviceBuf::<u8>::from_host(gpu, &vec![0x7Fu8; bytes]).unwrap();
    let base = buf.ptr();
    let err = |r: Result<Saved, GpuError>| r.map(|_| ()).unwrap_err().to_string();
    assert!(
        err(attn.saved_in(&plan, base, bytes - 1)).contains("need"),
        "d={d}: a short buffer is refused"
    );
    assert!(
        err(attn.saved_in(&plan, base + 16, bytes)).contains("multiple"),
        "d={d}: a misaligned one too"
    );
    let saved = attn.saved_in(&plan, base, bytes).unwrap();
    let x = [
        wide_tensor(rng, t, hq, d),
        wide_tensor(rng, t, hkv, d),
        wide_tensor(rng, t, hkv, d),
    ];
    let dev: Vec<_> = x.iter().map(|x| upload_bf16(gpu, x)).collect();
    attn.quantize_inputs(stream(), &plan, dev[0].ptr(), dev[1].ptr(), dev[2].ptr(), &saved)
        .unwrap();
    // Q's dim-major copy: the forward's when it writes it (FWD_QD_WRITE, the default): untouched by
    // the quantiser, then written by the forward (checked below with the rest)
    let [_, n_qdim, _] = OperandRef::sizes(&plan, hq);
    let q_dim = |host: &[u8]| host[(saved.q.dim - base) as usize..][..n_qdim].to_vec();
    if qd_written {
        let written = q_dim(&buf.to_host().unwrap())
            .iter()
            .filter(|&&b| b != 0x7F)
            .count();
        assert_eq!(
            written, 0,
            "d={d}: the quantiser wrote {written} bytes of Q's dim-major copy"
        );
    }
    let o = DeviceBuf::<u16>::zeros(gpu, t * hq * d).unwrap();
    let lse = DeviceBuf::<f32>::zeros(gpu, t * hq).unwrap();
    attn.forward_quantized(stream(), &plan, &saved, o.ptr(), lse.ptr())
        .unwrap();
    let host = buf.to_host().unwrap();
    for (name, x, op, rotate) in [
        ("q", &x[0], saved.q, had),
        ("k", &x[1], saved.k, had),
        ("v", &x[2], saved.v, false),
    ] {
        let [n_tok, n_dim, n_exps] = OperandRef::sizes(&plan, op.heads);
        let part = |ptr: u64, n: usize| &host[(ptr - base) as usize..(ptr - base) as usize + n];
        let exps: Vec<i8> = part(op.exps, n_exps).iter().map(|&b| b as i8).collect();
        let xr = rotated(x, d, rotate);
        let cpu = quant::quantize_e4m3(name, &xr, &shape.cu_seqlens, op.heads, d, attn.scale_mode()).unwrap();
        // Q's dim-major copy is in the v4 backward's permuted order (BWD_QPERM, the default) and
        // K's in its interleaved one (BWD_DS_STSM, the default): put them back in token order
        // first (permuted_dim_copy_is_the_plain_one_... checks the permutations themselves)
        // K has no dim-major copy when the v4 backward transposes it (BWD_KD_XPOSE, the default)
        assert_eq!(
            op.dim == 0,
            name == "k" && kd_xposed,
            "d={d} {name}: dim-major copy carved iff its reader needs it"
        );
        // V has no token-major copy when the v4 backward transposes it (BWD_VT_XPOSE, the default)
        assert_eq!(
            op.tok == 0,
            name == "v" && kd_xposed,
            "d={d} {name}: token-major copy carved iff its reader needs it"
        );
        let tag = format!("d={d} {name} in the caller's buffer");
        // (V's dim-major copy is in the v4 forward's permuted order with FWD_VPERM)
        let order = match name {
            "q" => attn.q_dim_order(),
            "k" => attn.k_dim_order(),
            _ => attn.v_dim_order(d),
        };
        let plain_dim = || {
            let permuted = part(op.dim, n_dim);
            let mut dim = permuted.to_vec();
            for (x, &b) in permuted.iter().enumerate() {
                dim[x / 32 * 32 + block_token(order, x % 32)] = b;
            }
            dim
        };
        if op.tok == 0 {
            check_exps(&tag, &exps, &cpu);
            check_dim_bytes(&tag, &shape, op.heads, &plain_dim(), &cpu, true);
            continue;
        }
        let tok = part(op.tok, n_tok);
        if op.dim == 0 {
            check_tok_exps(&tag, tok, &exps, &cpu);
            continue;
        }
        let dim = plain_dim();
        if name == "q" && qd_written {
            check_tok_exps(&tag, tok, &exps, &cpu);
            check_dim_bytes(
                &format!("{tag}, Q's copy by the forward"),
                &shape,
                op.heads,
                &dim,
                &cpu,
                false,
            );
        } else {
            check_operand_bytes(&tag, &shape, op.heads, [tok, &dim[..]], &exps, &cpu);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn nvfp4_quantiser_is_bitwise_the_cpu_reference() {
    let gpu = gpu();
    let mut rng = rng("nvfp4_quantiser");
    let heads = 2;
    let d = NVFP4_HEAD_DIM;
    let shape = VarlenShape::from_lens(&LENS, heads, heads, d).unwrap();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    for hadamard in [false, true] {
        let x = awkward_tensor_d(&mut rng, shape.tokens(), heads, d, 12);
        let dx = upload_bf16(&gpu, &x);
        let op = Nvfp4Operand::alloc(&gpu, &plan, heads).unwrap();
        quantize_nvfp4(&gpu, stream(), &plan, dx.ptr(), hadamard, &op).unwrap();
        let xr = rotated(&x, d, hadamard);
        let cpu = quant::quantize_nvfp4("x", &xr, &shape.cu_seqlens, heads, d).unwrap();
        let codes = op.codes.to_host().unwrap();
        let scales = op.scales.to_host().unwrap();
        let exps = op.exps.to_host().unwrap();
        let vals = from_bits(&op.vals.to_host().unwrap());
        assert_eq!(
            codes.iter().zip(&cpu.codes).filter(|(a, b)| a != b).count(),
            0,
            "E2M1 codes differ"
        );
        assert_eq!(scales, cpu.group_scales, "group scales differ");
        assert_eq!(exps, cpu.token_exps, "token exponents differ");
        for (i, v) in vals.iter().enumerate() {
            assert_eq!(
                *v as f64,
                cpu.mantissa_value(i),
                "BF16 value {i} is not e2m1 * scale exactly"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn nvfp4_quantiser_refuses_head_dim_64() {
    let gpu = gpu();
    let heads = 2;
    let shape = VarlenShape::from_lens(&[33, 1], heads, heads, 64).unwrap();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    let x = poisoned_bf16(&gpu, shape.tokens() * heads * 64);
    let mut op = Nvfp4Operand::alloc(&gpu, &plan, heads).unwrap();
    op.codes.upload(&vec![0xEEu8; op.codes.len()]).unwrap();
    match quantize_nvfp4(&gpu, stream(), &plan, x.ptr(), true, &op) {
        Err(GpuError::NotSupported(msg)) => assert!(
            msg.contains("head_dim 64") && msg.contains("head_dim 128"),
            "the refusal names the head dim given and the one allowed: {msg}"
        ),
        other => panic!("quantize_nvfp4 at head_dim 64: {other:?}, expected NotSupported"),
    }
    assert!(
        op.codes.to_host().unwrap().iter().all(|&c| c == 0xEE),
        "nothing was written"
    );
}

/// D of one (token, head) in the kernel's documented order (`cuda/quant.cu`, `delta_dot`): an FMA
/// chain per group of 4 elements, then the d / 4 group sums added pairwise with the pairing on the
/// group index's highest bit first (bit 4 at d = 128, bit 3 at d = 64) and bit 0 last, then one
/// exact power-of-two scale.
fn delta_in_kernel_order(q: &quant::E4m3Tensor, o: &[f32], tok: usize, h: usize) -> f32 {
    let groups = q.head_dim / 4;
    let row = (tok * q.heads + h) * q.head_dim;
    let mut s: Vec<f32> = (0..groups)
        .map(|g| {
            (0..4).fold(0f32, |acc, j| {
                let i = row + 4 * g + j;
                e4m3_decode(q.codes[i]).mul_add(o[i], acc)
            })
        })
        .collect();
    let mut bit = groups / 2;
    while bit > 0 {
        s = (0..groups).map(|l| s[l] + s[l ^ bit]).collect();
        bit /= 2;
    }
    let e = q.exps[tok * q.heads + h] as i32;
    if e >= -126 {
        s[0] * pow2_f32(e)
    } else {
        (s[0] * 0.5) * pow2_f32(e + 1)
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn delta_is_the_dot_product_of_quantised_do_and_o() {
    let gpu = gpu();
    let mut rng = rng("delta");
    for d in HEAD_DIMS {
        delta_case(&gpu, &mut rng, d);
    }
}

/// [`delta_is_the_dot_product_of_quantised_do_and_o`] at head dim `d`.
fn delta_case(gpu: &Gpu, rng: &mut ChaCha8Rng, d: usize) {
    let heads = 2;
    let shape = VarlenShape::from_lens(&[31, 129, 1], heads, heads, d).unwrap();
    let t = shape.tokens();
    let plan = Plan::new(gpu, &shape, true).unwrap();
    for mode in [ScaleMode::TokenBlock, ScaleMode::PerToken] {
        let d_o = wide_tensor(rng, t, heads, d);
        let o = gauss_tensor(rng, t * heads * d, 1.0);
        let (dd, od) = (upload_bf16(gpu, &d_o), upload_bf16(gpu, &o));
        let op = poisoned_operand(gpu, &plan, heads);
        let delta = poisoned_f32(gpu, heads * t);
        let out = DeltaOut {
            o: od.ptr(),
            delta: delta.ptr(),
        };
        quantize_e4m3(gpu, stream(), &plan, dd.ptr(), false, mode, &op, Some(out), None).unwrap();
        let q = quant::quantize_e4m3("dO", &d_o, &shape.cu_seqlens, heads, d, mode).unwrap();
        check_operand(&format!("d={d} dO {mode:?}"), &shape, heads, &op, &q);
        let got = delta.to_host().unwrap();
        for tok in 0..t {
            for h in 0..heads {
                let g = got[tok * heads + h];
                let want_order = delta_in_kernel_order(&q, &o, tok, h);
                assert_eq!(
                    g.to_bits(),
                    want_order.to_bits(),
                    "d={d} {mode:?} D[{h},{tok}]: {g:e} is not the documented summation order's {want_order:e}"
                );
                let terms = (0..d).map(|c| q.value(tok, h, c) * o[(tok * heads + h) * d + c] as f64);
                let want: f64 = terms.clone().sum();
                let absum: f64 = terms.map(f64::abs).sum();
                assert!(
                    (g as f64 - want).abs() <= 1e-6 * absum + 1e-30,
                    "d={d} {mode:?} D[{h},{tok}] = {g}, want {want}"
                );
            }
        }
    }
}

/// The PTX the on-disk kernel cache serves (`gpu::kcache`) is what the driver loads: a module
/// compiled into a fresh cache, read back from it (a hit), loaded, with its kernels there.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn a_module_from_the_disk_cache_loads_with_its_kernels() {
    use flamia_kernels::gpu::runtime::compile_ptx_cached;
    use flamia_kernels::gpu::Variant;
    let gpu = gpu();
    let dir = tempfile::tempdir().unwrap();
    let v = Variant::new().define("HEAD_DIM", 128);
    let (_, hit) = compile_ptx_cached(Some(dir.path()), "quant.cu", &v, gpu.arch()).unwrap();
    assert!(!hit, "a fresh cache cannot hold the module");
    let (ptx, hit) = compile_ptx_cached(Some(dir.path()), "quant.cu", &v, gpu.arch()).unwrap();
    assert!(hit, "the second compile must come from the cache");
    let m = gpu
        .context()
        .load_module(ptx)
        .expect("the driver loads the cached PTX");
    for name in ["quant_e4m3", "quant_amax", "quant_nvfp4"] {
        m.load_function(name).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
}
