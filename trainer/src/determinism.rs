//! Reproducible training (`run.deterministic`) and the checksum trace that diagnoses runs which
//! are not (`FLAMIA_TRACE_CHECKSUMS`). docs/training.md "Reproducibility" has what is and is not
//! bitwise repeatable on the GPU and why.
//!
//! - [`apply`]: libtorch's deterministic mode on or off for the process; with it, unless the
//!   device setting is `cpu`, also `CUBLAS_WORKSPACE_CONFIG=:4096:8` (libtorch sizes cuBLAS's
//!   workspace when it creates its first cuBLAS handle, so this runs first in a run, before the
//!   device is even probed). Without `run.deterministic` the variable is left alone
//!   ([`cublas_workspace_to_set`] says why).
//! - [`Trace`]: with `FLAMIA_TRACE_CHECKSUMS=<file>`, the bridge appends one line per attention
//!   call (checksums of q, k, v, o, lse; dO, dQ, dK, dV) and the training loop one line per step
//!   (the loss and every parameter gradient), so two runs can be compared line by line and the
//!   first tensor that differs names where they part.

use std::io::Write;
use std::path::PathBuf;

use tch::Tensor;

use crate::error::{Result, TrainError};

/// The environment variable cuBLAS reads for its workspace configuration.
pub const CUBLAS_WORKSPACE_CONFIG: &str = "CUBLAS_WORKSPACE_CONFIG";
/// The value [`apply`] sets: one of the two libtorch accepts as deterministic.
pub const CUBLAS_DETERMINISTIC: &str = ":4096:8";
/// The environment variable naming the checksum trace file.
pub const TRACE_ENV: &str = "FLAMIA_TRACE_CHECKSUMS";

/// Whether a `CUBLAS_WORKSPACE_CONFIG` value is one libtorch's deterministic mode accepts.
pub fn cublas_config_is_deterministic(v: &str) -> bool {
    matches!(v, ":4096:8" | ":16:8")
}

/// Checks that `run.deterministic` can be honoured in this environment: a
/// `CUBLAS_WORKSPACE_CONFIG` that is already set must be one of the deterministic values
/// (`:4096:8`, `:16:8`), since cuBLAS reads it once and it cannot be replaced afterwards.
pub fn check_env(deterministic: bool) -> Result<()> {
    if !deterministic {
        return Ok(());
    }
    match std::env::var(CUBLAS_WORKSPACE_CONFIG) {
        Ok(v) if !cublas_config_is_deterministic(&v) => Err(TrainError::Config(format!(
            "run.deterministic = true needs {CUBLAS_WORKSPACE_CONFIG} unset (flamia sets \
             {CUBLAS_DETERMINISTIC}) or one of :4096:8, :16:8; it is {v:?}"
        ))),
        _ => Ok(()),
    }
}

/// The `CUBLAS_WORKSPACE_CONFIG` value a run has to put into the environment, given
/// `run.deterministic`, the `run.device` setting and the variable's current value: `:4096:8`
/// when deterministic, the device may be CUDA (any setting but `cpu`, so `auto` too: the
/// decision comes before CUDA is probed) and the variable is unset; nothing otherwise (a value
/// already set is kept; [`check_env`] refuses a non-deterministic one). Not set by default: on
/// Hopper (and Blackwell) libtorch 2.11 already gives cuBLAS a 32 MiB workspace when the
/// variable is unset (`parseChosenWorkspaceSize` in its `CublasHandlePool.cpp`), the size
/// `:4096:8` names, so there the variable changes nothing but what libtorch's deterministic-mode
/// check accepts (docs/training.md "Reproducibility").
pub fn cublas_workspace_to_set(
    deterministic: bool,
    device: &str,
    current: Option<&str>,
) -> Option<&'static str> {
    (deterministic && device != "cpu" && current.is_none()).then_some(CUBLAS_DETERMINISTIC)
}

