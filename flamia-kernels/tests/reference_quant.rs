//! Quantised paths of the reference against `exact`: accuracy bars, determinism, and the shapes
//! the kernels must handle (packed documents not multiple of the tile, GQA, d = 64, non-causal).

mod common;

use common::{cosine, inputs};
use flamia_kernels::reference::{self, Forward, Grads};
use flamia_kernels::{AttnOptions, AttnPath, Precision, VarlenShape};

fn run(shape: &VarlenShape, opts: &AttnOptions, seed: u64) -> (Forward, Grads) {
    let (q, k, v, dout) = inputs(shape, seed);
    reference::forward_backward(&q, &k, &v, &dout, shape, opts).unwrap()
}

fn cosines(shape: &VarlenShape, opts: AttnOptions, seed: u64) -> [f64; 4] {
    let exact = AttnOptions {
        path: AttnPath::Exact,
        ..opts
    };
    let (fe, ge) = run(shape, &exact, seed);
    let (f, g) = run(shape, &opts, seed);
    [
        cosine(&f.o, &fe.o),
        cosine(&g.dq, &ge.dq),
        cosine(&g.dk, &ge.dk),
        cosine(&g.dv, &ge.dv),
    ]
}

#[test]
fn mxfp8_meets_the_cosine_bars() {
    let shape = VarlenShape::from_lens(&[300, 77, 200], 2, 2, 128).unwrap();
    for precision in [Precision::default(), Precision::causally_safe(true)] {
        let c = cosines(
            &shape,
            AttnOptions {
                precision,
                ..AttnOptions::new(AttnPath::Mxfp8)
            },
            1,
        );
        assert!(
            c[0] >= 0.997 && c[1..].iter().all(|&x| x >= 0.995),
            "{precision:?}: {c:?}"
        );
    }
}

#[test]
fn nvfp4_and_leaky_are_close_but_worse() {
    let shape = VarlenShape::from_lens(&[256, 100], 2, 1, 128).unwrap();
    let m = cosines(&shape, AttnOptions::new(AttnPath::Mxfp8), 2);
    let n = cosines(&shape, AttnOptions::new(AttnPath::Nvfp4), 2);
    assert!(n.iter().all(|&x| x > 0.95), "nvfp4 {n:?}");
    assert!(
        n[0] < m[0],
        "NVFP4 scores must cost accuracy: nvfp4 {n:?} vs mxfp8 {m:?}"
    );
    let l = cosines(&shape, AttnOptions::new(AttnPath::LeakyFp8), 2);
    assert!(l.iter().all(|&x| x > 0.9), "leaky {l:?}");
}

#[test]
fn d64_noncausal_gqa_and_tiny_documents() {
    let shape = VarlenShape::from_lens(&[1, 2, 33, 129, 5], 4, 1, 64).unwrap();
    for causal in [true, false] {
        for hadamard in [true, false] {
            let precision = Precision {
                hadamard,
                ..Precision::default()
            };
            let c = cosines(
                &shape,
                AttnOptions {
                    causal,
                    precision,
                    ..AttnOptions::new(AttnPath::Mxfp8)
                },
                3,
            );
            assert!(
                c[0] >= 0.995 && c[1..].iter().all(|&x| x >= 0.99),
                "causal {causal} H {hadamard}: {c:?}"
            );
        }
    }
}

#[test]
fn deterministic_and_bf16_outputs() {
    let shape = VarlenShape::from_lens(&[140, 60], 2, 1, 128).unwrap();
    let opts = AttnOptions::new(AttnPath::Mxfp8);
    let (f1, g1) = run(&shape, &opts, 4);
    let (f2, g2) = run(&shape, &opts, 4);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&f1.o), bits(&f2.o));
    assert_eq!(bits(&g1.dq), bits(&g2.dq));
    assert_eq!(bits(&g1.dk), bits(&g2.dk));
    assert_eq!(bits(&g1.dv), bits(&g2.dv));
    for x in f1.o.iter().chain(&g1.dq).chain(&g1.dk).chain(&g1.dv) {
        assert_eq!(x.to_bits() & 0xFFFF, 0, "{x} is not BF16-representable");
    }
    assert!(
        g1.ds_zero_fraction > 0.0 && g1.ds_zero_fraction < 0.2,
        "{}",
        g1.ds_zero_fraction
    );
}

#[test]
fn row_ds_exponents_round_fewer_ds_to_zero() {
    let shape = VarlenShape::from_lens(&[256], 2, 2, 128).unwrap();
    let (_, block) = run(&shape, &AttnOptions::new(AttnPath::Mxfp8), 5);
    let precision = Precision {
        row_ds_exponents: true,
        ..Precision::default()
    };
    let (_, row) = run(
        &shape,
        &AttnOptions {
            precision,
            ..AttnOptions::new(AttnPath::Mxfp8)
        },
        5,
    );
    assert!(
        row.ds_zero_fraction < block.ds_zero_fraction,
        "{} vs {}",
        row.ds_zero_fraction,
        block.ds_zero_fraction
    );
}
