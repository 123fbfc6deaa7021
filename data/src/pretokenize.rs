//! `flamia data tokenize`: parquet shards -> one pre-tokenised `.ftok` shard, reading one row
//! group at a time and tokenising each in parallel, so memory stays bounded.

use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{DataError, Result};
use crate::source::{self, Drops, Filters, RawDoc};
use crate::stream::Plan;
use crate::tokenizer::Tokenizer;
use crate::tokshard::TokWriter;

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

/// Tokenises every document of `specs` that passes `filters` (in file order) into `out`. With
/// `skip_bad`, missing or corrupt shards and unreadable row groups are skipped with a warning, and
/// a row whose text is not UTF-8 is dropped alone (the rest of its row group is kept); every
/// dropped row is counted in [`TokenizeReport::drops`] and logged at the end.
pub fn tokenize(
    specs: &[String],
    filters: &Filters,
    tok: &Tokenizer,
    out: &Path,
    threads: usize,
    skip_bad: bool,
) -> Result<TokenizeReport> {
    let t0 = Instant::now();
    let plan = Plan::build(specs, filters, skip_bad)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(|e| DataError::Config(format!("cannot start {threads} threads: {e}")))?;
    let mut w = TokWriter::create(out, &tok.fingerprint())?;
    let mut drops = Drops::default();
    for &(s, u, rows) in &plan.units {
        let slots = match source::read_slots(&plan.shards[s], u, filters, skip_bad) {
            Ok(r) => r,
            Err(e) if skip_bad => {
                tracing::warn!(
                    "skipping unreadable row group {u} of {}: {e}",
                    plan.shards[s].source.path().display()
                );
                drops.bad_units += 1;
                drops.bad_unit_rows += rows as u64;
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
        }
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
