//! A/B comparison of arms (one or more runs each, e.g. seeds) against a control (the first arm):
//! loss curves PNG, loss summaries, validation through the training path and exact attention,
//! task scores; per arm the mean and spread over its runs, and arm − control differences of
//! means with a 95% Welch t interval from the seed spread; with one run per arm, task accuracies
//! with paired-bootstrap differences over the same examples. Rendered as markdown.

use crate::error::{Error, Result};
use crate::plot;
use crate::runs::Run;
use crate::stats::{bootstrap_mean, paired_diff, spread, welch_diff, Estimate, Spread, RESAMPLES, SEED};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Comparison options.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Average the last `last_n` logged losses.
    pub last_n: usize,
    /// Directory the report (`compare.md`) and plot (`loss.png`) go to.
    pub out_dir: PathBuf,
}

/// Files a comparison wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub markdown: PathBuf,
    pub png: PathBuf,
}

/// One arm of a comparison: the runs made with one setting (different seeds).
#[derive(Debug, Clone)]
pub struct Arm {
    pub label: String,
    pub runs: Vec<Run>,
}

impl Arm {
    /// `label` for one run, `label/dir-name` for several.
    pub fn run_label(&self, r: &Run) -> String {
        if self.runs.len() == 1 {
            self.label.clone()
        } else {
            format!("{}/{}", self.label, r.label)
        }
    }
}

/// One scalar metric across arms.
#[derive(Debug, Clone)]
pub struct MetricRow {
    pub metric: String,
    /// Reported in percent (task scores) rather than as is (losses).
    pub percent: bool,
    /// Per arm: mean, sample standard deviation and count over its runs that have the metric.
    pub values: Vec<Spread>,
    /// Per arm (index 0, the control, is always `None`): arm − control difference of means with
    /// its 95% Welch t interval; `None` when either side has fewer than 2 runs.
    pub diffs: Vec<Option<Estimate>>,
}

/// Per-run scalar metrics: training loss (mean of the last `last_n` logged), the last validation
/// loss logged during training (`val_loss` in `metrics.jsonl`), validation loss of `flamia eval`
/// (exact and training path) and exact bits per byte, and every task's `acc_norm`, `acc` and
/// perplexity. Metrics no run has are left out.
pub fn metric_rows(arms: &[Arm], last_n: usize) -> Vec<MetricRow> {
    type Get = Box<dyn Fn(&Run) -> Option<f64>>;
    let mut metrics: Vec<(String, bool, Get)> = vec![
        (
            format!("training loss (mean of last {last_n} logged)"),
            false,
            Box::new(move |r: &Run| Some(r.last_n_mean(last_n))),
        ),
        (
            "validation loss during training (last logged)".into(),
            false,
            Box::new(|r: &Run| r.val_losses.last().map(|v| v.1)),
        ),
        (
            "validation loss, exact attention".into(),
            false,
            Box::new(|r: &Run| Some(r.eval.as_ref()?.validation.as_ref()?.exact.loss)),
        ),
        (
            "validation loss, training path".into(),
            false,
            Box::new(|r: &Run| Some(r.eval.as_ref()?.validation.as_ref()?.training.loss)),
        ),
        (
            "validation bits per byte, exact".into(),
            false,
            Box::new(|r: &Run| Some(r.eval.as_ref()?.validation.as_ref()?.exact.bpb)),
        ),
    ];
    let tasks: BTreeSet<String> = arms
        .iter()
        .flat_map(|a| &a.runs)
        .filter_map(|r| r.eval.as_ref())
        .flat_map(|e| e.tasks.keys().cloned())
        .collect();
    for t in tasks {
        let (a, b, c) = (t.clone(), t.clone(), t.clone());
        metrics.push((
            format!("{t} acc_norm"),
            true,
            Box::new(move |r: &Run| Some(r.eval.as_ref()?.tasks.get(&a)?.acc_norm)),
        ));
        metrics.push((
            format!("{t} acc"),
            true,
            Box::new(move |r: &Run| Some(r.eval.as_ref()?.tasks.get(&b)?.acc)),
        ));
        metrics.push((
            format!("{t} perplexity"),
            false,
            Box::new(move |r: &Run| r.eval.as_ref()?.tasks.get(&c)?.perplexity),
        ));
    }
    metrics
        .into_iter()
        .filter_map(|(metric, percent, get)| {
            let per_arm: Vec<Vec<f64>> = arms
                .iter()
                .map(|a| a.runs.iter().filter_map(&get).filter(|x| x.is_finite()).collect())
                .collect();
            if per_arm.iter().all(Vec::is_empty) {
                return None;
            }
            let diffs = per_arm
                .iter()
                .enumerate()
                .map(|(i, v)| if i == 0 { None } else { welch_diff(&per_arm[0], v) })
                .collect();
            Some(MetricRow {
                metric,
                percent,
                values: per_arm.iter().map(|v| spread(v)).collect(),
                diffs,
            })
        })
        .collect()
}

