//! Typed errors of the kernels crate: every variant says what was wrong and what is allowed.

use thiserror::Error;

/// Errors of `flamia-kernels`.
#[derive(Debug, Error)]
pub enum Error {
    /// Bad shape, layout or option, with a message naming the value and what is allowed.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// `cu_seqlens` does not describe a packing of the tokens.
    #[error("invalid cu_seqlens: {0}")]
    CuSeqlens(String),
    /// A non-finite value in an input tensor (quantising it would silently produce codes).
    #[error("non-finite value in {tensor} at flat index {index} (token {token}, head {head}, dim {dim}): {value}; inputs must be finite")]
    NonFinite {
        tensor: &'static str,
        index: usize,
        token: usize,
        head: usize,
        dim: usize,
        value: f32,
    },
    /// An attention implementation on a device (the GPU) failed; the message is its error.
    #[error("attention on the device failed: {0}")]
    Device(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
