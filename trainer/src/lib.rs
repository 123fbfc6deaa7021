//! flamia-trainer: a Llama-3-style model on libtorch (tch) with attention through the FLAMIA
//! bridge, the training loop, checkpoints, configuration and metrics.
//!
//! - [`attention`]: the libtorch autograd bridge (csrc/bridge.cpp) and the CPU/GPU dispatch.
//! - [`error`]: typed errors.

pub mod attention;
pub mod error;

pub use error::{Result, TrainError};
