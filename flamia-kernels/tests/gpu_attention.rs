//! GPU attention forward/backward against the CPU reference: error versus exact attention within
//! twice the CPU reference's own error plus a small atol (FA3's rule), the leakage properties of
//! the reference (document isolation, causal safety), poisoned outputs fully overwritten, no NaN,
//! repeated runs bitwise identical. Fresh random inputs every run. Run on the device: `--ignored`.

mod gpu_common;

use flamia_kernels::leakage::{causal_leakage, default_probe, doc_isolation};
use flamia_kernels::reference::{self, Forward, Grads};
use flamia_kernels::{AttnOptions, AttnPath, Precision, VarlenShape};
use gpu_common::*;

const LENS: [usize; 7] = [1, 31, 33, 64, 127, 129, 257];
/// Absolute slack of the error bound (relative Frobenius error units).
const ATOL: f64 = 2e-3;

fn inputs(rng: &mut rand_chacha::ChaCha8Rng, shape: &VarlenShape) -> [Vec<f32>; 4] {
    let (t, hq, hkv) = (shape.tokens(), shape.heads_q, shape.heads_kv);
    [
        gauss_tensor(rng, t * hq * 128, 1.0),
        gauss_tensor(rng, t * hkv * 128, 1.0),
        gauss_tensor(rng, t * hkv * 128, 1.0),
        gauss_tensor(rng, t * hq * 128, 1.0),
    ]
}

struct Errs([f64; 5]);

fn errs(got: &(Forward, Grads), exact: &(Forward, Grads)) -> Errs {
    Errs([
        rel_err(&got.0.o, &exact.0.o),
        rel_err(&got.0.lse, &exact.0.lse),
        rel_err(&got.1.dq, &exact.1.dq),
        rel_err(&got.1.dk, &exact.1.dk),
        rel_err(&got.1.dv, &exact.1.dv),
    ])
}

