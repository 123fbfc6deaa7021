//! The output head and next-token cross-entropy without the full logits: the tokens go through
//! `linear -> f32 -> log_softmax -> nll` a chunk at a time, and each chunk's gradients (with
//! respect to the hidden states and the output weight) are computed right there, so the f32
//! `(tokens, vocab)` logits never exist whole, neither in the forward nor in the backward.
//!
//! tch cannot define a custom autograd Function, so the head is joined to the rest of the graph
//! through a surrogate: [`HeadGrads::surrogate`] is `sum(h * dh) + <w, dw>`, whose gradient with
//! respect to `h` is exactly `dh` and with respect to `w` exactly `dw`; its backward runs the rest
//! of the model's backward. Per chunk the ops are those of the full-logits loss ([`loss_sum`]),
//! so one chunk gives its loss and gradients; several chunks differ only in summation order
//! (the per-chunk `dw` products are summed in f32).

use tch::{Kind, Tensor};

use crate::error::Result;

/// Target id the loss ignores (padding, document ends without a next token).
pub const IGNORE: i64 = -100;

/// Mean next-token cross-entropy over targets that are not [`IGNORE`], as the sum (divide by the
/// count so micro-batches combine exactly). Materialises the full logits: evaluation and the
/// reference of the tests; training uses [`head_forward_backward`].
pub fn loss_sum(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Ok(logits.f_log_softmax(-1, Kind::Float)?.f_nll_loss_nd::<Tensor>(
        targets,
        None,
        tch::Reduction::Sum,
        IGNORE,
    )?)
}

/// Tokens per loss chunk when the config says 0 (auto): one chunk's f32 logits take at most
/// 1 GiB, in multiples of 256 tokens (2,048 tokens for the 128,256-entry Llama-3 vocabulary).
pub fn auto_chunk_tokens(vocab: usize) -> usize {
    let fit = (1usize << 30) / (4 * vocab.max(1));
    (fit / 256 * 256).max(256)
}

/// The head's loss and gradients for one micro-batch.
#[derive(Debug)]
pub struct HeadGrads {
    /// Sum of the token losses (f32 scalar, detached; not divided by anything).
    pub loss_sum: Tensor,
    /// `d(loss_sum / denom) / dh`, like `h` (compute kind).
    pub dh: Tensor,
    /// `d(loss_sum / denom) / dw` in f32, like the output weight.
    pub dw: Tensor,
}

impl HeadGrads {
    /// `sum(h * dh) + <w, dw>`: backpropagating it gives `h` the gradient `dh` and `w` the
    /// gradient `dw` (and from there the whole model's). `h` and `w` are the graph tensors the
    /// head was computed from (the final norm's output and the f32 output weight).
    pub fn surrogate(&self, h: &Tensor, w: &Tensor) -> Result<Tensor> {
        let th = h.f_mul(&self.dh)?.f_sum(Kind::Float)?;
        let tw = w.f_view([-1])?.f_dot(&self.dw.f_view([-1])?)?;
        Ok(th.f_add(&tw)?)
    }
}

/// Loss sum and gradients of `sum(ce(h @ w^T, targets)) / denom` with `h` `(tokens, dim)` in the
/// compute kind, `w` `(vocab, dim)` f32 and `targets` `(tokens,)` int64, `chunk` tokens at a
/// time. Nothing is recorded in the autograd graph.
pub fn head_forward_backward(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    denom: f64,
    chunk: usize,
) -> Result<HeadGrads> {
    let h = h.detach();
    let compute = h.kind();
    let (t, _) = h.size2()?;
    let chunk = chunk.max(1) as i64;
    let wc = tch::no_grad(|| w.detach().f_to_kind(compute))?;
    let dh = Tensor::f_empty(h.size(), (compute, h.device()))?;
    let mut dw = Tensor::f_zeros(w.size(), (Kind::Float, w.device()))?;
    let mut loss = Tensor::f_zeros([], (Kind::Float, h.device()))?;
    let mut start = 0i64;
    while start < t {
        let n = chunk.min(t - start);
        let hc = h.f_narrow(0, start, n)?;
        // The chunk's logits as an f32 leaf: autograd gives the exact gradient of the loss ops
        // (log_softmax + nll, as in `loss_sum`), the matmuls around it are done by hand.
        let logits = tch::no_grad(|| hc.f_linear(&wc, None::<Tensor>)?.f_to_kind(Kind::Float))?
            .f_set_requires_grad(true)?;
        let ls = loss_sum(&logits, &targets.f_narrow(0, start, n)?)?;
        ls.f_div_scalar(denom)?.f_backward()?;
        let g = logits.f_grad()?.f_to_kind(compute)?;
        drop(logits);
        tch::no_grad(|| -> Result<()> {
            let mut rows = dh.f_narrow(0, start, n)?;
            rows.f_copy_(&g.f_mm(&wc)?)?;
            let gw = g.f_tr()?.f_mm(&hc)?;
            if compute == Kind::Float {
                let _ = dw.f_add_(&gw)?;
            } else {
                let _ = dw.f_add_(&gw.f_to_kind(Kind::Float)?)?;
            }
            let _ = loss.f_add_(&ls.detach())?;
            Ok(())
        })?;
        start += n;
    }
    Ok(HeadGrads {
        loss_sum: loss,
        dh,
        dw,
    })
}

