//! `flamia data ...`: build shards from text, inspect shards, pre-tokenise, and benchmark the data
//! pipeline. Thin wrappers over `flamia_data`; errors carry the file at fault.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use flamia_data::makeshard::{DEFAULT_DOC_CHARS, DEFAULT_ROWS_PER_GROUP};
use flamia_data::source::Filters;
use flamia_data::{Config, Tokenizer};
use indicatif::{ProgressBar, ProgressStyle};

/// `flamia data` arguments.
#[derive(Debug, Args)]
pub struct DataArgs {
    #[command(subcommand)]
    cmd: DataCmd,
}

#[derive(Debug, Subcommand)]
enum DataCmd {
    /// Build a FineWeb-Edu-schema parquet shard from UTF-8 text files (documents split at
    /// paragraph breaks; this is how data/shards/*.parquet are made) or from JSON lines (one
    /// document per line: `text`, optional FineWeb-Edu fields).
    MakeShard {
        /// Text files, in order.
        #[arg(long, num_args = 1.., required_unless_present = "jsonl", conflicts_with = "jsonl")]
        from: Vec<PathBuf>,
        /// A JSON-lines file, one document per line.
        #[arg(long)]
        jsonl: Option<PathBuf>,
        /// Output .parquet file.
        #[arg(long)]
        out: PathBuf,
        /// Target document size in characters.
        #[arg(long, default_value_t = DEFAULT_DOC_CHARS)]
        doc_chars: usize,
        /// Rows per row group.
        #[arg(long, default_value_t = DEFAULT_ROWS_PER_GROUP)]
        rows_per_group: usize,
    },
    /// Write a synthetic FineWeb-Edu-schema shard of about MB MiB of text (for memory and speed
    /// measurements).
    MakeSynthetic {
        /// Output .parquet file.
        #[arg(long)]
        out: PathBuf,
        /// MiB of text.
        #[arg(long, default_value_t = 64)]
        mb: u64,
        /// Rows per row group.
        #[arg(long, default_value_t = 1024)]
        rows_per_group: usize,
        /// Generator seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Show a shard's schema, rows, row groups and token statistics (of every shard of a
    /// directory or glob, then their totals).
    Inspect {
        /// A .parquet or .ftok file, a directory (searched at any depth), a glob, or
        /// embedded:train / embedded:val.
        path: String,
        /// "bytes" or a tokenizer.json.
        #[arg(long, default_value = "bytes")]
        tokenizer: String,
        /// Documents whose tokens are counted, per shard.
        #[arg(long, default_value_t = 10_000)]
        max_docs: u64,
    },
    /// Pre-tokenise parquet shards into one .ftok shard (the loader reads .ftok like parquet).
    /// .ftok inputs are copied unchanged and must come from the same tokenizer; the output is
    /// written as OUT.tmp and renamed over OUT when complete.
    Tokenize {
        /// Input shards: files, directories, globs or embedded:*. An output found in an input
        /// directory or glob is left out (naming it as an input is an error).
        #[arg(long = "input", num_args = 1.., required = true)]
        inputs: Vec<String>,
        /// Output .ftok file.
        #[arg(long)]
        out: PathBuf,
        /// "bytes" or a tokenizer.json.
        #[arg(long, default_value = "bytes")]
        tokenizer: String,
        /// Keep documents with int_score at least this.
        #[arg(long)]
        min_int_score: Option<i64>,
        /// Keep documents in this language.
        #[arg(long)]
        language: Option<String>,
        /// Tokenizer threads (0 = all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Skip bad shards instead of failing.
        #[arg(long)]
        skip_bad_shards: bool,
        /// Seconds between progress lines on stderr when it is not a terminal (a terminal gets a
        /// progress bar); 0 = after every row group.
        #[arg(long, default_value_t = 10.0)]
        progress_every: f64,
    },
    /// Measure tokens/s through the whole pipeline and of tokenisation alone.
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Training shards (default: the embedded shard).
    #[arg(long, num_args = 1..)]
    train: Vec<String>,
    /// "bytes" or a tokenizer.json.
    #[arg(long, default_value = "bytes")]
    tokenizer: String,
    /// Row length.
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 8)]
    batch_rows: usize,
    /// Batches to take.
    #[arg(long, default_value_t = 200)]
    batches: u64,
    /// Tokenizer threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Prefetch queue depth in batches.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Documents per shuffle block.
    #[arg(long, default_value_t = 256)]
    shuffle_buffer: usize,
    /// Row groups shuffled together (decoded and held at once).
    #[arg(long, default_value_t = 8)]
    shuffle_row_groups: usize,
    /// Simulated training step (ms) after each batch: waits > 0 mean the pipeline is too slow.
    #[arg(long, default_value_t = 0.0)]
    step_ms: f64,
    /// Skip the tokenisation-only measurement.
    #[arg(long)]
    no_tokenize: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `flamia data ...`.
