//! `flamia data tokenize`: parquet shards -> one pre-tokenised `.ftok` shard, reading one row
//! group at a time and tokenising each in parallel, so memory stays bounded.
//!
//! * `.ftok` inputs (named, or found in an input directory or glob) are copied through unchanged,
//!   so each must have been made with the same tokenizer: one whose fingerprint differs is refused
//!   (its ids, stamped with this tokenizer's fingerprint, would mean other text or lie outside the
//!   vocabulary).
//! * The output is never one of the inputs: a directory or glob input that holds it (a re-run into
//!   the same directory) leaves it out with a warning, and naming it as an `--input` file is an
//!   error.
//! * The output is written as `OUT.tmp` and renamed over `OUT` at the end ([`crate::atomic`]): a
//!   failed or killed run leaves the previous `OUT` as it was.
//! * Progress goes to a callback after every unit ([`tokenize_with_progress`]); [`tokenize`]
//!   logs a [`Progress`] line every [`LOG_EVERY`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::error::{DataError, Result};
use crate::source::{self, Drops, Filters, RawDoc, ShardSource};
use crate::stream::Plan;
use crate::tokenizer::Tokenizer;
use crate::tokshard::TokWriter;

/// How often [`tokenize`] logs its progress.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// What a tokenize run did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenizeReport {
    /// Documents written.
    pub docs: u64,
    /// Tokens written.
    pub tokens: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Rows read but not written, by reason (filters, empty text, and with `skip_bad` rows whose
    /// text is not UTF-8 and unreadable row groups).
    pub drops: Drops,
}

/// How far a tokenize run is: passed to the progress callback after every unit (parquet row
/// group, or 1024-document chunk of a `.ftok` input).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Units done (written, or skipped as unreadable with `skip_bad`).
    pub units_done: usize,
    /// Units of all inputs.
    pub units: usize,
    /// Rows of the units done.
    pub rows_done: u64,
    /// Rows of all inputs.
    pub rows: u64,
    /// Documents written so far.
    pub docs: u64,
    /// Tokens written so far.
    pub tokens: u64,
    /// Seconds since the start.
    pub seconds: f64,
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} row groups, {}/{} rows ({:.1}%): {} documents, {} tokens written in {:.0} s ({:.0} tokens/s)",
            self.units_done,
            self.units,
            self.rows_done,
            self.rows,
            100.0 * self.rows_done as f64 / self.rows.max(1) as f64,
            self.docs,
            self.tokens,
            self.seconds,
            self.tokens as f64 / self.seconds.max(1e-9)
        )
    }
}

/// Rate-limits progress lines: [`ProgressLog::line`] gives one when `every` has passed since the
/// last (or since the start).
#[derive(Debug, Clone)]
pub struct ProgressLog {
    every: f64,
    last: f64,
}

impl ProgressLog {
    /// A line at most every `every` (zero: after every unit).
    pub fn new(every: Duration) -> ProgressLog {
        ProgressLog {
            every: every.as_secs_f64(),
            last: 0.0,
        }
    }

    /// `tokenize: <progress>` if a line is due at `p.seconds`.
    pub fn line(&mut self, p: &Progress) -> Option<String> {
        if p.seconds - self.last < self.every {
            return None;
        }
        self.last = p.seconds;
        Some(format!("tokenize: {p}"))
    }
}

/// Tokenises every document of `specs` that passes `filters` (in file order) into `out`, logging
/// progress every [`LOG_EVERY`]. See [`tokenize_with_progress`].
pub fn tokenize(
    specs: &[String],
    filters: &Filters,
    tok: &Tokenizer,
    out: &Path,
    threads: usize,
    skip_bad: bool,
) -> Result<TokenizeReport> {
    let mut log = ProgressLog::new(LOG_EVERY);
    tokenize_with_progress(specs, filters, tok, out, threads, skip_bad, &mut |p| {
        if let Some(line) = log.line(p) {
            tracing::info!("{line}");
        }
    })
}

