//! Operands of the reference as the kernels see them: quantised (or exact) Q, K, V, dO, turned
//! into exact f64 reconstructions laid out head-major `(heads, tokens, head_dim)` for contiguous
//! per-head access, with the dense per-token exponent table `(heads, tokens)` kept beside them
//! (the folds of section 3 of `hopper-kernels.md` need the exponents).
//!
//! Which representation each path uses:
//! - `exact`: the f32 inputs, no rotation, no quantisation.
//! - `mxfp8`: Q, K (rotated when `hadamard`), V, dO as E4M3 with 32-token blocks (or per-token
//!   scales with `per_token_scales`); the same Q, K codes feed the scores and the gradients.
//! - `nvfp4`: scores from NVFP4 Q, K; gradients (dK = dS^T Q, dQ = dS K), V and dO from E4M3.
//! - `leaky-fp8`: as `mxfp8` but every E4M3 operand has one tensor-wide exponent rounded down.

use crate::error::Result;
use crate::formats::pow2_f64;
use crate::hadamard::rotate_rows;
use crate::options::{AttnOptions, AttnPath, VarlenShape};
use crate::quant::{quantize_e4m3, quantize_nvfp4, E4m3Tensor, Nvfp4Tensor, ScaleMode};

/// Exact values of one operand, head-major, and its per-token exponents (0 for exact operands).
#[derive(Debug, Clone)]
pub(crate) struct Operand {
    pub tokens: usize,
    pub head_dim: usize,
    /// `(heads, tokens, head_dim)`: `decode(code) * 2^exp`, exact in f64.
    pub real: Vec<f64>,
    /// `(heads, tokens)`: the token's block exponent.
    pub exps: Vec<i32>,
}

impl Operand {
    fn empty(tokens: usize, heads: usize, head_dim: usize) -> Operand {
        Operand {
            tokens,
            head_dim,
            real: vec![0.0; tokens * heads * head_dim],
            exps: vec![0; tokens * heads],
        }
    }

    fn put(&mut self, heads: usize, flat: usize, value: f64) {
        let d = self.head_dim;
        let (t, h, k) = (flat / (heads * d), flat / d % heads, flat % d);
        self.real[(h * self.tokens + t) * d + k] = value;
    }

    /// Unquantised f32 input.
    pub fn exact(x: &[f32], tokens: usize, heads: usize, head_dim: usize) -> Operand {
        let mut o = Operand::empty(tokens, heads, head_dim);
        for (i, &v) in x.iter().enumerate() {
            o.put(heads, i, v as f64);
        }
        o
    }

    /// E4M3 codes and their dense exponent table.
    pub fn e4m3(q: &E4m3Tensor, tokens: usize) -> Operand {
        let (heads, d) = (q.heads, q.head_dim);
        let mut o = Operand::empty(tokens, heads, d);
        for (i, v) in q.dequantize().into_iter().enumerate() {
            o.put(heads, i, v);
        }
        for t in 0..tokens {
            for h in 0..heads {
                o.exps[h * tokens + t] = q.exps[t * heads + h] as i32;
            }
        }
        o
    }

    /// NVFP4 codes (exponents are the per-token second-level scales).
    pub fn nvfp4(q: &Nvfp4Tensor, tokens: usize) -> Operand {
        let (heads, d) = (q.heads, q.head_dim);
        let mut o = Operand::empty(tokens, heads, d);
        for (i, v) in q.dequantize().into_iter().enumerate() {
            o.put(heads, i, v);
        }
        for t in 0..tokens {
            for h in 0..heads {
                o.exps[h * tokens + t] = q.token_exps[t * heads + h] as i32;
            }
        }
        o
    }

    /// Row of token `t` in head `h`.
    #[inline]
    pub fn row(&self, h: usize, t: usize) -> &[f64] {
        let d = self.head_dim;
        &self.real[(h * self.tokens + t) * d..(h * self.tokens + t + 1) * d]
    }

    /// Exponent of token `t` in head `h`.
    #[inline]
    pub fn exp(&self, h: usize, t: usize) -> i32 {
        self.exps[h * self.tokens + t]
    }

    /// `max |x|` over the row of token `t` in head `h`.
    pub fn row_amax(&self, h: usize, t: usize) -> f64 {
        self.row(h, t).iter().fold(0.0, |m, v| m.max(v.abs()))
    }
}

