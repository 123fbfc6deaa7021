//! Attention paths, precision options and the packed (varlen) shape every implementation takes.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Which numerics attention runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttnPath {
    /// Exact attention (f64 accumulation on CPU; BF16 flash attention on the GPU control path).
    Exact,
    /// FLAMIA default: E4M3 Q, K, V, dO, P, dS with 32-token power-of-two block scales.
    Mxfp8,
    /// Mixed: NVFP4 Q/K for the scores, E4M3 everywhere else.
    Nvfp4,
    /// Deliberately leaky negative control: tensor-wide amax, exponents rounded down.
    LeakyFp8,
}

impl AttnPath {
    /// Every path, in report order.
    pub const ALL: [AttnPath; 4] = [
        AttnPath::Exact,
        AttnPath::Mxfp8,
        AttnPath::Nvfp4,
        AttnPath::LeakyFp8,
    ];

    /// The name used on the command line and in configs.
    pub fn name(self) -> &'static str {
        match self {
            AttnPath::Exact => "exact",
            AttnPath::Mxfp8 => "mxfp8",
            AttnPath::Nvfp4 => "nvfp4",
            AttnPath::LeakyFp8 => "leaky-fp8",
        }
    }
}

impl std::fmt::Display for AttnPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AttnPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        AttnPath::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            Error::Invalid(format!(
                "unknown attention path {s:?}; allowed: exact, mxfp8, nvfp4, leaky-fp8"
            ))
        })
    }
}

/// Precision options (hopper-kernels.md section 5). The first three together make the kernel
/// bitwise causally safe; `hadamard` rotates Q and K over the head dim before quantising.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Precision {
    /// One power-of-two scale per token (instead of per 32-token block) for every operand.
    pub per_token_scales: bool,
    /// dS exponents per query row (instead of per 32x32 block).
    pub row_ds_exponents: bool,
    /// dQ prescale from the keys visible to each query row only (instead of sequence-wide maxima).
    pub causal_dq_scaling: bool,
    /// Normalised Hadamard-128 rotation of Q and K (default on at head dim 128).
    pub hadamard: bool,
}

impl Default for Precision {
    fn default() -> Self {
        Precision {
            per_token_scales: false,
            row_ds_exponents: false,
            causal_dq_scaling: false,
            hadamard: true,
        }
    }
}

impl Precision {
    /// All three causal-safety options on (and Hadamard as given).
    pub fn causally_safe(hadamard: bool) -> Self {
        Precision {
            per_token_scales: true,
            row_ds_exponents: true,
            causal_dq_scaling: true,
            hadamard,
        }
    }
}

/// Options of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttnOptions {
    pub path: AttnPath,
    pub precision: Precision,
    pub causal: bool,
    /// Softmax scale; `None` means `1/sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
}

impl AttnOptions {
    /// Causal attention on `path` with default precision options.
    pub fn new(path: AttnPath) -> Self {
        AttnOptions {
            path,
            precision: Precision::default(),
            causal: true,
            softmax_scale: None,
        }
    }

    /// The softmax scale actually used for `head_dim`.
    pub fn scale(&self, head_dim: usize) -> f32 {
        self.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }
}

/// Shape of a packed attention call: `(tokens, heads, head_dim)` tensors split by `cu_seqlens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VarlenShape {
    /// Document boundaries: starts at 0, strictly increasing, ends at the token count.
    pub cu_seqlens: Vec<usize>,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
}

impl VarlenShape {
    /// Head dims the kernels support.
    pub const HEAD_DIMS: [usize; 2] = [64, 128];

    /// Builds and validates a shape.
    pub fn new(cu_seqlens: Vec<usize>, heads_q: usize, heads_kv: usize, head_dim: usize) -> Result<Self> {
        let s = VarlenShape {
            cu_seqlens,
            heads_q,
            heads_kv,
            head_dim,
        };
        s.validate()?;
        Ok(s)
    }

    /// Builds a shape from document lengths.
    pub fn from_lens(lens: &[usize], heads_q: usize, heads_kv: usize, head_dim: usize) -> Result<Self> {
        let mut cu = Vec::with_capacity(lens.len() + 1);
        cu.push(0);
        for &l in lens {
            cu.push(cu.last().copied().unwrap_or(0) + l);
        }
        Self::new(cu, heads_q, heads_kv, head_dim)
    }

    /// Total tokens.
    pub fn tokens(&self) -> usize {
        self.cu_seqlens.last().copied().unwrap_or(0)
    }

    /// Number of documents.
    pub fn docs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    /// Checks every invariant; errors say what is allowed.
    pub fn validate(&self) -> Result<()> {
        if !Self::HEAD_DIMS.contains(&self.head_dim) {
            return Err(Error::Invalid(format!(
                "unsupported head_dim {}; allowed: 64, 128",
                self.head_dim
            )));
        }
        if self.heads_q == 0 || self.heads_kv == 0 {
            return Err(Error::Invalid(format!(
                "heads must be positive (got heads_q {}, heads_kv {})",
                self.heads_q, self.heads_kv
            )));
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::Invalid(format!(
                "query heads ({}) must be a multiple of KV heads ({})",
                self.heads_q, self.heads_kv
            )));
        }
        let cu = &self.cu_seqlens;
        if cu.len() < 2 {
            return Err(Error::CuSeqlens(format!(
                "needs at least 2 entries [0, ..., tokens], got {cu:?}"
            )));
        }
        if cu[0] != 0 {
            return Err(Error::CuSeqlens(format!("must start at 0, starts at {}", cu[0])));
        }
        if let Some(i) = (1..cu.len()).find(|&i| cu[i] <= cu[i - 1]) {
            return Err(Error::CuSeqlens(format!(
                "must be strictly increasing (empty documents are not allowed): entry {} = {} after {}",
                i,
                cu[i],
                cu[i - 1]
            )));
        }
        Ok(())
    }

    /// Checks that `cu_seqlens` ends at `tokens` (the first dimension of the tensors given).
    pub fn check_tokens(&self, tokens: usize) -> Result<()> {
        if self.tokens() != tokens {
            return Err(Error::CuSeqlens(format!(
                "must end at the token count {tokens}, ends at {}",
                self.tokens()
            )));
        }
        Ok(())
    }
}
