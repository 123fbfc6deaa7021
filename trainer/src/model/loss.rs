//! The output head and next-token cross-entropy without the full logits: the tokens go through
//! `linear -> cross-entropy` a chunk at a time, and each chunk's gradients (with respect to the
//! hidden states and the output weight) are computed right there, so the f32 `(tokens, vocab)`
//! logits never exist whole, neither in the forward nor in the backward.
//!
//! The cross-entropy's gradient is written by hand, in place in the chunk's one f32 buffer
//! ([`chunk_cross_entropy`]): `g = (softmax(z) - onehot(target)) / denom`, rows of ignored targets
//! zero. Per chunk this moves fewer bytes than autograd's `log_softmax + nll` forward and backward
//! (which keep the f32 logits, the log-softmax, the nll gradient and the log-softmax gradient, each
//! a full f32 `(chunk, vocab)` tensor); the pass counts are at [`chunk_cross_entropy`]. The results
//! are those of the autograd formulation up to f32 rounding (the tests compare against it).
//!
//! tch cannot define a custom autograd Function, so the head is joined to the rest of the graph
//! through a surrogate: [`HeadGrads::surrogate`] is `sum(h * dh) + <w, dw>`, whose gradient with
//! respect to `h` is exactly `dh` and with respect to `w` exactly `dw`; its backward runs the rest
//! of the model's backward. Several chunks differ from one only in summation order (the
//! per-chunk `dw` products are accumulated in f32).

use tch::{Device, Kind, Tensor};

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

/// One chunk's cross-entropy, computed in place on its logits.
struct ChunkCe {
    /// `exp(z - rowmax)` in f32, `(n, vocab)`: the chunk's one full-size f32 buffer.
    exp: Tensor,
    /// Row sums of `exp`, `(n, 1)` f32.
    sum_exp: Tensor,
    /// Targets as gather/scatter indices `(n, 1)`, ignored ones replaced by 0.
    index: Tensor,
    /// `(n, 1)` bool: the target is not [`IGNORE`].
    valid: Tensor,
    /// Sum of the chunk's token losses, f32 scalar.
    loss: Tensor,
}

/// The logits `hc @ wc^T` of one chunk (`hc` `(n, dim)`, `wc` `(vocab, dim)`, both in the
/// compute kind) and their cross-entropy against `targets` `(n,)`. Memory passes over the
/// `(n, vocab)` data, in units of one f32 `(n, vocab)` tensor (4 bytes an entry), for bf16
/// compute (f32 compute in brackets):
///
/// | step | bf16 | (f32) |
/// |---|---|---|
/// | GEMM writes the logits in the compute kind | 0.5 | (1) |
/// | row max (`amax`) reads them | 0.5 | (1) |
/// | `z - max` into f32 (bf16: a new f32 buffer; f32: `sub_` in place) | 1.5 | (2) |
/// | `exp_` in place | 2 | (2) |
/// | row sum | 1 | (1) |
///
/// 5.5 units (7) for the loss; [`head_forward_backward`] adds 1.5 (2) to turn `exp` into the
/// gradient in the compute kind: 7 (9) in all. The gather of the target entries and the
/// one-hot scatter touch `n` entries only. Autograd's `to_kind(Float) + log_softmax + nll` and
/// their backward took at least 9.5 units for bf16 (GEMM 0.5, f32 copy 1.5, log-softmax
/// forward >= 2, the nll gradient's zero fill 1, log-softmax backward >= 3, gradient to bf16 1.5)
/// and kept up to four f32 `(n, vocab)` tensors alive at once instead of one f32 and one bf16.
fn chunk_cross_entropy(hc: &Tensor, wc: &Tensor, targets: &Tensor) -> Result<ChunkCe> {
    let valid = targets.f_ne(IGNORE)?.f_unsqueeze(1)?;
    let index = targets
        .f_unsqueeze(1)?
        .f_masked_fill(&valid.f_logical_not()?, 0)?;
    let logits = hc.f_mm(&wc.f_tr()?)?;
    let max = logits.f_amax(-1, true)?;
    let mut exp = if logits.kind() == Kind::Float {
        let mut z = logits;
        let _ = z.f_sub_(&max)?;
        z
    } else {
        // bf16 - f32 (n, 1) promotes to an f32 result: the f32 copy and the shift in one pass.
        logits.f_sub(&max.f_to_kind(Kind::Float)?)?
    };
    // z_target - max, before `exp` overwrites the buffer.
    let shifted_target = exp.f_gather(1, &index, false)?;
    let _ = exp.f_exp_()?;
    let sum_exp = exp.f_sum_dim_intlist(-1, true, Kind::Float)?;
    // -log softmax(z)_target = log(sum exp(z - max)) - (z_target - max)
    let loss = sum_exp
        .f_log()?
        .f_sub(&shifted_target)?
        .f_where_scalarother(&valid, 0.0)?
        .f_sum(Kind::Float)?;
    Ok(ChunkCe {
        exp,
        sum_exp,
        index,
        valid,
        loss,
    })
}

