//! FLAMIA on the GPU (Hopper, `sm_90a`): the kernel runtime and the FP8 `wgmma` kernels.
//!
//! - [`runtime`]: embedded CUDA sources (`flamia-kernels/cuda/`), NVRTC compilation for the
//!   device's architecture, our `#include`s resolved from the embedded headers, `-D` variants,
//!   modules cached per (source, variant, arch), raw launches on a caller's stream; [`kcache`]:
//!   the compiled PTX on disk for later processes (`FLAMIA_KERNEL_CACHE`).
//! - [`plan`]: per-batch tables (32-token quantiser blocks, 64-token attention tiles, padding).
//! - [`quant`]: fused quantisers, bitwise equal to [`crate::quant`] (+ [`crate::hadamard`]).
//! - [`attention`]: forward and backward ([`Attention`]), on raw device pointers + a stream.
//! - [`sched`]: the persistent kernels' longest-first work lists; [`tma`]: TMA tensor maps.
//! - [`bench`]: the attention benchmark (`flamia bench attention`).
//! - [`buffer`]: device buffers owned by this side (plans, quantised operands, workspaces).
//! - [`host`]: forward + backward on host `f32` tensors (checks, tests, harnesses).
//! - [`error`]: [`GpuError`]: no driver, no GPU, no NVRTC, compile log, driver call.
//!
//! Builds with no CUDA installed: libcuda and libnvrtc are loaded at run time; without them every
//! entry point returns a typed error. Layouts of every buffer are in `cuda/attn_common.cuh`.

pub mod attention;
pub mod bench;
pub mod buffer;
pub mod error;
pub mod host;
pub mod kcache;
pub mod plan;
pub mod quant;
pub mod runtime;
pub mod sched;
pub mod tma;

pub use attention::{check_head_dim, Attention, BwdKernel, BwdOutputs, GradWorkspace, Saved};
pub use buffer::DeviceBuf;
pub use error::{GpuError, GpuResult};
pub use plan::{Plan, GPU_HEAD_DIMS};
pub use quant::{Nvfp4Operand, Operand};
pub use runtime::{kernel_builds, Gpu, KernelBuilds, RawStream, Variant};

/// The number in environment variable `var` (surrounding spaces ignored), if it is set and parses:
/// the development and test knobs of the kernels (`FLAMIA_*`).
pub(crate) fn env_number<T: std::str::FromStr>(var: &str) -> Option<T> {
    std::env::var(var).ok().and_then(|v| v.trim().parse().ok())
}

/// Whether the on/off knob in environment variable `var` is on: exactly `1` (surrounding spaces
/// ignored); unset or anything else is off.
pub(crate) fn env_on(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim() == "1")
}

/// Whether the default-on knob in environment variable `var` is switched off: exactly `0`
/// (surrounding spaces ignored); unset or anything else leaves it on.
pub(crate) fn env_off(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim() == "0")
}
