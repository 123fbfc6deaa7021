//! The numerics check behind `flamia check numerics`: on random normal inputs of a packed shape,
//! each quantised path's cosine and relative L2 error to `exact` for O, dQ, dK, dV, its dS
//! zero fraction, and the leakage figures of [`crate::leakage`]. The report serialises to the
//! JSON schema documented in `docs/numerics.md`.

use crate::call::AttnCall;
use crate::error::{Error, Result};
use crate::leakage::{causal_leakage, default_probe, doc_isolation, AttnFn, CausalLeak, Change};
use crate::options::{AttnOptions, AttnPath, Precision, VarlenShape};
use crate::reference::{Forward, Grads};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// What to check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckConfig {
    pub seed: u64,
    pub lens: Vec<usize>,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Quantised paths to compare with `exact` (`exact` itself is never listed).
    pub paths: Vec<AttnPath>,
    /// Compute the leakage figures (17 extra forward+backward runs).
    pub leakage: bool,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            seed: 0,
            lens: vec![700, 300, 1024],
            heads: 4,
            kv_heads: 4,
            head_dim: 128,
            paths: vec![AttnPath::Mxfp8, AttnPath::Nvfp4, AttnPath::LeakyFp8],
            leakage: true,
        }
    }
}

/// One value per output tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PerTensor {
    pub o: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
}

/// Accuracy of one path against `exact`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathReport {
    pub cosine: PerTensor,
    pub rel_l2: PerTensor,
    /// Fraction of non-zero dS elements rounded to zero.
    pub ds_zero_fraction: f64,
    /// Wall time of this path's forward + backward, seconds.
    pub wall_s: f64,
}

/// Default-MXFP8 leakage figures (max relative change over O, dQ, dK, dV).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mxfp8Leak {
    pub before_own_block: f64,
    pub in_own_block: f64,
    pub up_to_t: f64,
    pub before_own_block_bitwise_zero: bool,
    pub detail: CausalLeak,
}

/// A single leakage figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MaxLeak {
    pub max: f64,
    pub bitwise_zero: bool,
    pub detail: Change,
}

impl From<Change> for MaxLeak {
    fn from(c: Change) -> Self {
        MaxLeak {
            max: c.max(),
            bitwise_zero: c.bitwise_zero(),
            detail: c,
        }
    }
}

/// One causal probe: the largest change at positions `<= t` (full-dO and horizon runs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeLeak {
    pub max: f64,
    pub bitwise_zero: bool,
    pub detail: CausalLeak,
}

impl From<CausalLeak> for ProbeLeak {
    fn from(c: CausalLeak) -> Self {
        ProbeLeak {
            max: c.up_to_t.max().max(c.horizon.max()),
            bitwise_zero: c.bitwise_causal(),
            detail: c,
        }
    }
}

/// Leakage section of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeakageReport {
    /// Probe position: Q, K, V and dO after `t` are multiplied by 1e3.
    pub t: usize,
    pub mxfp8: Mxfp8Leak,
    #[serde(rename = "mxfp8+precision")]
    pub mxfp8_precision: ProbeLeak,
    #[serde(rename = "leaky-fp8")]
    pub leaky_fp8: ProbeLeak,
    /// Default MXFP8, one document scaled by 1e4, change of the others (`null` with one document).
    pub doc_isolation: Option<MaxLeak>,
}

/// The whole report (`flamia check numerics --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NumericsReport {
    pub config: CheckConfig,
    pub device: String,
    pub paths: BTreeMap<String, PathReport>,
    pub leakage: Option<LeakageReport>,
    pub wall_s: f64,
}

/// The check's inputs: standard normal q, k, v, dout of `cfg`'s shape from `cfg.seed`, causal,
/// on `exact` (the paths are set per run).
pub fn check_call(cfg: &CheckConfig) -> Result<AttnCall> {
    let shape = VarlenShape::from_lens(&cfg.lens, cfg.heads, cfg.kv_heads, cfg.head_dim)?;
    Ok(AttnCall::random(
        shape,
        AttnOptions::new(AttnPath::Exact),
        cfg.seed,
    ))
}

