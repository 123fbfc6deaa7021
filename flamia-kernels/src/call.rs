//! One attention call: the inputs `q, k, v, dO`, the packed shape (`cu_seqlens`, query heads, KV
//! heads, head dim) and the options. Every implementation that runs a forward + backward takes
//! it: the CPU reference ([`crate::reference::forward_backward`]), the GPU kernels
//! (`gpu::host::forward_backward`), the leakage harness and the numerics check (through
//! [`crate::leakage::AttnFn`]) and the tests.
//!
//! Layouts as [`crate::reference`]: `q`, `dout` `(tokens, heads_q, head_dim)`; `k`, `v`
//! `(tokens, heads_kv, head_dim)`; row-major binary32.

use crate::error::Result;
use crate::options::{AttnOptions, AttnPath, VarlenShape};
use crate::quant::check_len;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// Which input tensor of an [`AttnCall`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    Q,
    K,
    V,
    Dout,
}

impl Input {
    /// All four inputs.
    pub const ALL: [Input; 4] = [Input::Q, Input::K, Input::V, Input::Dout];
}

/// Inputs, shape and options of one forward + backward attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnCall {
    /// `(tokens, heads_q, head_dim)`.
    pub q: Vec<f32>,
    /// `(tokens, heads_kv, head_dim)`.
    pub k: Vec<f32>,
    /// `(tokens, heads_kv, head_dim)`.
    pub v: Vec<f32>,
    /// Gradient of the loss with respect to O, `(tokens, heads_q, head_dim)`.
    pub dout: Vec<f32>,
    pub shape: VarlenShape,
    pub opts: AttnOptions,
}

impl AttnCall {
    /// A call on the given tensors; errors when the shape is invalid or a tensor's length does
    /// not match it (values are checked by the implementations).
    pub fn new(
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        dout: Vec<f32>,
        shape: VarlenShape,
        opts: AttnOptions,
    ) -> Result<AttnCall> {
        shape.validate()?;
        let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
        check_len("q", &q, t, hq, d)?;
        check_len("k", &k, t, hkv, d)?;
        check_len("v", &v, t, hkv, d)?;
        check_len("dout", &dout, t, hq, d)?;
        Ok(AttnCall {
            q,
            k,
            v,
            dout,
            shape,
            opts,
        })
    }

    /// Standard normal inputs from `seed` (ChaCha8; q, k, v, dout drawn in this order: the
    /// inputs of `flamia check numerics --seed N`).
    pub fn random(shape: VarlenShape, opts: AttnOptions, seed: u64) -> AttnCall {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (t, hq, hkv, d) = (shape.tokens(), shape.heads_q, shape.heads_kv, shape.head_dim);
        let mut n = |len: usize| {
            (0..len)
                .map(|_| rng.sample::<f32, _>(StandardNormal))
                .collect::<Vec<f32>>()
        };
        let (q, k, v, dout) = (n(t * hq * d), n(t * hkv * d), n(t * hkv * d), n(t * hq * d));
        AttnCall {
            q,
            k,
            v,
            dout,
            shape,
            opts,
        }
    }

    /// The same inputs with other options.
    pub fn with_opts(&self, opts: AttnOptions) -> AttnCall {
        AttnCall { opts, ..self.clone() }
    }

    /// The same inputs and options on another path.
    pub fn with_path(&self, path: AttnPath) -> AttnCall {
        self.with_opts(AttnOptions { path, ..self.opts })
    }

    /// The inputs rounded to BF16 (nearest even), as the GPU's upload rounds them.
    pub fn bf16_rounded(&self) -> AttnCall {
        let r = |x: &[f32]| x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        AttnCall {
            q: r(&self.q),
            k: r(&self.k),
            v: r(&self.v),
            dout: r(&self.dout),
            ..self.clone()
        }
    }

    /// Heads of an input tensor (query heads for q and dout, KV heads for k and v).
    pub fn heads(&self, which: Input) -> usize {
        match which {
            Input::Q | Input::Dout => self.shape.heads_q,
            Input::K | Input::V => self.shape.heads_kv,
        }
    }

    /// One input tensor.
    pub fn input(&self, which: Input) -> &[f32] {
        match which {
            Input::Q => &self.q,
            Input::K => &self.k,
            Input::V => &self.v,
            Input::Dout => &self.dout,
        }
    }

    /// One input tensor, mutable.
    pub fn input_mut(&mut self, which: Input) -> &mut [f32] {
        match which {
            Input::Q => &mut self.q,
            Input::K => &mut self.k,
            Input::V => &mut self.v,
            Input::Dout => &mut self.dout,
        }
    }

    /// Multiplies token rows `[a, b)` of one input by `factor`.
    pub fn scale_rows(&mut self, which: Input, a: usize, b: usize, factor: f32) {
        let w = self.heads(which) * self.shape.head_dim;
        self.input_mut(which)[a * w..b * w]
            .iter_mut()
            .for_each(|v| *v *= factor);
    }
}
