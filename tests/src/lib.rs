//! Helpers for the end-to-end tests in `tests/`: locating (and building once) the `flamia` binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Path of the `flamia` binary, built once per test process with the same cargo that runs the tests.
pub fn flamia_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args(["build", "--quiet", "-p", "flamia-trainer", "--bin", "flamia"])
            .status()
            .expect("run cargo build for the flamia binary");
        assert!(status.success(), "cargo build -p flamia-trainer failed");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("target"));
        target.join("debug").join("flamia")
    })
    .clone()
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
