//! Causal-safety properties of hopper-kernels.md section 5, checked with the leakage harness on
//! the CPU reference: Q, K, V and dO after `t` perturbed, dO kept in full, O / LSE / dQ compared
//! up to `t` (and dK / dV under a horizon loss). Packed documents and GQA, probes in the first and
//! in a later document. Every property has a negative control that must leak: each precision
//! option switched off in turn, the leaky path, and the dQ prescale on the quiet-prefix input.

use flamia_kernels::leakage::{
    block_start, causal_leakage, default_probe, doc_isolation, quiet_prefix, reference_attn, CausalLeak,
};
use flamia_kernels::{AttnCall, AttnOptions, AttnPath, Precision, VarlenShape};

/// Two documents (150 and 90 tokens), GQA 4:2, head dim 64.
fn call(opts: AttnOptions) -> AttnCall {
    let shape = VarlenShape::from_lens(&[150, 90], 4, 2, 64).unwrap();
    AttnCall::random(shape, opts, 11)
}

/// Probes: the middle of the first (longest) document, and inside the second document.
fn probes(call: &AttnCall) -> [usize; 2] {
    [default_probe(&call.shape), 190]
}

fn leak(call: &AttnCall, t: usize) -> CausalLeak {
    causal_leakage(&reference_attn, call, t, 1e3).unwrap()
}

fn opts(path: AttnPath, precision: Precision) -> AttnOptions {
    AttnOptions {
        precision,
        ..AttnOptions::new(path)
    }
}

#[test]
fn probe_positions_and_their_blocks() {
    let c = call(AttnOptions::new(AttnPath::Mxfp8));
    let [a, b] = probes(&c);
    assert_eq!((a, block_start(&c.shape, a + 1)), (79, 64));
    // Blocks restart at the document start 150.
    assert_eq!(block_start(&c.shape, b + 1), 182);
    let l = leak(&c, b);
    assert_eq!((l.t, l.block_start), (190, 182));
}

#[test]
fn exact_attention_is_bitwise_causal() {
    let c = call(AttnOptions::new(AttnPath::Exact));
    for t in probes(&c) {
        for input in [c.clone(), quiet_prefix(&c, t)] {
            let l = leak(&input, t);
            assert!(l.bitwise_causal(), "exact t {t}: {l:?}");
        }
    }
}

#[test]
fn default_mxfp8_leaks_only_inside_the_perturbed_block() {
    let c = call(AttnOptions::new(AttnPath::Mxfp8));
    for t in probes(&c) {
        let l = leak(&c, t);
        assert!(
            l.before_own_block.bitwise_zero(),
            "t {t} before own block: {:?}",
            l.before_own_block
        );
        // The residual in-block leak of token-block scales is real and the harness sees it, in
        // the forward (Q, K, V block scales) and in dQ.
        let b = l.in_own_block;
        assert!(
            b.o > 0.0 && b.lse > 0.0 && b.dq > 0.0,
            "t {t} in own block: {b:?}"
        );
        assert!(
            l.horizon.dk > 0.0 && l.horizon.dv > 0.0,
            "t {t} horizon: {:?}",
            l.horizon
        );
    }
}

#[test]
fn precision_options_make_every_output_bitwise_causal() {
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
        for hadamard in [true, false] {
            let c = call(opts(path, Precision::causally_safe(hadamard)));
            for t in probes(&c) {
                for (input, what) in [(c.clone(), "normal"), (quiet_prefix(&c, t), "quiet prefix")] {
                    let l = leak(&input, t);
                    assert!(
                        l.bitwise_causal(),
                        "{path} hadamard {hadamard} t {t} {what}: {l:?}"
                    );
                }
            }
        }
    }
}

