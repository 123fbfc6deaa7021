//! Device and compute-precision selection.

use tch::{Device, Kind};

use crate::error::{Result, TrainError};

/// Parses `auto`, `cpu`, `cuda`, `cuda:N`; a CUDA device libtorch cannot see is an error here
/// (not a libtorch panic at the first tensor).
pub fn parse_device(s: &str) -> Result<Device> {
    let device = match s {
        "auto" => Device::cuda_if_available(),
        other => parse_spelling(other)?,
    };
    if let Device::Cuda(i) = device {
        check_visible(s, i, tch::Cuda::device_count())?;
    }
    Ok(device)
}

/// `cpu`, `cuda`, `cuda:N` as written, without asking libtorch anything.
fn parse_spelling(s: &str) -> Result<Device> {
    match s {
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

/// `cuda:i` needs more than `i` devices visible to libtorch.
fn check_visible(setting: &str, i: usize, visible: i64) -> Result<()> {
    if (i as i64) < visible {
        return Ok(());
    }
    Err(TrainError::Config(format!(
        "run.device {setting:?} asks for CUDA device {i}, but libtorch sees {visible} CUDA device(s) \
         (no GPU or driver here, or CUDA_VISIBLE_DEVICES hides it); use run.device = \"cpu\" or \"auto\""
    )))
}

/// Checks a `run.device` setting's spelling without probing for CUDA (configuration checks run
/// before [`crate::determinism::apply`], which must come before libtorch touches CUDA).
pub fn check_setting(s: &str) -> Result<()> {
    match s {
        "auto" => Ok(()),
        other => parse_spelling(other).map(|_| ()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invisible_cuda_device_is_a_clear_error() {
        assert!(check_visible("cuda", 0, 1).is_ok());
        assert!(check_visible("cuda:3", 3, 8).is_ok());
        let e = check_visible("cuda", 0, 0).unwrap_err().to_string();
        assert!(e.contains("sees 0 CUDA device") && e.contains("\"cpu\""), "{e}");
        assert!(check_visible("cuda:2", 2, 2).is_err());
        // On a machine without a GPU (CI), the whole parse says so instead of panicking later.
        if tch::Cuda::device_count() == 0 {
            assert!(parse_device("cuda").is_err());
            assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
            assert_eq!(parse_device("auto").unwrap(), Device::Cpu);
        }
    }
}
