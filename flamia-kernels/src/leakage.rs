//! Causal-leakage and document-isolation harness (hopper-kernels.md section 5) over the reference
//! (or any attention with the reference's signature, see [`AttnFn`]).
//!
//! **Causal leakage at `t`**: the keys and values of every position `> t` are multiplied by a
//! factor (1e3: it raises their blocks' amax), and everything is recomputed. The gradients are
//! those of a loss that reads outputs up to a *horizon* only (`dout` rows after it are zero in
//! both runs), so mathematically every output and gradient at positions `<= horizon` depends on
//! inputs at positions `<= horizon` only; any change there is leakage.
//! - `up_to_t`: horizon `t`, positions `<= t` (the precision options must give bitwise zero).
//! - `in_own_block`: horizon `t`, positions `[b, t]` where `b` starts the 32-token block (of its
//!   document) holding `t + 1`, the first perturbed token.
//! - `before_own_block`: horizon `b - 1`, positions `< b` (default MXFP8 must give bitwise zero:
//!   token-block scales confine the leak to the perturbed token's own block).
//!
//! **Document isolation**: one document's q, k, v and dout are multiplied by a factor (1e4); the
//! outputs and gradients of every other document must be bitwise unchanged.
//!
//! A change is `max |new - old| / max |old|` over the region, per tensor (O by query position,
//! dQ by query position, dK and dV by key position); `changed` counts elements whose bits differ.

use crate::error::{Error, Result};
use crate::options::{AttnOptions, VarlenShape};
use crate::quant::TOKEN_BLOCK;
use crate::reference::{self, Forward, Grads};
use serde::Serialize;

/// An attention implementation: `(q, k, v, dout, shape, opts) -> (forward, grads)`.
pub type AttnFn<'a> = dyn Fn(&[f32], &[f32], &[f32], &[f32], &VarlenShape, &AttnOptions) -> Result<(Forward, Grads)>
    + Sync
    + 'a;

/// Relative change of each output over a region, and how many elements changed bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Change {
    pub o: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    /// Elements (over the four tensors) whose bits differ.
    pub changed: usize,
}

impl Change {
    /// Largest relative change over O, dQ, dK, dV.
    pub fn max(&self) -> f64 {
        self.o.max(self.dq).max(self.dk).max(self.dv)
    }

    /// True when every element of the region is bitwise unchanged.
    pub fn bitwise_zero(&self) -> bool {
        self.changed == 0
    }
}

/// Result of [`causal_leakage`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CausalLeak {
    /// Last unperturbed position.
    pub t: usize,
    /// Start of the 32-token block holding `t + 1`.
    pub block_start: usize,
    pub up_to_t: Change,
    pub in_own_block: Change,
    pub before_own_block: Change,
}

/// Compares one `(tokens, heads, head_dim)` tensor over token positions in `positions`.
fn compare(old: &[f32], new: &[f32], heads: usize, d: usize, positions: &[(usize, usize)]) -> (f64, usize) {
    let (mut num, mut den, mut changed) = (0f64, 0f64, 0usize);
    for &(a, b) in positions {
        let r = a * heads * d..b * heads * d;
        for (&x, &y) in old[r.clone()].iter().zip(&new[r]) {
            num = num.max((x as f64 - y as f64).abs());
            den = den.max((x as f64).abs());
            changed += (x.to_bits() != y.to_bits()) as usize;
        }
    }
    let rel = if num == 0.0 {
        0.0
    } else if den == 0.0 {
        f64::INFINITY
    } else {
        num / den
    };
    (rel, changed)
}

fn change(
    shape: &VarlenShape,
    a: &(Forward, Grads),
    b: &(Forward, Grads),
    positions: &[(usize, usize)],
) -> Change {
    let (hq, hkv, d) = (shape.heads_q, shape.heads_kv, shape.head_dim);
    let (o, c1) = compare(&a.0.o, &b.0.o, hq, d, positions);
    let (dq, c2) = compare(&a.1.dq, &b.1.dq, hq, d, positions);
    let (dk, c3) = compare(&a.1.dk, &b.1.dk, hkv, d, positions);
    let (dv, c4) = compare(&a.1.dv, &b.1.dv, hkv, d, positions);
    Change {
        o,
        dq,
        dk,
        dv,
        changed: c1 + c2 + c3 + c4,
    }
}

/// Multiplies token rows `[a, b)` of a `(tokens, heads, head_dim)` tensor by `f`.
fn scale_rows(x: &mut [f32], heads: usize, d: usize, a: usize, b: usize, f: f32) {
    x[a * heads * d..b * heads * d].iter_mut().for_each(|v| *v *= f);
}

/// Start of the 32-token block (of its document) holding position `p`.
fn block_start(shape: &VarlenShape, p: usize) -> usize {
    let s = shape
        .cu_seqlens
        .iter()
        .rev()
        .find(|&&s| s <= p)
        .copied()
        .unwrap_or(0);
    s + (p - s) / TOKEN_BLOCK * TOKEN_BLOCK
}

