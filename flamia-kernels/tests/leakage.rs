//! Causal-safety properties of hopper-kernels.md section 5, checked with the leakage harness on
//! the CPU reference. Each property is paired with a negative control that must leak, so the
//! harness is shown to see leaks.

mod common;

use common::inputs;
use flamia_kernels::leakage::{causal_leakage, default_probe, doc_isolation, reference_attn};
use flamia_kernels::{AttnOptions, AttnPath, Precision, VarlenShape};

fn shape() -> VarlenShape {
    VarlenShape::from_lens(&[150, 90], 4, 2, 64).unwrap()
}

fn leak(opts: AttnOptions) -> flamia_kernels::leakage::CausalLeak {
    let shape = shape();
    let (q, k, v, dout) = inputs(&shape, 11);
    let t = default_probe(&shape);
    causal_leakage(&reference_attn, &q, &k, &v, &dout, &shape, &opts, t, 1e3).unwrap()
}

#[test]
fn default_mxfp8_is_bitwise_unchanged_before_the_perturbed_block() {
    let l = leak(AttnOptions::new(AttnPath::Mxfp8));
    assert_eq!((l.t, l.block_start), (79, 64));
    assert!(
        l.before_own_block.bitwise_zero(),
        "before own block: {:?}",
        l.before_own_block
    );
    assert_eq!(l.before_own_block.max(), 0.0);
    // The residual in-block leak of default scales is real and the harness sees it.
    assert!(
        l.in_own_block.changed > 0 && l.in_own_block.max() > 0.0,
        "in own block: {:?}",
        l.in_own_block
    );
}

#[test]
fn precision_options_make_every_output_bitwise_causal() {
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
        for hadamard in [true, false] {
            let opts = AttnOptions {
                precision: Precision::causally_safe(hadamard),
                ..AttnOptions::new(path)
            };
            let l = leak(opts);
            assert!(
                l.up_to_t.bitwise_zero(),
                "{path} hadamard {hadamard}: {:?}",
                l.up_to_t
            );
        }
    }
}

#[test]
fn per_token_scales_alone_are_needed_control() {
    // Without per-token scales (only the other two options) the in-block leak stays.
    let precision = Precision {
        per_token_scales: false,
        ..Precision::causally_safe(true)
    };
    let l = leak(AttnOptions {
        precision,
        ..AttnOptions::new(AttnPath::Mxfp8)
    });
    assert!(l.up_to_t.changed > 0);
}

#[test]
fn leaky_fp8_leaks_everywhere() {
    let l = leak(AttnOptions::new(AttnPath::LeakyFp8));
    assert!(l.up_to_t.max() > 1e-3, "leaky-fp8 up to t: {:?}", l.up_to_t);
    assert!(
        l.before_own_block.max() > 1e-3,
        "leaky-fp8 before own block: {:?}",
        l.before_own_block
    );
}

#[test]
fn documents_are_isolated_except_in_the_leaky_mode() {
    let shape = VarlenShape::from_lens(&[70, 150, 33], 2, 1, 128).unwrap();
    let (q, k, v, dout) = inputs(&shape, 12);
    for path in [AttnPath::Exact, AttnPath::Mxfp8, AttnPath::Nvfp4] {
        let opts = AttnOptions::new(path);
        let c = doc_isolation(&reference_attn, &q, &k, &v, &dout, &shape, &opts, 1, 1e4).unwrap();
        assert!(c.bitwise_zero(), "{path}: {c:?}");
    }
    let opts = AttnOptions::new(AttnPath::LeakyFp8);
    let c = doc_isolation(&reference_attn, &q, &k, &v, &dout, &shape, &opts, 1, 1e4).unwrap();
    assert!(c.max() > 1e-3, "leaky-fp8 must leak across documents: {c:?}");
}
