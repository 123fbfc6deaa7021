//! Token-block E4M3 quantiser, NVFP4 quantiser and their input validation.

use flamia_kernels::formats::{
    block_exponent, e4m3_decode, floor_exponent, nvfp4_token_exponent, E2M1_MAGNITUDES, EXP_MIN,
};
use flamia_kernels::quant::{quantize_e4m3, quantize_nvfp4, ScaleMode, TOKEN_BLOCK};
use flamia_kernels::Error;

mod common;
use common::normal;

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

/// NVFP4 by an independent formula (module docs of `quant`, section 2 of docs/numerics.md):
/// exponents by search instead of from the bits, nearest E4M3 group scale and nearest E2M1 code by
/// scanning every code (ties to the even mantissa). Returns `(codes, group_scales, token_exps)`.
fn nvfp4_by_search(x: &[f32], d: usize) -> (Vec<u8>, Vec<u8>, Vec<i8>) {
    // Nearest code among `values` (indexed by code) to `y`, ties to the even code.
    fn nearest(values: impl Iterator<Item = (u8, f64)>, y: f64) -> u8 {
        let mut best = (f64::INFINITY, 0u8);
        for (c, v) in values {
            let dist = (v - y).abs();
            if dist < best.0 || (dist == best.0 && c & 1 == 0) {
                best = (dist, c);
            }
        }
        best.1
    }
    let (mut codes, mut scales, mut exps) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks_exact(d) {
        let amax = row.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        let e: i32 = if amax < f32::MIN_POSITIVE as f64 {
            -127
        } else {
            (-130..=130).find(|&e| amax <= 2688.0 * 2f64.powi(e)).unwrap()
        };
        exps.push(e as i8);
        let inv = 2f32.powi(-e);
        for g in row.chunks_exact(16) {
            let gmax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
            let y = (gmax * inv) / 6.0;
            let sc = nearest((0u8..=0x7E).map(|c| (c, e4m3_decode(c) as f64)), y as f64);
            scales.push(sc);
            let s = e4m3_decode(sc);
            for &v in g {
                let sign = (v.is_sign_negative() as u8) << 3;
                let m = if s == 0.0 {
                    0
                } else {
                    let z = ((v * inv) / s).abs() as f64;
                    nearest((0u8..8).map(|c| (c, E2M1_MAGNITUDES[c as usize] as f64)), z)
                };
                codes.push(sign | m);
            }
        }
    }
    (codes, scales, exps)
}

/// One NVFP4 row of head dim 64 (4 groups), one head, one token.
fn nvfp4_row(row: &[f32; 64]) -> flamia_kernels::quant::Nvfp4Tensor {
    quantize_nvfp4("q", row, &[0, 1], 1, 64).unwrap()
}

#[test]
fn nvfp4_group_scale_rounds_to_nearest_on_hand_built_groups() {
    // Token amax 2688 = 6 * 448 gives token exponent 0 (group 0), so group g's scale is the
    // E4M3 nearest to gmax / 6. E4M3 in [8, 16) steps by 1: 10 = 0x52, 11 = 0x53.
    let mut row = [0f32; 64];
    row[0] = 2688.0;
    row[16] = 62.4; // 10.4 -> 10 (rounding up would give 11)
    row[32] = -63.0; // 10.5, a tie -> the even mantissa: 10
    row[48] = 63.6; // 10.6 -> 11
    let q = nvfp4_row(&row);
    assert_eq!(q.token_exps, [0]);
    assert_eq!(q.group_scales, [0x7E, 0x52, 0x52, 0x53]);
    assert_eq!(e4m3_decode(0x52), 10.0);
    assert_eq!(e4m3_decode(0x53), 11.0);
    // Codes: 2688 / 448 = 6 -> 0x7; 62.4 / 10 = 6.24 -> 6 (0x7); -63 / 10 -> -6 (0xF).
    assert_eq!(
        (q.codes[0], q.codes[16], q.codes[32], q.codes[48]),
        (0x7, 0x7, 0xF, 0x7)
    );
    assert_eq!(nvfp4_by_search(&row, 64), (q.codes, q.group_scales, q.token_exps));
}

