//! The `flamia` binary starts and reports its version.

mod support;
use support::flamia;

#[test]
fn version_prints() {
    let out = flamia().arg("--version").output().expect("run flamia");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("flamia "));
}