/// The causally safe options with one of them switched off.
fn safe_without(path: AttnPath, off: &str) -> AttnOptions {
    let mut p = Precision::causally_safe(true);
    match off {
        "per_token_scales" => p.per_token_scales = false,
        "row_ds_exponents" => p.row_ds_exponents = false,
        "causal_dq_scaling" => p.causal_dq_scaling = false,
        _ => unreachable!("{off}"),
    }
    opts(path, p)
}

#[test]
fn without_per_token_scales_q_k_v_and_do_block_scales_leak() {
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
        let c = call(safe_without(path, "per_token_scales"));
        for t in probes(&c) {
            let l = leak(&c, t);
            // nvfp4 scores use per-token NVFP4 Q and K, but V stays on token blocks: O leaks.
            assert!(l.up_to_t.o > 0.0 && l.up_to_t.dq > 0.0, "{path} t {t}: {l:?}");
            assert!(l.horizon.dk > 0.0, "{path} t {t}: {l:?}");
        }
    }
}

#[test]
fn without_row_ds_exponents_the_ds_block_exponent_leaks_into_dq() {
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
        let c = call(safe_without(path, "row_ds_exponents"));
        for t in probes(&c) {
            let l = leak(&c, t);
            let u = l.up_to_t;
            // The forward has no dS: O and LSE stay bitwise; dQ of the rows sharing a dS block
            // with the perturbed rows changes.
            assert!(u.o == 0.0 && u.lse == 0.0 && u.dq > 0.0, "{path} t {t}: {u:?}");
            assert!(l.before_own_block.bitwise_zero(), "{path} t {t}: {l:?}");
        }
    }
}

#[test]
fn without_causal_dq_scaling_the_document_wide_prescale_leaks_on_a_quiet_prefix() {
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
        let c = call(safe_without(path, "causal_dq_scaling"));
        for t in probes(&c) {
            // Ordinary inputs: the FP32 prescale commutes with rounding (docs/numerics.md 4).
            let l = leak(&c, t);
            assert!(l.bitwise_causal(), "{path} t {t} normal input: {l:?}");
            let l = leak(&quiet_prefix(&c, t), t);
            let u = l.up_to_t;
            assert!(
                u.o == 0.0 && u.lse == 0.0 && u.dq > 0.0,
                "{path} t {t} quiet: {u:?}"
            );
            assert!(l.before_own_block.dq > 0.0, "{path} t {t} quiet: {l:?}");
        }
    }
}

#[test]
fn leaky_fp8_leaks_everywhere() {
    let c = call(AttnOptions::new(AttnPath::LeakyFp8));
    for t in probes(&c) {
        let l = leak(&c, t);
        assert!(l.up_to_t.max() > 1e-3, "leaky-fp8 t {t}: {l:?}");
        assert!(l.before_own_block.max() > 1e-3, "leaky-fp8 t {t}: {l:?}");
        assert!(
            l.horizon.dk > 1e-3 && l.horizon.dv > 1e-3,
            "leaky-fp8 t {t}: {l:?}"
        );
    }
}

#[test]
fn documents_are_isolated_except_in_the_leaky_mode() {
    let shape = VarlenShape::from_lens(&[70, 150, 33], 2, 1, 128).unwrap();
    let c = AttnCall::random(shape, AttnOptions::new(AttnPath::Exact), 12);
    for path in [AttnPath::Exact, AttnPath::Mxfp8, AttnPath::Nvfp4] {
        for doc in 0..3 {
            let r = doc_isolation(&reference_attn, &c.with_path(path), doc, 1e4).unwrap();
            assert!(r.bitwise_zero(), "{path} doc {doc}: {r:?}");
        }
    }
    let r = doc_isolation(&reference_attn, &c.with_path(AttnPath::LeakyFp8), 1, 1e4).unwrap();
    assert!(r.max() > 1e-3, "leaky-fp8 must leak across documents: {r:?}");
    assert!(
        r.o > 0.0 && r.lse > 0.0 && r.dq > 0.0 && r.dk > 0.0 && r.dv > 0.0,
        "{r:?}"
    );
}
