//! Quantisers over packed documents: E4M3 with power-of-two token-block scales (the MXFP8 operand
//! format of Q, K, V, dO) and NVFP4 (Q, K of the mixed path).
//!
//! Input: `(tokens, heads, head_dim)` row-major binary32, documents delimited by `cu_seqlens`.
//! Output layouts:
//! - [`E4m3Tensor`]: `codes` `(tokens, heads, head_dim)` u8; `exps` dense per-token table
//!   `(tokens, heads)` i8 (every token of a block repeats the block's exponent, so kernels never
//!   need document offsets to find a scale). Value = `decode(code) * 2^exp`, exactly.
//! - [`Nvfp4Tensor`]: `codes` `(tokens, heads, head_dim)` u8 holding one E2M1 code in the low
//!   nibble; `group_scales` `(tokens, heads, head_dim / 16)` E4M3 codes; `token_exps` `(tokens,
//!   heads)` i8. Value = `e2m1(code) * e4m3(group_scale) * 2^token_exp`, exactly.
//!
//! Bit-level contract of [`quantize_e4m3`] (per head):
//! 1. Blocks: [`ScaleMode::TokenBlock`]: tokens `[s + 32 b, min(s + 32 (b + 1), end))` of each
//!    document `[s, end)` (restarting at every document; the last block may be partial);
//!    [`ScaleMode::PerToken`]: one token; [`ScaleMode::TensorFloor`]: the whole tensor, all heads.
//! 2. `amax` = max of `|x|` over the block (exact).
//! 3. `e = block_exponent(amax)` (smallest `e` with `amax <= 448 * 2^e`, from the bits; all-zero
//!    block: `EXP_MIN = -127`); `TensorFloor` uses `floor_exponent` (rounded down: leaks and clips).
//! 4. `code = e4m3_encode(x * 2^-e)` (exact power-of-two multiply, RNE, saturating).
//!
//! Bit-level contract of [`quantize_nvfp4`] (per token and head, a row `x` of `head_dim`):
//! 1. `e_t = nvfp4_token_exponent(max |x|)`: smallest `e` with `amax <= 2688 * 2^e` (2688 = 6 * 448).
//! 2. Per 16-element group with amax `g`: `sc = e4m3_encode((g * 2^-e_t) / 6)` (IEEE division).
//! 3. Element: if `decode(sc) == 0` the code is `0` with the sign of `x`; else
//!    `e2m1_encode((x * 2^-e_t) / decode(sc))` (IEEE division, RNE, saturating at 6).

use crate::error::{Error, Result};
use crate::formats::{
    block_exponent, e2m1_decode, e2m1_encode, e4m3_decode, e4m3_encode, floor_exponent, nvfp4_token_exponent,
    pow2_f32, pow2_f64, quantize_e4m3_scaled,
};
use crate::options::VarlenShape;

/// Tokens per scale block (the MXFP8 token block).
pub const TOKEN_BLOCK: usize = 32;
/// Head-dim elements per NVFP4 group.
pub const NVFP4_GROUP: usize = 16;

/// How the E4M3 block exponents are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleMode {
    /// One exponent per 32-token block of one document and head (the FLAMIA default).
    TokenBlock,
    /// One exponent per token and head (precision option `per_token_scales`).
    PerToken,
    /// Deliberately leaky control: one exponent for the whole tensor, rounded down.
    TensorFloor,
}

/// E4M3 codes with a dense per-token exponent table (layouts in the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E4m3Tensor {
    pub codes: Vec<u8>,
    pub exps: Vec<i8>,
    pub heads: usize,
    pub head_dim: usize,
}

impl E4m3Tensor {
    /// Exact reconstruction of element `(token, head, dim)`.
    pub fn value(&self, token: usize, head: usize, dim: usize) -> f64 {
        let i = (token * self.heads + head) * self.head_dim + dim;
        e4m3_decode(self.codes[i]) as f64 * pow2_f64(self.exps[token * self.heads + head] as i32)
    }

    /// Exact reconstruction of the whole tensor, `(tokens, heads, head_dim)`.
    pub fn dequantize(&self) -> Vec<f64> {
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &c)| e4m3_decode(c) as f64 * pow2_f64(self.exps[i / self.head_dim] as i32))
            .collect()
    }
}

/// NVFP4 codes, E4M3 group scales and per-token exponents (layouts in the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvfp4Tensor {
    pub codes: Vec<u8>,
    pub group_scales: Vec<u8>,
    pub token_exps: Vec<i8>,
    pub heads: usize,
    pub head_dim: usize,
}

impl Nvfp4Tensor {
    /// `e2m1(code) * e4m3(group_scale)` of element `i` (flat index), without the token exponent.
    pub fn mantissa_value(&self, i: usize) -> f64 {
        e2m1_decode(self.codes[i]) as f64 * e4m3_decode(self.group_scales[i / NVFP4_GROUP]) as f64
    }

    /// Exact reconstruction of the whole tensor, `(tokens, heads, head_dim)`.
    pub fn dequantize(&self) -> Vec<f64> {
        (0..self.codes.len())
            .map(|i| self.mantissa_value(i) * pow2_f64(self.token_exps[i / self.head_dim] as i32))
            .collect()
    }
}

