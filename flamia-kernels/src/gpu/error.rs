//! Typed errors of the CUDA side: what is missing (driver, GPU, NVRTC), what failed to compile
//! (with the NVRTC log), and which driver call failed.

use cudarc::driver::DriverError;
use thiserror::Error;

/// Errors of [`crate::gpu`].
#[derive(Debug, Error)]
pub enum GpuError {
    /// `libcuda.so` could not be loaded.
    #[error(
        "no CUDA driver: libcuda.so could not be loaded; install the NVIDIA driver or put the directory \
         holding libcuda.so.1 on LD_LIBRARY_PATH"
    )]
    NoDriver,
    /// The driver loaded but there is no device with this ordinal.
    #[error("no CUDA GPU: asked for device {ordinal}, the driver reports {count} device(s)")]
    NoGpu { ordinal: usize, count: i32 },
    /// `libnvrtc.so` could not be loaded.
    #[error(
        "no NVRTC: libnvrtc.so (CUDA 13) could not be loaded; put its directory (e.g. /usr/local/cuda/lib64, \
         or site-packages/nvidia/cu13/lib of the nvidia-cuda-nvrtc wheel) on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// The GPU lacks the FP8 `wgmma` instructions the kernels are written with.
    #[error(
        "unsupported GPU {name} (compute capability {major}.{minor}): the FP8 attention kernels use wgmma \
         and need compute capability 9.0 (Hopper: H100/H200)"
    )]
    Unsupported { name: String, major: i32, minor: i32 },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed to compile {source_name} [{variant}] for {arch} (options {options:?}):\n{log}")]
    Compile {
        source_name: String,
        variant: String,
        arch: String,
        options: Vec<String>,
        log: String,
    },
    /// A kernel source or `#include` that is not embedded in the crate.
    #[error("unknown CUDA source {name:?} (included from {from}); embedded sources: {known}")]
    UnknownSource {
        name: String,
        from: String,
        known: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {what} failed: {err}")]
    Driver { what: String, err: DriverError },
    /// Bad input (shape, options, buffer sizes).
    #[error(transparent)]
    Input(#[from] crate::Error),
    /// A kernel or option combination that the GPU code does not implement.
    #[error("not supported on the GPU: {0}")]
    NotSupported(String),
}

/// Result alias of [`crate::gpu`].
pub type GpuResult<T> = std::result::Result<T, GpuError>;

/// Adds the name of the failing call to a driver error.
pub(crate) trait DriverContext<T> {
    fn ctx(self, what: &str) -> GpuResult<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn ctx(self, what: &str) -> GpuResult<T> {
        self.map_err(|err| GpuError::Driver {
            what: what.to_string(),
            err,
        })
    }
}
