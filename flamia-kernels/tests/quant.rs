//! Token-block E4M3 quantiser, NVFP4 quantiser and their input validation.

use flamia_kernels::formats::{block_exponent, e4m3_decode, floor_exponent, nvfp4_token_exponent, EXP_MIN};
use flamia_kernels::quant::{quantize_e4m3, quantize_nvfp4, ScaleMode, TOKEN_BLOCK};
use flamia_kernels::Error;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

const D: usize = 64;
const H: usize = 2;

#[test]
fn blocks_restart_at_each_document_and_table_is_dense() {
    // Documents of 40 and 30 tokens: blocks [0,32), [32,40), [40,70).
    let cu = [0usize, 40, 70];
    let mut x = normal(70 * H * D, 1);
    x[(35 * H + 1) * D + 3] = 1000.0; // token 35, head 1
    let q = quantize_e4m3("k", &x, &cu, H, D, ScaleMode::TokenBlock).unwrap();
    assert_eq!(q.exps.len(), 70 * H);
    let block_amax = |t0: usize, t1: usize, h: usize| {
        (t0..t1)
            .flat_map(|t| x[(t * H + h) * D..(t * H + h + 1) * D].iter())
            .fold(0f32, |m, v| m.max(v.abs()))
    };
    for (t0, t1) in [(0, 32), (32, 40), (40, 70)] {
        for h in 0..H {
            let e = block_exponent(block_amax(t0, t1, h));
            for t in t0..t1 {
                assert_eq!(q.exps[t * H + h], e, "token {t} head {h}");
            }
        }
    }
    assert_eq!(q.exps[35 * H + 1], block_exponent(1000.0));
    assert_eq!(q.exps[40 * H + 1], q.exps[41 * H + 1]);
    assert!(
        q.exps[31 * H + 1] < q.exps[32 * H + 1],
        "the outlier must not reach the previous block"
    );
    assert!(q.exps[40 * H + 1] < q.exps[39 * H + 1], "nor the next document");
    assert_eq!(TOKEN_BLOCK, 32);
}

#[test]
fn reconstruction_is_within_half_an_ulp_and_never_clips() {
    let cu = [0usize, 100, 137];
    let x = normal(137 * H * D, 2);
    for mode in [ScaleMode::TokenBlock, ScaleMode::PerToken] {
        let q = quantize_e4m3("v", &x, &cu, H, D, mode).unwrap();
        let xh = q.dequantize();
        for (i, (&a, &b)) in x.iter().zip(&xh).enumerate() {
            let e = q.exps[i / D] as i32;
            let tol = (a.abs() as f64 * 2f64.powi(-4)).max(2f64.powi(e - 10));
            assert!((a as f64 - b).abs() <= tol, "{mode:?} element {i}: {a} vs {b}");
            assert!(q.codes[i] & 0x7F != 0x7F, "no NaN codes");
        }
    }
}

#[test]
fn per_token_and_tensor_floor_modes() {
    let cu = [0usize, 50];
    let mut x = normal(50 * H * D, 3);
    x[7 * H * D] = 300.0;
    let q = quantize_e4m3("q", &x, &cu, H, D, ScaleMode::PerToken).unwrap();
    for (r, row) in x.chunks_exact(D).enumerate() {
        assert_eq!(
            q.exps[r],
            block_exponent(row.iter().fold(0f32, |m, v| m.max(v.abs())))
        );
    }
    let l = quantize_e4m3("q", &x, &cu, H, D, ScaleMode::TensorFloor).unwrap();
    assert!(l.exps.iter().all(|&e| e == floor_exponent(300.0)));
    // Rounded down: the scaled amax 300 * 2^-0 lies in [256, 512) and the top clips at 448 only
    // when above it; here 300 * 2^-(8-8) = 300 <= 448, so check the exponent itself.
    assert_eq!(floor_exponent(300.0), 0);
    assert_eq!(block_exponent(300.0), 0);
    assert_eq!(
        floor_exponent(500.0),
        0,
        "500 would clip at 448 under the leaky rule"
    );
    assert_eq!(block_exponent(500.0), 1);
}