/// Tokenises every document of `specs` that passes `filters` (in file order) into `out`, calling
/// `progress` after every unit. With `skip_bad`, missing or corrupt shards and unreadable row
/// groups are skipped with a warning, and a row whose text is not UTF-8 is dropped alone (the rest
/// of its row group is kept); every dropped row is counted in [`TokenizeReport::drops`] and logged
/// at the end.
///
/// Refused before anything is written: a `.ftok` input made with another tokenizer (even with
/// `skip_bad`: it is not damaged, it is the wrong data), and `out` itself named as an input; `out`
/// found inside an input directory or glob is left out with a warning. `out` is replaced only when
/// the run succeeds.
pub fn tokenize_with_progress(
    specs: &[String],
    filters: &Filters,
    tok: &Tokenizer,
    out: &Path,
    threads: usize,
    skip_bad: bool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<TokenizeReport> {
    let t0 = Instant::now();
    let sources = inputs_without_output(specs, out, skip_bad)?;
    let plan = Plan::from_sources(sources, specs, filters, skip_bad)?;
    check_token_inputs(&plan, tok)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| DataError::Config(format!("cannot start {threads} threads: {e}")))?;
    let mut w = TokWriter::create(out, &tok.fingerprint())?;
    let mut drops = Drops::default();
    let mut p = Progress {
        units_done: 0,
        units: plan.units.len(),
        rows_done: 0,
        rows: plan.units.iter().map(|u| u.2 as u64).sum(),
        docs: 0,
        tokens: 0,
        seconds: 0.0,
    };
    for &(s, u, rows) in &plan.units {
        p.units_done += 1;
        p.rows_done += rows as u64;
        let slots = match source::read_slots(&plan.shards[s], u, filters, skip_bad) {
            Ok(r) => r,
            Err(e) if skip_bad => {
                tracing::warn!(
                    "skipping unreadable row group {u} of {}: {e}",
                    plan.shards[s].source.path().display()
                );
                drops.bad_units += 1;
                drops.bad_unit_rows += rows as u64;
                p.seconds = t0.elapsed().as_secs_f64();
                progress(&p);
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut texts = Vec::with_capacity(slots.len());
        for slot in slots {
            match slot {
                Ok(d) => texts.push(d),
                Err(reason) => drops.add(reason),
            }
        }
        let docs: Vec<Vec<u32>> = pool.install(|| {
            texts
                .into_par_iter()
                .map(|d| match d {
                    RawDoc::Text(t) => tok.encode(&t),
                    RawDoc::Tokens(t) => Ok(t),
                })
                .collect::<Result<_>>()
        })?;
        for d in &docs {
            w.push(d)?;
            p.docs += 1;
            p.tokens += d.len() as u64;
        }
        p.seconds = t0.elapsed().as_secs_f64();
        progress(&p);
    }
    let (docs, tokens) = w.finish()?;
    if drops.bad_utf8 > 0 || drops.bad_units > 0 {
        tracing::warn!("{}: {drops}", out.display());
    } else if drops.rows() > 0 {
        tracing::info!("{}: {drops}", out.display());
    }
    Ok(TokenizeReport {
        docs,
        tokens,
        seconds: t0.elapsed().as_secs_f64(),
        drops,
    })
}

/// The shards of `specs` without `out`: an error when a spec names `out` itself, a warning when
/// a directory or glob holds it (compared by canonical path, so `./x.ftok` and a symlink match).
fn inputs_without_output(specs: &[String], out: &Path, skip_bad: bool) -> Result<Vec<ShardSource>> {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    let Some(out_c) = canon(out) else {
        // No output yet: no input can be it.
        return source::resolve(specs, skip_bad);
    };
    let is_out = |p: &Path| canon(p).is_some_and(|c| c == out_c);
    if let Some(spec) = specs
        .iter()
        .find(|s| Path::new(s.as_str()).is_file() && is_out(Path::new(s.as_str())))
    {
        return Err(DataError::Input {
            path: spec.into(),
            problem: format!(
                "it is the output file (--out {}): tokenize replaces the output with what it reads, so it cannot read it; give another --out, or leave it out of --input",
                out.display()
            ),
        });
    }
    let mut sources = source::resolve(specs, skip_bad)?;
    let before = sources.len();
    sources.retain(|s| !matches!(s, ShardSource::File(p) if is_out(p)));
    if sources.len() < before {
        tracing::warn!(
            "leaving the output {} out of the inputs (an input directory or glob holds it): it is replaced by this run",
            out.display()
        );
    }
    if sources.is_empty() {
        return Err(DataError::NoData(format!(
            "no input shard in {specs:?} besides the output {}",
            out.display()
        )));
    }
    Ok(sources)
}

/// Refuses `.ftok` inputs made with another tokenizer than `tok`: their ids are copied unchanged.
fn check_token_inputs(plan: &Plan, tok: &Tokenizer) -> Result<()> {
    let fp = tok.fingerprint();
    for s in &plan.shards {
        if let Some(f) = s.token_fingerprint.as_ref().filter(|f| **f != fp) {
            let path: PathBuf = s.source.path();
            return Err(DataError::TokShard {
                problem: format!(
                    "made with tokenizer {f} but tokenize runs with tokenizer {} ({fp}); the ids of a .ftok input are copied unchanged, so it must come from the same tokenizer: tokenize its parquet shards with this one, or leave it out of --input (a directory or glob input takes every .ftok under it){}",
                    tok.spec(),
                    crate::tokshard::old_fingerprint_hint(f)
                ),
                path,
            });
        }
    }
    Ok(())
}
