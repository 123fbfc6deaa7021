//! AdamW over the f32 master weights with f32 moments, decoupled weight decay (none on norms and
//! embeddings), global-norm gradient clipping, and the learning-rate schedule.
//!
//! Written out rather than taken from `tch::nn::Optimizer` so the moments can be checkpointed
//! and restored bit for bit.

use tch::{Kind, Tensor};

use crate::config::TrainingConfig;
use crate::error::{Result, TrainError};

/// AdamW state for a fixed, name-sorted parameter list.
#[derive(Debug)]
pub struct AdamW {
    names: Vec<String>,
    params: Vec<Tensor>,
    decay: Vec<bool>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Updates applied so far (bias correction uses it).
    pub t: u64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl AdamW {
    /// `params` sorted by name; `no_decay(name)` says which get no weight decay.
    pub fn new(
        params: Vec<(String, Tensor)>,
        cfg: &TrainingConfig,
        no_decay: impl Fn(&str) -> bool,
    ) -> AdamW {
        let decay = params.iter().map(|(n, _)| !no_decay(n)).collect();
        let m = params.iter().map(|(_, p)| p.zeros_like()).collect();
        let v = params.iter().map(|(_, p)| p.zeros_like()).collect();
        let (names, params) = params.into_iter().unzip();
        AdamW {
            names,
            params,
            decay,
            m,
            v,
            t: 0,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        }
    }

    /// Names of the parameters that get weight decay.
    pub fn decayed(&self) -> impl Iterator<Item = &str> {
        self.names
            .iter()
            .zip(&self.decay)
            .filter(|(_, d)| **d)
            .map(|(n, _)| n.as_str())
    }

    /// Global L2 norm of the gradients (f64; non-finite if any gradient is).
    pub fn grad_norm(&self) -> f64 {
        let sq: Vec<Tensor> = self
            .params
            .iter()
            .filter(|p| p.grad().defined())
            .map(|p| p.grad().to_kind(Kind::Float).square().sum(Kind::Float))
            .collect();
        if sq.is_empty() {
            return 0.0;
        }
        Tensor::stack(&sq, 0).sum(Kind::Float).sqrt().double_value(&[])
    }

    /// Multiplies every gradient by `s` (clipping).
    pub fn scale_grads(&mut self, s: f64) {
        tch::no_grad(|| {
            for p in &self.params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.f_mul_scalar_(s);
                }
            }
        });
    }

    /// Sets every gradient to zero.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.zero_grad();
        }
    }

    /// One AdamW update with learning rate `lr`.
    pub fn step(&mut self, lr: f64) {
        self.t += 1;
        let bc1 = 1.0 - self.beta1.powi(self.t as i32);
        let bc2 = 1.0 - self.beta2.powi(self.t as i32);
        tch::no_grad(|| {
            for i in 0..self.params.len() {
                let g = self.params[i].grad();
                if !g.defined() {
                    continue;
                }
                let g = g.to_kind(Kind::Float);
                let m = &mut self.m[i];
                let _ = m.f_mul_scalar_(self.beta1);
                let _ = m.f_add_(&(&g * (1.0 - self.beta1)));
                let v = &mut self.v[i];
                let _ = v.f_mul_scalar_(self.beta2);
                let _ = v.f_add_(&(g.square() * (1.0 - self.beta2)));
                let p = &mut self.params[i];
                if self.decay[i] && self.weight_decay > 0.0 {
                    let _ = p.f_mul_scalar_(1.0 - lr * self.weight_decay);
                }
                let update = (&self.m[i] / bc1) / ((&self.v[i] / bc2).sqrt() + self.eps);
                let _ = p.f_sub_(&(update * lr));
            }
        });
    }

    /// Moments as named tensors (`m.<param>`, `v.<param>`) for the checkpoint.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.names.len());
        for (i, n) in self.names.iter().enumerate() {
            out.push((format!("m.{n}"), self.m[i].shallow_clone()));
            out.push((format!("v.{n}"), self.v[i].shallow_clone()));
        }
        out
    }

    /// Restores the moments saved by [`AdamW::state_tensors`] and the update count.
    pub fn load_state(&mut self, tensors: Vec<(String, Tensor)>, t: u64) -> Result<()> {
        let mut map: std::collections::HashMap<String, Tensor> = tensors.into_iter().collect();
        tch::no_grad(|| -> Result<()> {
            for (i, n) in self.names.iter().enumerate() {
                for (key, dst) in [
                    (format!("m.{n}"), &mut self.m[i]),
                    (format!("v.{n}"), &mut self.v[i]),
                ] {
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
                    dst.copy_(&src);
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
        );
        let loss = (&p1 * 2.0).sum(Kind::Float) - p2.sum(Kind::Float);
        loss.backward();
        opt.step(0.1);
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
