//! Throughput measurements behind `flamia data bench`: the whole pipeline (read -> tokenise ->
//! pack -> prefetch queue) as a training loop sees it, and raw tokenisation per thread count.

use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::config::Config;
use crate::error::{DataError, Result};
use crate::loader::Loader;
use crate::source::{self, Filters, RawDoc};
use crate::stream::Plan;
use crate::tokenizer::Tokenizer;

/// Result of [`pipeline`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineReport {
    /// Batches taken.
    pub batches: u64,
    /// Input tokens taken.
    pub tokens: u64,
    /// Wall time from loader start to the last batch (includes start-up).
    pub seconds: f64,
    /// Wall time from loader start to the first batch (tokenizer load, footers, first block).
    pub first_batch_seconds: f64,
    /// Time the consumer waited for data after the first batch.
    pub wait_seconds: f64,
    /// Simulated compute per step.
    pub step: Duration,
    /// Peak resident memory of the process (MiB), from `/proc/self/status` `VmHWM`.
    pub peak_rss_mib: Option<f64>,
}

impl PipelineReport {
    /// Tokens per second through the pipeline after the first batch (steady state).
    pub fn tokens_per_s(&self) -> f64 {
        let per_batch = self.tokens as f64 / self.batches.max(1) as f64;
        per_batch * (self.batches.saturating_sub(1)) as f64
            / (self.seconds - self.first_batch_seconds).max(1e-9)
    }
}

/// Runs a training loader for `batches` batches, sleeping `step` after each to stand in for the
/// GPU step; the wait time says whether the pipeline keeps up at that step time.
pub fn pipeline(cfg: &Config, batches: u64, step: Duration) -> Result<PipelineReport> {
    let t0 = Instant::now();
    let mut l = Loader::new(cfg, 0, 1, None)?;
    let (mut first, mut w0) = (0.0, Duration::ZERO);
    for i in 0..batches {
        l.next_batch()?
            .ok_or_else(|| DataError::NoData("training stream ended".into()))?;
        if i == 0 {
            first = t0.elapsed().as_secs_f64();
            w0 = l.stats().wait;
        }
        if !step.is_zero() {
            std::thread::sleep(step);
        }
    }
    let s = l.stats();
    Ok(PipelineReport {
        batches: s.batches,
        tokens: s.tokens,
        seconds: t0.elapsed().as_secs_f64(),
        first_batch_seconds: first,
        wait_seconds: s.wait.saturating_sub(w0).as_secs_f64(),
        step,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// Tokenisation alone: tokens per second with `threads` workers over the first `max_docs`
/// documents of the configured training shards (read into memory first, so I/O is excluded).
pub fn tokenize_throughput(cfg: &Config, threads: usize, max_docs: usize) -> Result<(u64, f64)> {
    let tok = Tokenizer::from_spec(&cfg.tokenizer)?;
    let filters = Filters::default();
    let plan = Plan::build(&cfg.train, &filters, cfg.skip_bad_shards)?;
    let mut texts = Vec::new();
    'outer: for &(s, u, _) in &plan.units {
        for d in source::read_unit(&plan.shards[s], u, &filters)?
            .into_iter()
            .flatten()
        {
            if let RawDoc::Text(t) = d {
                texts.push(t);
            }
            if texts.len() >= max_docs {
                break 'outer;
            }
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| DataError::Config(format!("cannot start {threads} threads: {e}")))?;
    let t0 = Instant::now();
    let n: usize = pool
        .install(|| {
            texts
                .par_iter()
                .map(|t| tok.encode(t).map(|v| v.len()))
                .collect::<Result<Vec<_>>>()
        })?
        .into_iter()
        .sum();
    Ok((n as u64, t0.elapsed().as_secs_f64()))
}

/// Peak resident set of this process in MiB (Linux `VmHWM`), `None` elsewhere.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Resets the peak-RSS mark so a later [`peak_rss_mib`] covers only what follows (Linux; `false`
/// when unsupported).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
