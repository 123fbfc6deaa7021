//! `flamia data tokenize`: parquet shards -> one pre-tokenised `.ftok` shard, reading one row
//! group at a time and tokenising each in parallel, so memory stays bounded.

use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{DataError, Result};
use crate::source::{self, Filters, RawDoc};
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
}

/// Tokenises every document of `specs` that passes `filters` (in file order) into `out`.
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
    for &(s, u, _) in &plan.units {
        let rows = match source::read_unit(&plan.shards[s], u, filters) {
            Ok(r) => r,
            Err(e) if skip_bad => {
                tracing::warn!("skipping unreadable row group {u}: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        let docs: Vec<Vec<u32>> = pool.install(|| {
            rows.into_par_iter()
                .flatten()
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
    Ok(TokenizeReport {
        docs,
        tokens,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
