//! Number formats of FLAMIA, bit for bit: E4M3 (OCP FP8), E2M1 (FP4) and power-of-two block
//! exponents. Everything here is integer/bit arithmetic on IEEE-754 binary32, so a GPU can
//! reproduce it exactly (see `docs/numerics.md`, "Bit-level contract").
//!
//! - **E4M3** (OCP FP8): 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448; no infinities;
//!   NaN = `0x7F`/`0xFF`; subnormals `m * 2^-9`. [`e4m3_encode`] rounds to nearest, ties to even,
//!   saturates every finite |x| >= 448 (and infinities) to ±448 and keeps the sign of zero. It is
//!   exactly PTX `cvt.rn.satfinite.e4m3x2.f32` (`__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)`)
//!   on finite input.
//! - **E2M1** (FP4): 1 sign, 2 exponent (bias 1), 1 mantissa bit: magnitudes
//!   {0, 0.5, 1, 1.5, 2, 3, 4, 6}; round to nearest, ties to even code, saturating at 6.
//! - **Block exponents**: [`block_exponent`] is the smallest `e` with `amax <= 448 * 2^e`
//!   (= `ceil(log2(amax / 448))`, rounded up so no code of the block clips), computed from the bits
//!   of `amax`; clamped to [`EXP_MIN`, `EXP_MAX`]; `amax == 0` (or an f32 subnormal amax) gives
//!   [`EXP_MIN`]. [`floor_exponent`] is the leaky OCP-MX rule `floor(log2(amax)) - 8`.

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// Smallest block exponent: all-zero blocks (and blocks whose amax is an f32 subnormal) get it.
/// `2^-EXP_MIN = 2^127` is still a normal f32, so scaling by it is exact.
pub const EXP_MIN: i8 = -127;
/// Largest block exponent (the largest f32 amax gives 120; the clamp never binds for finite input).
pub const EXP_MAX: i8 = 127;

/// The E4M3 NaN code used for NaN input (positive sign).
pub const E4M3_NAN: u8 = 0x7F;

/// Decodes an E4M3 code to its exact value (NaN for `0x7F`/`0xFF`).
#[inline]
pub fn e4m3_decode(code: u8) -> f32 {
    E4M3_TABLE[code as usize]
}

/// The 256 E4M3 values, indexed by code.
pub static E4M3_TABLE: [f32; 256] = build_e4m3_table();

const fn build_e4m3_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut c = 0usize;
    while c < 256 {
        let exp = ((c >> 3) & 0xF) as i32;
        let man = (c & 7) as u32;
        let mag = if exp == 15 && man == 7 {
            f32::NAN
        } else if exp == 0 {
            // m * 2^-9
            man as f32 / 512.0
        } else {
            // (8 + m) * 2^(exp - 10), built from bits: exact.
            f32::from_bits((((exp - 7 + 127) as u32) << 23) | (man << 20))
        };
        t[c] = if c & 0x80 != 0 { -mag } else { mag };
        c += 1;
    }
    t
}

/// Encodes `x` to E4M3: round to nearest even, saturating to ±448, sign of zero kept, NaN -> `0x7F`.
///
/// Bit-level algorithm (binary32 in, integer arithmetic only):
/// 1. `s` = sign bit of `x`; `a = |x|`. If `a >= 448` (or infinite): `s | 0x7E`.
/// 2. If `a < 2^-6` (E4M3 subnormal range): `q = round_half_even(a * 2^9)` (the product is exact),
///    code `s | q` (`q == 8` correctly becomes the smallest normal `0x08`).
/// 3. Else with `E` = unbiased exponent of `a` and `f` its 23 fraction bits: keep the top 3 bits,
///    round the 20 dropped bits half-to-even, code `s | (((E + 7) << 3) + m + carry)`; a result of
///    `0x7F` (a value that rounds to 480) saturates to `0x7E`.
#[inline]
pub fn e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abits = bits & 0x7FFF_FFFF;
    let a = f32::from_bits(abits);
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    if a < 1.0 / 64.0 {
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    let e = (abits >> 23) as i32 - 127; // -6..=8
    let frac = abits & 0x7F_FFFF;
    let man = frac >> 20;
    let rest = frac & 0xF_FFFF;
    let round_up = rest > 0x8_0000 || (rest == 0x8_0000 && (man & 1) == 1);
    let code = (((e + 7) as u32) << 3) + man + round_up as u32;
    sign | (code.min(0x7E) as u8)
}

