//! Format tests: E4M3 (OCP) decode/encode, ties, saturation; E2M1; block exponents.

use flamia_kernels::formats::{
    block_exponent, e2m1_decode, e2m1_encode, e4m3_decode, e4m3_encode, floor_exponent, nvfp4_token_exponent,
    EXP_MIN,
};

/// The OCP E4M3 value of `code`, computed independently in f64.
fn ocp_e4m3(code: u8) -> f64 {
    let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> 3) & 0xF) as i32;
    let m = (code & 7) as f64;
    if e == 15 && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        s * m / 8.0 * 2f64.powi(-6)
    } else {
        s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
    }
}

#[test]
fn all_256_e4m3_codes_decode_to_ocp_values() {
    for c in 0..=255u8 {
        let want = ocp_e4m3(c);
        let got = e4m3_decode(c) as f64;
        if want.is_nan() {
            assert!(got.is_nan(), "code {c:#04x} must be NaN");
            assert!(c == 0x7F || c == 0xFF);
        } else {
            assert_eq!(got, want, "code {c:#04x}");
            assert_eq!(got.is_sign_negative(), c & 0x80 != 0, "sign of code {c:#04x}");
        }
    }
    assert_eq!(e4m3_decode(0x7E), 448.0);
    assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_decode(0x08), 2f32.powi(-6));
    assert_eq!(e4m3_decode(0x38), 1.0);
}

#[test]
fn encode_decode_round_trips_every_finite_code() {
    for c in 0..=255u8 {
        if c & 0x7F == 0x7F {
            continue;
        }
        assert_eq!(e4m3_encode(e4m3_decode(c)), c, "code {c:#04x}");
    }
}

#[test]
fn ties_round_to_even_and_neighbours_round_to_nearest() {
    for c in 0u8..0x7E {
        let lo = e4m3_decode(c);
        let hi = e4m3_decode(c + 1);
        let mid = (lo + hi) / 2.0; // exact: at most 5 significant bits
        assert_eq!(((lo as f64 + hi as f64) / 2.0) as f32, mid);
        let even = if c % 2 == 0 { c } else { c + 1 };
        assert_eq!(e4m3_encode(mid), even, "tie between {c:#04x} and {:#04x}", c + 1);
        assert_eq!(e4m3_encode(-mid), even | 0x80, "negative tie at {c:#04x}");
        assert_eq!(e4m3_encode(mid.next_down()), c, "just below tie {c:#04x}");
        assert_eq!(e4m3_encode(mid.next_up()), c + 1, "just above tie {c:#04x}");
    }
}

#[test]
fn saturates_at_448_and_keeps_signs() {
    for x in [
        448.0f32,
        448.0f32.next_up(),
        463.9,
        464.0,
        480.0,
        1e6,
        f32::MAX,
        f32::INFINITY,
    ] {
        assert_eq!(e4m3_encode(x), 0x7E, "{x}");
        assert_eq!(e4m3_encode(-x), 0xFE, "{}", -x);
    }
    assert_eq!(e4m3_encode(f32::NAN), 0x7F);
    assert_eq!(e4m3_encode(0.0), 0x00);
    assert_eq!(e4m3_encode(-0.0), 0x80);
    // Below half the smallest subnormal: signed zero; exactly half: tie to even (zero).
    assert_eq!(e4m3_encode(2f32.powi(-10)), 0x00);
    assert_eq!(e4m3_encode(2f32.powi(-10).next_up()), 0x01);
    assert_eq!(e4m3_encode(-1e-30), 0x80);
}

#[test]
fn all_16_e2m1_codes() {
    let mags = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for c in 0..16u8 {
        let want = if c & 8 != 0 {
            -mags[(c & 7) as usize]
        } else {
            mags[(c & 7) as usize]
        };
        assert_eq!(e2m1_decode(c), want, "code {c}");
        assert_eq!(e2m1_encode(e2m1_decode(c)), c, "round trip {c}");
    }
    // Ties go to the even code; beyond 6 saturates.
    for (x, code) in [
        (0.25, 0),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (7.0, 7),
        (1e9, 7),
    ] {
        assert_eq!(e2m1_encode(x), code, "{x}");
        assert_eq!(e2m1_encode(-x), code | 8, "{}", -x);
    }
    assert_eq!(e2m1_encode(0.26), 1);
    assert_eq!(e2m1_encode(2.6), 5);
}

