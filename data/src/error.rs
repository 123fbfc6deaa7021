//! Typed errors of the data pipeline. Every variant names the file (or setting) at fault and says
//! what was wrong and what is allowed.

use std::path::PathBuf;

/// Result alias of the data crate.
pub type Result<T> = std::result::Result<T, DataError>;

/// Everything that can go wrong between a shard on disk and a packed batch.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A configuration value is out of range or inconsistent.
    #[error("invalid data config: {0}")]
    Config(String),
    /// A path, directory or glob matched no shard.
    #[error("no shard found for `{spec}`: give parquet (.parquet) or pre-tokenised (.ftok) files, directories holding them, globs, or `embedded:train` / `embedded:val`")]
    NoShards { spec: String },
    /// A named shard file does not exist or cannot be opened.
    #[error("cannot open shard {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    /// The parquet footer or a page could not be decoded: the file is truncated or corrupt.
    #[error("corrupt or truncated parquet shard {path}: {source}")]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    /// An arrow error while decoding record batches of a shard.
    #[error("cannot decode record batch of {path}: {source}")]
    Arrow {
        path: PathBuf,
        source: arrow::error::ArrowError,
    },
    /// A column the pipeline needs is missing or has the wrong type.
    #[error("shard {path}: column `{column}` {problem} (columns present: {present})")]
    Column {
        path: PathBuf,
        column: String,
        problem: String,
        present: String,
    },
    /// A shard holds no rows at all.
    #[error("shard {path} is empty (0 rows); remove it or set skip_bad_shards = true")]
    EmptyShard { path: PathBuf },
    /// A shard file has 0 bytes (an interrupted download or copy).
    #[error("shard {path} is an empty file (0 bytes): an interrupted download? remove it or set skip_bad_shards = true")]
    EmptyFile { path: PathBuf },
    /// A byte-typed text value is not valid UTF-8.
    #[error("shard {path}: row {row} of row group {row_group}: `text` is not valid UTF-8 (bad byte at offset {byte}); fix the file or set skip_bad_shards = true to drop such rows")]
    NotUtf8 {
        path: PathBuf,
        row_group: usize,
        row: usize,
        byte: usize,
    },
    /// No shard left after skipping bad ones, or no document passes the filters.
    #[error("no usable data: {0}")]
    NoData(String),
    /// A pre-tokenised shard is malformed.
    #[error("bad pre-tokenised shard {path}: {problem}")]
    TokShard { path: PathBuf, problem: String },
    /// The tokenizer file cannot be read or parsed, or lacks a needed token.
    #[error("invalid tokenizer {path}: {problem}")]
    Tokenizer { path: PathBuf, problem: String },
    /// A text file given to `make-shard` or a tiktoken rank file is unreadable or malformed.
    #[error("bad input file {path}: {problem}")]
    Input { path: PathBuf, problem: String },
    /// A saved data state does not belong to this configuration.
    #[error("data state does not match this run: {0}")]
    State(String),
    /// Writing an output file failed.
    #[error("cannot write {path}: {problem}")]
    Write { path: PathBuf, problem: String },
    /// The background prefetch thread stopped.
    #[error("data prefetch thread stopped: {0}")]
    Prefetch(String),
}
