//! Causal-leakage and document-isolation harness (hopper-kernels.md section 5) over any attention
//! implementation that takes an [`AttnCall`] (see [`AttnFn`]): the CPU reference
//! ([`reference_attn`]) or the GPU kernels (`gpu::host::attn_fn`).
//!
//! **Causal leakage at `t`** ([`causal_leakage`]): the positions `> t` are perturbed and everything
//! is recomputed with dO in full. O, LSE and dQ at a position `i` depend mathematically on inputs
//! at positions `<= i` only, whatever dO is, so any change at positions `<= t` is leakage. Two
//! perturbations, each against the same base run, because one cannot do both jobs:
//! - *scales*: Q, K, V and dO after `t` times a factor (1e3): raises the amax of every operand's
//!   blocks that hold perturbed tokens and the document's maxima. It also makes the perturbed
//!   rows' softmax one-hot, so their dS all but vanish;
//! - *gradients*: V and dO after `t` times the factor, Q and K untouched: P stays as it was and
//!   the perturbed rows' dS grow by `factor^2`, which moves a dS exponent shared with them.
//!
//! Figures (each the larger of the two perturbations; `changed` counts both):
//! - `up_to_t`: O, LSE, dQ over positions `[0, t]` (the precision options must give bitwise zero);
//! - `in_own_block`: the same over `[b, t]`, `b` = start of the 32-token block (of its document)
//!   holding `t + 1`, the first perturbed token;
//! - `before_own_block`: the same over `[0, b)` (default MXFP8 must give bitwise zero on ordinary
//!   inputs: token-block scales confine the leak to the perturbed token's own block);
//! - `horizon`: dK and dV at `j <= t` legitimately depend on later rows' dO, so they are checked
//!   on a second base run whose dO rows after `t` are zero (the gradients of a loss that reads
//!   outputs up to `t`) against the *scales* perturbation of it: O, LSE, dQ, dK, dV over `[0, t]`.
//!
//! [`quiet_prefix`] makes the dO rows up to `t` tiny (`2^-110`), so a dQ prescale taken over the
//! whole document (instead of the keys each row sees) pushes those rows' prescaled partial sums
//! into f32 subnormals in the perturbed run: the input on which `causal_dq_scaling` matters.
//!
//! **Document isolation** ([`doc_isolation`]): one document's q, k, v and dout are multiplied by a
//! factor (1e4); O, LSE, dQ, dK and dV of every other document must be bitwise unchanged.
//!
//! A change is `max |new - old| / max |old|` over the region, per tensor (O, LSE, dQ by query
//! position, dK and dV by key position; 0 for a tensor the region does not compare); `changed`
//! counts elements whose bits differ.

use crate::call::{AttnCall, Input};
use crate::error::{Error, Result};
use crate::options::VarlenShape;
use crate::quant::TOKEN_BLOCK;
use crate::reference::{self, Forward, Grads};
use serde::Serialize;

/// An attention implementation: one call's forward and backward.
pub type AttnFn<'a> = dyn Fn(&AttnCall) -> Result<(Forward, Grads)> + Sync + 'a;

/// Relative change of each output over a region, and how many elements changed bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Change {
    pub o: f64,
    pub lse: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    /// Elements (over the compared tensors) whose bits differ.
    pub changed: usize,
}

impl Change {
    /// Largest relative change over the tensors.
    pub fn max(&self) -> f64 {
        self.o.max(self.lse).max(self.dq).max(self.dk).max(self.dv)
    }

    /// True when every compared element of the region is bitwise unchanged.
    pub fn bitwise_zero(&self) -> bool {
        self.changed == 0
    }

    /// The larger change per tensor, and the changed elements of both.
    pub fn merge(self, other: Change) -> Change {
        Change {
            o: self.o.max(other.o),
            lse: self.lse.max(other.lse),
            dq: self.dq.max(other.dq),
            dk: self.dk.max(other.dk),
            dv: self.dv.max(other.dv),
            changed: self.changed + other.changed,
        }
    }
}

/// Result of [`causal_leakage`] (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CausalLeak {
    /// Last unperturbed position.
    pub t: usize,
    /// Start of the 32-token block holding `t + 1`.
    pub block_start: usize,
    /// O, LSE, dQ over `[0, t]`, dO in full.
    pub up_to_t: Change,
    /// O, LSE, dQ over `[block_start, t]`, dO in full.
    pub in_own_block: Change,
    /// O, LSE, dQ over `[0, block_start)`, dO in full.
    pub before_own_block: Change,
    /// O, LSE, dQ, dK, dV over `[0, t]`, dO after `t` zero in both runs.
    pub horizon: Change,
}

impl CausalLeak {
    /// True when no compared element at a position `<= t` changed (full dO and horizon runs).
    pub fn bitwise_causal(&self) -> bool {
        self.up_to_t.bitwise_zero() && self.horizon.bitwise_zero()
    }
}