/// Puts the process into (or out of) deterministic mode for a run whose `run.device` setting is
/// `device`. Call it first, before libtorch touches CUDA (`train` calls it before it even
/// resolves the device): it sets `CUBLAS_WORKSPACE_CONFIG` as [`cublas_workspace_to_set`] says
/// (cuBLAS's workspace size is fixed when libtorch creates its first cuBLAS handle; libtorch's
/// deterministic mode checks the variable on every matmul), then libtorch's switches.
pub fn apply(deterministic: bool, device: &str) -> Result<()> {
    check_env(deterministic)?;
    let current = std::env::var(CUBLAS_WORKSPACE_CONFIG).ok();
    if let Some(v) = cublas_workspace_to_set(deterministic, device, current.as_deref()) {
        // No other thread of the run exists yet (the data loader and the model come later).
        std::env::set_var(CUBLAS_WORKSPACE_CONFIG, v);
        tracing::info!(
            "run.deterministic: {CUBLAS_WORKSPACE_CONFIG}={v} set before CUDA starts (device setting {device:?})"
        );
    }
    crate::attention::set_deterministic(deterministic)
}

/// The per-step half of the checksum trace (the bridge writes the per-call half).
#[derive(Debug)]
pub struct Trace {
    path: PathBuf,
}

impl Trace {
    /// The trace named by `FLAMIA_TRACE_CHECKSUMS`, if set and non-empty.
    pub fn from_env() -> Option<Trace> {
        std::env::var_os(TRACE_ENV)
            .filter(|v| !v.is_empty())
            .map(|v| Trace { path: v.into() })
    }

    /// Appends `step <n> loss=<bits> <name>=<sum>:<weighted sum> ...` for every parameter that
    /// has a gradient (call it after the backward, before the optimizer).
    pub fn step(&self, step: usize, loss: f64, params: &[(String, Tensor)]) -> Result<()> {
        let mut line = format!("step {step} loss={:016x}", loss.to_bits());
        for (name, p) in params {
            let g = p.grad();
            if g.defined() {
                let [s, w] = crate::attention::checksum(&g)?;
                line.push_str(&format!(" {name}={:016x}:{:016x}", s as u64, w as u64));
            }
        }
        line.push('\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| TrainError::io(&self.path, e))?;
        f.write_all(line.as_bytes())
            .map_err(|e| TrainError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_deterministic_cublas_configs_are_accepted() {
        assert!(cublas_config_is_deterministic(":4096:8"));
        assert!(cublas_config_is_deterministic(":16:8"));
        assert!(!cublas_config_is_deterministic(":4096:2"));
        assert!(!cublas_config_is_deterministic(""));
    }

    #[test]
    fn the_cublas_workspace_is_set_only_for_deterministic_runs_that_may_use_cuda() {
        for dev in ["auto", "cuda", "cuda:3"] {
            assert_eq!(cublas_workspace_to_set(true, dev, None), Some(":4096:8"), "{dev}");
            // A value already set is kept (check_env refuses a bad one), and nothing is set
            // without run.deterministic.
            assert_eq!(cublas_workspace_to_set(true, dev, Some(":16:8")), None, "{dev}");
            assert_eq!(cublas_workspace_to_set(false, dev, None), None, "{dev}");
        }
        assert_eq!(cublas_workspace_to_set(true, "cpu", None), None);
    }

    #[test]
    fn checksums_see_every_bit_and_the_position() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        let same = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
        // One ulp apart in one element.
        let ulp = Tensor::from_slice(&[1.0f32, f32::from_bits(2.0f32.to_bits() + 1), 3.0]);
        // Same elements, another order: the plain sum agrees, the weighted one does not.
        let swapped = Tensor::from_slice(&[2.0f32, 1.0, 3.0]);
        let c = |t: &Tensor| crate::attention::checksum(t).unwrap();
        assert_eq!(c(&a), c(&same));
        assert_ne!(c(&a), c(&ulp));
        assert_eq!(c(&a)[0], c(&swapped)[0]);
        assert_ne!(c(&a)[1], c(&swapped)[1]);
        // BF16 and f64 are read at their own element size.
        let h = a.to_kind(tch::Kind::BFloat16);
        assert_eq!(c(&h), c(&same.to_kind(tch::Kind::BFloat16)));
        assert_ne!(
            c(&a.to_kind(tch::Kind::Double)),
            c(&ulp.to_kind(tch::Kind::Double))
        );
    }
}
