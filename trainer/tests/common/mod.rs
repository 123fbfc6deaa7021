//! Helpers of the end-to-end tests that run the `flamia` binary (CLI runs, golden losses, resume
//! equality). The binary is the one cargo built for this test run (`CARGO_BIN_EXE_flamia`: same
//! profile and features as the tests, built once).
#![allow(dead_code)] // each test file uses a subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// Path of the `flamia` binary.
pub fn flamia_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_flamia"))
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
