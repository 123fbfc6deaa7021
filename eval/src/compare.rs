//! A/B comparison of arms (one or more runs each, e.g. seeds) against a control (the first arm):
//! loss curves PNG, loss summaries, validation through the training path and exact attention,
//! task scores; per arm the mean and spread over its runs, and arm − control differences of
//! means with a 95% Welch t interval from the seed spread (and a paired t interval over runs
//! with the same seeds); with one run per arm, task accuracies with paired-bootstrap differences
//! over the same examples. Runs measured differently (steps, examples, shots, task attention,
//! validation data) are flagged, not compared. Rendered as markdown.

use crate::error::{Error, Result};
use crate::plot;
use crate::results::{EvalResults, TaskResult};
use crate::runs::Run;
use crate::stats::{
    bootstrap_mean, paired_diff, paired_t, spread, welch_diff, Estimate, Spread, RESAMPLES, SEED,
};
use std::collections::{BTreeMap, BTreeSet};
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

/// Named conditions one run's value of a metric was measured under (checkpoint step, examples,
/// shots, attention, validation data, steps). Runs whose conditions differ are not like for like.
pub type Conditions = Vec<(&'static str, String)>;

/// Start of the label of the row of the validation loss logged during training (`val_loss` in
/// `metrics.jsonl`); the full label names the attention path and the step.
pub const TRAINING_VAL_ROW: &str = "validation loss during training";

/// Start of the label of the row of the same validation tokens scored through exact attention
/// during training (`val_loss_exact` in `metrics.jsonl`, `training.val_exact`).
pub const TRAINING_VAL_EXACT_ROW: &str = "exact-attention validation loss during training";

/// A run's validation losses logged during training through one attention: (step, loss).
type Series = fn(&Run) -> &[(u64, f64)];

/// A mean of per-seed differences with its 95% paired t interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedDiff {
    pub est: Estimate,
    /// Seeds paired.
    pub pairs: usize,
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
    /// its 95% Welch t interval; `None` when either side has fewer than 2 runs or the row's runs
    /// are not like for like (`mismatch`).
    pub diffs: Vec<Option<Estimate>>,
    /// Per arm (index 0 always `None`): the mean of the differences arm − control between runs
    /// with the same seeds ([`crate::runs::Seeds`], from each run's `config.toml`) and its 95%
    /// paired t interval; `None` with fewer than 2 such pairs, when a seed pair occurs twice in
    /// one arm, or when the row's runs are not like for like.
    pub paired: Vec<Option<PairedDiff>>,
    /// Why the row's runs (over all arms) are not like for like: the conditions that differ and
    /// which runs have which. Differences are withheld when set.
    pub mismatch: Option<String>,
    /// How the row was measured, where its label cannot say it all.
    pub note: Option<String>,
}

/// The last step at which every run that logged a validation loss during training logged one
/// (`None` if no run logged one or they share no step).
pub fn common_val_step<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Option<u64> {
    common_step(runs, |r| &r.val_losses)
}

/// [`common_val_step`] of any series.
fn common_step<'a>(runs: impl IntoIterator<Item = &'a Run>, series: Series) -> Option<u64> {
    let with: Vec<&Run> = runs.into_iter().filter(|r| !series(r).is_empty()).collect();
    series(with.first()?).iter().rev().map(|v| v.0).find(|s| {
        with.iter()
            .all(|r| series(r).binary_search_by_key(s, |v| v.0).is_ok())
    })
}

type ValueFn = Box<dyn Fn(&Run) -> Option<f64>>;
type ConditionsFn = Box<dyn Fn(&Run) -> Conditions>;

/// One metric's definition: its value of a run and the conditions that value was measured under.
struct Metric {
    name: String,
    percent: bool,
    get: ValueFn,
    conditions: ConditionsFn,
    note: Option<String>,
}

fn checkpoint_step(r: &Run) -> (&'static str, String) {
    let step = r.eval.as_ref().and_then(|e| e.step);
    (
        "checkpoint step",
        step.map_or("unknown".into(), |s| s.to_string()),
    )
}

