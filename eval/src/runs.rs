//! Reading a training run directory for comparisons.
//!
//! Files read (docs/eval.md has the full description):
//! - `metrics.jsonl`: one JSON object per line. Lines with a numeric `step` and a training loss
//!   (the first key present of [`LOSS_KEYS`]) are loss points; the first key of [`TPS_KEYS`]
//!   gives tokens/s; a line with a numeric `step` and [`VAL_LOSS_KEY`] (flamia's validation
//!   during training) is a validation point. Other lines (events, evaluation lines) are skipped.
//! - `eval.json`: the [`EvalResults`] `flamia eval` wrote (optional).

use crate::error::{Error, Result};
use crate::results::{self, EvalResults};
use crate::stats::quantile;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Metrics file name inside a run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// Keys accepted for the training loss, in order of preference.
pub const LOSS_KEYS: [&str; 3] = ["loss", "train/loss", "loss_metrics/global_avg_loss"];
/// Key of the validation loss that `flamia train` logs with a step (`training.val_every`).
pub const VAL_LOSS_KEY: &str = "val_loss";
/// Keys accepted for throughput in tokens per second, in order of preference.
pub const TPS_KEYS: [&str; 3] = ["tokens_per_s", "tps", "train/tokens_per_s"];

/// What a comparison needs from one run.
#[derive(Debug, Clone)]
pub struct Run {
    pub label: String,
    pub dir: PathBuf,
    /// `(step, loss)` in file order.
    pub losses: Vec<(u64, f64)>,
    /// Every tokens/s value logged.
    pub tps: Vec<f64>,
    /// `(step, validation loss)` logged during training, in file order.
    pub val_losses: Vec<(u64, f64)>,
    pub eval: Option<EvalResults>,
}

impl Run {
    /// Reads `dir`; `label` defaults to the directory name.
    pub fn load(dir: &Path, label: Option<String>) -> Result<Run> {
        let run_err = |msg: String| Error::Run { run: dir.into(), msg };
        let path = dir.join(METRICS_FILE);
        let file = std::fs::File::open(&path).map_err(|e| {
            run_err(format!(
                "cannot open {METRICS_FILE} ({e}); is this a run directory?"
            ))
        })?;
        let mut losses = Vec::new();
        let mut tps = Vec::new();
        let mut val_losses = Vec::new();
        for (i, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| Error::io(&path, e))?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| Error::Json {
                path: path.clone(),
                line: i + 1,
                msg: e.to_string(),
            })?;
            let step = v.get("step").and_then(Value::as_u64);
            if let (Some(step), Some(val)) = (step, v.get(VAL_LOSS_KEY).and_then(Value::as_f64)) {
                val_losses.push((step, val));
            }
            let loss = LOSS_KEYS.iter().find_map(|k| v.get(*k).and_then(Value::as_f64));
            if let (Some(step), Some(loss)) = (step, loss) {
                losses.push((step, loss));
                if let Some(t) = TPS_KEYS.iter().find_map(|k| v.get(*k).and_then(Value::as_f64)) {
                    tps.push(t);
                }
            }
        }
        if losses.is_empty() {
            return Err(run_err(format!(
                "{METRICS_FILE} has no line with a numeric \"step\" and a loss (keys {LOSS_KEYS:?})"
            )));
        }
        let eval_path = dir.join(results::FILE_NAME);
        let eval = if eval_path.is_file() {
            Some(EvalResults::read(&eval_path)?)
        } else {
            None
        };
        let label = label.unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string())
        });
        Ok(Run {
            label,
            dir: dir.into(),
            losses,
            tps,
            val_losses,
            eval,
        })
    }

    /// Last logged step.
    pub fn last_step(&self) -> u64 {
        self.losses.last().map_or(0, |l| l.0)
    }

    /// Last logged loss.
    pub fn final_loss(&self) -> f64 {
        self.losses.last().map_or(f64::NAN, |l| l.1)
    }

    /// Mean of the last `n` logged losses (all of them if fewer).
    pub fn last_n_mean(&self, n: usize) -> f64 {
        let tail = &self.losses[self.losses.len().saturating_sub(n.max(1))..];
        tail.iter().map(|l| l.1).sum::<f64>() / tail.len() as f64
    }

    /// Median logged tokens/s (robust to the slow first steps), if any was logged.
    pub fn tokens_per_s(&self) -> Option<f64> {
        if self.tps.is_empty() {
            return None;
        }
        let mut t = self.tps.clone();
        t.sort_by(f64::total_cmp);
        Some(quantile(&t, 0.5))
    }
}
