//! AdamW over the f32 master weights with f32 moments, decoupled weight decay (none on norms and
//! embeddings), global-norm gradient clipping, and the learning-rate schedule.
//!
//! Multi-tensor form: [`AdamW::new`] moves every parameter, and its gradient, into one flat f32
//! buffer each (the parameters become views of it, `set_data`; the gradients are views that
//! autograd accumulates into in place), parameters with weight decay first. An update is then a
//! handful of elementwise kernels over the flat buffers, in slices of [`SLICE`] elements so the
//! temporaries stay small, whatever the number of parameters (the per-parameter form launched
//! ~15 kernels per parameter). The gradient norm is one reduction, clipping one multiply. The
//! fused `at::_fused_adamw_` is not reachable from tch 0.24 (its generated bindings leave out
//! the foreach and fused ops), and this form runs the same on the CPU and on CUDA.
//!
//! Written out rather than taken from `tch::nn::Optimizer` so the moments can be checkpointed
//! and restored bit for bit.
//!
//! ZeRO-1 ([`AdamW::shard_moments`]): a data-parallel rank keeps the moments of one contiguous
//! range of the flat buffers only and updates only that range of the parameters; the trainer
//! then all-gathers the parameters (`Ddp::all_gather_flat`). The update of each element is the
//! same arithmetic as unsharded, so the parameters are bitwise those of plain data parallelism.

use tch::{Kind, Tensor};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};

/// Elements per slice of the flat buffers in one update (64 Mi: 256 MiB f32 temporaries).
pub const SLICE: i64 = 1 << 26;

