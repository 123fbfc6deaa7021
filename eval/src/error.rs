//! Typed errors of the eval crate. Every message says what was wrong and what is allowed.

use std::path::PathBuf;

/// Result with the eval crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong while loading tasks, scoring, comparing runs or exporting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON line or JSON file did not parse.
    #[error("{path}: line {line}: invalid JSON: {msg}")]
    Json { path: PathBuf, line: usize, msg: String },
    /// A parquet file could not be read.
    #[error("{path}: parquet: {msg}")]
    Parquet { path: PathBuf, msg: String },
    /// A task record lacks a field or has one of the wrong type.
    #[error("task {task}, record {index}: {msg}")]
    Record { task: String, index: usize, msg: String },
    /// An unknown task name, file layout or option value.
    #[error("{0}")]
    Invalid(String),
    /// The scorer (the model behind it) failed or returned the wrong number of results.
    #[error("scorer: {0}")]
    Scorer(String),
    /// A run directory lacks a file or a file lacks a key.
    #[error("run {run}: {msg}")]
    Run { run: PathBuf, msg: String },
    /// Plot rendering failed.
    #[error("plot {path}: {msg}")]
    Plot { path: PathBuf, msg: String },
    /// Export to Hugging Face format found a missing, extra or misshapen tensor.
    #[error("export: {0}")]
    Export(String),
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