/// Cosine similarity (f64 accumulation).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return if aa == bb { 1.0 } else { 0.0 };
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// `||a - b|| / ||b||`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}

fn per_tensor(f: impl Fn(&[f32], &[f32]) -> f64, a: &(Forward, Grads), b: &(Forward, Grads)) -> PerTensor {
    PerTensor {
        o: f(&a.0.o, &b.0.o),
        dq: f(&a.1.dq, &b.1.dq),
        dk: f(&a.1.dk, &b.1.dk),
        dv: f(&a.1.dv, &b.1.dv),
    }
}

/// Relative L2 error of each output of `got` against `exact` (`||got - exact|| / ||exact||`).
pub fn rel_l2_to(got: &(Forward, Grads), exact: &(Forward, Grads)) -> PerTensor {
    per_tensor(rel_l2, got, exact)
}

/// Runs the check with `attn` (the CPU reference: [`crate::leakage::reference_attn`]) as the
/// implementation of the quantised paths and the CPU reference as `exact`.
pub fn run_check(cfg: &CheckConfig, attn: &AttnFn, device: &str) -> Result<NumericsReport> {
    let start = Instant::now();
    if cfg.paths.contains(&AttnPath::Exact) {
        return Err(Error::Invalid(
            "the numerics check compares paths with `exact`; do not list `exact`".into(),
        ));
    }
    let call = check_call(cfg)?;
    let exact = crate::leakage::reference_attn(&call)?;
    let mut paths = BTreeMap::new();
    for &path in &cfg.paths {
        let t0 = Instant::now();
        let got = attn(&call.with_path(path))?;
        let wall_s = t0.elapsed().as_secs_f64();
        paths.insert(
            path.name().to_string(),
            PathReport {
                cosine: per_tensor(cosine, &got, &exact),
                rel_l2: per_tensor(rel_l2, &got, &exact),
                ds_zero_fraction: got.1.ds_zero_fraction,
                wall_s,
            },
        );
    }
    let leakage = if cfg.leakage && call.shape.tokens() >= 2 {
        Some(leakage(attn, &call)?)
    } else {
        None
    };
    Ok(NumericsReport {
        config: cfg.clone(),
        device: device.to_string(),
        paths,
        leakage,
        wall_s: start.elapsed().as_secs_f64(),
    })
}

fn leakage(attn: &AttnFn, call: &AttnCall) -> Result<LeakageReport> {
    let shape = &call.shape;
    let t = default_probe(shape);
    let leak = |opts: AttnOptions| causal_leakage(attn, &call.with_opts(opts), t, 1e3);
    let m = leak(AttnOptions::new(AttnPath::Mxfp8))?;
    let p = leak(AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Mxfp8)
    })?;
    let l = leak(AttnOptions::new(AttnPath::LeakyFp8))?;
    let doc = if shape.docs() >= 2 {
        let longest = (0..shape.docs())
            .max_by_key(|&i| (shape.cu_seqlens[i + 1] - shape.cu_seqlens[i], usize::MAX - i))
            .unwrap_or(0);
        let c = doc_isolation(
            attn,
            &call.with_opts(AttnOptions::new(AttnPath::Mxfp8)),
            longest,
            1e4,
        )?;
        Some(c.into())
    } else {
        None
    };
    Ok(LeakageReport {
        t,
        mxfp8: Mxfp8Leak {
            before_own_block: m.before_own_block.max(),
            in_own_block: m.in_own_block.max(),
            up_to_t: m.up_to_t.max(),
            before_own_block_bitwise_zero: m.before_own_block.bitwise_zero(),
            detail: m,
        },
        mxfp8_precision: p.into(),
        leaky_fp8: l.into(),
        doc_isolation: doc,
    })
}
