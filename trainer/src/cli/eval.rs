//! `flamia eval`: zero-shot tasks and validation loss / bits per byte (through the training
//! attention path and exact attention) of a checkpoint; writes `eval.json` into the run directory,
//! merged with the results of the same checkpoint already there.
//!
//! Every input is read before the first example is scored (the task files, the validation texts
//! and their windows, an existing `eval.json`), so a mistyped path or column, or a validation split
//! that cannot be scored, fails at once rather than after hours of task scoring.

mod model;
mod progress;

use anyhow::{bail, Context};
use flamia_data::source::RawDoc;
use flamia_data::stream::StreamSpec;
use flamia_data::Plan;
use flamia_eval::harness::{self, HarnessOptions};
use flamia_eval::results::{EvalResults, FILE_NAME, SCHEMA};
use flamia_eval::validation::{self, ValStats, ValidationReport, Windows};
use flamia_eval::{loader, AttnMode, LanguageModel, ModelScorer, Task};
use flamia_trainer::checkpoint;
use flamia_trainer::config::TrainConfig;
use progress::{Counted, Progress};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use model::TrainedModel;

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Checkpoint directory (`RUN/checkpoints/step_NNNNNNNN`), or a run directory `RUN` (its
    /// newest complete checkpoint).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Comma-separated tasks (`all` = every task); needs --data-dir.
    #[arg(long)]
    tasks: Option<String>,
    /// Directory with the task files (layout: docs/eval.md).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Score only the first N examples of each task.
    #[arg(long)]
    limit: Option<usize>,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Solved examples put before each scored one (drawn from the same split, the example
    /// itself excluded, seed 1234).
    #[arg(long, default_value_t = 0)]
    num_fewshot: usize,
    /// Text between few-shot examples (lm-evaluation-harness's default: a blank line); `\n` is a
    /// newline.
    #[arg(long, default_value = "\n\n")]
    fewshot_delimiter: String,
    /// Attention the tasks are scored through: exact (default) or training.
    #[arg(long, default_value = "exact")]
    task_attn: String,
    /// Held-out shard for validation loss and bits per byte (.parquet, .jsonl or .txt); default:
    /// the run's own validation split (the held-out part of `data.train`, else `data.val`, with
    /// the run's `data.min_int_score` / `data.language` filters).
    #[arg(long)]
    val_data: Option<PathBuf>,
    /// Skip validation loss.
    #[arg(long)]
    no_val: bool,
    /// Text column of the held-out shard.
    #[arg(long, default_value = "text")]
    val_column: String,
    /// Use at most N documents of the held-out shard.
    #[arg(long)]
    val_docs: Option<usize>,
    /// Predicted tokens per validation window (default: the run's data.seq_len).
    #[arg(long)]
    val_seq_len: Option<usize>,
    /// Device override (auto, cpu, cuda:N); default: the run's own.
    #[arg(long)]
    device: Option<String>,
    /// Result file (default: RUN/eval.json). Results of the same checkpoint already there are
    /// kept where not re-scored; results of another checkpoint are replaced (with a warning).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The run directory of a checkpoint (`RUN/checkpoints/step_N` -> `RUN`).
fn run_dir(ckpt: &Path) -> PathBuf {
    match ckpt.parent() {
        Some(p) if p.file_name().is_some_and(|n| n == "checkpoints") => p.parent().unwrap_or(p).to_path_buf(),
        _ => ckpt.to_path_buf(),
    }
}

/// `--checkpoint`: a checkpoint directory (it holds `state.json`) as it is, or a run directory,
/// which stands for its newest complete checkpoint (said on stderr).
fn resolve_checkpoint(p: &Path) -> anyhow::Result<PathBuf> {
    if p.join("state.json").is_file() {
        return Ok(p.to_path_buf());
    }
    if !p.is_dir() {
        bail!(
            "--checkpoint {}: no such directory; give a checkpoint directory (RUN/checkpoints/step_NNNNNNNN) or a run directory (RUN)",
            p.display()
        );
    }
    if p.join("checkpoints").is_dir() {
        let all =
            checkpoint::list(p).with_context(|| format!("listing the checkpoints of {}", p.display()))?;
        let Some((step, newest)) = all.last() else {
            bail!(
                "--checkpoint {}: a run directory without a complete checkpoint in {} (a complete one holds state.json; step_*.tmp are writes that never finished)",
                p.display(),
                p.join("checkpoints").display()
            );
        };
        eprintln!(
            "--checkpoint {} is a run directory: evaluating its newest complete checkpoint {} (step {step}; {} complete in all)",
            p.display(),
            newest.display(),
            all.len()
        );
        return Ok(newest.clone());
    }
    bail!(
        "--checkpoint {}: neither a checkpoint directory (no state.json) nor a run directory (no checkpoints/ folder); give RUN/checkpoints/step_NNNNNNNN or RUN",
        p.display()
    )
}

/// Texts of the run's validation split (the held-out part of `data.train`, else `data.val`),
/// filtered as the trainer's validation filters them (`data.min_int_score`, `data.language`), at
/// most `limit` documents; with a description of the source.
fn run_val_texts(cfg: &TrainConfig, limit: Option<usize>) -> anyhow::Result<(String, Vec<String>)> {
    let filters = StreamSpec::from_config(&cfg.data, true).filters;
    let plan = Plan::validation(&cfg.data, &filters)
        .context("the run's validation split (pass --val-data FILE to score another, or --no-val)")?;
    let mut texts = Vec::new();
    for doc in plan.documents(&filters, limit)? {
        match doc {
            RawDoc::Text(t) => texts.push(t),
            RawDoc::Tokens(_) => bail!(
                "the run's validation split is pre-tokenised (.ftok); pass --val-data with a text shard (.parquet, .jsonl or .txt): bits per byte needs the text"
            ),
        }
    }
    let mut source = if cfg.data.holds_out() {
        format!(
            "held out of {} (holdout_fraction {}, holdout_files {:?})",
            cfg.data.train.join(","),
            cfg.data.holdout_fraction,
            cfg.data.holdout_files
        )
    } else {
        cfg.data.val.join(",")
    };
    let mut kept = Vec::new();
    if let Some(s) = filters.min_int_score {
        kept.push(format!("min_int_score {s}"));
    }
    if let Some(l) = &filters.language {
        kept.push(format!("language {l}"));
    }
    if !kept.is_empty() {
        source.push_str(&format!(", filtered: {}", kept.join(", ")));
    }
    if texts.is_empty() {
        bail!("the run's validation split ({source}) holds no documents; pass --val-data FILE, or --no-val");
    }
    Ok((source, texts))
}

/// Validation data read and cut into windows, ready to score.
struct PreparedVal {
    source: String,
    seq_len: usize,
    windows: Windows,
}

/// Reads the validation texts (`--val-data`, else the run's own split) and cuts them into windows.
fn prepare_validation(a: &EvalArgs, m: &TrainedModel) -> anyhow::Result<PreparedVal> {
    let (source, texts) = match &a.val_data {
        Some(p) => (
            p.display().to_string(),
            validation::read_texts(p, &a.val_column, a.val_docs)
                .with_context(|| format!("--val-data {}", p.display()))?,
        ),
        None => run_val_texts(&m.cfg, a.val_docs)?,
    };
    let seq_len = a.val_seq_len.unwrap_or(m.cfg.data.seq_len);
    let windows =
        validation::windows(m, &texts, seq_len).with_context(|| format!("validation data {source}"))?;
    Ok(PreparedVal {
        source,
        seq_len,
        windows,
    })
}

/// Validation loss and bits per byte through the training path, then exact attention, with a
/// progress report per pass.
fn score_validation(
    m: &mut TrainedModel,
    v: PreparedVal,
    batch_size: usize,
) -> anyhow::Result<ValidationReport> {
    let total = v.windows.windows.len() as u64;
    let pass = |m: &mut TrainedModel, attn: AttnMode, what: String| -> anyhow::Result<ValStats> {
        let mut progress = Progress::new(what, total, "windows");
        let mut counted = Counted {
            inner: &mut *m,
            progress: &mut progress,
        };
        let s = validation::evaluate(&mut counted, &v.windows, attn, batch_size)?;
        progress.finish();
        Ok(s)
    };
    let path = m.cfg.attention.path.clone();
    let training = pass(
        m,
        AttnMode::Training,
        format!("validation through the training path ({path})"),
    )?;
    let exact = pass(m, AttnMode::Exact, "validation through exact attention".into())?;
    Ok(ValidationReport::new(
        v.source,
        v.seq_len,
        m.prefix_token(),
        training,
        exact,
    ))
}

/// The result file already at `out`, if any (read now, so that an unreadable one stops the
/// evaluation before scoring instead of being overwritten).
fn read_earlier(out: &Path) -> anyhow::Result<Option<EvalResults>> {
    if !out.exists() {
        return Ok(None);
    }
    EvalResults::read(out).map(Some).with_context(|| {
        format!(
            "{} exists but cannot be read to merge the new results into; move it away or choose another file with --out",
            out.display()
        )
    })
}

/// Whether `earlier` holds results of checkpoint `ckpt` at `step` (same step, same directory).
fn same_checkpoint(earlier: &EvalResults, ckpt: &Path, step: u64) -> bool {
    earlier.step == Some(step)
        && match (
            std::fs::canonicalize(&earlier.checkpoint),
            std::fs::canonicalize(ckpt),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

fn step_of(r: &EvalResults) -> String {
    r.step.map_or_else(|| "unknown".into(), |s| s.to_string())
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    let task_attn: AttnMode = a.task_attn.parse()?;
    let tasks = match (&a.tasks, &a.data_dir) {
        (Some(t), Some(_)) => Task::parse_list(t)?,
        (Some(_), None) => bail!("--tasks needs --data-dir (where the task files are; see docs/eval.md)"),
        (None, _) => Vec::new(),
    };
    if tasks.is_empty() && a.no_val {
        bail!("nothing to evaluate: give --tasks with --data-dir, or drop --no-val");
    }
    let ckpt = resolve_checkpoint(&a.checkpoint)?;
    let out = a.out.clone().unwrap_or_else(|| run_dir(&ckpt).join(FILE_NAME));
    let mut m = TrainedModel::load(&ckpt, a.device.as_deref())?;
    let step = m.step as u64;
    let recorded = std::path::absolute(&ckpt).unwrap_or_else(|_| ckpt.clone());

    // Everything that can fail on its inputs before the first example is scored.
    let earlier = match read_earlier(&out)? {
        Some(e) if same_checkpoint(&e, &ckpt, step) => {
            eprintln!(
                "{} holds earlier results of this checkpoint: what is not re-scored now is kept",
                out.display()
            );
            Some(e)
        }
        Some(e) => {
            eprintln!(
                "warning: {} holds results of checkpoint {} (step {}); they will be replaced by those of {} (step {step})",
                out.display(),
                e.checkpoint,
                step_of(&e),
                recorded.display()
            );
            None
        }
        None => None,
    };
    let dir = a.data_dir.as_deref().unwrap_or(Path::new("."));
    // Few-shot examples are drawn from every record, so read them all then.
    let read_limit = if a.num_fewshot > 0 { None } else { a.limit };
    let mut loaded = Vec::with_capacity(tasks.len());
    for &task in &tasks {
        let (files, records) = loader::load_task(dir, task, read_limit)?;
        let n = a.limit.map_or(records.len(), |l| l.min(records.len()));
        let requests: usize = harness::docs_of(task, &records[..n])
            .with_context(|| format!("task {task}"))?
            .iter()
            .map(|d| d.requests.len())
            .sum();
        loaded.push((task, files, records, requests));
    }
    let val = if a.no_val {
        None
    } else {
        Some(prepare_validation(&a, &m)?)
    };

    let opts = HarnessOptions {
        batch_size: a.batch_size,
        limit: a.limit,
        num_fewshot: a.num_fewshot,
        fewshot_delimiter: a.fewshot_delimiter.replace("\\n", "\n"),
    };
    let mut results = BTreeMap::new();
    for (task, files, records, requests) in loaded {
        let t0 = std::time::Instant::now();
        let mut progress = Progress::new(format!("{task}"), requests as u64, "requests");
        let mut scorer = Counted {
            inner: ModelScorer::new(&mut m, task_attn),
            progress: &mut progress,
        };
        let mut r =
            harness::evaluate(&mut scorer, task, &records, &opts).with_context(|| format!("task {task}"))?;
        progress.finish();
        r.files = files.iter().map(|f| f.display().to_string()).collect();
        if let Some(ppl) = r.perplexity {
            eprintln!("{task}: perplexity {ppl:.3}");
        }
        eprintln!(
            "{task}: n {} acc {:.4} [{:.4}, {:.4}] acc_norm {:.4} [{:.4}, {:.4}] ({:.1} s)",
            r.n,
            r.acc,
            r.acc_ci95[0],
            r.acc_ci95[1],
            r.acc_norm,
            r.acc_norm_ci95[0],
            r.acc_norm_ci95[1],
            t0.elapsed().as_secs_f64()
        );
        results.insert(task.name().to_string(), r);
    }
    let validation = match val {
        None => None,
        Some(v) => {
            let v = score_validation(&mut m, v, a.batch_size)?;
            eprintln!(
                "validation: loss {:.4} through {} / {:.4} exact (gap {:+.4}), bpb {:.4} / {:.4}, {} tokens",
                v.training.loss,
                m.cfg.attention.path,
                v.exact.loss,
                v.gap_loss,
                v.training.bpb,
                v.exact.bpb,
                v.exact.tokens
            );
            Some(v)
        }
    };
    let mut res = EvalResults {
        schema: SCHEMA.into(),
        checkpoint: recorded.display().to_string(),
        step: Some(step),
        train_attn: m.cfg.attention.path.clone(),
        task_attn: task_attn.name().into(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        tasks: results,
        validation,
    };
    if let Some(e) = earlier {
        let earlier_attn = e.task_attn.clone();
        let kept = res.keep_earlier(e);
        if !kept.tasks.is_empty() || kept.validation {
            let mut what: Vec<String> = kept.tasks.clone();
            if kept.validation {
                what.push("validation".into());
            }
            eprintln!("kept from the earlier {}: {}", out.display(), what.join(", "));
        }
        if !kept.dropped_tasks.is_empty() {
            eprintln!(
                "warning: dropped the earlier results of {} (scored through {earlier_attn} attention; this time's tasks through {})",
                kept.dropped_tasks.join(", "),
                res.task_attn
            );
        }
    }
    res.write(&out)?;
    println!("wrote {}", out.display());
    Ok(())
}
