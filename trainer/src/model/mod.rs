//! The Llama-3-style model: token embedding, N x [RMSNorm -> GQA attention with RoPE through the
//! bridge -> RMSNorm -> SwiGLU], final RMSNorm, tied or untied output.
//!
//! Activations are packed: `(tokens, dim)` with all rows of a batch back to back and documents
//! delimited by `cu_seqlens`. Parameters are f32 (the master weights); the forward casts them to
//! the compute kind (BF16 on CUDA) inside the graph, so gradients land on the f32 masters.
//!
//! Training goes through [`Llama::forward_backward`]: the loss head in chunks (`loss`), and
//! optionally activation checkpointing ([`Checkpointing`]). Every libtorch call here is the
//! fallible `f_*` form, so running out of memory is an error the loop can explain, not a panic.

pub mod loss;
pub mod rope;
pub mod sizes;

use flamia_kernels::AttnOptions;
use tch::{nn, Device, Kind, Tensor};

use crate::attention::{attention, Packing};
use crate::error::{Result, TrainError};
pub use loss::loss_sum;
pub use sizes::{ModelConfig, Shape, SIZES};

/// What the backward recomputes instead of keeping (`training.activation_checkpointing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpointing {
    /// Keep every activation (fastest, most memory).
    None,
    /// Keep each block's input and its attention call (inputs, output, LSE and whatever the
    /// attention path saves); recompute the norms, projections, RoPE and SwiGLU in the backward.
    Selective,
    /// Keep each block's input only; recompute the whole block, attention included.
    Full,
}

impl Checkpointing {
    /// Parses the config spelling: `none`, `selective`, `full`.
    pub fn parse(s: &str) -> Result<Checkpointing> {
        match s {
            "none" => Ok(Checkpointing::None),
            "selective" => Ok(Checkpointing::Selective),
            "full" => Ok(Checkpointing::Full),
            other => Err(TrainError::Invalid(format!(
                "activation checkpointing {other:?}; allowed: none, selective, full"
            ))),
        }
    }
}

/// How the RMSNorms run (`model.rms_norm`). All three normalise in f32 and return `x`'s kind;
/// they differ in which kernels run and in the dtype of the weight inside the kernel.
///
/// libtorch 2.11's `rms_norm` runs its fused CUDA kernel (`_fused_rms_norm`: one kernel forward,
/// one for dx and one for dw backward) only when the input and the weight have the same dtype;
/// for a BF16 activation with our f32 weight it warns once ("Mismatch dtype between input and
/// weight ... Cannot dispatch to fused implementation") and runs its op-by-op composite instead,
/// which is the same work as [`RmsNorm::Composite`]. Hence the casts below. The kernel
/// accumulates in f32 whatever the dtype, reduces in a fixed order (no atomics: its dw is a
/// column reduction; above 65,536 rows, when the row is narrow for the GPU, e.g. dim 2048 on an
/// H200, per-block partial sums then `sum(0)`) and raises no deterministic-mode alert. On the CPU `_fused_rms_norm` is itself the composite, so there the
/// variants differ only by their casts.
///
/// GPU validation pending: the device tests (`trainer/tests/rms_norm.rs`, ignored ones) and the
/// throughput A/B (`bench/trainer_1b.sh` with `NORMS`) have not run yet; until the lead runs
/// them, the numerics and the speed of `fused` and `fused-f32` on CUDA are read from libtorch's
/// source, not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RmsNorm {
    /// The fused kernel in the activation's kind: the f32 weight is cast to `x`'s kind first
    /// (BF16 under `run.compute = bf16`), the policy every projection weight already follows.
    /// Trade-off against the f32 contract of [`RmsNorm::Composite`]: the weight is rounded to
    /// BF16 (relative 2^-8 at most) before the multiply, and the kernel returns dw in BF16
    /// (f32 accumulation, rounded once; above 65,536 rows per call its per-block partial sums
    /// are BF16 too) before the cast's backward adds it to the f32 master gradient. y and dx
    /// are rounded to BF16 once, as in the composite. By a count of passes (not measured) it
    /// moves about 4 bytes per element forward and 10 backward, the composite ~40 and ~75.
    /// Under f32 compute it is the kernel in f32 with no casts (the same as `FusedF32`).
    Fused,
    /// The fused kernel in f32: `x` is upcast (exactly), the kernel runs on f32 with the f32
    /// weight, the result is cast back to `x`'s kind. The composite's numerics up to the order
    /// of the sums (dw stays f32), at about half its bytes by the same count (the upcast and
    /// downcast passes remain, and the backward keeps an f32 copy of `x`).
    FusedF32,
    /// Op by op in f32 (upcast, square, mean, add eps, rsqrt, two multiplies, downcast: seven
    /// elementwise/reduction passes forward, about twice that backward), the implementation
    /// before the fused kernel; the reference for the others.
    Composite,
}

