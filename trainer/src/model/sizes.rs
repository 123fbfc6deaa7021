//! Model sizes as data (torchtitan style) and the model section of the config.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// One row of the size table. The FFN width follows the Llama-3 rule (see [`ffn_dim`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    pub name: &'static str,
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Llama-3 `ffn_dim_multiplier` (None = 1).
    pub ffn_multiplier: Option<f64>,
    /// The FFN width is rounded up to a multiple of this.
    pub multiple_of: usize,
    /// Output projection shares the token embedding.
    pub tied: bool,
}

/// Every size, small to large. Head dims are 64 or 128: the CPU reference and the GPU's v4
/// kernels take both (the NVFP4 path, a v3.1 kernel, takes 128 only: `check_gpu_head_dim`).
pub const SIZES: [Size; 6] = [
    // CPU demo: 2 layers of dim 128, 2 heads of 64 sharing one KV head.
    Size {
        name: "tiny",
        dim: 128,
        n_layers: 2,
        n_heads: 2,
        n_kv_heads: 1,
        ffn_multiplier: None,
        multiple_of: 64,
        tied: true,
    },
    Size {
        name: "debug",
        dim: 256,
        n_layers: 4,
        n_heads: 4,
        n_kv_heads: 2,
        ffn_multiplier: None,
        multiple_of: 128,
        tied: true,
    },
    Size {
        name: "125m",
        dim: 768,
        n_layers: 12,
        n_heads: 6,
        n_kv_heads: 2,
        ffn_multiplier: None,
        multiple_of: 256,
        tied: true,
    },
    Size {
        name: "350m",
        dim: 1024,
        n_layers: 24,
        n_heads: 8,
        n_kv_heads: 4,
        ffn_multiplier: None,
        multiple_of: 256,
        tied: true,
    },
    // Llama-3.2-1B-like (but 16 heads of 128): FFN 4*2048*2/3*1.5 rounded to 256 = 8192.
    Size {
        name: "1b",
        dim: 2048,
        n_layers: 16,
        n_heads: 16,
        n_kv_heads: 8,
        ffn_multiplier: Some(1.5),
        multiple_of: 256,
        tied: true,
    },
    // Llama-3.2-1B's shape: 32 heads of 64 sharing 8 KV heads, FFN 8192, tied embedding.
    Size {
        name: "1b-d64",
        dim: 2048,
        n_layers: 16,
        n_heads: 32,
        n_kv_heads: 8,
        ffn_multiplier: Some(1.5),
        multiple_of: 256,
        tied: true,
    },
];

/// Looks a size up by name.
pub fn size(name: &str) -> Result<Size> {
    SIZES.iter().copied().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = SIZES.iter().map(|s| s.name).collect();
        TrainError::Invalid(format!(
            "unknown model size {name:?}; allowed: {}",
            names.join(", ")
        ))
    })
}

/// The Llama-3 SwiGLU width: `4*dim`, times 2/3, times the multiplier, rounded up to `multiple_of`.
pub fn ffn_dim(dim: usize, multiplier: Option<f64>, multiple_of: usize) -> usize {
    let mut hidden = (2 * 4 * dim) / 3;
    if let Some(m) = multiplier {
        hidden = (m * hidden as f64) as usize;
    }
    hidden.div_ceil(multiple_of) * multiple_of
}

/// Llama-3 RoPE frequency scaling (the `rope_scaling` of Llama 3.1/3.2).
/// Each key is optional: one left out keeps its default (Llama 3.2's values).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RopeScaling {
    /// Divisor of the low frequencies (32 for Llama 3.2, 8 for 3.1).
    pub factor: f64,
    /// Wavelengths longer than `original_max_position / low_freq_factor` are fully scaled.
    pub low_freq_factor: f64,
    /// Wavelengths shorter than `original_max_position / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// Context length the unscaled frequencies were trained for.
    pub original_max_position: usize,
}

impl Default for RopeScaling {
    fn default() -> Self {
        RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192,
        }
    }
}

