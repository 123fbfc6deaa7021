//! Helpers for the end-to-end tests in `tests/`: locating (and building once) the `flamia` binary.

use std::path::PathBuf;
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
