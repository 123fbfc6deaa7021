//! Typed errors of the trainer library; messages say what was wrong and what is allowed.

use thiserror::Error;

/// Anything the trainer library can fail with.
#[derive(Debug, Error)]
pub enum TrainError {
    /// Bad input: shapes, config values, arguments.
    #[error("{0}")]
    Invalid(String),
    /// Configuration could not be read or resolved.
    #[error("config: {0}")]
    Config(String),
    /// The attention bridge or a kernel behind it failed.
    #[error("attention: {0}")]
    Attention(String),
    /// Checkpoint writing, reading or resuming failed.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Tch(#[from] tch::TchError),
    /// File system errors, with the path.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

/// Result with [`TrainError`].
pub type Result<T, E = TrainError> = std::result::Result<T, E>;