/// The 8 E2M1 magnitudes, indexed by the 3 magnitude bits of the code.
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decodes a 4-bit E2M1 code (low nibble; bit 3 is the sign).
pub fn e2m1_decode(code: u8) -> f32 {
    let m = E2M1_MAGNITUDES[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// Encodes `x` to a 4-bit E2M1 code: round to nearest, ties to the even code, saturating at ±6,
/// sign kept (also for zero), NaN is not allowed (callers validate input) and maps to ±6.
///
/// Decision points on `a = |x|` (ties go to the code with mantissa bit 0):
/// `a <= 0.25 -> 0`, `< 0.75 -> 0.5`, `<= 1.25 -> 1`, `< 1.75 -> 1.5`, `<= 2.5 -> 2`,
/// `< 3.5 -> 3`, `<= 5 -> 4`, else `6`.
pub fn e2m1_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8u8 } else { 0 };
    let a = x.abs();
    let m = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | m
}

/// Smallest `e` with `amax <= limit * 2^e`, where `limit = (1 + limit_frac / 2^23) * 2^limit_exp`
/// (a binary32 with fraction bits `limit_frac`), clamped to [`EXP_MIN`, `EXP_MAX`].
/// With `amax = (1 + f / 2^23) * 2^E`: `e = E - limit_exp + (f > limit_frac)`.
fn exponent_above(amax: f32, limit_exp: i32, limit_frac: u32) -> i8 {
    let bits = amax.to_bits() & 0x7FFF_FFFF;
    let biased = (bits >> 23) as i32;
    if biased == 0 {
        return EXP_MIN; // zero or f32 subnormal: far below any non-clamped exponent
    }
    let e = biased - 127 - limit_exp + ((bits & 0x7F_FFFF) > limit_frac) as i32;
    e.clamp(EXP_MIN as i32, EXP_MAX as i32) as i8
}

/// Block exponent of E4M3 quantisation: smallest `e` with `amax <= 448 * 2^e`
/// (`448 = 1.75 * 2^8`: fraction bits `0x600000`). `amax = 448 * 2^k` gives exactly `k`.
#[inline]
pub fn block_exponent(amax: f32) -> i8 {
    exponent_above(amax, 8, 0x60_0000)
}

/// Per-token second-level exponent of NVFP4: smallest `e` with `amax <= 6 * 448 * 2^e`
/// (`2688 = 1.3125 * 2^11`: fraction bits `0x280000`).
pub fn nvfp4_token_exponent(amax: f32) -> i8 {
    exponent_above(amax, 11, 0x28_0000)
}

/// The leaky OCP-MX rule (exponent rounded *down*): `floor(log2(amax)) - 8`, so the scaled amax
/// lies in [256, 512) and values above 448 clip. Zero/subnormal amax gives [`EXP_MIN`].
pub fn floor_exponent(amax: f32) -> i8 {
    let bits = amax.to_bits() & 0x7FFF_FFFF;
    let biased = (bits >> 23) as i32;
    if biased == 0 {
        return EXP_MIN;
    }
    (biased - 127 - 8).clamp(EXP_MIN as i32, EXP_MAX as i32) as i8
}

/// `2^e` as f32 for `e` in `[-126, 127]` (built from bits, exact).
#[inline]
pub fn pow2_f32(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `2^e` as f64 for `e` in `[-1022, 1023]` (built from bits, exact).
#[inline]
pub fn pow2_f64(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Quantises one value with block exponent `e`: `e4m3_encode(x * 2^-e)`. The multiply is exact
/// (a power of two; only values that end far below the smallest E4M3 subnormal can lose bits, and
/// those encode to ±0 either way).
#[inline]
pub fn quantize_e4m3_scaled(x: f32, e: i8) -> u8 {
    e4m3_encode(x * pow2_f32(-(e as i32)))
}

/// Reconstructs `decode(code) * 2^e` exactly in f64.
#[inline]
pub fn dequantize_e4m3(code: u8, e: i8) -> f64 {
    e4m3_decode(code) as f64 * pow2_f64(e as i32)
}
