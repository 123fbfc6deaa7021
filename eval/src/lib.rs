//! Evaluation for flamia: zero-shot multiple-choice tasks scored by log-likelihood through a
//! [`Scorer`]-style interface the trainer's model implements, validation loss and bits per byte,
//! and A/B comparison reports of runs against the BF16 control. No libtorch dependency.