/// Conditions of `flamia eval`'s validation: the data and windows; `tokens` for losses (per
/// token), `bytes` for bits per byte.
fn validation_conditions(r: &Run, per_token: bool) -> Conditions {
    let Some(v) = r.eval.as_ref().and_then(|e| e.validation.as_ref()) else {
        return Vec::new();
    };
    let size = if per_token {
        ("validation tokens", v.exact.tokens.to_string())
    } else {
        ("validation bytes", v.exact.bytes.to_string())
    };
    vec![
        checkpoint_step(r),
        ("validation source", v.source.clone()),
        ("validation seq_len", v.seq_len.to_string()),
        (
            "validation prefix token",
            v.prefix_token.map_or("unknown".into(), |t| t.to_string()),
        ),
        ("validation documents", v.exact.docs.to_string()),
        size,
    ]
}

/// Conditions of a task result: examples, shots and the attention the task was scored through.
fn task_conditions(r: &Run, task: &str) -> Conditions {
    let Some((e, t)) = r.eval.as_ref().and_then(|e| Some((e, e.tasks.get(task)?))) else {
        return Vec::new();
    };
    vec![
        checkpoint_step(r),
        ("examples", format!("n {} (fingerprint {})", t.n, t.fingerprint)),
        ("num_fewshot", t.num_fewshot.to_string()),
        ("task_attn", e.task_attn.clone()),
    ]
}