/// `[model]`: which size and the options around it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Size from the table ([`SIZES`]): tiny, debug, 125m, 350m, 1b, 1b-d64.
    pub size: String,
    /// RoPE base (Llama 3: 500000).
    pub rope_theta: f64,
    /// Apply the Llama-3 frequency scaling to RoPE (true) or plain RoPE (false).
    pub rope_scaled: bool,
    /// Parameters of the frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Override of the size's tied output projection (None = the size's choice).
    pub tied: Option<bool>,
    /// RMSNorm epsilon.
    pub norm_eps: f64,
    /// How the RMSNorms run: `fused` (default: libtorch's fused kernel with the weight cast to
    /// the activations' kind, BF16 on the GPU), `fused-f32` (the fused kernel in f32) or
    /// `composite` (op by op in f32); [`super::RmsNorm`] has the numerics of each.
    pub rms_norm: String,
    /// Std of the normal initialisation (output projections get it divided by sqrt(2 * layers)).
    pub init_std: f64,
    /// Rows of the embedding and the output head: 0 = the tokenizer's vocabulary; a larger value
    /// pads both (ids beyond the tokenizer's never occur; e.g. 128256 gives the byte tokenizer
    /// the Llama-3 head's size, for measuring memory and speed without a tokenizer file).
    pub vocab_size: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            size: "tiny".into(),
            rope_theta: 500000.0,
            rope_scaled: true,
            rope_scaling: RopeScaling::default(),
            tied: None,
            norm_eps: 1e-5,
            rms_norm: "fused".into(),
            init_std: 0.02,
            vocab_size: 0,
        }
    }
}

impl ModelConfig {
    /// Checks every field; messages say what is allowed.
    pub fn validate(&self) -> Result<()> {
        size(&self.size)?;
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(TrainError::Invalid(format!(
                "model.rope_theta must be > 0, got {}",
                self.rope_theta
            )));
        }
        let r = &self.rope_scaling;
        if !(r.factor >= 1.0 && r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0.0) {
            return Err(TrainError::Invalid(format!(
                "model.rope_scaling needs factor >= 1 and high_freq_factor > low_freq_factor > 0, got {r:?}"
            )));
        }
        super::RmsNorm::parse(&self.rms_norm)?;
        if !(self.norm_eps > 0.0 && self.init_std > 0.0) {
            return Err(TrainError::Invalid(
                "model.norm_eps and model.init_std must be > 0".into(),
            ));
        }
        Ok(())
    }

    /// The resolved shape for a tokenizer's vocabulary (padded to `vocab_size` when larger).
    pub fn shape(&self, vocab: usize) -> Result<Shape> {
        let vocab = vocab.max(self.vocab_size);
        let s = size(&self.size)?;
        Ok(Shape {
            dim: s.dim,
            n_layers: s.n_layers,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.dim / s.n_heads,
            ffn_dim: ffn_dim(s.dim, s.ffn_multiplier, s.multiple_of),
            vocab,
            tied: self.tied.unwrap_or(s.tied),
        })
    }
}

/// Resolved model dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Shape {
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub tied: bool,
}

impl Shape {
    /// (total parameters, embedding parameters).
    pub fn param_counts(&self) -> (usize, usize) {
        let (d, hd) = (self.dim, self.head_dim);
        let attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2;
        let ffn = 3 * d * self.ffn_dim;
        let per_layer = attn + ffn + 2 * d;
        let emb = self.vocab * d;
        let out = if self.tied { 0 } else { self.vocab * d };
        (emb + out + self.n_layers * per_layer + d, emb)
    }

    /// Weights a token meets in matmuls: every projection of every block and the output head
    /// (which, when tied, is the embedding matrix; the embedding lookup itself is no matmul).
    pub fn matmul_params(&self) -> usize {
        let (d, hd) = (self.dim, self.head_dim);
        let attn = d * self.n_heads * hd * 2 + d * self.n_kv_heads * hd * 2;
        self.n_layers * (attn + 3 * d * self.ffn_dim) + self.vocab * d
    }

