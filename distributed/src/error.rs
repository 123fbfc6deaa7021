//! Typed errors of the distributed layer. Every message says what went wrong, on which rank or
//! address, and what is allowed, so that a failed multi-node launch can be diagnosed from one log.

use std::time::Duration;

/// Everything that can go wrong while forming or running a process group.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A launcher variable is missing or malformed.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    BadEnv {
        var: &'static str,
        value: String,
        reason: String,
    },

    /// Rank/world-size values that cannot describe a process group.
    #[error("invalid process group: {0}")]
    BadTopology(String),

    /// A Slurm hostlist expression that cannot be expanded.
    #[error("cannot expand Slurm hostlist {expr:?}: {reason}")]
    BadHostlist { expr: String, reason: String },

    /// Rank 0 could not be reached before the rendezvous timeout.
    #[error(
        "rank {rank}: master {addr} unreachable after {waited:?} (last error: {last_error}); \
         check MASTER_ADDR/MASTER_PORT, that rank 0 is running, and firewalls"
    )]
    MasterUnreachable {
        rank: usize,
        addr: String,
        waited: Duration,
        last_error: String,
    },

    /// Rank 0 could not listen on the rendezvous address.
    #[error("rank 0: cannot listen on {addr}: {reason} (is MASTER_PORT already in use?)")]
    Bind { addr: String, reason: String },

    /// Ranks disagree on the world size.
    #[error("world size mismatch: rank {rank} says WORLD_SIZE={theirs}, rank 0 expects {expected}; every rank must be launched with the same world size")]
    WorldSizeMismatch {
        rank: usize,
        theirs: usize,
        expected: usize,
    },

    /// Two processes claimed the same rank.
    #[error("duplicate rank {rank}: already held by {first_host}, claimed again by {second_host}; every process needs a distinct RANK in 0..WORLD_SIZE")]
    DuplicateRank {
        rank: usize,
        first_host: String,
        second_host: String,
    },

    /// A rank outside `0..world_size` tried to join.
    #[error("rank {rank} is out of range for world size {world_size} (allowed 0..{world_size})")]
    RankOutOfRange { rank: usize, world_size: usize },

    /// Not every rank joined before the timeout.
    #[error("rendezvous timed out after {waited:?}: {joined} of {world_size} ranks joined, missing ranks {missing:?}")]
    RendezvousTimeout {
        waited: Duration,
        joined: usize,
        world_size: usize,
        missing: Vec<usize>,
    },

    /// The rendezvous server this process reached belongs to another job (two jobs on one port).
    #[error(
        "rank {rank}: {addr} belongs to job {server_job}, this process is job {this_job}: another \
         job is using this rendezvous port; give each job its own MASTER_PORT (or FLAMIA_DIST_PORT)"
    )]
    ForeignJob {
        rank: usize,
        addr: String,
        server_job: String,
        this_job: String,
    },

    /// A message too large for the rendezvous/store protocol; nothing was sent.
    #[error(
        "message of {bytes} bytes to {peer} exceeds the protocol limit of {max} bytes; nothing was \
         sent (the store carries control-plane data; send bulk data through NCCL or in smaller pieces)"
    )]
    MessageTooLarge { peer: String, bytes: usize, max: usize },

    /// Rank 0 refused this rank (it carries rank 0's reason).
    #[error("rank {rank} rejected by rank 0: {reason}")]
    Rejected { rank: usize, reason: String },

    /// A peer spoke something that is not the flamia rendezvous protocol.
    #[error("protocol error with {peer}: {reason}")]
    Protocol { peer: String, reason: String },

    /// Socket failure on an established connection.
    #[error("I/O error with {peer}: {source}")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },

    /// A store wait did not complete in time.
    #[error("store: waiting for key {key:?} timed out after {waited:?}")]
    StoreTimeout { key: String, waited: Duration },

    /// The group failed: a peer died, stopped heartbeating, or asked everyone to stop on error.
    #[error("process group failed: {0}")]
    PeerFailure(String),

    /// An NCCL call failed (or was aborted after a timeout / peer failure).
    #[error("NCCL {op} failed: {reason}")]
    Nccl { op: &'static str, reason: String },

    /// A collective did not finish before its timeout; the communicator was aborted.
    #[error("NCCL {op} did not complete within {timeout:?}; communicator aborted (a peer is probably dead or stuck)")]
    CollectiveTimeout { op: &'static str, timeout: Duration },

    /// Ranks started with different inputs (configuration, data, checkpoint, parameters): the
    /// message names the item, the ranks and the first difference.
    #[error("ranks disagree at start-up: {0}")]
    Disagreement(String),

    /// Buffer sizes or bucket layouts that do not match.
    #[error("layout mismatch: {0}")]
    Layout(String),
}

impl DistError {
    pub(crate) fn io(peer: impl Into<String>, source: std::io::Error) -> Self {
        DistError::Io {
            peer: peer.into(),
            source,
        }
    }
    pub(crate) fn protocol(peer: impl Into<String>, reason: impl Into<String>) -> Self {
        DistError::Protocol {
            peer: peer.into(),
            reason: reason.into(),
        }
    }
}

/// Result alias for the crate.
pub type Result<T, E = DistError> = std::result::Result<T, E>;