pub fn run(args: DataArgs) -> anyhow::Result<()> {
    match args.cmd {
        DataCmd::MakeShard {
            from,
            jsonl,
            out,
            doc_chars,
            rows_per_group,
        } => {
            let (rows, bytes) = match jsonl {
                Some(j) => flamia_data::makeshard::make_shard_jsonl(&j, &out, rows_per_group),
                None => flamia_data::makeshard::make_shard(&from, &out, doc_chars, rows_per_group),
            }
            .with_context(|| format!("make-shard {}", out.display()))?;
            println!("wrote {}: {rows} documents, {bytes} text bytes", out.display());
        }
        DataCmd::MakeSynthetic {
            out,
            mb,
            rows_per_group,
            seed,
        } => {
            let (rows, bytes) = flamia_data::makeshard::make_synthetic(&out, mb, rows_per_group, seed)
                .with_context(|| format!("make-synthetic {}", out.display()))?;
            println!("wrote {}: {rows} documents, {bytes} text bytes", out.display());
        }
        DataCmd::Inspect {
            path,
            tokenizer,
            max_docs,
        } => {
            let tok = Tokenizer::from_spec(&tokenizer)?;
            inspect(&path, &tok, max_docs).with_context(|| format!("inspect {path}"))?;
        }
        DataCmd::Tokenize {
            inputs,
            out,
            tokenizer,
            min_int_score,
            language,
            threads,
            skip_bad_shards,
            progress_every,
        } => {
            if !(progress_every.is_finite() && progress_every >= 0.0) {
                anyhow::bail!("--progress-every {progress_every}: must be a number of seconds >= 0");
            }
            let tok = Tokenizer::from_spec(&tokenizer)?;
            let filters = Filters {
                min_int_score,
                language,
            };
            let threads = Config {
                num_threads: threads,
                ..Config::default()
            }
            .threads();
            let mut progress = TokenizeProgress::new(Duration::from_secs_f64(progress_every));
            let r = flamia_data::pretokenize::tokenize_with_progress(
                &inputs,
                &filters,
                &tok,
                &out,
                threads,
                skip_bad_shards,
                &mut |p| progress.update(p),
            );
            progress.finish();
            let r = r.with_context(|| format!("tokenize into {}", out.display()))?;
            println!(
                "wrote {}: {} documents, {} tokens in {:.2} s ({:.0} tokens/s)",
                out.display(),
                r.docs,
                r.tokens,
                r.seconds,
                r.tokens as f64 / r.seconds.max(1e-9)
            );
        }
        DataCmd::Bench(b) => bench(b)?,
    }
    Ok(())
}

/// Prints the report of every shard of `spec` as it is made (a directory of many shards shows
/// progress), then, for more than one, their totals.
fn inspect(spec: &str, tok: &Tokenizer, max_docs: u64) -> anyhow::Result<()> {
    let shards = flamia_data::inspect::shards(spec)?;
    let n = shards.len();
    if n > 1 {
        println!("{n} shards in {spec}\n");
    }
    let (mut rows, mut bytes, mut groups) = (0u64, 0u64, 0usize);
    for (i, src) in shards.iter().enumerate() {
        let r = flamia_data::inspect::inspect_source(src, tok, max_docs)?;
        (rows, bytes, groups) = (rows + r.rows, bytes + r.bytes, groups + r.row_groups);
        print!("{r}");
        if i + 1 < n {
            println!();
        }
    }
    if n > 1 {
        println!("\ntotal       {rows} rows in {groups} row groups, {bytes} bytes in {n} shards");
    }
    Ok(())
}

