//! The FLAMIA CPU reference: attention forward (O, LSE) and backward (dQ, dK, dV) for every path
//! and precision option, structured as the GPU kernels run it (128-query x 128-key tiles, online
//! softmax, masked diagonal tiles, P with the V exponent folded, D from the quantised dO, dS with
//! 32x32 power-of-two block scales). It is the numerical specification GPU kernels are tested
//! against; the design and the exact rules are in `docs/numerics.md`.
//!
//! Layouts: `q`, `o`, `dout`, `dq`: `(tokens, heads_q, head_dim)`; `k`, `v`, `dk`, `dv`:
//! `(tokens, heads_kv, head_dim)`; `lse`: `(tokens, heads_q)` (natural log of the softmax
//! denominator of the scaled scores). All binary32. Quantised paths return BF16-representable
//! values (the kernels' output format); `exact` accumulates in f64 and returns f32.
//!
//! ```
//! use flamia_kernels::{reference, AttnOptions, AttnPath, VarlenShape};
//! let shape = VarlenShape::from_lens(&[3, 2], 2, 1, 64).unwrap();
//! let n = |h: usize| (0..5 * h * 64).map(|i| ((i * 7919 % 97) as f32 / 97.0) - 0.5).collect::<Vec<f32>>();
//! let (q, k, v, dout) = (n(2), n(1), n(1), n(2));
//! let opts = AttnOptions::new(AttnPath::Mxfp8);
//! let fwd = reference::forward(&q, &k, &v, &shape, &opts).unwrap();
//! let g = reference::backward(&q, &k, &v, &fwd.o, &fwd.lse, &dout, &shape, &opts).unwrap();
//! assert_eq!(g.dq.len(), q.len());
//! // The same as one call:
//! let call = flamia_kernels::AttnCall::new(q, k, v, dout, shape, opts).unwrap();
//! let (f2, g2) = reference::forward_backward(&call).unwrap();
//! assert_eq!((f2, g2), (fwd, g));
//! ```

mod bwd;
mod fwd;
mod operands;

pub use fwd::TILE;

use crate::call::AttnCall;
use crate::error::{Error, Result};
use crate::options::{AttnOptions, VarlenShape};
use crate::quant::{check_finite, check_len};
use fwd::Ctx;

/// Forward outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// `(tokens, heads_q, head_dim)`.
    pub o: Vec<f32>,
    /// `(tokens, heads_q)`, natural log.
    pub lse: Vec<f32>,
}

/// Backward outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    /// `(tokens, heads_q, head_dim)`.
    pub dq: Vec<f32>,
    /// `(tokens, heads_kv, head_dim)`.
    pub dk: Vec<f32>,
    /// `(tokens, heads_kv, head_dim)`.
    pub dv: Vec<f32>,
    /// Fraction of the non-zero (visible) dS elements that rounded to zero in E4M3 (0 on `exact`).
    pub ds_zero_fraction: f64,
}

fn validate_qkv(q: &[f32], k: &[f32], v: &[f32], shape: &VarlenShape, opts: &AttnOptions) -> Result<()> {
    shape.validate()?;
    let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
    if q.len().is_multiple_of(hq * d) {
        shape.check_tokens(q.len() / (hq * d))?;
    }
    check_len("q", q, t, hq, d)?;
    check_len("k", k, t, hkv, d)?;
    check_len("v", v, t, hkv, d)?;
    check_finite("q", q, hq, d)?;
    check_finite("k", k, hkv, d)?;
    check_finite("v", v, hkv, d)?;
    let scale = opts.scale(d);
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::Invalid(format!(
            "softmax_scale must be finite and positive, got {scale}"
        )));
    }
    Ok(())
}

fn ctx<'a>(shape: &'a VarlenShape, prep: &'a operands::Prepared, opts: &AttnOptions) -> Ctx<'a> {
    let scale = opts.scale(shape.head_dim) as f64;
    Ctx {
        shape,
        prep,
        causal: opts.causal,
        c: scale * std::f64::consts::LOG2_E,
        scale,
    }
}

/// Attention forward on packed documents. Errors on bad shapes and non-finite input.
pub fn forward(q: &[f32], k: &[f32], v: &[f32], shape: &VarlenShape, opts: &AttnOptions) -> Result<Forward> {
    validate_qkv(q, k, v, shape, opts)?;
    let prep = operands::prepare(q, k, v, shape, opts)?;
    let (o, lse) = fwd::forward(&ctx(shape, &prep, opts));
    Ok(Forward { o, lse })
}

/// Attention backward: recomputes the quantised operands deterministically (same codes as the
/// forward), P from the saved `lse`, and returns dQ, dK, dV in the original (unrotated) basis.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    lse: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
) -> Result<Grads> {
    validate_qkv(q, k, v, shape, opts)?;
    let (t, hq, d) = (shape.tokens(), shape.heads_q, shape.head_dim);
    check_len("o", o, t, hq, d)?;
    check_len("dout", dout, t, hq, d)?;
    check_len("lse", lse, t, hq, 1)?;
    check_finite("o", o, hq, d)?;
    check_finite("dout", dout, hq, d)?;
    check_finite("lse", lse, hq, 1)?;
    let prep = operands::prepare(q, k, v, shape, opts)?;
    let dout_op = operands::prepare_dout(dout, shape, opts)?;
    let c = ctx(shape, &prep, opts);
    let b = bwd::BwdCtx::new(
        &c,
        &dout_op,
        o,
        lse,
        opts.precision.row_ds_exponents,
        opts.precision.causal_dq_scaling,
    );
    let (dq, dk, dv, ds_zero_fraction) = bwd::backward(&b);
    Ok(Grads {
        dq,
        dk,
        dv,
        ds_zero_fraction,
    })
}

/// Forward then backward of one call (what one training step does).
pub fn forward_backward(call: &AttnCall) -> Result<(Forward, Grads)> {
    let AttnCall {
        q,
        k,
        v,
        dout,
        shape,
        opts,
    } = call;
    let f = forward(q, k, v, shape, opts)?;
    let g = backward(q, k, v, &f.o, &f.lse, dout, shape, opts)?;
    Ok((f, g))
}