/// Q, K, V of one call, prepared for the path.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub quantised: bool,
    pub rotated: bool,
    /// Score operands (`S = Qs Ks^T`).
    pub qs: Operand,
    pub ks: Operand,
    /// Gradient operands (`dK = dS^T Qg`, `dQ = dS Kg`); `None`: the score operands.
    pub qg: Option<Operand>,
    pub kg: Option<Operand>,
    pub v: Operand,
}

impl Prepared {
    pub fn qg(&self) -> &Operand {
        self.qg.as_ref().unwrap_or(&self.qs)
    }
    pub fn kg(&self) -> &Operand {
        self.kg.as_ref().unwrap_or(&self.ks)
    }
}

/// The E4M3 scale mode of the path's token-block operands.
pub(crate) fn scale_mode(opts: &AttnOptions) -> ScaleMode {
    match (opts.path, opts.precision.per_token_scales) {
        (AttnPath::LeakyFp8, _) => ScaleMode::TensorFloor,
        (_, true) => ScaleMode::PerToken,
        (_, false) => ScaleMode::TokenBlock,
    }
}

/// Quantises (or copies) Q, K, V for the path. Inputs are validated by the caller.
pub(crate) fn prepare(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
) -> Result<Prepared> {
    let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
    let cu = &shape.cu_seqlens;
    if opts.path == AttnPath::Exact {
        return Ok(Prepared {
            quantised: false,
            rotated: false,
            qs: Operand::exact(q, t, hq, d),
            ks: Operand::exact(k, t, hkv, d),
            qg: None,
            kg: None,
            v: Operand::exact(v, t, hkv, d),
        });
    }
    let rotated = opts.precision.hadamard;
    let (qr, kr) = if rotated {
        (rotate_rows(q, d)?, rotate_rows(k, d)?)
    } else {
        (q.to_vec(), k.to_vec())
    };
    let mode = scale_mode(opts);
    let q8 = Operand::e4m3(&quantize_e4m3("q", &qr, cu, hq, d, mode)?, t);
    let k8 = Operand::e4m3(&quantize_e4m3("k", &kr, cu, hkv, d, mode)?, t);
    let v8 = Operand::e4m3(&quantize_e4m3("v", v, cu, hkv, d, mode)?, t);
    let prepared = if opts.path == AttnPath::Nvfp4 {
        Prepared {
            quantised: true,
            rotated,
            qs: Operand::nvfp4(&quantize_nvfp4("q", &qr, cu, hq, d)?, t),
            ks: Operand::nvfp4(&quantize_nvfp4("k", &kr, cu, hkv, d)?, t),
            qg: Some(q8),
            kg: Some(k8),
            v: v8,
        }
    } else {
        Prepared {
            quantised: true,
            rotated,
            qs: q8,
            ks: k8,
            qg: None,
            kg: None,
            v: v8,
        }
    };
    Ok(prepared)
}

/// dO for the path (E4M3 token blocks as V, or exact).
pub(crate) fn prepare_dout(dout: &[f32], shape: &VarlenShape, opts: &AttnOptions) -> Result<Operand> {
    let (t, hq, d) = (shape.tokens(), shape.heads_q, shape.head_dim);
    if opts.path == AttnPath::Exact {
        return Ok(Operand::exact(dout, t, hq, d));
    }
    Ok(Operand::e4m3(
        &quantize_e4m3("dout", dout, &shape.cu_seqlens, hq, d, scale_mode(opts))?,
        t,
    ))
}

/// Dot product with 16 interleaved accumulators summed as a fixed tree (deterministic, and the
/// same bits whatever the vector width the compiler picks: no FMA, no reassociation). On
/// quantised operands every product and partial sum is exact in f64, so the order does not
/// matter there. Lengths are multiples of 16 (head dims 64, 128).
#[inline(always)]
pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0f64; 16];
    for (x, y) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            s[l] += x[l] * y[l];
        }
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            s[l] += s[l + w];
        }
    }
    s[0]
}

/// `acc += w * x`.
#[inline(always)]
pub(crate) fn axpy(acc: &mut [f64], w: f64, x: &[f64]) {
    for (a, v) in acc.iter_mut().zip(x) {
        *a += w * v;
    }
}

/// `2^e` for exponents that may fall outside f64's normal range in degenerate cases.
#[inline]
pub(crate) fn pow2(e: i32) -> f64 {
    pow2_f64(e.clamp(-1022, 1023))
}