#[test]
fn amax_of_448_times_2k_gives_exponent_k() {
    for k in -100..=100 {
        let amax = 448.0f32 * 2f32.powi(k);
        assert_eq!(block_exponent(amax) as i32, k, "448 * 2^{k}");
        assert_eq!(
            block_exponent(amax.next_up()) as i32,
            k + 1,
            "just above 448 * 2^{k}"
        );
        assert_eq!(
            block_exponent(amax.next_down()) as i32,
            k,
            "just below 448 * 2^{k}"
        );
        let t = 2688.0f32 * 2f32.powi(k);
        assert_eq!(nvfp4_token_exponent(t) as i32, k, "2688 * 2^{k}");
        assert_eq!(nvfp4_token_exponent(t.next_up()) as i32, k + 1);
    }
    assert_eq!(block_exponent(0.0), EXP_MIN);
    assert_eq!(block_exponent(1e-45), EXP_MIN);
    assert_eq!(floor_exponent(0.0), EXP_MIN);
}

#[test]
fn block_exponent_is_the_smallest_exponent_that_does_not_clip() {
    let mut x = 1.234e-30f32;
    while x < 1e30 {
        let e = block_exponent(x) as i32;
        let (amax, lim) = (x as f64, 448.0 * 2f64.powi(e));
        assert!(amax <= lim && amax > lim / 2.0, "amax {x}: e {e}");
        let f = floor_exponent(x) as i32;
        assert_eq!(f, x.log2().floor() as i32 - 8, "floor exponent of {x}");
        x *= 1.37;
    }
}

/// The body of the CUDA function opened by `signature` in `src` (up to its first `}`) holds each
/// of `lines`, whitespace aside: an edit of a formula that a test models fails there until the
/// model follows it.
fn assert_cuda_body(src: &str, signature: &str, lines: &[&str]) {
    let body = src
        .split(signature)
        .nth(1)
        .and_then(|s| s.split('}').next())
        .unwrap_or_else(|| panic!("no `{signature}` in the CUDA source"));
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    for line in lines {
        assert!(
            squash(body).contains(&squash(line)),
            "`{signature}` changed: update this test's model of it\n{body}"
        );
    }
}

/// The kernels' three-instruction block exponent (`e4m3_scale_exp_nn` in `cuda/attn_common.cuh`,
/// used by the v4 backward for its dS exponents: `max(-126, ((bits + 2^21 - 1) >> 23) - 135)`,
/// the bump at a mantissa past 1.75 being the carry of the added 2^21 - 1) is `block_exponent`
/// clamped to the kernels' -126 on every f32 that is not NaN: all 2^31 - 2^23 + 1 non-negative ones
/// (the maxima it gets), and every 4,099th of the negative ones (-126, as the branchy form gives).
/// The formula is read from the CUDA source, so the test follows an edit of either.
#[test]
fn the_kernels_short_block_exponent_is_the_block_exponent_on_every_non_nan() {
    assert_cuda_body(
        include_str!("../cuda/attn_common.cuh"),
        "int e4m3_scale_exp_nn(float amax) {",
        &[
            "const u32 u = __float_as_uint(amax) + 0x1fffffu;",
            "return max(-126, ((int)u >> 23) - 135);",
        ],
    );
    let model = |bits: u32| (((bits.wrapping_add(0x1f_ffff) as i32) >> 23) - 135).max(-126);
    let spec = |x: f32| (block_exponent(x) as i32).max(-126);
    let check = |bits: u32| {
        let x = f32::from_bits(bits);
        let want = if x > 0.0 { spec(x) } else { -126 };
        assert_eq!(model(bits), want, "amax bits {bits:#010x} ({x:e})");
    };
    (0..=0x7f80_0000u32).for_each(check);
    (0x8000_0000..=0xff80_0000u32).step_by(4099).for_each(check);
    check(0xff80_0000);
}

/// The quantiser's branch-free block exponent (`block_exponent_nn` in `cuda/formats.cuh`,
/// `max(EXP_MIN, ((bits + 2^21 - 1) >> 23) - 135)`, for the maxima it takes: >= +0, never NaN)
/// is `block_exponent` itself on all 2^31 - 2^23 + 1 such f32 (zero, subnormals and +inf
/// included; no upper clamp is needed: +inf gives 120). Read from the CUDA source, as above.
#[test]
fn the_quantisers_branch_free_block_exponent_is_the_block_exponent() {
    assert_cuda_body(
        include_str!("../cuda/formats.cuh"),
        "int block_exponent_nn(float amax) {",
        &["return max(EXP_MIN, (int)((__float_as_uint(amax) + 0x1fffffu) >> 23) - 135);"],
    );
    let model = |bits: u32| ((bits.wrapping_add(0x1f_ffff) >> 23) as i32 - 135).max(EXP_MIN as i32);
    for bits in 0..=0x7f80_0000u32 {
        let x = f32::from_bits(bits);
        assert_eq!(
            model(bits),
            block_exponent(x) as i32,
            "amax bits {bits:#010x} ({x:e})"
        );
    }
}