/// Causal-leakage figures at position `t` with keys and values after `t` multiplied by `factor`
/// (module docs). `attn` runs the attention; pass [`reference_attn`] for the CPU reference.
#[allow(clippy::too_many_arguments)]
pub fn causal_leakage(
    attn: &AttnFn,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
    t: usize,
    factor: f32,
) -> Result<CausalLeak> {
    leak_runs(attn, q, k, v, dout, shape, opts, t, factor, true)
}

/// [`causal_leakage`] without the `before_own_block` runs (2 attention calls instead of 4;
/// `before_own_block` is reported as zero change and must not be read).
#[allow(clippy::too_many_arguments)]
pub fn causal_leakage_up_to_t(
    attn: &AttnFn,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
    t: usize,
    factor: f32,
) -> Result<CausalLeak> {
    leak_runs(attn, q, k, v, dout, shape, opts, t, factor, false)
}

#[allow(clippy::too_many_arguments)]
fn leak_runs(
    attn: &AttnFn,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
    t: usize,
    factor: f32,
    before_block: bool,
) -> Result<CausalLeak> {
    let tokens = shape.tokens();
    if !opts.causal {
        return Err(Error::Invalid(
            "causal leakage needs causal attention (opts.causal = true)".into(),
        ));
    }
    if t + 1 >= tokens {
        return Err(Error::Invalid(format!(
            "leakage position t = {t} must leave a later token (tokens = {tokens})"
        )));
    }
    let (hq, hkv, d) = (shape.heads_q, shape.heads_kv, shape.head_dim);
    let (mut kp, mut vp) = (k.to_vec(), v.to_vec());
    scale_rows(&mut kp, hkv, d, t + 1, tokens, factor);
    scale_rows(&mut vp, hkv, d, t + 1, tokens, factor);
    let b = block_start(shape, t + 1);
    let run = |horizon: usize| -> Result<(Change, Change)> {
        let mut g = dout.to_vec();
        scale_rows(&mut g, hq, d, horizon + 1, tokens, 0.0);
        let base = attn(q, k, v, &g, shape, opts)?;
        let pert = attn(q, &kp, &vp, &g, shape, opts)?;
        Ok((
            change(shape, &base, &pert, &[(0, horizon + 1)]),
            change(shape, &base, &pert, &[(b, horizon + 1)]),
        ))
    };
    let (up_to_t, in_own_block) = run(t)?;
    let before_own_block = if b == 0 || !before_block {
        Change::default()
    } else {
        run(b - 1)?.0
    };
    Ok(CausalLeak {
        t,
        block_start: b,
        up_to_t,
        in_own_block,
        before_own_block,
    })
}

/// Document isolation: multiplies document `doc`'s q, k, v, dout by `factor` and reports the
/// change of every other document's outputs and gradients.
#[allow(clippy::too_many_arguments)]
pub fn doc_isolation(
    attn: &AttnFn,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
    doc: usize,
    factor: f32,
) -> Result<Change> {
    if doc >= shape.docs() || shape.docs() < 2 {
        return Err(Error::Invalid(format!(
            "document isolation needs at least 2 documents and doc < {} (got doc {doc})",
            shape.docs()
        )));
    }
    let (hq, hkv, d) = (shape.heads_q, shape.heads_kv, shape.head_dim);
    let (a, b) = (shape.cu_seqlens[doc], shape.cu_seqlens[doc + 1]);
    let (mut q2, mut k2, mut v2, mut g2) = (q.to_vec(), k.to_vec(), v.to_vec(), dout.to_vec());
    scale_rows(&mut q2, hq, d, a, b, factor);
    scale_rows(&mut k2, hkv, d, a, b, factor);
    scale_rows(&mut v2, hkv, d, a, b, factor);
    scale_rows(&mut g2, hq, d, a, b, factor);
    let base = attn(q, k, v, dout, shape, opts)?;
    let pert = attn(&q2, &k2, &v2, &g2, shape, opts)?;
    Ok(change(shape, &base, &pert, &[(0, a), (b, shape.tokens())]))
}

/// The CPU reference as an [`AttnFn`].
pub fn reference_attn(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dout: &[f32],
    shape: &VarlenShape,
    opts: &AttnOptions,
) -> Result<(Forward, Grads)> {
    reference::forward_backward(q, k, v, dout, shape, opts)
}

/// A default probe position: the 16th token of the block in the middle of the longest document
/// (so the perturbed token's block holds both visible and perturbed tokens).
pub fn default_probe(shape: &VarlenShape) -> usize {
    let (s, e) = shape
        .cu_seqlens
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|&(s, e)| (e - s, usize::MAX - s))
        .unwrap_or((0, shape.tokens()));
    let len = e - s;
    (s + len / 2 / TOKEN_BLOCK * TOKEN_BLOCK + TOKEN_BLOCK / 2 - 1)
        .min(e.saturating_sub(2))
        .max(s)
}
