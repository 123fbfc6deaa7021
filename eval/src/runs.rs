//! Reading a training run directory for comparisons.
//!
//! Files read (docs/eval.md has the full description):
//! - `metrics.jsonl`: one JSON object per line. Lines with a numeric `step` and a training loss
//!   (the first key present of [`LOSS_KEYS`]) are loss points; the first key of [`TPS_KEYS`]
//!   gives tokens/s; a line with a numeric `step` and [`VAL_LOSS_KEY`] (flamia's validation
//!   during training) is a validation point. Other lines (events, evaluation lines) are skipped.
//!   A step logged more than once keeps its last line (see [`Run::load`]).
//! - `eval.json`: the [`EvalResults`] `flamia eval` wrote (optional).
//! - `config.toml`: the resolved config `flamia train` writes (optional); only `seed` of its
//!   `[run]` and `[data]` tables is read, to pair runs of different arms by seed.

use crate::error::{Error, Result};
use crate::results::{self, EvalResults};
use crate::stats::quantile;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Metrics file name inside a run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// Keys accepted for the training loss, in order of preference.
pub const LOSS_KEYS: [&str; 3] = ["loss", "train/loss", "loss_metrics/global_avg_loss"];
/// Key of the validation loss that `flamia train` logs with a step (`training.val_every`).
pub const VAL_LOSS_KEY: &str = "val_loss";
/// Key of the same validation tokens' loss through exact attention (`training.val_exact`).
pub const VAL_LOSS_EXACT_KEY: &str = "val_loss_exact";
/// Keys accepted for throughput in tokens per second, in order of preference.
pub const TPS_KEYS: [&str; 3] = ["tokens_per_s", "tps", "train/tokens_per_s"];
/// Resolved-config file name inside a run directory.
pub const CONFIG_FILE: &str = "config.toml";

/// The seeds a run was made with (`run.seed`: initialisation, `data.seed`: data order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Seeds {
    pub run: u64,
    pub data: u64,
}

impl std::fmt::Display for Seeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run.seed {}, data.seed {}", self.run, self.data)
    }
}

/// What a comparison needs from one run.
#[derive(Debug, Clone)]
pub struct Run {
    pub label: String,
    pub dir: PathBuf,
    /// `(step, loss)` by increasing step, one per step (the last line logged for it).
    pub losses: Vec<(u64, f64)>,
    /// The tokens/s of the loss points that logged one (the last line of each step).
    pub tps: Vec<f64>,
    /// `(step, validation loss)` logged during training (through the training attention path),
    /// by increasing step, one per step (the last line logged for it).
    pub val_losses: Vec<(u64, f64)>,
    /// The same passes' losses through exact attention (`val_loss_exact`), likewise.
    pub val_losses_exact: Vec<(u64, f64)>,
    pub eval: Option<EvalResults>,
    /// Seeds from the run's `config.toml`; `None` without the file or either key.
    pub seeds: Option<Seeds>,
}

impl Run {
    /// Reads `dir`; `label` defaults to the directory name.
    ///
    /// A step that appears on several lines keeps its last line, and points are ordered by
    /// step, so a curve never runs backwards. `flamia train` itself drops the lines past the
    /// checkpoint when it resumes, so its files do not repeat steps; a log whose writer appended
    /// after resuming from an earlier step (or a resume that could not rewrite the file) does.
    pub fn load(dir: &Path, label: Option<String>) -> Result<Run> {
        let run_err = |msg: String| Error::Run { run: dir.into(), msg };
        let path = dir.join(METRICS_FILE);
        let file = std::fs::File::open(&path).map_err(|e| {
            run_err(format!(
                "cannot open {METRICS_FILE} ({e}); is this a run directory?"
            ))
        })?;
        // step -> (loss, tokens/s); step -> validation loss. Later lines replace earlier ones.
        let mut losses: BTreeMap<u64, (f64, Option<f64>)> = BTreeMap::new();
        let mut val_losses: BTreeMap<u64, f64> = BTreeMap::new();
        let mut val_losses_exact: BTreeMap<u64, f64> = BTreeMap::new();
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
            for (key, series) in [
                (VAL_LOSS_KEY, &mut val_losses),
                (VAL_LOSS_EXACT_KEY, &mut val_losses_exact),
            ] {
                if let (Some(step), Some(val)) = (step, v.get(key).and_then(Value::as_f64)) {
                    series.insert(step, val);
                }
            }
            let loss = LOSS_KEYS.iter().find_map(|k| v.get(*k).and_then(Value::as_f64));
            if let (Some(step), Some(loss)) = (step, loss) {
                let t = TPS_KEYS.iter().find_map(|k| v.get(*k).and_then(Value::as_f64));
                losses.insert(step, (loss, t));
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
        let seeds = read_seeds(&dir.join(CONFIG_FILE))?;
        let label = label.unwrap_or_else(|| {
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string())
        });
        Ok(Run {
            label,
            dir: dir.into(),
            tps: losses.values().filter_map(|l| l.1).collect(),
            losses: losses.into_iter().map(|(s, l)| (s, l.0)).collect(),
            val_losses: val_losses.into_iter().collect(),
            val_losses_exact: val_losses_exact.into_iter().collect(),
            eval,
            seeds,
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

/// [`parse_seeds`] of the file at `path`; `None` when there is no such file.
fn read_seeds(path: &Path) -> Result<Option<Seeds>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse_seeds(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// `seed` of the `[run]` and `[data]` tables of a resolved `config.toml`; `None` when the text is
/// not TOML or either is missing or not a non-negative integer.
pub fn parse_seeds(text: &str) -> Option<Seeds> {
    let t: toml::Table = text.parse().ok()?;
    let seed = |table: &str| u64::try_from(t.get(table)?.get("seed")?.as_integer()?).ok();
    Some(Seeds {
        run: seed("run")?,
        data: seed("data")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_come_from_the_run_and_data_tables_only() {
        let text = "[run]\nname = \"x\"\nseed = 3 # init\n\n[model]\nseed = 99\n\n[data]\n\
                    train = [\n    [1, 2],\n    [3, 4]\n]\nseed = 1_000\n\n[data.filters]\nseed = 5\n";
        assert_eq!(parse_seeds(text), Some(Seeds { run: 3, data: 1000 }));
        assert_eq!(parse_seeds("[run]\nseed = 3\n"), None, "no [data] seed");
        assert_eq!(parse_seeds("[run]\nseed = -1\n[data]\nseed = 2\n"), None);
    }
}