/// AdamW state for a fixed, name-sorted parameter list.
#[derive(Debug)]
pub struct AdamW {
    names: Vec<String>,
    decay: Vec<bool>,
    /// Each parameter's offset and shape in the flat buffers.
    layout: Vec<(i64, Vec<i64>)>,
    /// Elements of the decayed parameters (they lead the flat buffers).
    n_decay: i64,
    params: Tensor,
    grads: Tensor,
    m: Tensor,
    v: Tensor,
    /// ZeRO-1: the range of the flat buffers this rank updates; `m`/`v` hold only that range.
    shard: Option<std::ops::Range<i64>>,
    /// Updates applied so far (bias correction uses it).
    pub t: u64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl AdamW {
    /// `params` sorted by name; `no_decay(name)` says which get no weight decay. The parameters'
    /// values move into the optimizer's flat buffer (every handle to them sees it) and their
    /// gradients are defined (zero) as views of the flat gradient buffer.
    pub fn new(
        params: Vec<(String, Tensor)>,
        cfg: &TrainingConfig,
        no_decay: impl Fn(&str) -> bool,
    ) -> Result<AdamW> {
        let decay: Vec<bool> = params.iter().map(|(n, _)| !no_decay(n)).collect();
        let device = params
            .first()
            .map(|(_, p)| p.device())
            .unwrap_or(tch::Device::Cpu);
        // Decayed parameters first, each group in name order.
        let order: Vec<usize> = (0..params.len())
            .filter(|&i| decay[i])
            .chain((0..params.len()).filter(|&i| !decay[i]))
            .collect();
        let mut layout = vec![(0i64, Vec::new()); params.len()];
        let (mut off, mut n_decay) = (0i64, 0i64);
        for &i in &order {
            layout[i] = (off, params[i].1.size());
            off += params[i].1.numel() as i64;
            if decay[i] {
                n_decay = off;
            }
        }
        let opts = (Kind::Float, device);
        let flat = Tensor::f_empty([off], opts)?;
        let grads = Tensor::f_zeros([off], opts)?;
        let view = |buf: &Tensor, i: usize| -> Result<Tensor> {
            let (o, shape) = &layout[i];
            let n: i64 = shape.iter().product();
            Ok(buf.f_narrow(0, *o, n)?.f_view(shape.as_slice())?)
        };
        tch::no_grad(|| -> Result<()> {
            for (i, (name, p)) in params.iter().enumerate() {
                if p.kind() != Kind::Float {
                    return Err(TrainError::Invalid(format!(
                        "AdamW keeps f32 master weights; {name} is {:?}",
                        p.kind()
                    )));
                }
                let mut dst = view(&flat, i)?;
                dst.f_copy_(p)?;
                let mut p = p.shallow_clone();
                p.f_set_data(&dst)?;
            }
            Ok(())
        })?;
        // Define every gradient (a zero backward), then point it at its slice of the flat
        // gradient buffer; autograd accumulates into a defined gradient in place.
        let mut zero = Tensor::f_zeros([], opts)?;
        for (_, p) in &params {
            zero = zero.f_add(&p.f_sum(Kind::Float)?.f_mul_scalar(0.0)?)?;
        }
        if !params.is_empty() {
            zero.f_backward()?;
        }
        tch::no_grad(|| -> Result<()> {
            for (i, (_, p)) in params.iter().enumerate() {
                let mut g = p.f_grad()?;
                g.f_set_data(&view(&grads, i)?)?;
            }
            Ok(())
        })?;
        let m = Tensor::f_zeros([off], opts)?;
        let v = Tensor::f_zeros([off], opts)?;
        Ok(AdamW {
            names: params.into_iter().map(|(n, _)| n).collect(),
            decay,
            layout,
            n_decay,
            params: flat,
            grads,
            m,
            v,
            shard: None,
            t: 0,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        })
    }

    /// Names of the parameters that get weight decay.
    pub fn decayed(&self) -> impl Iterator<Item = &str> {
        self.names
            .iter()
            .zip(&self.decay)
            .filter(|(_, d)| **d)
            .map(|(n, _)| n.as_str())
    }

    /// Global L2 norm of the gradients as an f32 scalar on the device (non-finite if any
    /// gradient is); reading it is the caller's synchronisation.
    pub fn grad_norm(&self) -> Result<Tensor> {
        Ok(self.grads.f_norm()?)
    }

    /// L2 norm of the gradients in `range` of the flat buffer (ZeRO-1 with sharded gradient
    /// reduction: a rank's part of the global norm), as [`AdamW::grad_norm`].
    pub fn grad_norm_of(&self, range: std::ops::Range<i64>) -> Result<Tensor> {
        Ok(self
            .grads
            .f_narrow(0, range.start, range.end - range.start)?
            .f_norm()?)
    }

    /// The flat gradient buffer (every gradient is a view of it).
    pub fn flat_grads(&self) -> &Tensor {
        &self.grads
    }

    /// Multiplies every gradient by `s` (clipping).
    pub fn scale_grads(&mut self, s: f64) -> Result<()> {
        let _ = tch::no_grad(|| self.grads.f_mul_scalar_(s))?;
        Ok(())
    }

    /// Sets every gradient to zero.
    pub fn zero_grad(&mut self) -> Result<()> {
        let _ = tch::no_grad(|| self.grads.f_zero_())?;
        Ok(())
    }

    /// One AdamW update with learning rate `lr`:
    /// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`, `p *= 1 - lr wd` (decayed ones),
    /// `p -= lr (m / bc1) / (sqrt(v / bc2) + eps)`.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        let range = self.shard.clone().unwrap_or(0..self.params.size()[0]);
        let (first, total) = (range.start, range.end);
        tch::no_grad(|| -> Result<()> {
            let mut start = first;
            while start < total {
                let n = SLICE.min(total - start);
                let g = self.grads.f_narrow(0, start, n)?;
                let mut m = self.m.f_narrow(0, start - first, n)?;
                let mut v = self.v.f_narrow(0, start - first, n)?;
                let mut p = self.params.f_narrow(0, start, n)?;
                let _ = m.f_lerp_(&g, 1.0 - self.beta1)?;
                let _ = v.f_lerp_(&g.f_square()?, 1.0 - self.beta2)?;
                if self.weight_decay > 0.0 && start < self.n_decay {
                    let d = n.min(self.n_decay - start);
                    let _ = p.f_narrow(0, 0, d)?.f_mul_scalar_(1.0 - lr * self.weight_decay)?;
                }
                // denom = (sqrt(v / bc2) + eps) * (-bc1 / lr): p + m / denom is the update.
                let mut denom = v.f_div_scalar(bc2)?;
                let _ = denom.f_sqrt_()?;
                let _ = denom.f_add_scalar_(self.eps)?;
                let _ = denom.f_mul_scalar_(-bc1 / lr)?;
                let _ = p.f_addcdiv_(&m, &denom)?;
                start += n;
            }
            Ok(())
        })
    }