/// Compares one `(tokens, heads, width)` tensor over token ranges `[a, b)`.
fn compare(old: &[f32], new: &[f32], width: usize, ranges: &[(usize, usize)]) -> (f64, usize) {
    let (mut num, mut den, mut changed) = (0f64, 0f64, 0usize);
    for &(a, b) in ranges {
        let r = a * width..b * width;
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

/// The change between two runs over token ranges; `kv`: compare dK and dV too.
fn change(
    shape: &VarlenShape,
    a: &(Forward, Grads),
    b: &(Forward, Grads),
    ranges: &[(usize, usize)],
    kv: bool,
) -> Change {
    let (hq, hkv, d) = (shape.heads_q, shape.heads_kv, shape.head_dim);
    let (o, c1) = compare(&a.0.o, &b.0.o, hq * d, ranges);
    let (lse, c2) = compare(&a.0.lse, &b.0.lse, hq, ranges);
    let (dq, c3) = compare(&a.1.dq, &b.1.dq, hq * d, ranges);
    let ((dk, c4), (dv, c5)) = if kv {
        (
            compare(&a.1.dk, &b.1.dk, hkv * d, ranges),
            compare(&a.1.dv, &b.1.dv, hkv * d, ranges),
        )
    } else {
        ((0.0, 0), (0.0, 0))
    };
    Change {
        o,
        lse,
        dq,
        dk,
        dv,
        changed: c1 + c2 + c3 + c4 + c5,
    }
}

/// Start of the 32-token block (of its document) holding position `p`.
pub fn block_start(shape: &VarlenShape, p: usize) -> usize {
    let s = shape
        .cu_seqlens
        .iter()
        .rev()
        .find(|&&s| s <= p)
        .copied()
        .unwrap_or(0);
    s + (p - s) / TOKEN_BLOCK * TOKEN_BLOCK
}

/// Causal-leakage figures at position `t` (module docs): two perturbations of the positions after
/// `t`, each compared with the same base run. Five attention calls.
pub fn causal_leakage(attn: &AttnFn, call: &AttnCall, t: usize, factor: f32) -> Result<CausalLeak> {
    let tokens = call.shape.tokens();
    if !call.opts.causal {
        return Err(Error::Invalid(
            "causal leakage needs causal attention (opts.causal = true)".into(),
        ));
    }
    if t + 1 >= tokens {
        return Err(Error::Invalid(format!(
            "leakage position t = {t} must leave a later token (tokens = {tokens})"
        )));
    }
    let perturbed = |base: &AttnCall, inputs: &[Input]| {
        let mut p = base.clone();
        for &which in inputs {
            p.scale_rows(which, t + 1, tokens, factor);
        }
        p
    };
    let b = block_start(&call.shape, t + 1);
    let shape = &call.shape;
    let base = attn(call)?;
    let scales = attn(&perturbed(call, &Input::ALL))?;
    let grads = attn(&perturbed(call, &[Input::V, Input::Dout]))?;
    let region = |a: usize, z: usize| {
        change(shape, &base, &scales, &[(a, z)], false).merge(change(shape, &base, &grads, &[(a, z)], false))
    };
    let mut horizon_call = call.clone();
    horizon_call.scale_rows(Input::Dout, t + 1, tokens, 0.0);
    let horizon_base = attn(&horizon_call)?;
    let horizon_pert = attn(&perturbed(&horizon_call, &Input::ALL))?;
    Ok(CausalLeak {
        t,
        block_start: b,
        up_to_t: region(0, t + 1),
        in_own_block: region(b, t + 1),
        before_own_block: region(0, b),
        horizon: change(shape, &horizon_base, &horizon_pert, &[(0, t + 1)], true),
    })
}

/// The exponent [`quiet_prefix`] scales dO by.
pub const QUIET_EXP: i32 = -110;

/// `call` with the dO rows `[0, t]` multiplied by `2^QUIET_EXP` (module docs): dQ values of those
/// rows near `2^-110`, still normal binary32, and 30 binades from the subnormals that a
/// document-wide dQ prescale reaches once the rows after `t` are scaled by 1e3.
pub fn quiet_prefix(call: &AttnCall, t: usize) -> AttnCall {
    let mut c = call.clone();
    c.scale_rows(Input::Dout, 0, t + 1, crate::formats::pow2_f32(QUIET_EXP));
    c
}

/// Document isolation: multiplies document `doc`'s q, k, v, dout by `factor` and reports the
/// change of every other document's outputs and gradients. Two attention calls.
pub fn doc_isolation(attn: &AttnFn, call: &AttnCall, doc: usize, factor: f32) -> Result<Change> {
    let shape = &call.shape;
    if doc >= shape.docs() || shape.docs() < 2 {
        return Err(Error::Invalid(format!(
            "document isolation needs at least 2 documents and doc < {} (got doc {doc})",
            shape.docs()
        )));
    }
    let (a, b) = (shape.cu_seqlens[doc], shape.cu_seqlens[doc + 1]);
    let mut pert = call.clone();
    for which in Input::ALL {
        pert.scale_rows(which, a, b, factor);
    }
    let base = attn(call)?;
    let new = attn(&pert)?;
    Ok(change(shape, &base, &new, &[(0, a), (b, shape.tokens())], true))
}

/// The CPU reference as an [`AttnFn`].
pub fn reference_attn(call: &AttnCall) -> Result<(Forward, Grads)> {
    reference::forward_backward(call)
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
