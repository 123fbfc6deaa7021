//! FLAMIA attention for packed documents.
//!
//! Tensors are flash-attention "varlen" layout: `(tokens, heads, head_dim)` row-major, documents
//! packed back to back and delimited by `cu_seqlens` (`[0, len0, len0+len1, ..., tokens]`).
//! Query heads are a multiple of KV heads (GQA: query head `h` reads KV head `h / (hq / hkv)`).
//!
//! - [`call`]: [`AttnCall`], the inputs, shape and options of one attention call.
//! - [`options`]: the attention paths and precision options shared by every implementation.
//! - [`error`]: typed errors for bad input.
//! - [`formats`]: E4M3, E2M1 and power-of-two block exponents, bit for bit.
//! - [`quant`]: the token-block E4M3 quantiser over packed documents and the NVFP4 quantiser.
//! - [`hadamard`]: the normalised Walsh-Hadamard rotation of Q and K.
//! - [`reference`]: the CPU reference attention forward/backward (the numerical specification).
//! - [`leakage`]: the causal-leakage and document-isolation harness.
//! - [`numerics`]: the accuracy/leakage check behind `flamia check numerics`.
//! - [`gpu`]: the CUDA side: NVRTC kernel runtime, fused quantisers, FP8 wgmma attention.
//!
//! The numeric design and the bit-level contract GPU kernels must reproduce are in
//! `docs/numerics.md`.

pub mod call;
pub mod error;
pub mod formats;
pub mod gpu;
pub mod hadamard;
pub mod leakage;
pub mod numerics;
pub mod options;
pub mod quant;
pub mod reference;

pub use call::{AttnCall, Input};
pub use error::{Error, Result};
pub use options::{AttnOptions, AttnPath, Precision, VarlenShape};