#[test]
fn nvfp4_codes_signs_ties_and_zero_groups_on_hand_built_rows() {
    let mut row = [0f32; 64];
    // Group 0: scale 10 (gmax 60), elements on E2M1 ties and signs.
    row[..8].copy_from_slice(&[60.0, -25.0, 7.5, 2.5, -0.0, 0.0, -12.5, 35.0]);
    // -2.5 -> tie 2|3 -> 2 (0xC); 0.75 -> tie 0.5|1 -> 1 (0x2); 0.25 -> tie 0|0.5 -> 0;
    // -0 keeps its sign (0x8); -1.25 -> tie 1|1.5 -> 1 (0xA); 3.5 -> tie 3|4 -> 4 (0x6).
    // Group 1: all zeros with negative zeros: scale 0, codes carry the signs.
    row[16] = -0.0;
    row[20] = -0.0;
    // Group 2: gmax so small that gmax / 6 is below half the smallest E4M3 subnormal (2^-10):
    // scale 0, every code a signed zero.
    row[32] = 1e-4;
    row[33] = -5e-4;
    // Group 3: the token amax 2688 * 2^3, so the token exponent is 3.
    row[48] = -21504.0;
    let q = nvfp4_row(&row);
    assert_eq!(q.token_exps, [3]);
    // Group 0 with exponent 3: 60 / 8 / 6 = 1.25 -> E4M3 1.25 = 0x3A.
    assert_eq!(q.group_scales, [0x3A, 0, 0, 0x7E]);
    let want0 = [0x7u8, 0xC, 0x2, 0x0, 0x8, 0x0, 0xA, 0x6];
    let got0: Vec<u8> = q.codes[..8].to_vec();
    // With scale 1.25 and exponent 3 the group's quotient is x / 10, as if the scale were 10.
    assert_eq!(got0, want0);
    assert_eq!(q.codes[16..32].iter().filter(|&&c| c == 0x8).count(), 2);
    assert_eq!((q.codes[16], q.codes[17], q.codes[20]), (0x8, 0x0, 0x8));
    assert_eq!((q.codes[32], q.codes[33], q.codes[34]), (0x0, 0x8, 0x0));
    assert_eq!(q.codes[48], 0xF);
    assert_eq!(nvfp4_by_search(&row, 64), (q.codes, q.group_scales, q.token_exps));
    // An all-zero row: the smallest token exponent, zero scales.
    let z = nvfp4_row(&[0f32; 64]);
    assert_eq!(z.token_exps, [EXP_MIN]);
    assert!(z.group_scales.iter().chain(&z.codes).all(|&c| c == 0));
}

#[test]
fn nvfp4_matches_the_independent_formula_bitwise_on_random_rows() {
    // Rows with a random power-of-two scale each (exponents from 2^-30 to 2^30), some zero rows.
    let (tokens, heads, d) = (97, 3, 128);
    let mut x = normal(tokens * heads * d, 8);
    for (r, row) in x.chunks_exact_mut(d).enumerate() {
        let f = if r % 17 == 5 {
            0.0
        } else {
            2f32.powi((r * 7919 % 61) as i32 - 30)
        };
        row.iter_mut().for_each(|v| *v *= f);
    }
    let q = quantize_nvfp4("k", &x, &[0, 40, tokens], heads, d).unwrap();
    let (codes, scales, exps) = nvfp4_by_search(&x, d);
    assert_eq!(q.token_exps, exps);
    let first = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
    assert_eq!(first(&q.group_scales, &scales), None, "group scales differ");
    assert_eq!(first(&q.codes, &codes), None, "codes differ");
}
