//! Helpers for the end-to-end tests in `tests/`: locating (and building once) the workspace's
//! binaries, and reading a run's metrics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Path of a binary of this workspace, built (once per test process and binary) with the cargo
/// that runs the tests.
///
/// It is built with the `test` profile: `cargo test --workspace` has already compiled every
/// member and binary with that profile, so this build is a no-op there instead of a second
/// compile of the whole workspace in the `dev` profile (which once cost CI several minutes).
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    built
        .entry(format!("{package}/{bin}"))
        .or_insert_with(|| {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .current_dir(&root)
                .args([
                    "build",
                    "--quiet",
                    "--profile",
                    "test",
                    "-p",
                    package,
                    "--bin",
                    bin,
                ])
                .status()
                .unwrap_or_else(|e| panic!("run cargo build for {package}/{bin}: {e}"));
            assert!(status.success(), "cargo build -p {package} --bin {bin} failed");
            let target = std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root.join("target"));
            // The `test` profile's output directory is `debug`.
            target.join("debug").join(bin)
        })
        .clone()
}

/// Path of the `flamia` binary (see [`workspace_bin`]).
pub fn flamia_bin() -> PathBuf {
    workspace_bin("flamia-trainer", "flamia")
}

/// A `Command` for the `flamia` binary.
pub fn flamia() -> Command {
    Command::new(flamia_bin())
}

/// `(step, loss)` of every line of a run directory's `metrics.jsonl`.
pub fn losses(dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            (
                v["step"].as_u64().expect("step"),
                v["loss"].as_f64().expect("loss"),
            )
        })
        .collect()
}
