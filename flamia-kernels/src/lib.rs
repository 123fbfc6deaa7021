//! FLAMIA attention for packed documents.
//!
//! Tensors are flash-attention "varlen" layout: `(tokens, heads, head_dim)` row-major, documents
//! packed back to back and delimited by `cu_seqlens` (`[0, len0, len0+len1, ..., tokens]`).
//! Query heads are a multiple of KV heads (GQA: query head `h` reads KV head `h / (hq / hkv)`).
//!
//! - [`options`]: the attention paths and precision options shared by every implementation.
//! - [`error`]: typed errors for bad input.

pub mod error;
pub mod options;

pub use error::{Error, Result};
pub use options::{AttnOptions, AttnPath, Precision, VarlenShape};