/// One task and metric across runs.
#[derive(Debug, Clone)]
pub struct TaskRow {
    pub task: String,
    /// Examples the control scored.
    pub n: usize,
    /// Per run: the accuracy and its interval, `None` if the run has no result for the task.
    pub values: Vec<Option<Estimate>>,
    /// Per run (index 0, the control, is always `None`): paired difference run - control, or why
    /// it could not be paired.
    pub diffs: Vec<Option<std::result::Result<Estimate, String>>>,
}

/// Task rows for `acc` (`norm = false`) or `acc_norm`, one per task any run has.
pub fn task_rows(runs: &[Run], norm: bool) -> Vec<TaskRow> {
    let tasks: BTreeSet<&String> = runs
        .iter()
        .filter_map(|r| r.eval.as_ref())
        .flat_map(|e| e.tasks.keys())
        .collect();
    tasks
        .into_iter()
        .map(|task| {
            let results: Vec<_> = runs
                .iter()
                .map(|r| r.eval.as_ref().and_then(|e| e.tasks.get(task)))
                .collect();
            let values = results
                .iter()
                .map(|t| t.map(|t| bootstrap_mean(&t.outcomes(norm), RESAMPLES, SEED)))
                .collect();
            let control = results[0];
            let diffs = results
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if i == 0 {
                        return None;
                    }
                    let (c, t) = (control?, (*t)?);
                    Some(if c.fingerprint == t.fingerprint && c.n == t.n {
                        Ok(paired_diff(&c.outcomes(norm), &t.outcomes(norm), RESAMPLES, SEED))
                    } else {
                        Err(format!("different examples (n {} vs {})", c.n, t.n))
                    })
                })
                .collect();
            TaskRow {
                task: task.clone(),
                n: control.map_or(0, |c| c.n),
                values,
                diffs,
            }
        })
        .collect()
}

fn f4(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "-".into()
    }
}

fn pct(e: &Estimate) -> String {
    format!("{:.1} [{:.1}, {:.1}]", 100.0 * e.mean, 100.0 * e.lo, 100.0 * e.hi)
}

fn signed_pct(e: &Estimate) -> String {
    format!(
        "{:+.1} [{:+.1}, {:+.1}]",
        100.0 * e.mean,
        100.0 * e.lo,
        100.0 * e.hi
    )
}

fn spread_cell(v: &Spread, percent: bool) -> String {
    let k = if percent { 100.0 } else { 1.0 };
    match (v.n, percent) {
        (0, _) => "-".into(),
        (1, true) => format!("{:.1}", k * v.mean),
        (1, false) => f4(v.mean),
        (_, true) => format!("{:.1} ± {:.1}", k * v.mean, k * v.sd),
        (_, false) => format!("{} ± {}", f4(v.mean), f4(v.sd)),
    }
}

