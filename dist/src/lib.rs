//! Distributed training for flamia: rank discovery from torchrun or Slurm variables, a TCP
//! rendezvous where rank 0 publishes the NCCL unique id, NCCL communicators (cudarc), gradient
//! bucketing, and failure detection that exits loudly instead of hanging.
//!
//! Kept out of the trainer crate so it builds and tests without libtorch.
