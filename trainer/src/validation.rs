//! Validation during training (`training.val_every`, `training.val_tokens`): the model's mean
//! next-token loss on the validation split — `data.val`, or the part of `data.train` held out by
//! `holdout_fraction` / `holdout_files` — through the training attention path and the same
//! chunked loss head as training, logged as `val_loss` with the step's metrics (JSONL, W&B,
//! a line above the progress bar). With a FLAMIA path and `training.val_exact` (the default) the
//! same tokens are scored again through exact attention (`val_loss_exact`): quality is judged by
//! that number, never only through the kernel that trained.
//!
//! A pass scores the first `val_tokens` tokens of the split (all ranks together; each rank whole
//! batches of its own share until it has its part). The batches are read once, at the first
//! pass, and kept on the host, so every pass scores the same tokens. A pass runs without
//! autograd and touches neither the parameters, their gradients, the RNG nor the training data
//! stream: training is the same with or without validation (tested bitwise on the CPU).

use std::time::Instant;

use flamia_data::{Batch, Loader};
use tch::{Device, Tensor};

use crate::config::TrainConfig;
use crate::ddp::Ddp;
use crate::error::{Result, TrainError};
use crate::metrics::progress::Progress;
use crate::model::{host_to_device, Llama, StepOptions};

/// One validation pass's result (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ValResult {
    /// Mean next-token loss over the scored targets of all ranks.
    pub loss: f64,
    /// Targets scored, all ranks together.
    pub tokens: u64,
    /// Wall time of the pass on this rank (both passes with an exact one).
    pub seconds: f64,
    /// The same targets' mean loss through exact attention (`training.val_exact`).
    pub exact_loss: Option<f64>,
}

/// The validation schedule and this rank's batches.
pub struct Validator {
    every: usize,
    /// `training.steps`: validated too when the run is at least `every` steps long.
    last: usize,
    /// This rank's share of the token budget.
    budget: usize,
    /// Opened at start (so a bad validation config fails at once), read at the first pass.
    loader: Option<Loader>,
    batches: Vec<Batch>,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field("every", &self.every)
            .field("budget", &self.budget)
            .field("batches", &self.batches.len())
            .finish()
    }
}

impl Validator {
    /// The validator of `rank` of `world`, or `None` when validation is off (`val_every = 0`) or
    /// the config has no validation split (empty `data.val`, nothing held out).
    pub fn new(cfg: &TrainConfig, rank: usize, world: usize) -> Result<Option<Validator>> {
        let t = &cfg.training;
        if t.val_every == 0 {
            return Ok(None);
        }
        if cfg.data.val.is_empty() && !cfg.data.holds_out() {
            tracing::info!(
                "validation off: no validation split (data.val is empty and nothing of data.train is held out)"
            );
            return Ok(None);
        }
        let loader = Loader::validation(&cfg.data, rank, world)
            .map_err(|e| TrainError::Invalid(format!("validation data: {e}")))?;
        Ok(Some(Validator {
            every: t.val_every,
            last: t.steps,
            budget: t.val_tokens.div_ceil(world.max(1)),
            loader: Some(loader),
            batches: Vec::new(),
        }))
    }

    /// Whether optimizer step `step` (1-based, completed) is followed by a validation pass.
    pub fn due(&self, step: usize) -> bool {
        step.is_multiple_of(self.every) || (step == self.last && self.last >= self.every)
    }

    /// This rank's batches: read from the split on the first call, up to the budget.
    fn batches(&mut self) -> Result<&[Batch]> {
        if let Some(mut loader) = self.loader.take() {
            let mut tokens = 0;
            while tokens < self.budget {
                match loader
                    .next_batch()
                    .map_err(|e| TrainError::Invalid(format!("validation data: {e}")))?
                {
                    Some(b) => {
                        tokens += b.tokens.len();
                        self.batches.push(b);
                    }
                    None => break,
                }
            }
        }
        Ok(&self.batches)
    }

    /// One pass: every rank scores its batches, then the loss sums and target counts are
    /// combined over ranks (collective: every rank calls it at the same steps).
    pub fn run(
        &mut self,
        model: &Llama,
        opts: &StepOptions,
        device: Device,
        ddp: &Ddp,
        progress: &Progress,
    ) -> Result<ValResult> {
        let t0 = Instant::now();
        let batches = self.batches()?;
        let n = batches.len();
        let mut sum: Option<Tensor> = None;
        let mut targets = 0usize;
        for (i, b) in batches.iter().enumerate() {
            progress.status(format!("validating: batch {} of {n}", i + 1));
            let tokens: Vec<i64> = b.tokens.iter().map(|&t| i64::from(t)).collect();
            let ls = (|| -> Result<Tensor> {
                let input = model.input(&tokens, &b.packed_cu_seqlens(), device)?;
                let y = host_to_device(&b.targets, device)?;
                model.loss_sum_no_grad(&input, &y, opts)
            })()
            .map_err(|e| {
                crate::memory::explain_in(
                    e,
                    || format!("validation batch {} of {n} ({} tokens)", i + 1, tokens.len()),
                    device,
                    crate::memory::Phase::Validation,
                )
            })?;
            targets += b.target_tokens();
            sum = Some(match sum {
                None => ls,
                Some(s) => s.f_add(&ls)?,
            });
        }
        let local = match sum {
            Some(s) => s.f_double_value(&[])?,
            None => 0.0,
        };
        // Means over ranks of the sums and the counts: their ratio is the mean over all targets.
        let m = ddp.mean(&[local, targets as f64])?;
        let world = ddp.world_size() as f64;
        if m[1] <= 0.0 {
            return Err(TrainError::Invalid(
                "validation: the validation split gave no target tokens".into(),
            ));
        }
        Ok(ValResult {
            loss: m[0] / m[1],
            tokens: (m[1] * world).round() as u64,
            seconds: t0.elapsed().as_secs_f64(),
            exact_loss: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validator(every: usize, last: usize) -> Validator {
        Validator {
            every,
            last,
            budget: 1,
            loader: None,
            batches: Vec::new(),
        }
    }

    #[test]
    fn due_every_n_steps_and_at_the_end_of_a_long_enough_run() {
        let v = validator(4, 10);
        let due: Vec<usize> = (1..=10).filter(|&s| v.due(s)).collect();
        assert_eq!(due, vec![4, 8, 10]);
        // A run shorter than the interval is not validated at its end either.
        let v = validator(25, 10);
        assert!((1..=10).all(|s| !v.due(s)));
    }
}
