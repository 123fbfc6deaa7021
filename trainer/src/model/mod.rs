//! The Llama-3-style model: token embedding, N x [RMSNorm -> GQA attention with RoPE through the
//! bridge -> RMSNorm -> SwiGLU], final RMSNorm, tied or untied output.
//!
//! Activations are packed: `(tokens, dim)` with all rows of a batch back to back and documents
//! delimited by `cu_seqlens`. Parameters are f32 (the master weights); the forward casts them to
//! the compute kind (BF16 on CUDA) inside the graph, so gradients land on the f32 masters.

pub mod rope;
pub mod sizes;

use flamia_kernels::AttnOptions;
use tch::{nn, Device, Kind, Tensor};

use crate::attention::{attention, Packing};
use crate::error::Result;
pub use sizes::{ModelConfig, Shape, SIZES};

struct Block {
    attention_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    w1: Tensor,
    w2: Tensor,
    w3: Tensor,
}

/// One batch's inputs, packed.
#[derive(Debug)]
pub struct PackedInput {
    /// Token ids `(tokens,)` int64 on the device.
    pub tokens: Tensor,
    /// Document boundaries.
    pub packing: Packing,
    /// RoPE cos/sin `(tokens, 1, head_dim/2)` f32 on the device.
    pub cos: Tensor,
    pub sin: Tensor,
}

/// The model and its variables.
pub struct Llama {
    pub shape: Shape,
    pub cfg: ModelConfig,
    pub vs: nn::VarStore,
    tok_embeddings: Tensor,
    layers: Vec<Block>,
    norm: Tensor,
    output: Option<Tensor>,
    inv_freq: Vec<f64>,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama").field("shape", &self.shape).finish()
    }
}

impl Llama {
    /// Creates the variables (f32) with the seeded initialisation; call `tch::manual_seed` first.
    pub fn new(cfg: &ModelConfig, vocab: usize, device: Device) -> Result<Llama> {
        cfg.validate()?;
        let shape = cfg.shape(vocab)?;
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let (d, hd, std) = (shape.dim as i64, shape.head_dim as i64, cfg.init_std);
        let out_std = std / (2.0 * shape.n_layers as f64).sqrt();
        let tok_embeddings = (&root / "tok_embeddings").randn("weight", &[shape.vocab as i64, d], 0.0, std);
        let mut layers = Vec::with_capacity(shape.n_layers);
        for i in 0..shape.n_layers {
            let l = &root / "layers" / i;
            let a = &l / "attention";
            let f = &l / "feed_forward";
            let (hq, hkv, ffn) = (
                shape.n_heads as i64,
                shape.n_kv_heads as i64,
                shape.ffn_dim as i64,
            );
            layers.push(Block {
                attention_norm: (&l / "attention_norm").ones("weight", &[d]),
                wq: (&a / "wq").randn("weight", &[hq * hd, d], 0.0, std),
                wk: (&a / "wk").randn("weight", &[hkv * hd, d], 0.0, std),
                wv: (&a / "wv").randn("weight", &[hkv * hd, d], 0.0, std),
                wo: (&a / "wo").randn("weight", &[d, hq * hd], 0.0, out_std),
                ffn_norm: (&l / "ffn_norm").ones("weight", &[d]),
                w1: (&f / "w1").randn("weight", &[ffn, d], 0.0, std),
                w2: (&f / "w2").randn("weight", &[d, ffn], 0.0, out_std),
                w3: (&f / "w3").randn("weight", &[ffn, d], 0.0, std),
            });
        }
        let norm = (&root / "norm").ones("weight", &[d]);
        let output =
            (!shape.tied).then(|| (&root / "output").randn("weight", &[shape.vocab as i64, d], 0.0, std));
        let scaling = cfg.rope_scaled.then_some(&cfg.rope_scaling);
        let inv_freq = rope::inv_freqs(shape.head_dim, cfg.rope_theta, scaling);
        Ok(Llama {
            shape,
            cfg: cfg.clone(),
            vs,
            tok_embeddings,
            layers,
            norm,
            output,
            inv_freq,
        })
    }

    /// Names of parameters that get no weight decay: norms and embeddings (and a tied output).
    pub fn no_decay(name: &str) -> bool {
        name.ends_with("norm.weight") || name.starts_with("tok_embeddings")
    }

    /// Packs token ids and boundaries for the forward.
    pub fn input(&self, tokens: &[i64], cu_seqlens: &[usize], device: Device) -> Result<PackedInput> {
        let packing = Packing::new(cu_seqlens, device)?;
        let (cos, sin) = rope::tables(&self.inv_freq, &rope::positions(cu_seqlens), device);
        Ok(PackedInput {
            tokens: Tensor::from_slice(tokens).to_device(device),
            packing,
            cos,
            sin,
        })
    }

    /// Logits `(tokens, vocab)` in f32.
    pub fn forward(&self, input: &PackedInput, attn: &AttnOptions, compute: Kind) -> Result<Tensor> {
        let s = &self.shape;
        let t = input.tokens.size()[0];
        let (hq, hkv, hd) = (s.n_heads as i64, s.n_kv_heads as i64, s.head_dim as i64);
        let eps = self.cfg.norm_eps;
        let cast = |w: &Tensor| w.to_kind(compute);
        let mut x = Tensor::embedding(&self.tok_embeddings, &input.tokens, -1, false, false).to_kind(compute);
        for b in &self.layers {
            let h = rms_norm(&x, &b.attention_norm, eps);
            let q = h.linear(&cast(&b.wq), None::<Tensor>).reshape([t, hq, hd]);
            let k = h.linear(&cast(&b.wk), None::<Tensor>).reshape([t, hkv, hd]);
            let v = h.linear(&cast(&b.wv), None::<Tensor>).reshape([t, hkv, hd]);
            let q = rope::apply(&q, &input.cos, &input.sin);
            let k = rope::apply(&k, &input.cos, &input.sin);
            let o = attention(&q, &k, &v, &input.packing, attn)?.reshape([t, hq * hd]);
            // Out of place on purpose: `+=` is an in-place add on tch tensors, and `x` is saved
            // for the backward of the RMSNorm that read it.
            x = &x + o.linear(&cast(&b.wo), None::<Tensor>);
            let h = rms_norm(&x, &b.ffn_norm, eps);
            let gate = h.linear(&cast(&b.w1), None::<Tensor>).silu();
            let up = h.linear(&cast(&b.w3), None::<Tensor>);
            x = &x + (gate * up).linear(&cast(&b.w2), None::<Tensor>);
        }
        let x = rms_norm(&x, &self.norm, eps);
        let w_out = self.output.as_ref().unwrap_or(&self.tok_embeddings);
        Ok(x.linear(&cast(w_out), None::<Tensor>).to_kind(Kind::Float))
    }

    /// Named parameters, sorted by name (the order every optimiser/checkpoint loop uses).
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// RMSNorm computed in f32, returned in `x`'s kind.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let xf = x.to_kind(Kind::Float);
    let inv = (xf.square().mean_dim(-1, true, Kind::Float) + eps).rsqrt();
    (xf * inv * weight).to_kind(kind)
}

/// Mean next-token cross-entropy over targets that are not `ignore` (-100), as the sum and count
/// so micro-batches combine exactly.
pub fn loss_sum(logits: &Tensor, targets: &Tensor) -> Tensor {
    logits
        .log_softmax(-1, Kind::Float)
        .nll_loss_nd::<Tensor>(targets, None, tch::Reduction::Sum, -100)
}