impl RmsNorm {
    /// The config spellings, in [`RmsNorm::parse`]'s order.
    pub const NAMES: [&'static str; 3] = ["fused", "fused-f32", "composite"];

    /// Parses the config spelling: `fused`, `fused-f32`, `composite`.
    pub fn parse(s: &str) -> Result<RmsNorm> {
        match s {
            "fused" => Ok(RmsNorm::Fused),
            "fused-f32" => Ok(RmsNorm::FusedF32),
            "composite" => Ok(RmsNorm::Composite),
            other => Err(TrainError::Invalid(format!(
                "model.rms_norm {other:?}; allowed: {}",
                RmsNorm::NAMES.join(", ")
            ))),
        }
    }

    /// RMSNorm of `x` over its last dimension with `weight` (f32 master, or any kind) and
    /// `eps`, in `x`'s kind.
    pub fn apply(self, x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
        let kind = x.kind();
        let d = *x.size().last().unwrap_or(&1);
        Ok(match self {
            RmsNorm::Fused => x.f_rms_norm([d], Some(weight.f_to_kind(kind)?), eps)?,
            RmsNorm::FusedF32 => x
                .f_to_kind(Kind::Float)?
                .f_rms_norm([d], Some(weight.f_to_kind(Kind::Float)?), eps)?
                .f_to_kind(kind)?,
            RmsNorm::Composite => {
                let xf = x.f_to_kind(Kind::Float)?;
                let inv = xf
                    .f_square()?
                    .f_mean_dim(-1, true, Kind::Float)?
                    .f_add_scalar(eps)?
                    .f_rsqrt()?;
                xf.f_mul(&inv)?.f_mul(weight)?.f_to_kind(kind)?
            }
        })
    }
}

/// How [`Llama::forward_backward`] runs.
#[derive(Debug, Clone, Copy)]
pub struct StepOptions<'a> {
    pub attn: &'a AttnOptions,
    /// Compute kind of activations (BF16 on CUDA, f32 on CPU).
    pub compute: Kind,
    pub checkpointing: Checkpointing,
    /// Tokens per loss chunk; 0 = [`loss::auto_chunk_tokens`].
    pub loss_chunk_tokens: usize,
}

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
    rope: rope::TableCache,
    /// `model.rms_norm`, parsed.
    norm_impl: RmsNorm,
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
        tracing::info!("model.rms_norm = {}", cfg.rms_norm);
        Ok(Llama {
            shape,
            cfg: cfg.clone(),
            vs,
            tok_embeddings,
            layers,
            norm,
            output,
            inv_freq,
            rope: rope::TableCache::default(),
            norm_impl: RmsNorm::parse(&cfg.rms_norm)?,
        })
    }

    /// Names of parameters that get no weight decay: norms and embeddings (and a tied output).
    pub fn no_decay(name: &str) -> bool {
        name.ends_with("norm.weight") || name.starts_with("tok_embeddings")
    }

    /// Packs token ids and boundaries for the forward. The ids and the RoPE positions go to the
    /// device in one asynchronous copy from pinned memory; the cos/sin rows are gathered there
    /// from the cached tables (nothing is computed on the host, and the stream is not drained).
    pub fn input(&self, tokens: &[i64], cu_seqlens: &[usize], device: Device) -> Result<PackedInput> {
        let packing = Packing::new(cu_seqlens, device)?;
        let n = tokens.len() as i64;
        let mut host = Vec::with_capacity(2 * tokens.len());
        host.extend_from_slice(tokens);
        host.extend(rope::positions(cu_seqlens));
        let both = host_to_device(&host, device)?;
        let positions = both.f_narrow(0, n, n)?;
        let (cos, sin) = self
            .rope
            .gather(&self.inv_freq, &positions, packing.max_seqlen() as usize)?;
        Ok(PackedInput {
            tokens: both.f_narrow(0, 0, n)?,
            packing,
            cos,
            sin,
        })
    }

    /// The RMSNorm implementation the model runs (`model.rms_norm`).
    pub fn norm_impl(&self) -> RmsNorm {
        self.norm_impl
    }

    /// The model's RMSNorm (`model.rms_norm`) of `x` with `weight`.
    fn rms_norm(&self, x: &Tensor, weight: &Tensor) -> Result<Tensor> {
        self.norm_impl.apply(x, weight, self.cfg.norm_eps)
    }

    /// The token embeddings of the batch in the compute kind.
    fn embed(&self, input: &PackedInput, compute: Kind) -> Result<Tensor> {
        Ok(Tensor::f_embedding(&self.tok_embeddings, &input.tokens, -1, false, false)?.f_to_kind(compute)?)
    }

    /// RMSNorm, projections and RoPE of a block: attention's q, k, v.
    fn qkv(
        &self,
        b: &Block,
        x: &Tensor,
        input: &PackedInput,
        compute: Kind,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let s = &self.shape;
        let t = x.size()[0];
        let (hq, hkv, hd) = (s.n_heads as i64, s.n_kv_heads as i64, s.head_dim as i64);
        let h = self.rms_norm(x, &b.attention_norm)?;
        let proj = |w: &Tensor, heads: i64| -> Result<Tensor> {
            Ok(h.f_linear(&w.f_to_kind(compute)?, None::<Tensor>)?
                .f_reshape([t, heads, hd])?)
        };
        let q = rope::apply(&proj(&b.wq, hq)?, &input.cos, &input.sin)?;
        let k = rope::apply(&proj(&b.wk, hkv)?, &input.cos, &input.sin)?;
        Ok((q, k, proj(&b.wv, hkv)?))
    }

    /// The rest of a block after attention's output `o` `(tokens, heads, head_dim)`: output
    /// projection and residual, RMSNorm, SwiGLU and residual.
    fn after_attention(&self, b: &Block, x: &Tensor, o: &Tensor, compute: Kind) -> Result<Tensor> {
        let t = x.size()[0];
        let cast = |w: &Tensor| w.f_to_kind(compute);
        let o = o.f_reshape([t, -1])?;
        // Out of place on purpose: `x` is saved for the backward of the RMSNorm that read it.
        let x = x.f_add(&o.f_linear(&cast(&b.wo)?, None::<Tensor>)?)?;
        let h = self.rms_norm(&x, &b.ffn_norm)?;
        let gate = h.f_linear(&cast(&b.w1)?, None::<Tensor>)?.f_silu()?;
        let up = h.f_linear(&cast(&b.w3)?, None::<Tensor>)?;
        Ok(x.f_add(&gate.f_mul(&up)?.f_linear(&cast(&b.w2)?, None::<Tensor>)?)?)
    }

    fn block(
        &self,
        b: &Block,
        x: &Tensor,
        input: &PackedInput,
        attn: &AttnOptions,
        compute: Kind,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(b, x, input, compute)?;
        let o = attention(&q, &k, &v, &input.packing, attn)?;
        self.after_attention(b, x, &o, compute)
    }

    /// The hidden states after the final RMSNorm, `(tokens, dim)` in the compute kind.
    pub fn hidden(&self, input: &PackedInput, attn: &AttnOptions, compute: Kind) -> Result<Tensor> {
        let mut x = self.embed(input, compute)?;
        for b in &self.layers {
            x = self.block(b, &x, input, attn, compute)?;
        }
        self.rms_norm(&x, &self.norm)
    }

    /// The output projection's weight `(vocab, dim)`, f32 (the token embedding when tied).
    pub fn output_weight(&self) -> &Tensor {
        self.output.as_ref().unwrap_or(&self.tok_embeddings)
    }

    /// Logits `(tokens, vocab)` in f32 (evaluation; training never builds them whole, see
    /// [`Llama::forward_backward`]).
    pub fn forward(&self, input: &PackedInput, attn: &AttnOptions, compute: Kind) -> Result<Tensor> {
        let x = self.hidden(input, attn, compute)?;
        Ok(
            x.f_linear(&self.output_weight().f_to_kind(compute)?, None::<Tensor>)?
                .f_to_kind(Kind::Float)?,
        )
    }

    /// Forward and backward of one micro-batch: accumulates the gradients of
    /// `loss_sum / denom` into the parameters and returns `loss_sum` (f32 scalar on the device,
    /// detached; reading it is the caller's choice of when to synchronise). The loss head runs
    /// in chunks ([`loss::head_forward_backward`]); `opts.checkpointing` picks what the
    /// backward recomputes.
    pub fn forward_backward(
        &self,
        input: &PackedInput,
        targets: &Tensor,
        denom: f64,
        opts: &StepOptions,
    ) -> Result<Tensor> {
        // The loss head's forward and backward from the final hidden states `h` (a graph
        // tensor): the backward of the surrogate runs the rest of the model's backward.
        let head = |h: &Tensor| -> Result<Tensor> {
            let chunk = match opts.loss_chunk_tokens {
                0 => loss::auto_chunk_tokens(self.shape.vocab),
                n => n,
            };
            let g = loss::head_forward_backward(h, self.output_weight(), targets, denom, chunk)?;
            g.surrogate(h, self.output_weight())?.f_backward()?;
            Ok(g.loss_sum)
        };
        match opts.checkpointing {
            Checkpointing::None => head(&self.hidden(input, opts.attn, opts.compute)?),
            Checkpointing::Full | Checkpointing::Selective => self.checkpointed(input, opts, head),
        }
    }

    /// The summed next-token loss of a batch without autograd (validation): the hidden states
    /// through `opts.attn`, then the loss head in chunks as in training
    /// ([`loss::head_loss_sum`]). An f32 scalar on the device.
    pub fn loss_sum_no_grad(
        &self,
        input: &PackedInput,
        targets: &Tensor,
        opts: &StepOptions,
    ) -> Result<Tensor> {
        let chunk = match opts.loss_chunk_tokens {
            0 => loss::auto_chunk_tokens(self.shape.vocab),
            n => n,
        };
        let h = tch::no_grad(|| self.hidden(input, opts.attn, opts.compute))?;
        loss::head_loss_sum(&h, self.output_weight(), targets, chunk)
    }

    /// Activation checkpointing, one layer at a time: the forward runs without a graph and
    /// keeps each block's input (and, `Selective`, the attention call with its saved tensors);
    /// the backward rebuilds one block's graph from its saved input, backpropagates the
    /// gradient arriving at its output (surrogate `sum(y * g)`), and takes the gradient of the
    /// input from the leaf. Parameters' gradients accumulate across these backward calls.
    fn checkpointed(
        &self,
        input: &PackedInput,
        opts: &StepOptions,
        head: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let (attn, compute) = (opts.attn, opts.compute);
        let selective = opts.checkpointing == Checkpointing::Selective;
        let mut inputs = Vec::with_capacity(self.layers.len());
        // Selective: the attention call of every layer, run with autograd on leaf q/k/v: its
        // node keeps what the bridge saved (the forward's own tensors, nothing recomputed).
        let mut kept: Vec<(Tensor, Tensor, Tensor, Tensor)> = Vec::new();
        let mut x = tch::no_grad(|| self.embed(input, compute))?;
        for b in &self.layers {
            let next = if selective {
                let (q, k, v) = tch::no_grad(|| self.qkv(b, &x, input, compute))?;
                let (q, k, v) = (
                    q.f_set_requires_grad(true)?,
                    k.f_set_requires_grad(true)?,
                    v.f_set_requires_grad(true)?,
                );
                let o = attention(&q, &k, &v, &input.packing, attn)?;
                // q, k, v stay as gradient receivers only: on CUDA the FLAMIA paths' backward
                // reads the forward's codes, so their BF16 values go now (else every layer's
                // q, k, v live until its backward: tokens x (dim + 2 kv dim) x 2 B a layer)
                crate::attention::release_unsaved_inputs(&q, &k, &v, attn)?;
                let next = tch::no_grad(|| self.after_attention(b, &x, &o, compute))?;
                kept.push((q, k, v, o));
                next
            } else {
                tch::no_grad(|| self.block(b, &x, input, attn, compute))?
            };
            inputs.push(std::mem::replace(&mut x, next));
        }
        let xl = x.f_set_requires_grad(true)?;
        let h = self.rms_norm(&xl, &self.norm)?;
        let loss_sum = head(&h)?; // the head's dh and dw (vocab x dim f32) are freed by now
        drop(h);
        let mut g = xl.f_grad()?;
        for (i, b) in self.layers.iter().enumerate().rev() {
            let xi = inputs
                .pop()
                .expect("one input per layer")
                .f_set_requires_grad(true)?;
            if let Some((q, k, v, o)) = kept.pop() {
                let ol = o.detach().f_set_requires_grad(true)?;
                let y = self.after_attention(b, &xi, &ol, compute)?;
                backprop(&y, &g)?;
                backprop(&o, &ol.f_grad()?)?;
                let (dq, dk, dv) = (q.f_grad()?, k.f_grad()?, v.f_grad()?);
                drop((q, k, v, o, y));
                let (rq, rk, rv) = self.qkv(b, &xi, input, compute)?;
                let s = surrogate(&rq, &dq)?
                    .f_add(&surrogate(&rk, &dk)?)?
                    .f_add(&surrogate(&rv, &dv)?)?;
                s.f_backward()?;
            } else {
                let y = self.block(b, &xi, input, attn, compute)?;
                backprop(&y, &g)?;
            }
            g = xi.f_grad()?;
            debug_assert_eq!(inputs.len(), i);
        }
        let e = self.embed(input, compute)?;
        backprop(&e, &g)?;
        Ok(loss_sum)
    }

    /// Named parameters, sorted by name (the order every optimiser/checkpoint loop uses).
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// `sum(y * g)` in f32: its gradient with respect to `y` is `g` (the way a gradient arriving at
/// `y` from outside the graph is fed into the graph's backward; tch has no `backward(grad)`).
fn surrogate(y: &Tensor, g: &Tensor) -> Result<Tensor> {
    Ok(y.f_mul(g)?.f_sum(Kind::Float)?)
}