fn diff_cell(d: &Estimate, percent: bool) -> String {
    if percent {
        signed_pct(d)
    } else {
        format!("{:+.4} [{:+.4}, {:+.4}]", d.mean, d.lo, d.hi)
    }
}

/// The markdown report; `png` is the plot's file name relative to the report.
pub fn markdown(arms: &[Arm], last_n: usize, png: Option<&str>) -> String {
    let mut s = String::new();
    let names: Vec<String> = arms
        .iter()
        .map(|a| {
            if a.runs.len() == 1 {
                a.label.clone()
            } else {
                format!("{} ({} runs)", a.label, a.runs.len())
            }
        })
        .collect();
    let _ = writeln!(
        s,
        "# Comparison: {} (control) vs {}\n",
        names[0],
        names[1..].join(", ")
    );
    if let Some(p) = png {
        let _ = writeln!(s, "![training loss]({p})\n");
    }
    let runs: Vec<Run> = arms
        .iter()
        .flat_map(|a| {
            a.runs.iter().map(|r| Run {
                label: a.run_label(r),
                ..r.clone()
            })
        })
        .collect();
    s.push_str("## Training\n\n");
    let _ = writeln!(
        s,
        "| run | steps | final loss | mean of last {last_n} logged | tokens/s (median) |"
    );
    s.push_str("|---|---:|---:|---:|---:|\n");
    for r in &runs {
        let tps = r.tokens_per_s().map_or("-".into(), |t| format!("{t:.0}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {tps} |",
            r.label,
            r.last_step(),
            f4(r.final_loss()),
            f4(r.last_n_mean(last_n))
        );
    }
    let rows = metric_rows(arms, last_n);
    let _ = writeln!(
        s,
        "\n## Arms: mean ± sd over runs; difference to the control with a 95% Welch t interval from the seed spread\n"
    );
    if arms.iter().any(|a| a.runs.len() < 2) {
        s.push_str("Intervals need at least 2 runs (seeds) per arm; arms with one run show `n/a`.\n\n");
    }
    let mut head = String::from("| metric |");
    let mut rule = String::from("|---|");
    for (i, a) in arms.iter().enumerate() {
        let _ = write!(head, " {} (n={}) |", a.label, a.runs.len());
        rule.push_str("---:|");
        if i > 0 {
            let _ = write!(head, " {} − {} |", a.label, arms[0].label);
            rule.push_str("---:|");
        }
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for row in &rows {
        let _ = write!(s, "| {} |", row.metric);
        for (i, v) in row.values.iter().enumerate() {
            let _ = write!(s, " {} |", spread_cell(v, row.percent));
            if i > 0 {
                let d = row.diffs[i]
                    .as_ref()
                    .map_or("n/a".into(), |d| diff_cell(d, row.percent));
                let _ = write!(s, " {d} |");
            }
        }
        s.push('\n');
    }
    let runs = &runs[..];
    if runs
        .iter()
        .any(|r| r.eval.as_ref().is_some_and(|e| e.validation.is_some()))
    {
        s.push_str("\n## Validation on the held-out shard\n\n");
        s.push_str(
            "Loss in nats per token. `gap` = exact − training-path loss: a leaking attention path looks \
             better through itself than through exact attention.\n\n",
        );
        s.push_str(
            "| run | trained with | loss (training path) | loss (exact) | gap | bpb (exact) | tokens |\n",
        );
        s.push_str("|---|---|---:|---:|---:|---:|---:|\n");
        for r in runs {
            match r
                .eval
                .as_ref()
                .and_then(|e| e.validation.as_ref().map(|v| (e, v)))
            {
                Some((e, v)) => {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {:+.4} | {} | {} |",
                        r.label,
                        e.train_attn,
                        f4(v.training.loss),
                        f4(v.exact.loss),
                        v.gap_loss,
                        f4(v.exact.bpb),
                        v.exact.tokens
                    );
                }
                None => {
                    let _ = writeln!(s, "| {} | - | - | - | - | - | - |", r.label);
                }
            }
        }
    }
    // Paired per-example comparisons need one run per arm (which run would pair otherwise).
    let single = arms.iter().all(|a| a.runs.len() == 1);
    for (norm, metric) in [(true, "acc_norm"), (false, "acc")] {
        let rows = if single { task_rows(runs, norm) } else { Vec::new() };
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "\n## Tasks: {metric} (%, 95% bootstrap interval; differences are run − control, paired \
             bootstrap over the same examples)\n"
        );
        let mut head = String::from("| task | n |");
        let mut rule = String::from("|---|---:|");
        for (i, r) in runs.iter().enumerate() {
            let _ = write!(head, " {} |", r.label);
            rule.push_str("---:|");
            if i > 0 {
                let _ = write!(head, " {} − {} |", r.label, runs[0].label);
                rule.push_str("---:|");
            }
        }
        let _ = writeln!(s, "{head}\n{rule}");
        for row in rows {
            let _ = write!(s, "| {} | {} |", row.task, row.n);
            for (i, v) in row.values.iter().enumerate() {
                let _ = write!(s, " {} |", v.as_ref().map_or("-".into(), pct));
                if i > 0 {
                    let d = match &row.diffs[i] {
                        Some(Ok(e)) => signed_pct(e),
                        Some(Err(why)) => format!("not paired: {why}"),
                        None => "-".into(),
                    };
                    let _ = write!(s, " {d} |");
                }
            }
            s.push('\n');
        }
    }
    if let Some(e) = runs[0].eval.as_ref() {
        let _ = writeln!(s, "\nTasks scored zero-shot through `{}` attention.", e.task_attn);
    }
    s
}