/// Loss sum and gradients of `sum(ce(h @ w^T, targets)) / denom` with `h` `(tokens, dim)` in the
/// compute kind, `w` `(vocab, dim)` f32 and `targets` `(tokens,)` int64, `chunk` tokens at a
/// time. Nothing is recorded in the autograd graph.
///
/// Per chunk, after [`chunk_cross_entropy`]: `exp[r, target_r] -= sum_exp_r` (the one-hot,
/// `n` entries), then one pass `g = exp * (valid_r / (sum_exp_r * denom))` written in the compute
/// kind (bf16: read f32, write bf16 into a new buffer; f32: `mul_` in place), so
/// `g = (softmax - onehot) / denom` with ignored rows zero. `dh = g @ wc` goes straight into its
/// rows of `dh`. `dw += g^T h` accumulates in f32: f32 compute and bf16 on CUDA in the GEMM
/// itself (`addmm_`; bf16 operands with f32 output through `aten::addmm.dtype_out`, which
/// libtorch 2.11 implements on CUDA only), bf16 on the CPU as a bf16 product added to the f32
/// sum with the promotion inside the add kernel (no f32 copy of the product).
pub fn head_forward_backward(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    denom: f64,
    chunk: usize,
) -> Result<HeadGrads> {
    tch::no_grad(|| {
        let h = h.detach();
        let compute = h.kind();
        let device = h.device();
        let (t, _) = h.size2()?;
        let chunk = chunk.max(1) as i64;
        let wc = w.detach().f_to_kind(compute)?;
        let dh = Tensor::f_empty(h.size(), (compute, device))?;
        let mut dw = Tensor::f_zeros(w.size(), (Kind::Float, device))?;
        let mut loss = Tensor::f_zeros([], (Kind::Float, device))?;
        let mut start = 0i64;
        while start < t {
            let n = chunk.min(t - start);
            let hc = h.f_narrow(0, start, n)?;
            let ce = chunk_cross_entropy(&hc, &wc, &targets.f_narrow(0, start, n)?)?;
            let mut exp = ce.exp;
            let _ = exp.f_scatter_add_(1, &ce.index, &ce.sum_exp.f_neg()?)?;
            let scale = ce
                .valid
                .f_to_kind(Kind::Float)?
                .f_div(&ce.sum_exp.f_mul_scalar(denom)?)?;
            let g = if compute == Kind::Float {
                let _ = exp.f_mul_(&scale)?;
                exp
            } else {
                let g = Tensor::f_empty(exp.size(), (compute, device))?;
                let _ = exp.f_mul_out(&g, &scale)?;
                g
            };
            let _ = g.f_mm_out(&dh.f_narrow(0, start, n)?, &wc)?;
            let gt = g.f_tr()?;
            match (compute, device) {
                (Kind::Float, _) => {
                    let _ = dw.f_addmm_(&gt, &hc)?;
                }
                (_, Device::Cuda(_)) => {
                    let _ = dw.f_addmm_dtype_out(&dw, &gt, &hc, Kind::Float)?;
                }
                _ => {
                    let _ = dw.f_add_(&gt.f_mm(&hc)?)?;
                }
            }
            let _ = loss.f_add_(&ce.loss)?;
            start += n;
        }
        Ok(HeadGrads {
            loss_sum: loss,
            dh,
            dw,
        })
    })
}

