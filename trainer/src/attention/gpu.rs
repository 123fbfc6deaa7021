//! CUDA side of the bridge for the FLAMIA paths: BF16 device tensors handed to
//! `flamia_kernels::gpu` on the current stream. (The `bf16` control never gets here: bridge.cpp
//! calls libtorch's flash attention for it.)

use super::ffi::FlamiaCall;

/// Runs the forward or backward of one CUDA call.
pub(crate) fn run(call: &FlamiaCall, _backward: bool) -> Result<(), String> {
    let (opts, _shape) = call.decode()?;
    Err(format!(
        "the GPU FLAMIA path ({}) is not built into this trainer yet: use attention.path = \"bf16\" on CUDA",
        opts.path
    ))
}
