//! `flamia data inspect`: what a shard holds (schema, rows, row groups, sizes) and token statistics
//! of its first documents under a tokenizer; a directory or glob gives one report per shard.

use std::fmt;
use std::path::Path;

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::error::{DataError, Result};
use crate::source::{self, Filters, RawDoc, ShardSource};
use crate::tokenizer::Tokenizer;

/// Summary of one shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Path or `embedded:*` name.
    pub path: String,
    /// `parquet` or `ftok`.
    pub format: String,
    /// Bytes on disk (or embedded).
    pub bytes: u64,
    /// `name: type` of each column (parquet) or the tokenizer fingerprint (ftok).
    pub schema: Vec<String>,
    /// Rows (documents).
    pub rows: u64,
    /// Row groups (parquet) or units (ftok).
    pub row_groups: usize,
    /// Documents whose tokens were counted.
    pub docs_counted: u64,
    /// Text bytes of those documents (parquet only).
    pub text_bytes: u64,
    /// Tokens of those documents (without end-of-text).
    pub tokens: u64,
    /// Fewest tokens in a counted document.
    pub min_tokens: u64,
    /// Most tokens in a counted document.
    pub max_tokens: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "shard       {} ({}, {} bytes)",
            self.path, self.format, self.bytes
        )?;
        writeln!(f, "rows        {} in {} row groups", self.rows, self.row_groups)?;
        writeln!(f, "schema      {}", self.schema.join(", "))?;
        if self.docs_counted > 0 {
            let n = self.docs_counted as f64;
            writeln!(
                f,
                "tokens      {} in {} documents: mean {:.1}, min {}, max {}",
                self.tokens,
                self.docs_counted,
                self.tokens as f64 / n,
                self.min_tokens,
                self.max_tokens
            )?;
            if self.text_bytes > 0 && self.tokens > 0 {
                writeln!(
                    f,
                    "bytes/token {:.3}",
                    self.text_bytes as f64 / self.tokens as f64
                )?;
            }
        }
        Ok(())
    }
}

/// Inspects every shard `spec` resolves to (a file, a directory searched at any depth, a glob or
/// `embedded:*`), in the loader's order, counting tokens of up to `max_docs` documents of each.
pub fn inspect(spec: &str, tok: &Tokenizer, max_docs: u64) -> Result<Vec<Report>> {
    shards(spec)?
        .iter()
        .map(|src| inspect_source(src, tok, max_docs))
        .collect()
}

/// The shards `spec` resolves to, in order (at least one).
pub fn shards(spec: &str) -> Result<Vec<ShardSource>> {
    let sources = source::resolve(&[spec.to_string()], false)?;
    if sources.is_empty() {
        return Err(DataError::NoShards { spec: spec.into() });
    }
    Ok(sources)
}

/// Inspects one shard, counting tokens of up to `max_docs` documents.
pub fn inspect_source(src: &ShardSource, tok: &Tokenizer, max_docs: u64) -> Result<Report> {
    let src = src.clone();
    let shard = source::open(&src, &Filters::default())?;
    let path = src.path();
    let mut r = Report {
        path: path.display().to_string(),
        ..Report::default()
    };
    r.rows = shard.unit_rows.iter().sum::<usize>() as u64;
    r.row_groups = shard.unit_rows.len();
    match &src {
        ShardSource::Embedded { bytes, .. } => {
            r.bytes = bytes.len() as u64;
            r.schema = parquet_schema(&path, bytes::Bytes::from_static(bytes))?;
        }
        ShardSource::File(p) => {
            r.bytes = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
            if shard.tokenized {
                r.schema = vec![format!(
                    "tokenizer: {}",
                    shard.token_fingerprint.clone().unwrap_or_default()
                )];
            } else {
                let f = std::fs::File::open(p).map_err(|e| DataError::Open {
                    path: p.clone(),
                    source: e,
                })?;
                r.schema = parquet_schema(&path, f)?;
            }
        }
    }
    r.format = if shard.tokenized { "ftok" } else { "parquet" }.into();
    r.min_tokens = u64::MAX;
    'units: for u in 0..shard.unit_rows.len() {
        for doc in source::read_unit(&shard, u, &Filters::default())?
            .into_iter()
            .flatten()
        {
            if r.docs_counted >= max_docs {
                break 'units;
            }
            let n = match doc {
                RawDoc::Text(t) => {
                    r.text_bytes += t.len() as u64;
                    tok.encode(&t)?.len() as u64
                }
                RawDoc::Tokens(t) => t.len() as u64,
            };
            r.docs_counted += 1;
            r.tokens += n;
            r.min_tokens = r.min_tokens.min(n);
            r.max_tokens = r.max_tokens.max(n);
        }
    }
    if r.docs_counted == 0 {
        r.min_tokens = 0;
    }
    Ok(r)
}

fn parquet_schema<R: parquet::file::reader::ChunkReader + 'static>(path: &Path, r: R) -> Result<Vec<String>> {
    let reader = SerializedFileReader::new(r).map_err(|e| DataError::Parquet {
        path: path.into(),
        source: e,
    })?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    Ok(schema
        .columns()
        .iter()
        .map(|c| {
            let t = c
                .logical_type_ref()
                .map(|l| format!("{l:?}"))
                .unwrap_or_else(|| format!("{}", c.physical_type()));
            format!("{}: {}", c.path().string(), t)
        })
        .collect())
}