/// Errors with [`Error::NonFinite`] at the first NaN/Inf of a `(tokens, heads, head_dim)` tensor.
pub fn check_finite(tensor: &'static str, x: &[f32], heads: usize, head_dim: usize) -> Result<()> {
    match x.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(Error::NonFinite {
            tensor,
            index,
            token: index / (heads * head_dim),
            head: index / head_dim % heads,
            dim: index % head_dim,
            value: x[index],
        }),
    }
}

/// Errors unless `x` holds `tokens * heads * head_dim` elements.
pub fn check_len(
    tensor: &'static str,
    x: &[f32],
    tokens: usize,
    heads: usize,
    head_dim: usize,
) -> Result<()> {
    let want = tokens * heads * head_dim;
    if x.len() != want {
        return Err(Error::Invalid(format!(
            "{tensor} has {} elements; expected tokens x heads x head_dim = {tokens} x {heads} x {head_dim} = {want}",
            x.len()
        )));
    }
    Ok(())
}

/// Validates `cu_seqlens`, head dim and the tensor before quantising.
fn validate(
    tensor: &'static str,
    x: &[f32],
    cu_seqlens: &[usize],
    heads: usize,
    head_dim: usize,
) -> Result<usize> {
    let shape = VarlenShape::new(cu_seqlens.to_vec(), heads, heads, head_dim)?;
    let tokens = shape.tokens();
    check_len(tensor, x, tokens, heads, head_dim)?;
    check_finite(tensor, x, heads, head_dim)?;
    Ok(tokens)
}

/// Quantises a `(tokens, heads, head_dim)` tensor to E4M3 with power-of-two block exponents
/// (contract in the module docs). `tensor` names it in errors.
pub fn quantize_e4m3(
    tensor: &'static str,
    x: &[f32],
    cu_seqlens: &[usize],
    heads: usize,
    head_dim: usize,
    mode: ScaleMode,
) -> Result<E4m3Tensor> {
    let tokens = validate(tensor, x, cu_seqlens, heads, head_dim)?;
    let mut exps = vec![0i8; tokens * heads];
    let row = |t: usize, h: usize| &x[(t * heads + h) * head_dim..(t * heads + h + 1) * head_dim];
    let amax_of = |t0: usize, t1: usize, h: usize| {
        (t0..t1)
            .flat_map(|t| row(t, h).iter())
            .fold(0f32, |m, v| m.max(v.abs()))
    };
    match mode {
        ScaleMode::TensorFloor => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            exps.fill(floor_exponent(amax));
        }
        ScaleMode::TokenBlock | ScaleMode::PerToken => {
            let block = if mode == ScaleMode::PerToken {
                1
            } else {
                TOKEN_BLOCK
            };
            for d in cu_seqlens.windows(2) {
                let (s, end) = (d[0], d[1]);
                for t0 in (s..end).step_by(block) {
                    let t1 = (t0 + block).min(end);
                    for h in 0..heads {
                        let e = block_exponent(amax_of(t0, t1, h));
                        for t in t0..t1 {
                            exps[t * heads + h] = e;
                        }
                    }
                }
            }
        }
    }
    let codes = x
        .iter()
        .enumerate()
        .map(|(i, &v)| quantize_e4m3_scaled(v, exps[i / head_dim]))
        .collect();
    Ok(E4m3Tensor {
        codes,
        exps,
        heads,
        head_dim,
    })
}

/// Quantises a `(tokens, heads, head_dim)` tensor to NVFP4 with per-token power-of-two second-level
/// scales (contract in the module docs). Needs no document boundaries: every scale is per token.
pub fn quantize_nvfp4(
    tensor: &'static str,
    x: &[f32],
    cu_seqlens: &[usize],
    heads: usize,
    head_dim: usize,
) -> Result<Nvfp4Tensor> {
    let tokens = validate(tensor, x, cu_seqlens, heads, head_dim)?;
    let mut codes = vec![0u8; x.len()];
    let mut group_scales = vec![0u8; x.len() / NVFP4_GROUP];
    let mut token_exps = vec![0i8; tokens * heads];
    for (r, row) in x.chunks_exact(head_dim).enumerate() {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = nvfp4_token_exponent(amax);
        token_exps[r] = e;
        let inv = pow2_f32(-(e as i32));
        for (g, grp) in row.chunks_exact(NVFP4_GROUP).enumerate() {
            let gi = r * head_dim / NVFP4_GROUP + g;
            let gmax = grp.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sc = e4m3_encode((gmax * inv) / 6.0);
            group_scales[gi] = sc;
            let scale = e4m3_decode(sc);
            for (k, &v) in grp.iter().enumerate() {
                let i = r * head_dim + g * NVFP4_GROUP + k;
                codes[i] = if scale == 0.0 {
                    (v.is_sign_negative() as u8) << 3
                } else {
                    e2m1_encode((v * inv) / scale)
                };
            }
        }
    }
    Ok(Nvfp4Tensor {
        codes,
        group_scales,
        token_exps,
        heads,
        head_dim,
    })
}
