//! Device and compute-precision selection.

use tch::{Device, Kind};

use crate::error::{Result, TrainError};

/// Parses `auto`, `cpu`, `cuda`, `cuda:N`.
pub fn parse_device(s: &str) -> Result<Device> {
    match s {
        "auto" => Ok(Device::cuda_if_available()),
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .map(Device::Cuda)
            .ok_or_else(|| {
                TrainError::Config(format!("run.device {other:?}: allowed auto, cpu, cuda, cuda:N"))
            }),
    }
}

/// Checks a `run.device` setting's spelling without probing for CUDA (configuration checks run
/// before [`crate::determinism::apply`], which must come before libtorch touches CUDA).
pub fn check_setting(s: &str) -> Result<()> {
    match s {
        "auto" | "cuda" => Ok(()),
        other => parse_device(other).map(|_| ()),
    }
}

/// The compute kind: BF16 on CUDA and f32 on CPU for `auto`. (On CPU, BF16 matmuls are emulated
/// and slower than f32, and the CPU attention reference takes f32 anyway.)
pub fn compute_kind(setting: &str, device: Device) -> Kind {
    match (setting, device) {
        ("bf16", _) => Kind::BFloat16,
        ("fp32", _) => Kind::Float,
        (_, Device::Cpu) => Kind::Float,
        _ => Kind::BFloat16,
    }
}