/// Writes `loss.png` and `compare.md` into `opts.out_dir`.
pub fn write(arms: &[Arm], opts: &CompareOptions) -> Result<Written> {
    if arms.len() < 2 {
        return Err(Error::Invalid(format!(
            "compare needs at least 2 arms (the first is the control), got {}",
            arms.len()
        )));
    }
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| Error::io(&opts.out_dir, e))?;
    let png = opts.out_dir.join("loss.png");
    plot::loss_curves(arms, &png, 900, 720)?;
    let md = markdown(arms, opts.last_n, Some("loss.png"));
    let markdown = opts.out_dir.join("compare.md");
    std::fs::write(&markdown, md).map_err(|e| Error::io(&markdown, e))?;
    Ok(Written { markdown, png })
}

/// Loads runs given as `DIR` or `LABEL=DIR`.
pub fn load_runs(specs: &[String]) -> Result<Vec<Run>> {
    specs
        .iter()
        .map(|spec| match spec.split_once('=') {
            Some((label, dir)) if !label.is_empty() && !Path::new(spec).exists() => {
                Run::load(Path::new(dir), Some(label.to_string()))
            }
            _ => Run::load(Path::new(spec), None),
        })
        .collect()
}

/// Loads arms given as `DIR`, `DIR1,DIR2,...` or `LABEL=DIR1,DIR2,...` (one run per directory;
/// the label defaults to the first directory's name).
pub fn load_arms(specs: &[String]) -> Result<Vec<Arm>> {
    specs
        .iter()
        .map(|spec| {
            let (label, dirs) = match spec.split_once('=') {
                Some((label, dirs)) if !label.is_empty() && !Path::new(spec).exists() => {
                    (Some(label.to_string()), dirs)
                }
                _ => (None, spec.as_str()),
            };
            let runs = dirs
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| Run::load(Path::new(d), None))
                .collect::<Result<Vec<_>>>()?;
            let first = runs
                .first()
                .ok_or_else(|| Error::Invalid(format!("arm {spec:?} names no run directory")))?;
            Ok(Arm {
                label: label.unwrap_or_else(|| first.label.clone()),
                runs,
            })
        })
        .collect()
}
