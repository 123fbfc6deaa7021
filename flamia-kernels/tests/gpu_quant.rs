//! GPU quantisers against the CPU reference, byte for byte, on fresh random inputs with awkward
//! document lengths (1, 31, 32, 33, 127, 129, 4095). Run on the device: `--ignored`.

mod gpu_common;

use flamia_kernels::gpu::plan::PlanTables;
use flamia_kernels::gpu::quant::{quantize_e4m3, quantize_nvfp4, AmaxScratch, DeltaOut};
use flamia_kernels::gpu::{Nvfp4Operand, Operand, Plan};
use flamia_kernels::hadamard::rotate_rows;
use flamia_kernels::quant::{self, ScaleMode};
use flamia_kernels::VarlenShape;
use gpu_common::*;

const LENS: [usize; 7] = [1, 31, 32, 33, 127, 129, 4095];

/// Checks the token-major codes, exponents and the dim-major copy (with its zero padding).
fn check_operand(tag: &str, shape: &VarlenShape, heads: usize, gpu_op: &Operand, cpu: &quant::E4m3Tensor) {
    let tok = gpu_op.tok.to_host().unwrap();
    let exps = gpu_op.exps.to_host().unwrap();
    let dim = gpu_op.dim.to_host().unwrap();
    let bad_tok = tok.iter().zip(&cpu.codes).filter(|(a, b)| a != b).count();
    let bad_exp = exps.iter().zip(&cpu.exps).filter(|(a, b)| a != b).count();
    if let Some(i) = tok.iter().zip(&cpu.codes).position(|(a, b)| a != b) {
        eprintln!(
            "{tag}: first code mismatch at {i}: gpu {:#04x} cpu {:#04x}",
            tok[i], cpu.codes[i]
        );
    }
    if let Some(i) = exps.iter().zip(&cpu.exps).position(|(a, b)| a != b) {
        eprintln!(
            "{tag}: first exponent mismatch at {i}: gpu {} cpu {}",
            exps[i], cpu.exps[i]
        );
    }
    assert_eq!(
        bad_tok, 0,
        "{tag}: {bad_tok} token-major codes differ from the CPU reference"
    );
    assert_eq!(
        bad_exp, 0,
        "{tag}: {bad_exp} exponents differ from the CPU reference"
    );
    let tables = PlanTables::new(shape, true);
    let tpad = tables.tpad;
    let mut pad = 0;
    let mut bad_dim = 0;
    for w in shape.cu_seqlens.windows(2) {
        let (s, len) = (w[0], w[1] - w[0]);
        for h in 0..heads {
            for c in 0..128 {
                for tt in 0..len.div_ceil(64) * 64 {
                    let got = dim[(h * 128 + c) * tpad + pad + tt];
                    let want = if tt < len {
                        cpu.codes[((s + tt) * heads + h) * 128 + c]
                    } else {
                        0
                    };
                    bad_dim += (got != want) as usize;
                }
            }
        }
        pad += len.div_ceil(64) * 64;
    }
    assert_eq!(
        bad_dim, 0,
        "{tag}: {bad_dim} dim-major codes (or padding bytes) wrong"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn e4m3_quantiser_is_bitwise_the_cpu_reference() {
    let gpu = gpu();
    let mut rng = rng("e4m3_quantiser");
    let heads = 3;
    let shape = VarlenShape::from_lens(&LENS, heads, heads, 128).unwrap();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    let amax = AmaxScratch::new(&gpu).unwrap();
    for mode in [ScaleMode::TokenBlock, ScaleMode::PerToken, ScaleMode::TensorFloor] {
        for hadamard in [false, true] {
            let x = awkward_tensor(&mut rng, shape.tokens(), heads, 12);
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
            let xr = if hadamard {
                rotate_rows(&x, 128).unwrap()
            } else {
                x.clone()
            };
            let cpu = quant::quantize_e4m3("x", &xr, &shape.cu_seqlens, heads, 128, mode).unwrap();
            check_operand(&format!("{mode:?} hadamard={hadamard}"), &shape, heads, &op, &cpu);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn quantiser_overwrites_poisoned_buffers_and_repeats_bitwise() {
    let gpu = gpu();
    let mut rng = rng("quantiser_poison");
    let heads = 2;
    let shape = VarlenShape::from_lens(&[33, 1, 129], heads, heads, 128).unwrap();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    let x = awkward_tensor(&mut rng, shape.tokens(), heads, 6);
    let dx = upload_bf16(&gpu, &x);
    let mut op = Operand::alloc(&gpu, &plan, heads).unwrap();
    op.tok.upload(&vec![0x7Fu8; op.tok.len()]).unwrap();
    op.dim.upload(&vec![0x7Fu8; op.dim.len()]).unwrap();
    op.exps.upload(&vec![99i8; op.exps.len()]).unwrap();
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
    let first = (
        op.tok.to_host().unwrap(),
        op.dim.to_host().unwrap(),
        op.exps.to_host().unwrap(),
    );
    assert!(
        first.0.iter().all(|&c| c & 0x7F != 0x7F),
        "a NaN code survived in the token-major codes"
    );
    assert!(first.2.iter().all(|&e| e != 99), "an exponent was not written");
    // the dim-major padding and every code are rewritten, as the CPU check shows
    let cpu = quant::quantize_e4m3(
        "x",
        &rotate_rows(&x, 128).unwrap(),
        &shape.cu_seqlens,
        heads,
        128,
        ScaleMode::TokenBlock,
    )
    .unwrap();
    check_operand("poisoned", &shape, heads, &op, &cpu);
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
    let second = (
        op.tok.to_host().unwrap(),
        op.dim.to_host().unwrap(),
        op.exps.to_host().unwrap(),
    );
    assert_eq!(first, second, "repeated quantisation differs");
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn nvfp4_quantiser_is_bitwise_the_cpu_reference() {
    let gpu = gpu();
    let mut rng = rng("nvfp4_quantiser");
    let heads = 2;
    let shape = VarlenShape::from_lens(&LENS, heads, heads, 128).unwrap();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    for hadamard in [false, true] {
        let x = awkward_tensor(&mut rng, shape.tokens(), heads, 12);
        let dx = upload_bf16(&gpu, &x);
        let op = Nvfp4Operand::alloc(&gpu, &plan, heads).unwrap();
        quantize_nvfp4(&gpu, stream(), &plan, dx.ptr(), hadamard, &op).unwrap();
        let xr = if hadamard {
            rotate_rows(&x, 128).unwrap()
        } else {
            x.clone()
        };
        let cpu = quant::quantize_nvfp4("x", &xr, &shape.cu_seqlens, heads, 128).unwrap();
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
fn delta_is_the_dot_product_of_quantised_do_and_o() {
    let gpu = gpu();
    let mut rng = rng("delta");
    let heads = 2;
    let shape = VarlenShape::from_lens(&[31, 129, 1], heads, heads, 128).unwrap();
    let t = shape.tokens();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    let d_o = awkward_tensor(&mut rng, t, heads, 4);
    let o = gauss_tensor(&mut rng, t * heads * 128, 1.0);
    let (dd, od) = (upload_bf16(&gpu, &d_o), upload_bf16(&gpu, &o));
    let op = Operand::alloc(&gpu, &plan, heads).unwrap();
    let delta = poisoned_f32(&gpu, heads * t);
    let out = DeltaOut {
        o: od.ptr(),
        delta: delta.ptr(),
    };
    quantize_e4m3(
        &gpu,
        stream(),
        &plan,
        dd.ptr(),
        false,
        ScaleMode::TokenBlock,
        &op,
        Some(out),
        None,
    )
    .unwrap();
    let got = delta.to_host().unwrap();
    let q = quant::quantize_e4m3("dO", &d_o, &shape.cu_seqlens, heads, 128, ScaleMode::TokenBlock).unwrap();
    for tok in 0..t {
        for h in 0..heads {
            let want: f64 = (0..128)
                .map(|c| q.value(tok, h, c) * o[(tok * heads + h) * 128 + c] as f64)
                .sum();
            let absum: f64 = (0..128)
                .map(|c| (q.value(tok, h, c) * o[(tok * heads + h) * 128 + c] as f64).abs())
                .sum();
            let g = got[tok * heads + h] as f64;
            assert!(
                (g - want).abs() <= 1e-6 * absum + 1e-30,
                "D[{h},{tok}] = {g}, want {want}"
            );
        }
    }
}