/// Backpropagates the gradient `g` arriving at `y`.
fn backprop(y: &Tensor, g: &Tensor) -> Result<()> {
    Ok(surrogate(y, g)?.f_backward()?)
}

/// Copies host int64 data to `device`: asynchronously from pinned memory on CUDA (a plain
/// `to_device` of pageable memory waits for the whole stream), as is on the CPU.
pub fn host_to_device(data: &[i64], device: Device) -> Result<Tensor> {
    crate::attention::upload(&Tensor::from_slice(data), Kind::Int64, device)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::config::AttentionConfig;

    const VOCAB: usize = 40;

    fn batch() -> (Vec<i64>, Vec<i64>, Vec<usize>) {
        let cu = vec![0usize, 7, 20, 32];
        let tokens: Vec<i64> = (0..32).map(|i| (i * 7 + 3) % VOCAB as i64).collect();
        let mut targets: Vec<i64> = (0..32).map(|i| (i * 5 + 1) % VOCAB as i64).collect();
        targets[6] = loss::IGNORE;
        targets[31] = loss::IGNORE;
        (tokens, targets, cu)
    }

    fn grads(model: &Llama) -> Vec<(String, Tensor)> {
        model
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.grad().copy()))
            .collect()
    }

    fn zero(model: &Llama) {
        for (_, mut p) in model.named_parameters() {
            p.zero_grad();
        }
    }

    /// Loss and gradients of the plain graph with the full logits (the trainer before chunking).
    fn reference(
        model: &Llama,
        input: &PackedInput,
        targets: &Tensor,
        attn: &AttnOptions,
    ) -> (f64, Vec<(String, Tensor)>) {
        zero(model);
        let logits = model.forward(input, attn, Kind::Float).unwrap();
        let ls = loss_sum(&logits, targets).unwrap();
        (&ls / 30.0).backward();
        (ls.double_value(&[]), grads(model))
    }

    fn compare(path: &str) {
        tch::manual_seed(0);
        let cfg = ModelConfig::default();
        let model = Llama::new(&cfg, VOCAB, Device::Cpu).unwrap();
        let (tokens, targets, cu) = batch();
        let input = model.input(&tokens, &cu, Device::Cpu).unwrap();
        let targets = Tensor::from_slice(&targets);
        let attn = AttentionConfig {
            path: path.into(),
            ..Default::default()
        }
        .options()
        .unwrap();
        let (l0, g0) = reference(&model, &input, &targets, &attn);
        let modes = [
            (Checkpointing::None, 0usize),
            (Checkpointing::None, 5),
            (Checkpointing::Selective, 7),
            (Checkpointing::Full, 3),
        ];
        for (mode, chunk) in modes {
            zero(&model);
            let opts = StepOptions {
                attn: &attn,
                compute: Kind::Float,
                checkpointing: mode,
                loss_chunk_tokens: chunk,
            };
            let l = model
                .forward_backward(&input, &targets, 30.0, &opts)
                .unwrap()
                .double_value(&[]);
            assert!(
                (l - l0).abs() / l0 < 1e-6,
                "{path} {mode:?}/{chunk}: loss {l} vs {l0}"
            );
            for ((n, a), (_, b)) in grads(&model).iter().zip(&g0) {
                let scale = f64::try_from(b.abs().max()).unwrap().max(1e-12);
                let d = f64::try_from((a - b).abs().max()).unwrap() / scale;
                assert!(
                    d < 1e-5,
                    "{path} {mode:?}/{chunk}: gradient of {n} off by {d:e} (relative to its max)"
                );
            }
        }
    }

    #[test]
    fn every_checkpointing_mode_and_loss_chunking_gives_the_plain_graphs_gradients() {
        compare("bf16");
    }

    #[test]
    fn quantised_attention_recomputed_or_kept_gives_the_same_gradients() {
        compare("mxfp8");
    }

    #[test]
    fn the_model_runs_the_configured_rms_norm_and_refuses_an_unknown_one() {
        for (name, want) in RmsNorm::NAMES
            .iter()
            .zip([RmsNorm::Fused, RmsNorm::FusedF32, RmsNorm::Composite])
        {
            let cfg = ModelConfig {
                rms_norm: name.to_string(),
                ..Default::default()
            };
            assert_eq!(Llama::new(&cfg, VOCAB, Device::Cpu).unwrap().norm_impl(), want);
        }
        let cfg = ModelConfig {
            rms_norm: "rms".into(),
            ..Default::default()
        };
        let e = Llama::new(&cfg, VOCAB, Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("allowed: fused, fused-f32, composite"), "{e}");
    }

    #[test]
    fn checkpointing_names_parse_and_others_are_refused() {
        assert_eq!(Checkpointing::parse("full").unwrap(), Checkpointing::Full);
        assert_eq!(
            Checkpointing::parse("selective").unwrap(),
            Checkpointing::Selective
        );
        assert_eq!(Checkpointing::parse("none").unwrap(), Checkpointing::None);
        let e = Checkpointing::parse("some").unwrap_err().to_string();
        assert!(e.contains("none, selective, full"), "{e}");
    }
}
