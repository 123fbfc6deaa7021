//! The RMSNorm implementations of `model.rms_norm` ([`RmsNorm`]): `fused` and `fused-f32`
//! against the op-by-op `composite` (y, dx, dw within tolerances derived from the BF16
//! roundings each one makes), and every implementation repeating its bits exactly.
//!
//! On the CPU libtorch's `_fused_rms_norm` is itself a composite, so the CPU tests check the
//! casts, dtypes and gradients of the wrapper and these tests' own machinery. The ignored ones
//! are the real check, on CUDA (run on the device with `--ignored`): the fused kernel's numerics
//! for a BF16 activation (weight cast to BF16, or the activation upcast to f32) and an f32 one,
//! that `fused` really is libtorch's fused kernel (bit for bit the output of a direct
//! `_fused_rms_norm` call), and bitwise repeats with libtorch's deterministic mode off (the
//! `bf16` control's setting) and on (with uninitialised memory filled with NaN).

use flamia_trainer::attention::set_deterministic;
use flamia_trainer::model::RmsNorm;
use tch::{Device, Kind, Tensor};

const EPS: f64 = 1e-5;
const ALL: [RmsNorm; 3] = [RmsNorm::Fused, RmsNorm::FusedF32, RmsNorm::Composite];

/// Inputs of one case, made on the host from a seed: x `(rows, dim)` f32 with a different scale
/// per row (so the normalisation matters), the weight around 1, the gradient arriving at y.
struct Case {
    x: Tensor,
    w: Tensor,
    g: Tensor,
}

fn case(rows: i64, dim: i64, seed: i64) -> Case {
    tch::manual_seed(seed);
    let f = (Kind::Float, Device::Cpu);
    let scale = (Tensor::randn([rows, 1], f) * 1.5).exp();
    Case {
        x: Tensor::randn([rows, dim], f) * scale,
        w: Tensor::randn([dim], f) * 0.5 + 1.0,
        g: Tensor::randn([rows, dim], f),
    }
}

/// y, dx (both in `kind`) and dw (f32, the master's gradient) of one forward and backward of
/// `imp` on `dev`: x a leaf in `kind`, the weight an f32 leaf, loss `sum(y * g)` in f32.
fn run(imp: RmsNorm, c: &Case, kind: Kind, dev: Device) -> [Tensor; 3] {
    // Detached: on the CPU `to_device`/`to_kind` may hand back `c.x` itself, whose gradient
    // would then accumulate over runs.
    let x = c.x.to_device(dev).to_kind(kind).detach().set_requires_grad(true);
    let w = c.w.to_device(dev).detach().set_requires_grad(true);
    let y = imp.apply(&x, &w, EPS).unwrap();
    assert_eq!(y.kind(), kind, "{imp:?}: y comes back in x's kind");
    (y.to_kind(Kind::Float) * c.g.to_device(dev))
        .sum(Kind::Float)
        .backward();
    let (dx, dw) = (x.grad(), w.grad());
    assert_eq!(dx.kind(), kind, "{imp:?}: dx in x's kind");
    assert_eq!(dw.kind(), Kind::Float, "{imp:?}: dw lands on the f32 master");
    [y.detach(), dx, dw]
}

/// max |a - b| / max |b|, in f64.
fn gap(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    (&a - &b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-30)
}

/// The allowed gap to the composite for (y, dx, dw), relative to the composite's largest entry.
/// f32 x: the same f32 math in another order (1e-5). BF16 x: BF16 keeps 8 significant bits,
/// so one rounding is off by at most 2^-8 of the value. `fused-f32` computes y and dx in f32 as
/// the composite does before the one rounding both make, so they differ by at most one BF16 step
/// (2^-7 of the value) where that rounding flips, and dw (f32 from the same BF16 dy) like f32
/// (1e-5). `fused` also rounds the weight (y: the weight's, its own and the composite's
/// roundings, 3 x 2^-8 = 1.2e-2; dx the same three through the row sum) and returns dw in
/// BF16 (2^-8, plus BF16 partial sums above 65,536 rows).
fn tolerance(imp: RmsNorm, kind: Kind) -> [f64; 3] {
    match (kind, imp) {
        (Kind::Float, _) => [1e-5; 3],
        (_, RmsNorm::FusedF32) => [1e-2, 1e-2, 1e-5],
        (_, _) => [2e-2, 2e-2, 1e-2],
    }
}

/// `fused` and `fused-f32` against `composite` on `dev` for BF16 and f32 x over `shapes`;
/// prints the gaps.
fn compare_with_composite(dev: Device, shapes: &[(i64, i64)]) {
    for (i, &(rows, dim)) in shapes.iter().enumerate() {
        let c = case(rows, dim, 10 + i as i64);
        for kind in [Kind::BFloat16, Kind::Float] {
            let want = run(RmsNorm::Composite, &c, kind, dev);
            for imp in [RmsNorm::Fused, RmsNorm::FusedF32] {
                let got = run(imp, &c, kind, dev);
                let tol = tolerance(imp, kind);
                for (k, name) in ["y", "dx", "dw"].iter().enumerate() {
                    let d = gap(&got[k], &want[k]);
                    println!(
                        "{rows}x{dim} {kind:?} {imp:?} {name}: gap {d:.3e} (allowed {:.0e})",
                        tol[k]
                    );
                    assert!(
                        d <= tol[k],
                        "{rows}x{dim} {kind:?} {imp:?}: {name} is {d:.3e} of its largest entry from the composite's (allowed {:.0e})",
                        tol[k]
                    );
                }
            }
        }
    }
}