    fn view(&self, buf: &Tensor, i: usize) -> Result<Tensor> {
        let (o, shape) = &self.layout[i];
        let n: i64 = shape.iter().product();
        Ok(buf.f_narrow(0, *o, n)?.f_view(shape.as_slice())?)
    }

    /// Moments as named tensors (`m.<param>`, `v.<param>`) for the checkpoint. Under ZeRO-1 this
    /// rank holds only its range: gather the full moments and use [`AdamW::state_tensors_of`].
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        if self.shard.is_some() {
            return Err(TrainError::Invalid(
                "the moments are sharded (ZeRO-1): gather them first".into(),
            ));
        }
        self.state_tensors_of(&self.m, &self.v)
    }

    /// Named views (`m.<param>`, `v.<param>`) of full-length moment buffers `m` and `v`.
    pub fn state_tensors_of(&self, m: &Tensor, v: &Tensor) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::with_capacity(2 * self.names.len());
        for (i, n) in self.names.iter().enumerate() {
            out.push((format!("m.{n}"), self.view(m, i)?));
            out.push((format!("v.{n}"), self.view(v, i)?));
        }
        Ok(out)
    }

    /// Elements of the flat buffers (every parameter).
    pub fn numel(&self) -> i64 {
        self.params.size()[0]
    }

    /// The flat parameter buffer (every parameter is a view of it).
    pub fn flat_params(&self) -> &Tensor {
        &self.params
    }

    /// This rank's moment buffers: the whole flat length, or the ZeRO-1 range.
    pub fn flat_moments(&self) -> (&Tensor, &Tensor) {
        (&self.m, &self.v)
    }

    /// ZeRO-1: keep (a copy of) the moments of `range` only and update only that range from now
    /// on. Call once, after the moments are restored or broadcast.
    pub fn shard_moments(&mut self, range: std::ops::Range<i64>) -> Result<()> {
        if self.shard.is_some() || range.start > range.end || range.end > self.numel() {
            return Err(TrainError::Invalid(format!(
                "ZeRO-1 range {range:?} of {} elements (already sharded: {})",
                self.numel(),
                self.shard.is_some()
            )));
        }
        let n = range.end - range.start;
        let own = |full: &Tensor| -> Result<Tensor> {
            let mut dst = Tensor::f_empty([n], (Kind::Float, full.device()))?;
            dst.f_copy_(&full.f_narrow(0, range.start, n)?)?;
            Ok(dst)
        };
        self.m = own(&self.m)?;
        self.v = own(&self.v)?;
        self.shard = Some(range);
        Ok(())
    }

    /// Restores the moments saved by [`AdamW::state_tensors`] and the update count.
    pub fn load_state(&mut self, tensors: Vec<(String, Tensor)>, t: u64) -> Result<()> {
        let mut map: std::collections::HashMap<String, Tensor> = tensors.into_iter().collect();
        tch::no_grad(|| -> Result<()> {
            for (i, n) in self.names.iter().enumerate() {
                for (key, buf) in [(format!("m.{n}"), &self.m), (format!("v.{n}"), &self.v)] {
                    let mut dst = self.view(buf, i)?;
                    let src = map
                        .remove(&key)
                        .ok_or_else(|| TrainError::Checkpoint(format!("optimizer state lacks {key}")))?;
                    if src.size() != dst.size() {
                        return Err(TrainError::Checkpoint(format!(
                            "optimizer state {key} has shape {:?}, the model needs {:?}",
                            src.size(),
                            dst.size()
                        )));
                    }
                    dst.f_copy_(&src)?;
                }
            }
            Ok(())
        })?;
        self.t = t;
        Ok(())
    }
}