#[test]
fn all_zero_block_gets_smallest_exponent() {
    let cu = [0usize, 64];
    let mut x = normal(64 * H * D, 4);
    for t in 32..64 {
        for v in &mut x[t * H * D..(t + 1) * H * D] {
            *v = 0.0;
        }
    }
    let q = quantize_e4m3("dout", &x, &cu, H, D, ScaleMode::TokenBlock).unwrap();
    assert!(q.exps[32 * H..].iter().all(|&e| e == EXP_MIN));
    assert!(q.codes[32 * H * D..].iter().all(|&c| c == 0));
}

#[test]
fn nvfp4_is_per_token_and_accurate() {
    let cu = [0usize, 33];
    let x = normal(33 * H * D, 5);
    let q = quantize_nvfp4("q", &x, &cu, H, D).unwrap();
    let xh = q.dequantize();
    let err: f64 = x
        .iter()
        .zip(&xh)
        .map(|(&a, &b)| (a as f64 - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt();
    assert!(err / norm < 0.12, "NVFP4 relative L2 error {}", err / norm);
    for (r, row) in x.chunks_exact(D).enumerate() {
        assert_eq!(
            q.token_exps[r],
            nvfp4_token_exponent(row.iter().fold(0f32, |m, v| m.max(v.abs())))
        );
    }
    // Group scale of the group holding the token amax: (amax * 2^-e) / 6 encoded, <= 448.
    assert!(q
        .group_scales
        .iter()
        .all(|&s| e4m3_decode(s) <= 448.0 && s & 0x80 == 0));
    // Scaling one token changes no other token's codes.
    let mut y = x.clone();
    for v in &mut y[5 * H * D..6 * H * D] {
        *v *= 1e4;
    }
    let p = quantize_nvfp4("q", &y, &cu, H, D).unwrap();
    for r in (0..33 * H).filter(|r| r / H != 5) {
        assert_eq!(q.codes[r * D..(r + 1) * D], p.codes[r * D..(r + 1) * D]);
        assert_eq!(q.token_exps[r], p.token_exps[r]);
    }
}

#[test]
fn non_finite_input_is_reported_with_position() {
    let cu = [0usize, 10];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = normal(10 * H * D, 6);
        let i = (7 * H + 1) * D + 5;
        x[i] = bad;
        match quantize_e4m3("k", &x, &cu, H, D, ScaleMode::TokenBlock) {
            Err(Error::NonFinite {
                tensor,
                index,
                token,
                head,
                dim,
                ..
            }) => {
                assert_eq!((tensor, index, token, head, dim), ("k", i, 7, 1, 5));
            }
            other => panic!("expected NonFinite, got {other:?}"),
        }
        assert!(matches!(
            quantize_nvfp4("q", &x, &cu, H, D),
            Err(Error::NonFinite { tensor: "q", .. })
        ));
    }
}

#[test]
fn bad_shapes_are_rejected() {
    let x = normal(10 * H * D, 7);
    assert!(matches!(
        quantize_e4m3("k", &x, &[0, 9], H, D, ScaleMode::TokenBlock),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        quantize_e4m3("k", &x, &[1, 10], H, D, ScaleMode::TokenBlock),
        Err(Error::CuSeqlens(_))
    ));
    assert!(matches!(
        quantize_e4m3("k", &x, &[0, 5, 5, 10], H, D, ScaleMode::TokenBlock),
        Err(Error::CuSeqlens(_))
    ));
    let y = normal(10 * H * 96, 7);
    assert!(matches!(
        quantize_e4m3("k", &y, &[0, 10], H, 96, ScaleMode::TokenBlock),
        Err(Error::Invalid(_))
    ));
}
