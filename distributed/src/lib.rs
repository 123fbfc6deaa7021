//! Distributed training for flamia: rank discovery from torchrun or Slurm variables, a TCP
//! rendezvous where rank 0 publishes the NCCL unique id, NCCL communicators (cudarc), gradient
//! bucketing, ZeRO-1 partitioning, failure detection that exits loudly instead of hanging, and the
//! scheduler's stop signals (checkpoint, then exit for a requeue).
//!
//! Kept out of the trainer crate so it builds and tests without libtorch. See
//! `docs/distributed.md` for how the pieces fit and how the training loop calls them.

pub mod bucket;
pub mod env;
pub mod error;
pub mod gpu_check;
pub mod group;
pub mod health;
pub mod hostlist;
pub mod nccl;
pub mod server;
pub mod signal;
pub mod stream;
pub mod wire;
pub mod zero;

pub use bucket::{BucketPlan, ReduceDtype};
pub use env::{Source, Topology};
pub use error::{DistError, Result};
pub use group::{GroupOptions, ProcessGroup, Store};
pub use health::{Health, PEER_FAILURE_EXIT_CODE};
pub use signal::PREEMPTED_EXIT_CODE;
pub use zero::ZeroPartition;
