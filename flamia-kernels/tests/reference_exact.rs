//! The `exact` path against a naive f64 attention (materialised scores) and finite differences:
//! packed documents crossing tile boundaries, causal and non-causal, MHA and GQA, d = 64 and 128.

mod common;

use common::{naive, rel_max};
use flamia_kernels::{reference, AttnCall, AttnOptions, AttnPath, VarlenShape};

fn check(lens: &[usize], hq: usize, hkv: usize, d: usize, causal: bool, seed: u64) {
    let shape = VarlenShape::from_lens(lens, hq, hkv, d).unwrap();
    let opts = AttnOptions {
        causal,
        ..AttnOptions::new(AttnPath::Exact)
    };
    let call = AttnCall::random(shape, opts, seed);
    let (f, g) = reference::forward_backward(&call).unwrap();
    let n = naive(&call);
    let what = format!("lens {lens:?} hq {hq} hkv {hkv} d {d} causal {causal}");
    for (name, a, b) in [
        ("o", &f.o, &n.o),
        ("lse", &f.lse, &n.lse),
        ("dq", &g.dq, &n.dq),
        ("dk", &g.dk, &n.dk),
        ("dv", &g.dv, &n.dv),
    ] {
        let err = rel_max(a, b);
        assert!(err < 2e-6, "{what}: {name} max relative error {err}");
    }
    assert_eq!(g.ds_zero_fraction, 0.0);
}

#[test]
fn exact_matches_naive_mha_gqa_causal_noncausal() {
    check(&[37, 130, 5], 2, 2, 64, true, 1);
    check(&[37, 130, 5], 4, 2, 64, false, 2);
    check(&[200, 1], 4, 1, 128, true, 3);
    check(&[129], 2, 1, 128, false, 4);
}

#[test]
fn exact_gradients_match_finite_differences() {
    // L = sum(dout * O); central differences in f64 around the f32 inputs.
    let shape = VarlenShape::from_lens(&[20, 13], 2, 1, 64).unwrap();
    let call = AttnCall::random(shape, AttnOptions::new(AttnPath::Exact), 9);
    let (_, g) = reference::forward_backward(&call).unwrap();
    let (q, k, v) = (call.q.clone(), call.k.clone(), call.v.clone());
    let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
        let n = naive(&AttnCall {
            q: q.to_vec(),
            k: k.to_vec(),
            v: v.to_vec(),
            ..call.clone()
        });
        n.o.iter().zip(&call.dout).map(|(o, &g)| o * g as f64).sum()
    };
    let eps = 1e-2f32;
    for (which, idx) in [(0usize, 5usize), (0, 1000), (1, 77), (1, 1500), (2, 3), (2, 2000)] {
        let (mut a, mut b) = (
            (q.clone(), k.clone(), v.clone()),
            (q.clone(), k.clone(), v.clone()),
        );
        let (pa, pb, grad) = match which {
            0 => (&mut a.0, &mut b.0, g.dq[idx]),
            1 => (&mut a.1, &mut b.1, g.dk[idx]),
            _ => (&mut a.2, &mut b.2, g.dv[idx]),
        };
        let (x0, x1) = (pa[idx] + eps, pb[idx] - eps);
        pa[idx] = x0;
        pb[idx] = x1;
        let fd = (loss(&a.0, &a.1, &a.2) - loss(&b.0, &b.1, &b.2)) / (x0 as f64 - x1 as f64);
        assert!(
            (fd - grad as f64).abs() < 2e-3 * (1.0 + fd.abs()),
            "tensor {which} idx {idx}: fd {fd} vs {grad}"
        );
    }
}
