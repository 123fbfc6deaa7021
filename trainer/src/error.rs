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
    /// `--resume` found the run complete (its newest checkpoint is at `training.steps`): nothing
    /// to train, and not a failure (a requeued job that already finished exits 0 on it).
    #[error("{0}")]
    Complete(String),
    /// This rank stopped because the process group had failed (another rank died, hung or
    /// reported an error) before its own error surfaced; the CLI exits with
    /// `flamia_dist::PEER_FAILURE_EXIT_CODE` so a launcher can tell it from the rank's own failure.
    #[error("{0}")]
    PeerFailure(String),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Tch(#[from] tch::TchError),
    /// The device ran out of memory: what was running, how much memory was in use, and what to
    /// change (see [`crate::memory::explain`]).
    #[error("out of memory during {what} ({in_use}); {detail}\nremedies: {remedies}")]
    OutOfMemory {
        /// The phase of the step (e.g. `the forward/backward of micro-batch 2 of 4 (16384 tokens)`).
        what: String,
        /// Memory in use on the device when the error surfaced.
        in_use: String,
        /// The allocator's own message (first line).
        detail: String,
        /// What to change, for the phase that ran out ([`crate::memory::Phase`]).
        remedies: String,
    },
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