fn check_accuracy(tag: &str, shape: &VarlenShape, opts: AttnOptions) {
    let gpu = gpu();
    let mut rng = rng(tag);
    let [q, k, v, g] = inputs(&mut rng, shape);
    let exact_opts = AttnOptions {
        path: AttnPath::Exact,
        ..opts
    };
    let exact = reference::forward_backward(&q, &k, &v, &g, shape, &exact_opts).unwrap();
    let cpu = reference::forward_backward(&q, &k, &v, &g, shape, &opts).unwrap();
    let got = gpu_attn(&gpu, &q, &k, &v, &g, shape, &opts).unwrap();
    for (name, x) in [
        ("O", &got.0.o),
        ("LSE", &got.0.lse),
        ("dQ", &got.1.dq),
        ("dK", &got.1.dk),
        ("dV", &got.1.dv),
    ] {
        assert_eq!(
            count_nan(x),
            0,
            "{tag}: {name} has non-finite (unwritten) elements"
        );
    }
    let (e_gpu, e_cpu) = (errs(&got, &exact), errs(&cpu, &exact));
    let names = ["O", "LSE", "dQ", "dK", "dV"];
    let gots = [&got.0.o, &got.0.lse, &got.1.dq, &got.1.dk, &got.1.dv];
    let cpus = [&cpu.0.o, &cpu.0.lse, &cpu.1.dq, &cpu.1.dk, &cpu.1.dv];
    for (i, name) in names.iter().enumerate() {
        eprintln!(
            "{tag}: {name:<3} rel err vs exact: gpu {:.3e}  cpu reference {:.3e}  |gpu - cpu| rel {:.3e}",
            e_gpu.0[i],
            e_cpu.0[i],
            rel_err(gots[i], cpus[i])
        );
    }
    for (i, name) in names.iter().enumerate() {
        assert!(
            e_gpu.0[i] <= 2.0 * e_cpu.0[i] + ATOL,
            "{tag}: {name} error {:.3e} exceeds 2 x CPU reference error {:.3e} + {ATOL}",
            e_gpu.0[i],
            e_cpu.0[i]
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn mxfp8_causal_gqa_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 4, 2, 128).unwrap();
    check_accuracy("mxfp8 causal gqa", &shape, AttnOptions::new(AttnPath::Mxfp8));
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn mxfp8_non_causal_mha_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 2, 2, 128).unwrap();
    check_accuracy(
        "mxfp8 non-causal",
        &shape,
        AttnOptions {
            causal: false,
            ..AttnOptions::new(AttnPath::Mxfp8)
        },
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn precision_options_and_no_hadamard_are_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 2, 1, 128).unwrap();
    let opts = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Mxfp8)
    };
    check_accuracy("mxfp8 causally safe", &shape, opts);
    let mut plain = AttnOptions::new(AttnPath::Mxfp8);
    plain.precision.hadamard = false;
    check_accuracy("mxfp8 no hadamard", &shape, plain);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn leaky_fp8_runs_and_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 2, 2, 128).unwrap();
    check_accuracy("leaky-fp8", &shape, AttnOptions::new(AttnPath::LeakyFp8));
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn nvfp4_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 4, 2, 128).unwrap();
    check_accuracy("nvfp4 causal gqa", &shape, AttnOptions::new(AttnPath::Nvfp4));
    let safe = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Nvfp4)
    };
    check_accuracy("nvfp4 causally safe", &shape, safe);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn repeated_runs_are_bitwise_identical() {
    let gpu = gpu();
    let mut rng = rng("repeat");
    let shape = VarlenShape::from_lens(&[300, 1, 65], 4, 1, 128).unwrap();
    let [q, k, v, g] = inputs(&mut rng, &shape);
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
        let opts = AttnOptions::new(path);
        let a = gpu_attn(&gpu, &q, &k, &v, &g, &shape, &opts).unwrap();
        let b = gpu_attn(&gpu, &q, &k, &v, &g, &shape, &opts).unwrap();
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(
            bits(&a.0.o),
            bits(&b.0.o),
            "{path}: forward O differs between runs"
        );
        assert_eq!(bits(&a.0.lse), bits(&b.0.lse), "{path}: LSE differs between runs");
        assert_eq!(bits(&a.1.dq), bits(&b.1.dq), "{path}: dQ differs between runs");
        assert_eq!(bits(&a.1.dk), bits(&b.1.dk), "{path}: dK differs between runs");
        assert_eq!(bits(&a.1.dv), bits(&b.1.dv), "{path}: dV differs between runs");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn documents_are_isolated_bitwise() {
    let gpu = gpu();
    let mut rng = rng("isolation");
    let shape = VarlenShape::from_lens(&[70, 33, 129], 2, 2, 128).unwrap();
    let [q, k, v, g] = inputs(&mut rng, &shape);
    let f = |q: &[f32], k: &[f32], v: &[f32], d: &[f32], s: &VarlenShape, o: &AttnOptions| {
        gpu_attn(&gpu, q, k, v, d, s, o)
    };
    for doc in 0..3 {
        let c = doc_isolation(
            &f,
            &q,
            &k,
            &v,
            &g,
            &shape,
            &AttnOptions::new(AttnPath::Mxfp8),
            doc,
            1e4,
        )
        .unwrap();
        assert!(
            c.bitwise_zero(),
            "scaling document {doc} changed {} elements of the others: {c:?}",
            c.changed
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn causal_leakage_has_the_reference_properties() {
    let gpu = gpu();
    let mut rng = rng("leakage");
    let shape = VarlenShape::from_lens(&[40, 200], 2, 1, 128).unwrap();
    let [q, k, v, g] = inputs(&mut rng, &shape);
    let t = default_probe(&shape);
    let f = |q: &[f32], k: &[f32], v: &[f32], d: &[f32], s: &VarlenShape, o: &AttnOptions| {
        gpu_attn(&gpu, q, k, v, d, s, o)
    };
    let default = causal_leakage(
        &f,
        &q,
        &k,
        &v,
        &g,
        &shape,
        &AttnOptions::new(AttnPath::Mxfp8),
        t,
        1e3,
    )
    .unwrap();
    eprintln!("mxfp8 default: {default:?}");
    assert!(
        default.before_own_block.bitwise_zero(),
        "default MXFP8 leaked before the perturbed block: {default:?}"
    );
    let safe = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Mxfp8)
    };
    let s = causal_leakage(&f, &q, &k, &v, &g, &shape, &safe, t, 1e3).unwrap();
    eprintln!("mxfp8 causally safe: {s:?}");
    assert!(
        s.up_to_t.bitwise_zero(),
        "the precision options must give bitwise zero leakage: {s:?}"
    );
    let leaky = causal_leakage(
        &f,
        &q,
        &k,
        &v,
        &g,
        &shape,
        &AttnOptions::new(AttnPath::LeakyFp8),
        t,
        1e3,
    )
    .unwrap();
    eprintln!("leaky-fp8: {leaky:?}");
    assert!(
        leaky.up_to_t.max() > 0.0,
        "the leaky control must show its leak: {leaky:?}"
    );
}
