//! Evaluation for flamia: zero-shot multiple-choice tasks scored by log-likelihood through the
//! [`Scorer`] interface the trainer's model implements (via [`LanguageModel`]), validation loss and
//! bits per byte through the training attention path and exact attention, A/B comparison reports
//! of runs against the BF16 control, and export to Hugging Face Llama format. No libtorch
//! dependency.

pub mod compare;
pub mod error;
pub mod export;
pub mod harness;
pub mod loader;
pub mod plot;
pub mod results;
pub mod runs;
pub mod scorer;
pub mod stats;
pub mod tasks;
pub mod validation;

pub use error::{Error, Result};
pub use harness::HarnessOptions;
pub use results::{EvalResults, TaskResult};
pub use scorer::{AttnMode, LanguageModel, LogLik, ModelScorer, Request, Scorer, TokenScore};
pub use tasks::{Doc, Task};
