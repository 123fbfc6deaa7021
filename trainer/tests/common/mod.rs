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

/// The repository root (configs, embedded data and launch scripts are found from here).
pub fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A TCP port on the loopback interface that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `--set` arguments that make the tiny config small and fast: 2 rows of 64 tokens.
pub const SMALL: [&str; 6] = [
    "--set",
    "data.seq_len=64",
    "--set",
    "data.batch_rows=2",
    "--set",
    "data.max_doc_tokens=64",
];

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
