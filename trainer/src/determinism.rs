//! Reproducible training (`run.deterministic`) and the checksum trace that diagnoses runs which
//! are not (`FLAMIA_TRACE_CHECKSUMS`). docs/training.md "Reproducibility" has what is and is not
//! bitwise repeatable on the GPU and why.
//!
//! - [`Deterministic`]: the setting, `auto` (default: on for the FLAMIA attention paths, off for
//!   the `bf16` control), `true` or `false`; [`Deterministic::resolve`] decides for a path.
//! - [`apply`]: libtorch's deterministic mode on or off for the process, its NaN fill of
//!   uninitialised memory off unless `run.fill_uninitialized_memory`; with the mode, unless the
//!   device setting is `cpu`, also `CUBLAS_WORKSPACE_CONFIG=:4096:8` (libtorch sizes cuBLAS's
//!   workspace when it creates its first cuBLAS handle, so this runs first in a run, before the
//!   device is even probed). Without the mode the variable is left alone
//!   ([`cublas_workspace_to_set`] says why).
//! - [`Trace`]: with `FLAMIA_TRACE_CHECKSUMS=<file>`, the bridge appends one line per attention
//!   call (checksums of q, k, v, o, lse; dO, dQ, dK, dV) and the training loop one line per step
//!   (the loss and every parameter gradient), so two runs can be compared line by line and the
//!   first tensor that differs names where they part.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;

use flamia_kernels::AttnPath;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tch::Tensor;

use crate::config::TrainConfig;
use crate::error::{Result, TrainError};

/// `run.deterministic`: `auto` (the default), `true` or `false` (TOML booleans; the strings
/// `"auto"`, `"true"`, `"false"` too, for the environment and `--set`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deterministic {
    /// On for the FLAMIA attention paths (`mxfp8`, `nvfp4`, `leaky-fp8`), off for the `bf16`
    /// control ([`Deterministic::resolve`]).
    #[default]
    Auto,
    /// Always on.
    On,
    /// Always off.
    Off,
}

impl Deterministic {
    /// Whether a run on attention path `path` trains in deterministic mode. `auto`: on for every
    /// FLAMIA path, whose runs then repeat bitwise by default at a small cost (libtorch's
    /// deterministic algorithms touch no kernel of those paths; what they fix is libtorch's
    /// gradient of the tied embedding/output weight, docs/training.md "Reproducibility"); off
    /// for the `bf16` control, where the mode also swaps libtorch's flash-attention backward for
    /// its deterministic variant, a different kernel than the one the control measures.
    pub fn resolve(self, path: AttnPath) -> bool {
        match self {
            Deterministic::On => true,
            Deterministic::Off => false,
            Deterministic::Auto => path != AttnPath::Exact,
        }
    }

    /// The setting as written in a config: `auto`, `true` or `false`.
    pub fn name(self) -> &'static str {
        match self {
            Deterministic::Auto => "auto",
            Deterministic::On => "true",
            Deterministic::Off => "false",
        }
    }
}

