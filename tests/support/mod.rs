//! Shared support of the end-to-end tests in this folder and of the multi-process tests of
//! `distributed/tests/`: the binaries cargo built for this test run, the repository root, a free
//! loopback port, the small-run settings and the `metrics.jsonl` loss readers.
//!
//! The end-to-end tests are `[[test]]` targets of the package that owns the binary they run
//! (`trainer/Cargo.toml` for `flamia`, `distributed/Cargo.toml` for `flamia-dist`), so `cargo test
//! --workspace` builds each binary once, with the tests' profile and features, and
//! `CARGO_BIN_EXE_*` names it. Other packages include this file with `#[path]`.
#![allow(dead_code)] // each test file uses a subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// Path of the `flamia` binary (tests of the `flamia-trainer` package only: cargo sets the
/// variable for the tests of the package that owns the binary, so elsewhere this panics, saying so).
/// `FLAMIA_TEST_BIN` set at run time names another one: a test executable carried to another
/// machine (the device) runs the `flamia` carried with it, not the build machine's path.
#[allow(clippy::option_env_unwrap)]
pub fn flamia_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FLAMIA_TEST_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    PathBuf::from(
        option_env!("CARGO_BIN_EXE_flamia")
            .expect("CARGO_BIN_EXE_flamia: only tests of the flamia-trainer package run the flamia binary"),
    )
}

/// A `Command` for the `flamia` binary.
pub fn flamia() -> Command {
    Command::new(flamia_bin())
}

/// Path of the `flamia-dist` binary (tests of the `flamia-dist` package only, as [`flamia_bin`]).
#[allow(clippy::option_env_unwrap)]
pub fn dist_bin() -> PathBuf {
    PathBuf::from(
        option_env!("CARGO_BIN_EXE_flamia-dist")
            .expect("CARGO_BIN_EXE_flamia-dist: only tests of the flamia-dist package run that binary"),
    )
}

/// The repository root (configs, embedded data and launch scripts are found from here); every
/// package that uses this module sits one level below it. `FLAMIA_TEST_REPO` set at run time
/// names another checkout (a test executable carried to the device runs there).
pub fn repo() -> &'static Path {
    static REPO: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    REPO.get_or_init(
        || match std::env::var_os("FLAMIA_TEST_REPO").filter(|p| !p.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
        },
    )
}

/// A TCP port on the loopback interface that was free a moment ago.
pub fn free_port() -> u16 {
    // The port is free when the listener drops, so the OS may hand the same one to a test
    // running beside this one in the same binary (seen: two DDP tests' ranks meeting at one
    // master, "Address already in use" / "duplicate rank"). No port twice per process.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
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

/// `(step, val_loss)` of the `metrics.jsonl` lines that carry a validation loss.
pub fn val_losses(dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            Some((v["step"].as_u64()?, v.get("val_loss")?.as_f64()?))
        })
        .collect()
}