/// Learning rate for the 0-based optimizer step `step`: linear warm-up to `lr`, then cosine to
/// `lr * min_lr_ratio` at the last step, or WSD (stable, then linear decay over the last
/// `decay_fraction` of the steps).
pub fn lr_at(cfg: &TrainingConfig, step: usize) -> f64 {
    let (peak, min) = (cfg.lr, cfg.lr * cfg.min_lr_ratio);
    let warm = cfg.warmup_steps.min(cfg.steps);
    if step < warm {
        return peak * (step + 1) as f64 / warm as f64;
    }
    let total = cfg.steps.max(1);
    match cfg.schedule.as_str() {
        "wsd" => {
            let decay = ((cfg.decay_fraction * total as f64).round() as usize).max(1);
            let start = total.saturating_sub(decay).max(warm);
            if step < start {
                peak
            } else {
                let p = ((step - start + 1) as f64 / (total - start).max(1) as f64).min(1.0);
                peak + (min - peak) * p
            }
        }
        _ => {
            let span = (total - warm).max(1) as f64;
            let p = (((step - warm) as f64 + 1.0) / span).min(1.0);
            min + (peak - min) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_warm_up_then_decay_to_the_floor() {
        let mut c = TrainingConfig {
            steps: 100,
            warmup_steps: 10,
            lr: 1.0,
            min_lr_ratio: 0.1,
            ..Default::default()
        };
        assert!((lr_at(&c, 0) - 0.1).abs() < 1e-12);
        assert!((lr_at(&c, 9) - 1.0).abs() < 1e-12);
        assert!((lr_at(&c, 99) - 0.1).abs() < 1e-12);
        assert!(lr_at(&c, 50) < lr_at(&c, 20));
        c.schedule = "wsd".into();
        c.decay_fraction = 0.2;
        assert_eq!(lr_at(&c, 50), 1.0);
        assert_eq!(lr_at(&c, 79), 1.0);
        assert!((lr_at(&c, 99) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn adamw_first_step_moves_each_weight_by_lr_and_skips_decay_where_asked() {
        let p1 = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let p2 = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
        let cfg = TrainingConfig {
            weight_decay: 0.5,
            ..Default::default()
        };
        let mut opt = AdamW::new(
            vec![
                ("a.weight".into(), p1.shallow_clone()),
                ("norm.weight".into(), p2.shallow_clone()),
            ],
            &cfg,
            |n| n.starts_with("norm"),
        )
        .unwrap();
        let loss = (&p1 * 2.0).sum(Kind::Float) - p2.sum(Kind::Float);
        loss.backward();
        opt.step(0.1).unwrap();
        // Adam's first step is lr * sign(g) (up to eps); decay multiplies a.weight by 1 - 0.05.
        let a: Vec<f32> = p1.detach().try_into().unwrap();
        let b: Vec<f32> = p2.detach().try_into().unwrap();
        assert!(
            (a[0] - (1.0 * 0.95 - 0.1)).abs() < 1e-6 && (a[1] - (-2.0 * 0.95 - 0.1)).abs() < 1e-6,
            "{a:?}"
        );
        assert!((b[0] - 3.1).abs() < 1e-6, "{b:?}");
        assert_eq!(opt.decayed().collect::<Vec<_>>(), vec!["a.weight"]);
    }
}