/// Progress of `data tokenize`: an indicatif bar over row groups when stderr is a terminal, else
/// a `tokenize: ...` log line every `every`.
struct TokenizeProgress {
    bar: Option<ProgressBar>,
    log: flamia_data::pretokenize::ProgressLog,
}

impl TokenizeProgress {
    fn new(every: Duration) -> TokenizeProgress {
        TokenizeProgress {
            bar: std::io::stderr().is_terminal().then(ProgressBar::no_length),
            log: flamia_data::pretokenize::ProgressLog::new(every),
        }
    }

    fn update(&mut self, p: &flamia_data::pretokenize::Progress) {
        match &self.bar {
            Some(bar) => {
                if bar.length().is_none() {
                    bar.set_length(p.units as u64);
                    bar.set_style(
                        ProgressStyle::with_template(
                            "{elapsed_precise} [{bar:30}] {pos}/{len} row groups {msg}",
                        )
                        .expect("static template")
                        .progress_chars("=> "),
                    );
                }
                bar.set_position(p.units_done as u64);
                bar.set_message(format!(
                    "| {} docs | {} tokens | {:.0} tok/s",
                    p.docs,
                    p.tokens,
                    p.tokens as f64 / p.seconds.max(1e-9)
                ));
            }
            None => {
                if let Some(line) = self.log.line(p) {
                    tracing::info!("{line}");
                }
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn bench(b: BenchArgs) -> anyhow::Result<()> {
    let mut cfg = Config {
        tokenizer: b.tokenizer,
        seq_len: b.seq_len,
        batch_rows: b.batch_rows,
        num_threads: b.threads,
        prefetch: b.prefetch,
        shuffle_buffer: b.shuffle_buffer,
        shuffle_row_groups: b.shuffle_row_groups,
        ..Config::default()
    };
    if !b.train.is_empty() {
        cfg.train = b.train;
    }
    cfg.validate()?;
    let step = Duration::from_secs_f64(b.step_ms.max(0.0) / 1e3);
    let p = flamia_data::bench::pipeline(&cfg, b.batches, step)?;
    let tok = if b.no_tokenize {
        None
    } else {
        let (n, s) = flamia_data::bench::tokenize_throughput(&cfg, cfg.threads(), 4096)?;
        Some((n, s, n as f64 / s.max(1e-9)))
    };
    if b.json {
        let v = serde_json::json!({
            "threads": cfg.threads(),
            "seq_len": cfg.seq_len,
            "batch_rows": cfg.batch_rows,
            "batches": p.batches,
            "tokens": p.tokens,
            "seconds": p.seconds,
            "first_batch_seconds": p.first_batch_seconds,
            "tokens_per_s": p.tokens_per_s(),
            "wait_seconds": p.wait_seconds,
            "step_ms": b.step_ms,
            "shuffle_row_groups": cfg.shuffle_row_groups,
            "peak_rss_mib": p.peak_rss_mib,
            "tokenize_tokens_per_s": tok.map(|t| t.2),
        });
        println!("{v}");
    } else {
        println!(
            "pipeline: {} batches, {} tokens: {:.0} tokens/s after the first batch ({:.3} s to it; {} threads, seq_len {}, {} rows)",
            p.batches,
            p.tokens,
            p.tokens_per_s(),
            p.first_batch_seconds,
            cfg.threads(),
            cfg.seq_len,
            cfg.batch_rows
        );
        println!(
            "waiting:  {:.3} s of {:.3} s after the first batch ({:.1}%) with a simulated step of {} ms",
            p.wait_seconds,
            p.seconds - p.first_batch_seconds,
            100.0 * p.wait_seconds / (p.seconds - p.first_batch_seconds).max(1e-9),
            b.step_ms
        );
        if let Some((n, s, r)) = tok {
            println!(
                "tokenise: {n} tokens in {s:.3} s = {r:.0} tokens/s ({} threads, in memory)",
                cfg.threads()
            );
        }
        if let Some(m) = p.peak_rss_mib {
            println!("peak RSS: {m:.1} MiB");
        }
    }
    Ok(())
}
