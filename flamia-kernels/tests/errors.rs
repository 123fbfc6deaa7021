//! Bad input gets a typed error naming what was wrong and what is allowed.

use flamia_kernels::{reference, AttnOptions, AttnPath, Error, VarlenShape};

fn data(tokens: usize, heads: usize, d: usize) -> Vec<f32> {
    (0..tokens * heads * d)
        .map(|i| (i % 13) as f32 * 0.1 - 0.6)
        .collect()
}

fn fwd(cu: Vec<usize>, hq: usize, hkv: usize, d: usize, tokens: usize) -> Result<reference::Forward, Error> {
    let shape = VarlenShape {
        cu_seqlens: cu,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
    };
    let (q, k) = (data(tokens, hq, d), data(tokens, hkv, d));
    reference::forward(&q, &k, &k, &shape, &AttnOptions::new(AttnPath::Mxfp8))
}

#[test]
fn cu_seqlens_not_increasing() {
    let e = fwd(vec![0, 8, 8, 16], 2, 2, 64, 16).unwrap_err();
    assert!(matches!(e, Error::CuSeqlens(_)), "{e}");
    assert!(e.to_string().contains("strictly increasing"), "{e}");
    let e = fwd(vec![0, 10, 6], 2, 2, 64, 6).unwrap_err();
    assert!(matches!(e, Error::CuSeqlens(_)), "{e}");
}

#[test]
fn cu_seqlens_not_starting_at_zero() {
    let e = fwd(vec![2, 16], 2, 2, 64, 16).unwrap_err();
    assert!(
        matches!(e, Error::CuSeqlens(_)) && e.to_string().contains("start at 0"),
        "{e}"
    );
}

#[test]
fn cu_seqlens_not_ending_at_token_count() {
    let e = fwd(vec![0, 8, 12], 2, 2, 64, 16).unwrap_err();
    assert!(
        matches!(e, Error::CuSeqlens(_)) && e.to_string().contains("must end at the token count 16"),
        "{e}"
    );
    let shape = VarlenShape::new(vec![0, 8, 12], 2, 2, 64).unwrap();
    let e = shape.check_tokens(16).unwrap_err();
    assert!(
        matches!(e, Error::CuSeqlens(_)) && e.to_string().contains("must end at the token count 16"),
        "{e}"
    );
}

#[test]
fn unsupported_head_dim() {
    let e = fwd(vec![0, 16], 2, 2, 96, 16).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().contains("allowed: 64, 128"),
        "{e}"
    );
}

#[test]
fn query_heads_not_a_multiple_of_kv_heads() {
    let e = fwd(vec![0, 16], 3, 2, 64, 16).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().contains("multiple of KV heads"),
        "{e}"
    );
}

#[test]
fn nan_or_inf_in_an_input_is_reported_never_quantised() {
    let shape = VarlenShape::from_lens(&[16], 2, 1, 64).unwrap();
    let (q, k, v) = (data(16, 2, 64), data(16, 1, 64), data(16, 1, 64));
    let opts = AttnOptions::new(AttnPath::Mxfp8);
    let mut bad = v.clone();
    bad[3 * 64 + 9] = f32::NAN;
    match reference::forward(&q, &k, &bad, &shape, &opts) {
        Err(Error::NonFinite {
            tensor: "v",
            token: 3,
            head: 0,
            dim: 9,
            ..
        }) => {}
        other => panic!("expected NonFinite in v, got {other:?}"),
    }
    let f = reference::forward(&q, &k, &v, &shape, &opts).unwrap();
    let mut dout = data(16, 2, 64);
    dout[(5 * 2 + 1) * 64 + 2] = f32::NEG_INFINITY;
    let e = reference::backward(&q, &k, &v, &f.o, &f.lse, &dout, &shape, &opts).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NonFinite {
                tensor: "dout",
                token: 5,
                head: 1,
                dim: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("inputs must be finite"), "{e}");
    let mut qi = q.clone();
    qi[0] = f32::INFINITY;
    let e = reference::forward(&qi, &k, &v, &shape, &AttnOptions::new(AttnPath::Exact)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NonFinite {
                tensor: "q",
                index: 0,
                ..
            }
        ),
        "{e}"
    );
}