/// Sum of the token losses of `ce(h @ w^T, targets)` without gradients, `chunk` tokens at a time:
/// the forward half of [`head_forward_backward`] (the same ops per chunk, so the same loss
/// bits), for validation. One chunk's f32 buffer is what exists at a time.
pub fn head_loss_sum(h: &Tensor, w: &Tensor, targets: &Tensor, chunk: usize) -> Result<Tensor> {
    tch::no_grad(|| {
        let (t, _) = h.size2()?;
        let chunk = chunk.max(1) as i64;
        let wc = w.f_to_kind(h.kind())?;
        let mut loss = Tensor::f_zeros([], (Kind::Float, h.device()))?;
        let mut start = 0i64;
        while start < t {
            let n = chunk.min(t - start);
            let ce = chunk_cross_entropy(&h.f_narrow(0, start, n)?, &wc, &targets.f_narrow(0, start, n)?)?;
            let _ = loss.f_add_(&ce.loss)?;
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

    /// Loss and gradients of the full-logits loss through plain autograd.
    fn reference(h: &Tensor, w: &Tensor, targets: &Tensor, denom: f64) -> (f64, Tensor, Tensor) {
        let h = h.detach().set_requires_grad(true);
        let w = w.detach().set_requires_grad(true);
        let logits = h.linear(&w, None::<Tensor>).to_kind(Kind::Float);
        let ls = loss_sum(&logits, targets).unwrap();
        (&ls / denom).backward();
        (ls.double_value(&[]), h.grad(), w.grad())
    }

    /// The chunked head as it was before the hand-written gradient: per chunk, the f32 logits
    /// as an autograd leaf through `log_softmax + nll` ([`loss_sum`]), the matmuls by hand.
    fn autograd_head(
        h: &Tensor,
        w: &Tensor,
        targets: &Tensor,
        denom: f64,
        chunk: usize,
    ) -> (f64, Tensor, Tensor) {
        let h = h.detach();
        let compute = h.kind();
        let (t, _) = h.size2().unwrap();
        let chunk = chunk.max(1) as i64;
        let wc = tch::no_grad(|| w.detach().to_kind(compute));
        let dh = Tensor::empty(h.size(), (compute, h.device()));
        let mut dw = Tensor::zeros(w.size(), (Kind::Float, w.device()));
        let mut loss = 0.0;
        let mut start = 0i64;
        while start < t {
            let n = chunk.min(t - start);
            let hc = h.narrow(0, start, n);
            let logits =
                tch::no_grad(|| hc.linear(&wc, None::<Tensor>).to_kind(Kind::Float)).set_requires_grad(true);
            let ls = loss_sum(&logits, &targets.narrow(0, start, n)).unwrap();
            (&ls / denom).backward();
            let g = logits.grad().to_kind(compute);
            tch::no_grad(|| {
                dh.narrow(0, start, n).copy_(&g.mm(&wc));
                let _ = dw.f_add_(&g.tr().mm(&hc).to_kind(Kind::Float)).unwrap();
            });
            loss += ls.double_value(&[]);
            start += n;
        }
        (loss, dh, dw)
    }

    /// Loss and gradients in f64 from `h` and `w` as given (the exact values the compute kind
    /// holds), written out: `g = (softmax - onehot) / denom`, ignored rows zero.
    fn exact(h: &Tensor, w: &Tensor, targets: &Tensor, denom: f64) -> (f64, Tensor, Tensor) {
        let h = h.to_kind(Kind::Double);
        let w = w.to_kind(Kind::Double);
        let valid = targets.ne(IGNORE).unsqueeze(1);
        let index = targets.unsqueeze(1).masked_fill(&valid.logical_not(), 0);
        let lsm = h.mm(&w.tr()).log_softmax(-1, Kind::Double);
        let loss = -lsm
            .gather(1, &index, false)
            .where_scalarother(&valid, 0.0)
            .sum(Kind::Double);
        let onehot = lsm.zeros_like().scatter_value(1, &index, 1.0);
        let g = (lsm.exp() - onehot).where_scalarother(&valid, 0.0) / denom;
        (loss.double_value(&[]), g.mm(&w), g.tr().mm(&h))
    }

    fn case(seed: i64, (t, d, v): (i64, i64, i64), kind: Kind) -> (Tensor, Tensor, Tensor) {
        tch::manual_seed(seed);
        let h = Tensor::randn([t, d], (Kind::Float, Device::Cpu)).to_kind(kind);
        let w = Tensor::randn([v, d], (Kind::Float, Device::Cpu)) * 0.3;
        let targets = Tensor::randint(v, [t], (Kind::Int64, Device::Cpu));
        for i in [0, 5, t - 1] {
            let _ = targets.get(i).fill_(IGNORE);
        }
        (h, w, targets)
    }

    /// The ignored targets' rows of `dh` are exactly zero.
    fn assert_no_gradient<const N: usize>(dh: &Tensor, rows: [i64; N]) {
        for i in rows {
            assert_eq!(dh.get(i).abs().max().double_value(&[]), 0.0, "row {i}");
        }
    }

    /// `got` (on any device) is no further from the exact `want` than 1.5x the autograd head's
    /// `old`, and within 2% of the largest entry.
    fn assert_as_accurate(label: &str, got: &Tensor, old: &Tensor, want: &Tensor) {
        let (e, e_old) = (max_rel(&got.to_device(Device::Cpu), want), max_rel(old, want));
        assert!(
            e <= 1.5 * e_old && e < 2e-2,
            "{label}: error {e:e} (autograd head {e_old:e})"
        );
    }

    #[test]
    fn hand_written_gradient_matches_autograd_in_f32() {
        let (h, w, targets) = case(3, (37, 16, 50), Kind::Float);
        let denom = 34.0;
        let (l0, dh0, dw0) = reference(&h, &w, &targets, denom);
        for chunk in [1usize, 8, 36, 37, 1000] {
            let (la, dha, dwa) = autograd_head(&h, &w, &targets, denom, chunk);
            let c = head_forward_backward(&h, &w, &targets, denom, chunk).unwrap();
            let l = c.loss_sum.double_value(&[]);
            for (what, want) in [("autograd head", la), ("full logits", l0)] {
                assert!(
                    (l - want).abs() / want < 1e-6,
                    "chunk {chunk}: loss {l} vs {what} {want}"
                );
            }
            for (what, got, want) in [
                ("dh vs autograd head", &c.dh, &dha),
                ("dw vs autograd head", &c.dw, &dwa),
                ("dh vs full logits", &c.dh, &dh0),
                ("dw vs full logits", &c.dw, &dw0),
            ] {
                let e = max_rel(got, want);
                assert!(e < 1e-6, "chunk {chunk}: {what} off by {e:e}");
            }
            assert_no_gradient(&c.dh, [0, 5, 36]);
        }
    }

    #[test]
    fn hand_written_gradient_in_bf16_is_as_accurate_as_autograds() {
        let (h, w, targets) = case(7, (64, 32, 96), Kind::BFloat16);
        let denom = 61.0;
        // The exact result for the weights the bf16 head multiplies by.
        let (lx, dhx, dwx) = exact(&h, &w.to_kind(Kind::BFloat16), &targets, denom);
        for chunk in [5usize, 64, 1000] {
            let (la, dha, dwa) = autograd_head(&h, &w, &targets, denom, chunk);
            let c = head_forward_backward(&h, &w, &targets, denom, chunk).unwrap();
            assert_eq!((c.dh.kind(), c.dw.kind()), (Kind::BFloat16, Kind::Float));
            let l = c.loss_sum.double_value(&[]);
            // Both take the cross-entropy of the same bf16 logits in f32.
            assert!((l - la).abs() / la < 1e-6, "chunk {chunk}: loss {l} vs {la}");
            assert!(
                (l - lx).abs() / lx < 1e-2,
                "chunk {chunk}: loss {l} vs exact {lx}"
            );
            for (what, got, old, want) in [("dh", &c.dh, &dha, &dhx), ("dw", &c.dw, &dwa, &dwx)] {
                assert_as_accurate(&format!("chunk {chunk}: {what}"), got, old, want);
                let d = max_rel(got, old);
                assert!(d < 1e-2, "chunk {chunk}: {what} differs from autograd's by {d:e}");
            }
            assert_no_gradient(&c.dh, [0, 5, 63]);
        }
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

    #[test]
    #[ignore = "needs a CUDA GPU: the bf16 head on CUDA (aten::addmm.dtype_out into the f32 dW)"]
    fn bf16_head_on_cuda_is_as_accurate_as_autograds_on_the_cpu() {
        assert!(tch::Cuda::is_available(), "no CUDA device");
        let cuda = Device::Cuda(0);
        let (h, w, targets) = case(11, (300, 64, 1000), Kind::BFloat16);
        let denom = 297.0;
        let (lx, dhx, dwx) = exact(&h, &w.to_kind(Kind::BFloat16), &targets, denom);
        let (la, dha, dwa) = autograd_head(&h, &w, &targets, denom, 128);
        let c = head_forward_backward(
            &h.to_device(cuda),
            &w.to_device(cuda),
            &targets.to_device(cuda),
            denom,
            128,
        )
        .unwrap();
        let l = c.loss_sum.double_value(&[]);
        assert!((l - la).abs() / la < 1e-3, "loss {l} vs {la} (exact {lx})");
        for (what, got, old, want) in [("dh", &c.dh, &dha, &dhx), ("dw", &c.dw, &dwa, &dwx)] {
            let got = got.to_device(Device::Cpu);
            let (e, e_old) = (max_rel(&got, want), max_rel(old, want));
            assert!(
                e <= 1.5 * e_old,
                "{what} error {e:e} (autograd head on the CPU {e_old:e})"
            );
        }
    }
}