/// Whether two tensors have the same dtype, shape and bits.
fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    let bits = |t: &Tensor| match t.kind() {
        Kind::BFloat16 | Kind::Half => t.view_dtype(Kind::Int16),
        Kind::Float => t.view_dtype(Kind::Int),
        k => panic!("unexpected kind {k:?}"),
    };
    a.kind() == b.kind() && a.size() == b.size() && bits(a).equal(&bits(b))
}

/// Every implementation, run twice on the same inputs on `dev`, gives the same y, dx, dw bits.
fn repeats_bitwise(dev: Device, shapes: &[(i64, i64)], what: &str) {
    for (i, &(rows, dim)) in shapes.iter().enumerate() {
        let c = case(rows, dim, 20 + i as i64);
        for kind in [Kind::BFloat16, Kind::Float] {
            for imp in ALL {
                let (a, b) = (run(imp, &c, kind, dev), run(imp, &c, kind, dev));
                for (k, name) in ["y", "dx", "dw"].iter().enumerate() {
                    assert!(
                        same_bits(&a[k], &b[k]),
                        "{what}: {rows}x{dim} {kind:?} {imp:?}: {name} differs between two runs on the same inputs"
                    );
                }
            }
        }
    }
}

#[test]
fn the_variants_match_the_composite_on_the_cpu() {
    compare_with_composite(Device::Cpu, &[(37, 64), (19, 30)]);
}

#[test]
fn every_variant_repeats_its_bits_on_the_cpu() {
    repeats_bitwise(Device::Cpu, &[(37, 64), (19, 30)], "cpu");
}

#[test]
fn the_names_parse_and_others_are_refused() {
    for (name, imp) in RmsNorm::NAMES.iter().zip(ALL) {
        assert_eq!(RmsNorm::parse(name).unwrap(), imp);
    }
    let e = RmsNorm::parse("apex").unwrap_err().to_string();
    assert!(
        e.contains("model.rms_norm \"apex\"") && e.contains("fused, fused-f32, composite"),
        "{e}"
    );
}

/// Shapes on the GPU: the 1B model's (16,384 tokens of dim 2048, dw by the one-pass column
/// reduction), more than 65,536 rows (dw by per-block partial sums and `sum(0)` on an H200),
/// and two small ones (a dim that is not a multiple of 4 takes the kernel's unvectorised path).
const GPU_SHAPES: [(i64, i64); 4] = [(16384, 2048), (70000, 2048), (37, 64), (301, 30)];

fn cuda() -> Device {
    assert!(
        tch::Cuda::is_available(),
        "this test needs a CUDA GPU; it must not pass without one"
    );
    Device::Cuda(0)
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cuda_fused_variants_match_the_composite_and_fused_is_libtorchs_kernel() {
    let dev = cuda();
    compare_with_composite(dev, &GPU_SHAPES);
    // `fused` and `fused-f32` are libtorch's fused CUDA kernel: their y is, bit for bit, what a
    // direct `_fused_rms_norm` call on same-dtype operands gives (libtorch's composite fallback,
    // which `rms_norm` takes for a BF16 x with an f32 weight, reduces in another order).
    for (i, &(rows, dim)) in GPU_SHAPES.iter().enumerate() {
        let c = case(rows, dim, 30 + i as i64);
        let w = c.w.to_device(dev);
        for kind in [Kind::BFloat16, Kind::Float] {
            let x = c.x.to_device(dev).to_kind(kind);
            let direct = |k: Kind| {
                x.to_kind(k)
                    .internal_fused_rms_norm([dim], Some(w.to_kind(k)), EPS)
                    .0
                    .to_kind(kind)
            };
            for (imp, k) in [(RmsNorm::Fused, kind), (RmsNorm::FusedF32, Kind::Float)] {
                let y = tch::no_grad(|| imp.apply(&x, &w, EPS).unwrap());
                assert!(
                    same_bits(&y, &direct(k)),
                    "{rows}x{dim} {kind:?} {imp:?}: y is not the fused kernel's"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cuda_every_variant_repeats_its_bits_with_and_without_deterministic_mode() {
    let dev = cuda();
    let shapes = [GPU_SHAPES[0], GPU_SHAPES[1], GPU_SHAPES[3]];
    repeats_bitwise(dev, &shapes, "deterministic mode off");
    // On, with libtorch filling what it allocates with NaN: an operation without a
    // deterministic implementation would be an error, a read of unwritten memory a NaN.
    set_deterministic(true, true).unwrap();
    let on = std::panic::catch_unwind(|| repeats_bitwise(dev, &shapes, "deterministic mode on"));
    set_deterministic(false, false).unwrap();
    on.unwrap();
}