impl Serialize for Deterministic {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Deterministic::Auto => s.serialize_str("auto"),
            Deterministic::On => s.serialize_bool(true),
            Deterministic::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Deterministic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Deterministic;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("auto, true or false")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> std::result::Result<Deterministic, E> {
                Ok(if b { Deterministic::On } else { Deterministic::Off })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Deterministic, E> {
                match v {
                    "auto" => Ok(Deterministic::Auto),
                    "true" => Ok(Deterministic::On),
                    "false" => Ok(Deterministic::Off),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

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

/// Checks that deterministic mode (`deterministic`: [`enabled`]) can be honoured in this environment: a
/// `CUBLAS_WORKSPACE_CONFIG` that is already set must be one of the deterministic values
/// (`:4096:8`, `:16:8`), since cuBLAS reads it once and it cannot be replaced afterwards.
pub fn check_env(deterministic: bool) -> Result<()> {
    if !deterministic {
        return Ok(());
    }
    match std::env::var(CUBLAS_WORKSPACE_CONFIG) {
        Ok(v) if !cublas_config_is_deterministic(&v) => Err(TrainError::Config(format!(
            "deterministic mode (run.deterministic = true, or auto on a FLAMIA attention path) \
             needs {CUBLAS_WORKSPACE_CONFIG} unset (flamia sets {CUBLAS_DETERMINISTIC}) or one of \
             :4096:8, :16:8; it is {v:?} (run.deterministic = false trains without the mode)"
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

/// Whether `cfg` trains in deterministic mode: `run.deterministic` resolved for
/// `attention.path` (an unknown path is an error).
pub fn enabled(cfg: &TrainConfig) -> Result<bool> {
    Ok(cfg
        .run
        .deterministic
        .resolve(crate::attention::parse_path(&cfg.attention.path)?))
}

/// Puts the process into (or out of) the deterministic mode `cfg` asks for ([`enabled`]). Call
/// it first, before libtorch touches CUDA (`train` calls it before it even resolves the
/// device): it sets `CUBLAS_WORKSPACE_CONFIG` as [`cublas_workspace_to_set`] says (cuBLAS's
/// workspace size is fixed when libtorch creates its first cuBLAS handle; libtorch's
/// deterministic mode checks the variable on every matmul), then libtorch's switches
/// ([`crate::attention::set_deterministic`], with `run.fill_uninitialized_memory`), and logs
/// the outcome (`run.deterministic auto: on for attention path mxfp8, ...`).
pub fn apply(cfg: &TrainConfig) -> Result<()> {
    let on = enabled(cfg)?;
    let fill = cfg.run.fill_uninitialized_memory;
    let device = cfg.run.device.as_str();
    check_env(on)?;
    let current = std::env::var(CUBLAS_WORKSPACE_CONFIG).ok();
    if let Some(v) = cublas_workspace_to_set(on, device, current.as_deref()) {
        // No other thread of the run exists yet (the data loader and the model come later).
        std::env::set_var(CUBLAS_WORKSPACE_CONFIG, v);
        tracing::info!(
            "run.deterministic: {CUBLAS_WORKSPACE_CONFIG}={v} set before CUDA starts (device setting {device:?})"
        );
    }
    crate::attention::set_deterministic(on, fill)?;
    let fill_note = match (on, fill) {
        (false, _) => "",
        (true, false) => ", NaN fill of uninitialised memory off",
        (true, true) => ", NaN fill of uninitialised memory on",
    };
    tracing::info!(
        "run.deterministic {}: {} for attention path {}{fill_note}",
        cfg.run.deterministic.name(),
        if on { "on" } else { "off" },
        cfg.attention.path,
    );
    Ok(())
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
    fn auto_is_on_for_the_flamia_paths_and_off_for_the_bf16_control() {
        for p in [AttnPath::Mxfp8, AttnPath::Nvfp4, AttnPath::LeakyFp8] {
            assert!(Deterministic::Auto.resolve(p), "{p:?}");
            assert!(Deterministic::On.resolve(p), "{p:?}");
            assert!(!Deterministic::Off.resolve(p), "{p:?}");
        }
        assert!(!Deterministic::Auto.resolve(AttnPath::Exact));
        assert!(Deterministic::On.resolve(AttnPath::Exact));
        assert_eq!(Deterministic::default(), Deterministic::Auto);
    }

    #[test]
    fn the_setting_reads_booleans_and_auto_and_writes_them_back() {
        #[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize)]
        struct T {
            d: Deterministic,
        }
        for (text, want) in [
            ("d = true", Deterministic::On),
            ("d = false", Deterministic::Off),
            ("d = \"auto\"", Deterministic::Auto),
            ("d = \"true\"", Deterministic::On),
            ("d = \"false\"", Deterministic::Off),
        ] {
            let t: T = toml::from_str(text).unwrap();
            assert_eq!(t.d, want, "{text}");
            let back: T = toml::from_str(&toml::to_string(&t).unwrap()).unwrap();
            assert_eq!(back, t, "{text}");
        }
        assert_eq!(
            toml::to_string(&T {
                d: Deterministic::Auto
            })
            .unwrap()
            .trim(),
            "d = \"auto\""
        );
        assert_eq!(
            toml::to_string(&T { d: Deterministic::On }).unwrap().trim(),
            "d = true"
        );
        let err = toml::from_str::<T>("d = \"sometimes\"").unwrap_err().to_string();
        assert!(err.contains("auto, true or false"), "{err}");
        assert!(toml::from_str::<T>("d = 1").is_err());
    }

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