/// Which conditions differ between runs (labelled): `None` when all agree.
fn mismatch(runs: &[(String, Conditions)]) -> Option<String> {
    let first = &runs.first()?.1;
    let mut parts = Vec::new();
    for (k, (name, _)) in first.iter().enumerate() {
        // value -> runs with it, in first-seen order
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for (label, c) in runs {
            let v = c.get(k).map_or("missing", |x| x.1.as_str());
            match groups.iter_mut().find(|g| g.0 == v) {
                Some(g) => g.1.push(label),
                None => groups.push((v, vec![label])),
            }
        }
        if groups.len() > 1 {
            let gs: Vec<String> = groups
                .iter()
                .map(|(v, ls)| format!("{v} ({})", ls.join(", ")))
                .collect();
            parts.push(format!("{name} differs: {}", gs.join(" vs ")));
        }
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Differences arm − control between runs with the same seeds (see [`MetricRow::paired`]).
fn paired_by_seed(control: &[(&Run, f64)], arm: &[(&Run, f64)]) -> Option<PairedDiff> {
    let by_seed = |runs: &[(&Run, f64)]| {
        let mut m = BTreeMap::new();
        for (r, x) in runs {
            if let Some(s) = r.seeds {
                if m.insert(s, *x).is_some() {
                    return None; // a seed pair twice in one arm: which run would pair?
                }
            }
        }
        Some(m)
    };
    let (c, a) = (by_seed(control)?, by_seed(arm)?);
    let diffs: Vec<f64> = a.iter().filter_map(|(s, x)| c.get(s).map(|y| x - y)).collect();
    paired_t(&diffs).map(|est| PairedDiff {
        est,
        pairs: diffs.len(),
    })
}

/// The row of a validation loss logged during training (`series` of each run, `label` then the
/// attention it went through and the step): compared at the last step every run logged one,
/// with a note naming the runs whose later validation steps are left out.
fn training_val_metric(arms: &[Arm], series: Series, label: &str, path: &str) -> Metric {
    let val_step = common_step(arms.iter().flat_map(|a| &a.runs), series);
    let (name, note) = match val_step {
        Some(step) => {
            let later: Vec<String> = arms
                .iter()
                .flat_map(|a| a.runs.iter().map(move |r| (a, r)))
                .filter_map(|(a, r)| {
                    let last = series(r).last()?.0;
                    (last > step).then(|| format!("{} {last}", a.run_label(r)))
                })
                .collect();
            (
                format!("{label} ({path}, step {step})"),
                (!later.is_empty()).then(|| {
                    format!(
                        "compared at step {step}, the last step every run logged a validation loss; \
                         later validation steps of some runs are left out ({})",
                        later.join(", ")
                    )
                }),
            )
        }
        None => (format!("{label} ({path}, last logged step)"), None),
    };
    Metric {
        name,
        percent: false,
        get: Box::new(move |r: &Run| {
            let v = series(r);
            match val_step {
                Some(s) => v.binary_search_by_key(&s, |x| x.0).ok().map(|i| v[i].1),
                None => v.last().map(|x| x.1),
            }
        }),
        conditions: Box::new(move |r: &Run| {
            let step = match val_step {
                Some(s) => s.to_string(),
                None => series(r).last().map_or("none".into(), |x| x.0.to_string()),
            };
            vec![("validation step", step)]
        }),
        note,
    }
}

/// Per-run scalar metrics: training loss (mean of the last `last_n` logged), the validation loss
/// logged during training (`val_loss` in `metrics.jsonl`, computed through each run's training
/// attention path, at the last step every run logged one), validation loss of `flamia eval`
/// (exact and training path) and exact bits per byte, and every task's `acc_norm`, `acc` and
/// perplexity. Metrics no run has are left out. A row whose runs were measured under different
/// conditions (last training step, validation step, checkpoint step, validation data, examples,
/// shots, task attention) is flagged (`mismatch`) and its differences withheld.
pub fn metric_rows(arms: &[Arm], last_n: usize) -> Vec<MetricRow> {
    let all = || arms.iter().flat_map(|a| &a.runs);
    let mut metrics: Vec<Metric> = vec![
        Metric {
            name: format!("training loss (mean of last {last_n} logged)"),
            percent: false,
            get: Box::new(move |r: &Run| Some(r.last_n_mean(last_n))),
            conditions: Box::new(|r: &Run| vec![("last training step", r.last_step().to_string())]),
            note: None,
        },
        training_val_metric(
            arms,
            |r| &r.val_losses,
            TRAINING_VAL_ROW,
            "training attention path",
        ),
        training_val_metric(
            arms,
            |r| &r.val_losses_exact,
            TRAINING_VAL_EXACT_ROW,
            "exact attention",
        ),
        Metric {
            name: "validation loss, exact attention".into(),
            percent: false,
            get: Box::new(|r: &Run| Some(r.eval.as_ref()?.validation.as_ref()?.exact.loss)),
            conditions: Box::new(|r: &Run| validation_conditions(r, true)),
            note: None,
        },
        Metric {
            name: "validation loss, training path".into(),
            percent: false,
            get: Box::new(|r: &Run| Some(r.eval.as_ref()?.validation.as_ref()?.training.loss)),
            conditions: Box::new(|r: &Run| validation_conditions(r, true)),
            note: None,
        },
        Metric {
            name: "validation bits per byte, exact".into(),
            percent: false,
            get: Box::new(|r: &Run| Some(r.eval.as_ref()?.validation.as_ref()?.exact.bpb)),
            conditions: Box::new(|r: &Run| validation_conditions(r, false)),
            note: None,
        },
    ];
    let tasks: BTreeSet<String> = all()
        .filter_map(|r| r.eval.as_ref())
        .flat_map(|e| e.tasks.keys().cloned())
        .collect();
    for t in tasks {
        type Get = fn(&TaskResult) -> Option<f64>;
        let per_task: [(&str, bool, Get); 3] = [
            ("acc_norm", true, |t| Some(t.acc_norm)),
            ("acc", true, |t| Some(t.acc)),
            ("perplexity", false, |t| t.perplexity),
        ];
        for (what, percent, get) in per_task {
            let (a, b) = (t.clone(), t.clone());
            metrics.push(Metric {
                name: format!("{t} {what}"),
                percent,
                get: Box::new(move |r: &Run| get(r.eval.as_ref()?.tasks.get(&a)?)),
                conditions: Box::new(move |r: &Run| task_conditions(r, &b)),
                note: None,
            });
        }
    }
    metrics
        .into_iter()
        .filter_map(|m| {
            let per_arm: Vec<Vec<(&Run, f64)>> = arms
                .iter()
                .map(|a| {
                    a.runs
                        .iter()
                        .filter_map(|r| (m.get)(r).filter(|x| x.is_finite()).map(|x| (r, x)))
                        .collect()
                })
                .collect();
            if per_arm.iter().all(Vec::is_empty) {
                return None;
            }
            let conditions: Vec<(String, Conditions)> = arms
                .iter()
                .zip(&per_arm)
                .flat_map(|(a, v)| v.iter().map(|(r, _)| (a.run_label(r), (m.conditions)(r))))
                .collect();
            let mismatch = mismatch(&conditions);
            let xs: Vec<Vec<f64>> = per_arm.iter().map(|v| v.iter().map(|p| p.1).collect()).collect();
            let compared = |i: usize| i > 0 && mismatch.is_none();
            Some(MetricRow {
                metric: m.name,
                percent: m.percent,
                values: xs.iter().map(|v| spread(v)).collect(),
                diffs: (0..arms.len())
                    .map(|i| welch_diff(&xs[0], &xs[i]).filter(|_| compared(i)))
                    .collect(),
                paired: (0..arms.len())
                    .map(|i| paired_by_seed(&per_arm[0], &per_arm[i]).filter(|_| compared(i)))
                    .collect(),
                mismatch,
                note: m.note,
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

/// Why two runs' results of one task cannot be paired example by example: different examples or
/// prompts, shots, task attention or checkpoint step. `None` when they can.
fn unpaired_reason(ce: &EvalResults, c: &TaskResult, te: &EvalResults, t: &TaskResult) -> Option<String> {
    let mut why = Vec::new();
    if c.n != t.n {
        why.push(format!("different examples (n {} vs {})", c.n, t.n));
    } else if c.num_fewshot == t.num_fewshot && c.fingerprint != t.fingerprint {
        why.push(format!(
            "different examples or prompts (fingerprint {} vs {})",
            c.fingerprint, t.fingerprint
        ));
    }
    if c.num_fewshot != t.num_fewshot {
        why.push(format!(
            "different shots ({} vs {})",
            c.num_fewshot, t.num_fewshot
        ));
    }
    if ce.task_attn != te.task_attn {
        why.push(format!(
            "different task attention (`{}` vs `{}`)",
            ce.task_attn, te.task_attn
        ));
    }
    if ce.step != te.step {
        let s = |x: Option<u64>| x.map_or("unknown".into(), |s| s.to_string());
        why.push(format!(
            "different checkpoint steps ({} vs {})",
            s(ce.step),
            s(te.step)
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Task rows for `acc` (`norm = false`) or `acc_norm`, one per task any run has. A run is paired
/// with the control only when both scored the same examples with the same prompts (fingerprint
/// and `n`), the same shots, through the same task attention, at the same checkpoint step.
pub fn task_rows(runs: &[Run], norm: bool) -> Vec<TaskRow> {
    let tasks: BTreeSet<&String> = runs
        .iter()
        .filter_map(|r| r.eval.as_ref())
        .flat_map(|e| e.tasks.keys())
        .collect();
    tasks
        .into_iter()
        .map(|task| {
            let results: Vec<Option<(&EvalResults, &TaskResult)>> = runs
                .iter()
                .map(|r| r.eval.as_ref().and_then(|e| Some((e, e.tasks.get(task)?))))
                .collect();
            let values = results
                .iter()
                .map(|t| t.map(|(_, t)| bootstrap_mean(&t.outcomes(norm), RESAMPLES, SEED)))
                .collect();
            let control = results[0];
            let diffs = results
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if i == 0 {
                        return None;
                    }
                    let ((ce, c), (te, t)) = (control?, (*t)?);
                    Some(match unpaired_reason(ce, c, te, t) {
                        None => Ok(paired_diff(&c.outcomes(norm), &t.outcomes(norm), RESAMPLES, SEED)),
                        Some(why) => Err(why),
                    })
                })
                .collect();
            TaskRow {
                task: task.clone(),
                n: control.map_or(0, |(_, c)| c.n),
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
    let inexact = inexact_task_runs(&runs);
    if !inexact.is_empty() {
        let _ = writeln!(
            s,
            "> **Warning:** tasks of {} were not scored through exact attention. A leaking path \
             scores well through itself, so those task numbers do not judge quality; score with \
             `flamia eval --task-attn exact` (the default).\n",
            inexact.join(", ")
        );
    }
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
    let show_paired = rows.iter().any(|r| r.paired.iter().any(Option::is_some));
    let mut head = String::from("| metric |");
    let mut rule = String::from("|---|");
    for (i, a) in arms.iter().enumerate() {
        let _ = write!(head, " {} (n={}) |", a.label, a.runs.len());
        rule.push_str("---:|");
        if i > 0 {
            let _ = write!(head, " {} − {} |", a.label, arms[0].label);
            rule.push_str("---:|");
            if show_paired {
                let _ = write!(head, " {} − {}, paired by seed |", a.label, arms[0].label);
                rule.push_str("---:|");
            }
        }
    }
    let _ = writeln!(s, "{head}\n{rule}");
    const WITHHELD: &str = "not compared ⚠";
    for row in &rows {
        let flag = if row.mismatch.is_some() { " ⚠" } else { "" };
        let _ = write!(s, "| {}{flag} |", row.metric);
        for (i, v) in row.values.iter().enumerate() {
            let _ = write!(s, " {} |", spread_cell(v, row.percent));
            if i == 0 {
                continue;
            }
            let d = match &row.diffs[i] {
                _ if row.mismatch.is_some() => WITHHELD.into(),
                Some(d) => diff_cell(d, row.percent),
                None => "n/a".into(),
            };
            let _ = write!(s, " {d} |");
            if show_paired {
                let p = match &row.paired[i] {
                    _ if row.mismatch.is_some() => WITHHELD.into(),
                    Some(p) => format!("{} ({} seeds)", diff_cell(&p.est, row.percent), p.pairs),
                    None => "n/a".into(),
                };
                let _ = write!(s, " {p} |");
            }
        }
        s.push('\n');
    }
    if rows.iter().any(|r| r.metric.starts_with(TRAINING_VAL_ROW)) {
        let exact = rows
            .iter()
            .any(|r| r.metric == "validation loss, exact attention");
        let during = rows.iter().any(|r| r.metric.starts_with(TRAINING_VAL_EXACT_ROW));
        let _ = writeln!(
            s,
            "\n`{TRAINING_VAL_ROW}` is the trainer's `val_loss`, computed through each run's training \
             attention path (FP8 attention for an FP8 run): it is not an exact-attention measurement. \
             Judge quality by {}{}.",
            if during {
                format!(
                    "`{TRAINING_VAL_EXACT_ROW}` (the trainer's `val_loss_exact`: the same tokens through \
                     exact attention) or "
                )
            } else {
                String::new()
            },
            if exact {
                "`validation loss, exact attention` (`flamia eval` on the checkpoints)"
            } else {
                "`validation loss, exact attention` (`flamia eval` on the checkpoints), which no run here \
                 has: run `flamia eval` on each run's final checkpoint"
            }
        );
    }

    if show_paired {
        s.push_str(
            "\nPaired by seed: runs of an arm and of the control with the same `run.seed` and \
             `data.seed` (each run's `config.toml`); mean of the per-seed differences with a 95% \
             paired t interval (seeds − 1 degrees of freedom).\n",
        );
    }
    let notes: Vec<&MetricRow> = rows.iter().filter(|r| r.note.is_some()).collect();
    if !notes.is_empty() {
        s.push('\n');
        for r in notes {
            let _ = writeln!(s, "- `{}`: {}", r.metric, r.note.as_deref().unwrap_or_default());
        }
    }
    let flagged: Vec<&MetricRow> = rows.iter().filter(|r| r.mismatch.is_some()).collect();
    if !flagged.is_empty() {
        s.push_str(
            "\n⚠ Not like for like (the means above mix runs measured differently; no difference \
             is computed):\n\n",
        );
        for r in flagged {
            let _ = writeln!(
                s,
                "- `{}`: {}",
                r.metric,
                r.mismatch.as_deref().unwrap_or_default()
            );
        }
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
    task_scoring(&mut s, runs);
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
    s
}

/// Shots of a run's tasks: one count, or the distinct counts when they differ by task.
fn shots(e: &EvalResults) -> String {
    let ks: BTreeSet<usize> = e.tasks.values().map(|t| t.num_fewshot).collect();
    match ks.len() {
        0 => "-".into(),
        1 => match ks.first() {
            Some(0) => "0 (zero-shot)".into(),
            Some(k) => format!("{k}"),
            None => "-".into(),
        },
        _ => format!(
            "{} (differs by task)",
            ks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Runs whose tasks were scored through an attention other than exact.
fn inexact_task_runs(runs: &[Run]) -> Vec<String> {
    runs.iter()
        .filter_map(|r| {
            let e = r.eval.as_ref().filter(|e| !e.tasks.is_empty())?;
            (e.task_attn != "exact").then(|| format!("{} (`{}`)", r.label, e.task_attn))
        })
        .collect()
}

/// Per run: how its tasks were scored (checkpoint step, attention, shots).
fn task_scoring(s: &mut String, runs: &[Run]) {
    if !runs
        .iter()
        .any(|r| r.eval.as_ref().is_some_and(|e| !e.tasks.is_empty()))
    {
        return;
    }
    s.push_str("\n## Task scoring\n\n");
    s.push_str("| run | checkpoint step | trained with | tasks scored through | shots |\n");
    s.push_str("|---|---:|---|---|---|\n");
    for r in runs {
        match r.eval.as_ref().filter(|e| !e.tasks.is_empty()) {
            Some(e) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | `{}` | {} |",
                    r.label,
                    e.step.map_or("-".into(), |x| x.to_string()),
                    e.train_attn,
                    e.task_attn,
                    shots(e)
                );
            }
            None => {
                let _ = writeln!(s, "| {} | - | - | - | - |", r.label);
            }
        }
    }
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