/// Sum of the token losses of `ce(h @ w^T, targets)` without gradients, `chunk` tokens at a time:
/// the forward half of [`head_forward_backward`] (the same ops per chunk), for validation. The
/// f32 logits of one chunk are what exists at a time.
pub fn head_loss_sum(h: &Tensor, w: &Tensor, targets: &Tensor, chunk: usize) -> Result<Tensor> {
    tch::no_grad(|| {
        let compute = h.kind();
        let (t, _) = h.size2()?;
        let chunk = chunk.max(1) as i64;
        let wc = w.f_to_kind(compute)?;
        let mut loss = Tensor::f_zeros([], (Kind::Float, h.device()))?;
        let mut start = 0i64;
        while start < t {
            let n = chunk.min(t - start);
            let logits = h
                .f_narrow(0, start, n)?
                .f_linear(&wc, None::<Tensor>)?
                .f_to_kind(Kind::Float)?;
            let _ = loss.f_add_(&loss_sum(&logits, &targets.f_narrow(0, start, n)?)?)?;
            start += n;
        }
        Ok(loss)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a - b).abs().max().double_value(&[]);
        d / b.abs().max().double_value(&[]).max(1e-30)
    }

    /// Loss and gradients of the full-logits loss (today's path) through plain autograd.
    fn reference(h: &Tensor, w: &Tensor, targets: &Tensor, denom: f64) -> (f64, Tensor, Tensor) {
        let h = h.detach().set_requires_grad(true);
        let w = w.detach().set_requires_grad(true);
        let logits = h.linear(&w, None::<Tensor>).to_kind(Kind::Float);
        let ls = loss_sum(&logits, targets).unwrap();
        (&ls / denom).backward();
        (ls.double_value(&[]), h.grad(), w.grad())
    }

    #[test]
    fn chunked_head_matches_the_full_logits_loss_and_gradients() {
        tch::manual_seed(3);
        let (t, d, v) = (37i64, 16i64, 50i64);
        let h = Tensor::randn([t, d], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([v, d], (Kind::Float, Device::Cpu)) * 0.3;
        let targets = Tensor::randint(v, [t], (Kind::Int64, Device::Cpu));
        let _ = targets.get(5).fill_(IGNORE);
        let _ = targets.get(36).fill_(IGNORE);
        let denom = 35.0;
        let (l0, dh0, dw0) = reference(&h, &w, &targets, denom);
        // One chunk: the same ops in the same order, bitwise.
        let one = head_forward_backward(&h, &w, &targets, denom, 1000).unwrap();
        assert_eq!(one.loss_sum.double_value(&[]).to_bits(), l0.to_bits());
        assert_eq!(max_rel(&one.dh, &dh0), 0.0);
        assert_eq!(max_rel(&one.dw, &dw0), 0.0);
        // Chunks that do not divide the tokens (and one token at a time): summation order only.
        for chunk in [1usize, 8, 36] {
            let c = head_forward_backward(&h, &w, &targets, denom, chunk).unwrap();
            let dl = (c.loss_sum.double_value(&[]) - l0).abs() / l0;
            assert!(
                dl < 1e-6,
                "chunk {chunk}: loss {} vs {l0}",
                c.loss_sum.double_value(&[])
            );
            assert!(max_rel(&c.dh, &dh0) < 1e-6, "chunk {chunk}: dh");
            assert!(
                max_rel(&c.dw, &dw0) < 1e-5,
                "chunk {chunk}: dw {}",
                max_rel(&c.dw, &dw0)
            );
        }
        // Ignored targets get no gradient.
        let c = head_forward_backward(&h, &w, &targets, denom, 8).unwrap();
        assert_eq!(c.dh.get(5).abs().max().double_value(&[]), 0.0);
    }

    #[test]
    fn loss_without_gradients_is_the_training_heads_loss() {
        tch::manual_seed(5);
        let (t, d, v) = (29i64, 12i64, 31i64);
        let h = Tensor::randn([t, d], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([v, d], (Kind::Float, Device::Cpu)) * 0.3;
        let targets = Tensor::randint(v, [t], (Kind::Int64, Device::Cpu));
        let _ = targets.get(3).fill_(IGNORE);
        for chunk in [1usize, 7, 29, 100] {
            let train = head_forward_backward(&h, &w, &targets, 1.0, chunk).unwrap();
            let eval = head_loss_sum(&h, &w, &targets, chunk).unwrap();
            assert_eq!(
                eval.double_value(&[]).to_bits(),
                train.loss_sum.double_value(&[]).to_bits(),
                "chunk {chunk}"
            );
            assert!(!eval.requires_grad());
        }
    }

    #[test]
    fn surrogate_backward_delivers_the_head_gradients() {
        tch::manual_seed(4);
        let x = Tensor::randn([6, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let w = Tensor::randn([11, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let h = x.tanh(); // some graph between the leaf and the head
        let targets = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6]);
        let g = head_forward_backward(&h, &w, &targets, 6.0, 4).unwrap();
        g.surrogate(&h, &w).unwrap().backward();
        let (_, _, dw0) = reference(&h, &w, &targets, 6.0);
        assert!(max_rel(&w.grad(), &dw0) < 1e-6);
        // d/dx = dh * (1 - tanh^2)
        let want = &g.dh * (1.0 - h.detach().square());
        assert!(max_rel(&x.grad(), &want) < 1e-6);
    }

    #[test]
    fn auto_chunk_keeps_a_chunk_of_f32_logits_within_one_gib() {
        assert_eq!(auto_chunk_tokens(128_256), 2048);
        assert!(auto_chunk_tokens(258) * 4 * 258 <= 1 << 30);
        assert_eq!(auto_chunk_tokens(100_000_000), 256);
    }
}
