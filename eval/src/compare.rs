//! A/B comparison of runs against a control (the first run): loss curves PNG, loss summaries,
//! validation through the training path and exact attention, task accuracies with 95% bootstrap
//! intervals and paired-bootstrap differences to the control, tokens/s; rendered as markdown.

use crate::error::{Error, Result};
use crate::plot;
use crate::runs::Run;
use crate::stats::{bootstrap_mean, paired_diff, Estimate, RESAMPLES, SEED};
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

/// The markdown report; `png` is the plot's file name relative to the report.
pub fn markdown(runs: &[Run], last_n: usize, png: Option<&str>) -> String {
    let mut s = String::new();
    let names: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
    let _ = writeln!(
        s,
        "# Comparison: {} (control) vs {}\n",
        names[0],
        names[1..].join(", ")
    );
    if let Some(p) = png {
        let _ = writeln!(s, "![training loss]({p})\n");
    }
    s.push_str("## Training\n\n");
    let _ = writeln!(
        s,
        "| run | steps | final loss | mean of last {last_n} logged | tokens/s (median) |"
    );
    s.push_str("|---|---:|---:|---:|---:|\n");
    for r in runs {
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
    for (norm, metric) in [(true, "acc_norm"), (false, "acc")] {
        let rows = task_rows(runs, norm);
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
pub fn write(runs: &[Run], opts: &CompareOptions) -> Result<Written> {
    if runs.len() < 2 {
        return Err(Error::Invalid(format!(
            "compare needs at least 2 runs (the first is the control), got {}",
            runs.len()
        )));
    }
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| Error::io(&opts.out_dir, e))?;
    let png = opts.out_dir.join("loss.png");
    plot::loss_curves(runs, &png, 900, 540)?;
    let md = markdown(runs, opts.last_n, Some("loss.png"));
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
