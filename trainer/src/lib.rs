//! flamia-trainer: a Llama-3-style model on libtorch (tch) with attention through the FLAMIA
//! bridge, the training loop, checkpoints, configuration and metrics.
//!
//! - [`attention`]: the libtorch autograd bridge (csrc/bridge.cpp) and the CPU/GPU dispatch.
//! - [`model`]: the Llama-3-style model, sizes as data, RoPE.
//! - [`optim`]: AdamW and the learning-rate schedule.
//! - [`train`]: the training loop; [`validation`]: held-out loss during training.
//! - [`checkpoint`]: atomic checkpoints and resume.
//! - [`config`]: the run configuration (presets, environment, `--set`).
//! - [`determinism`]: `run.deterministic` and the checksum trace of runs that are not.
//! - [`metrics`]: JSONL, progress bar, Weights & Biases.
//! - [`device`], [`memory`]: device, compute precision, peak memory.
//! - [`ddp`], [`overlap`]: data parallelism (the gradient reduction, overlapped with the
//!   backward through per-parameter hooks when `distributed.overlap` is on).
//! - [`error`]: typed errors.

pub mod attention;
pub mod checkpoint;
pub mod config;
pub mod ddp;
pub mod determinism;
pub mod device;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod overlap;
pub mod train;
pub mod validation;

pub use error::{Result, TrainError};
