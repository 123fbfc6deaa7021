//! `flamia eval`: zero-shot tasks and validation loss / bits per byte (through the training
//! attention path and exact attention) of a checkpoint; writes `eval.json` into the run directory.

mod model;

use anyhow::{bail, Context};
use flamia_data::source::{Filters, RawDoc};
use flamia_data::Plan;
use flamia_eval::harness::{self, HarnessOptions};
use flamia_eval::results::{EvalResults, FILE_NAME, SCHEMA};
use flamia_eval::validation::{self, ValidationOptions};
use flamia_eval::{loader, AttnMode, ModelScorer, Task};
use flamia_trainer::config::TrainConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use model::TrainedModel;

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Checkpoint directory (`RUN/checkpoints/step_NNNNNNNN`).
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
    /// the run's own `data.val` shards.
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
    /// Result file (default: RUN/eval.json).
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

/// Texts of the run's validation split (the held-out part of `data.train`, else `data.val`), at
/// most `limit` documents.
fn run_val_texts(cfg: &TrainConfig, limit: Option<usize>) -> anyhow::Result<(String, Vec<String>)> {
    let filters = Filters::default();
    let plan = Plan::validation(&cfg.data, &filters).context("the run's validation split")?;
    let mut texts = Vec::new();
    for doc in plan.documents(&filters, limit)? {
        match doc {
            RawDoc::Text(t) => texts.push(t),
            RawDoc::Tokens(_) => bail!(
                "the run's validation split is pre-tokenised; pass --val-data with a text shard (bits per byte needs the text)"
            ),
        }
    }
    if texts.is_empty() {
        bail!("the run's validation split holds no documents; pass --val-data");
    }
    let source = if cfg.data.holds_out() {
        format!(
            "held out of {} (holdout_fraction {}, holdout_files {:?})",
            cfg.data.train.join(","),
            cfg.data.holdout_fraction,
            cfg.data.holdout_files
        )
    } else {
        cfg.data.val.join(",")
    };
    Ok((source, texts))
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
    let mut m = TrainedModel::load(&a.checkpoint, a.device.as_deref())?;
    let opts = HarnessOptions {
        batch_size: a.batch_size,
        limit: a.limit,
        num_fewshot: a.num_fewshot,
        fewshot_delimiter: a.fewshot_delimiter.replace("\\n", "\n"),
    };
    let mut results = BTreeMap::new();
    for task in tasks {
        let dir = a.data_dir.as_deref().unwrap_or(Path::new("."));
        // Few-shot examples are drawn from every record, so read them all then.
        let read_limit = if a.num_fewshot > 0 { None } else { a.limit };
        let (files, records) = loader::load_task(dir, task, read_limit)?;
        let t0 = std::time::Instant::now();
        let mut scorer = ModelScorer::new(&mut m, task_attn);
        let mut r =
            harness::evaluate(&mut scorer, task, &records, &opts).with_context(|| format!("task {task}"))?;
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
    let validation = match (a.no_val, &a.val_data) {
        (true, _) => None,
        (false, source) => {
            let (path, texts) = match source {
                Some(p) => (
                    p.display().to_string(),
                    validation::read_texts(p, &a.val_column, a.val_docs)?,
                ),
                None => run_val_texts(&m.cfg, a.val_docs)?,
            };
            let vopts = ValidationOptions {
                seq_len: a.val_seq_len.unwrap_or(m.cfg.data.seq_len),
                batch_size: a.batch_size,
            };
            let v = validation::report(&mut m, &texts, &vopts, &path)?;
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
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| run_dir(&a.checkpoint).join(FILE_NAME));
    let res = EvalResults {
        schema: SCHEMA.into(),
        checkpoint: a.checkpoint.display().to_string(),
        step: Some(m.step as u64),
        train_attn: m.cfg.attention.path.clone(),
        task_attn: task_attn.name().into(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        tasks: results,
        validation,
    };
    res.write(&out)?;
    println!("wrote {}", out.display());
    Ok(())
}