    /// Model FLOPs of one training step (forward + backward, recomputation not counted) over
    /// documents of lengths `doc_lens`: `6 * matmul_params` per token, plus per layer causal
    /// attention inside each document with the attention bench's count
    /// (`flamia_kernels::gpu::bench::causal_fwd_flops`: forward `4 * heads * head_dim *
    /// l (l + 1) / 2`, training 3x the forward: the backward's two products per forward product,
    /// PaLM's model-FLOPs count; the 3.5x of FlashAttention's benchmarks, which `flamia bench
    /// attention` uses for TFLOP/s, adds the backward's recomputed S = Q K^T).
    pub fn train_flops(&self, doc_lens: impl IntoIterator<Item = usize>) -> f64 {
        let (mut tokens, mut causal) = (0.0, 0.0);
        for l in doc_lens {
            tokens += l as f64;
            causal += (l * (l + 1)) as f64 / 2.0;
        }
        let attn_fwd = 4.0 * (self.n_heads * self.head_dim) as f64 * causal;
        6.0 * self.matmul_params() as f64 * tokens + 3.0 * self.n_layers as f64 * attn_fwd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_flops_match_a_hand_count_and_the_attention_bench() {
        let tiny = ModelConfig::default().shape(258).unwrap();
        // tiny: dim 128, 2 layers, 2 heads of 64, 1 KV head, FFN 384, tied, vocab 258.
        assert_eq!((tiny.ffn_dim, tiny.head_dim), (384, 64));
        let per_layer = 128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 384; // q,o + k,v + SwiGLU
        let matmul = 2 * per_layer + 258 * 128; // + the tied head
        assert_eq!(matmul, 426_240);
        // Documents of 3 and 5 tokens: 8 tokens; causal pairs 3*4/2 + 5*6/2 = 21.
        let want = 6.0 * 426_240.0 * 8.0 + 3.0 * 2.0 * (4.0 * 2.0 * 64.0 * 21.0);
        assert_eq!(tiny.train_flops([3, 5]), want);
        assert_eq!(want, 20_524_032.0);
        // One 65,536-token document at 1B (16 heads of 128, the bench's shape): the attention
        // part is 3 x the bench's forward count per layer (model FLOPs: no recomputed S).
        let b = ModelConfig {
            size: "1b".into(),
            ..Default::default()
        }
        .shape(128_256)
        .unwrap();
        let attn = b.train_flops([65536]) - 6.0 * b.matmul_params() as f64 * 65536.0;
        let bench = flamia_kernels::gpu::bench::causal_fwd_flops(&[65536], 128);
        assert_eq!(attn, 3.0 * 16.0 * bench);
        // Short documents cost less attention than one long one of the same tokens.
        assert!(b.train_flops(vec![1024; 64]) < b.train_flops([65536]));
    }

    #[test]
    fn the_1b_d64_size_is_llama_3_2_1b_shaped() {
        let cfg = ModelConfig {
            size: "1b-d64".into(),
            ..ModelConfig::default()
        };
        let s = cfg.shape(128_256).unwrap();
        assert_eq!(
            (s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim),
            (2048, 16, 32, 8, 64)
        );
        assert_eq!(s.ffn_dim, 8192);
        // exactly Llama-3.2-1B's parameter count (8 KV heads of 64: K and V project to 512)
        assert_eq!(s.param_counts().0, 1_235_814_400);
    }

    #[test]
    fn llama3_ffn_rule_and_1b_shape() {
        assert_eq!(ffn_dim(2048, Some(1.5), 256), 8192);
        assert_eq!(ffn_dim(4096, Some(1.3), 1024), 14336); // Llama-3-8B
        let cfg = ModelConfig {
            size: "1b".into(),
            ..Default::default()
        };
        let s = cfg.shape(128256).unwrap();
        assert_eq!(
            (s.dim, s.n_layers, s.n_heads, s.head_dim, s.n_kv_heads, s.ffn_dim),
            (2048, 16, 16, 128, 8, 8192)
        );
        // Llama-3.2-1B (32 heads of 64, 8 KV) has 1,235,814,400 parameters; our 1b has 16 heads
        // of 128 with 8 KV heads, so K/V are twice as wide: 2 * 16 * 2048 * 512 more.
        assert_eq!(s.param_counts().0, 1_235_814_400 + 2 * 16 * 2048 * 512);
        // The matmul weights: all parameters but the norms, the embedding counted once (tied head).
        let norms = 16 * 2 * 2048 + 2048;
        assert_eq!(s.matmul_params(), s.param_counts().0 - norms);
        assert!(size("7b")
            .unwrap_err()
            .to_string()
            .contains("tiny, debug, 125m, 350m, 1b"));
    }
}
