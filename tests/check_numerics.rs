//! `flamia check numerics --json` end to end: schema, the MXFP8 cosine bars, and the leakage
//! figures (bitwise zero where the design promises it, a visible leak in the leaky control), and
//! the exit status: success only when every leakage figure is what the design promises (the
//! failing side is `cli::check`'s unit tests, which feed the check a leaking implementation).

mod support;
use serde_json::Value;
use support::flamia;

fn check(args: &[&str]) -> std::process::Output {
    flamia()
        .args(["check", "numerics"])
        .args(args)
        .output()
        .expect("run flamia")
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = x.get(*k).unwrap_or_else(|| panic!("missing key {path:?} in {v}"));
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number: {x}"))
}

#[test]
fn json_report_has_the_schema_and_meets_the_bars() {
    let out = check(&["--json", "--lens", "100,60", "--heads", "2"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "one JSON object on stdout: {stdout}"
    );
    let r: Value = serde_json::from_str(stdout.trim()).expect("valid JSON");
    for path in ["mxfp8", "nvfp4", "leaky-fp8"] {
        for metric in ["cosine", "rel_l2"] {
            for t in ["o", "dq", "dk", "dv"] {
                let x = num(&r, &["paths", path, metric, t]);
                assert!(x.is_finite() && x >= 0.0, "{path}.{metric}.{t} = {x}");
            }
        }
        let z = num(&r, &["paths", path, "ds_zero_fraction"]);
        assert!((0.0..=1.0).contains(&z));
    }
    assert!(num(&r, &["paths", "mxfp8", "cosine", "o"]) >= 0.997);
    for t in ["dq", "dk", "dv"] {
        assert!(
            num(&r, &["paths", "mxfp8", "cosine", t]) >= 0.995,
            "mxfp8 cosine {t}"
        );
    }
    assert_eq!(num(&r, &["leakage", "mxfp8", "before_own_block"]), 0.0);
    assert!(num(&r, &["leakage", "mxfp8", "in_own_block"]) > 0.0);
    assert_eq!(num(&r, &["leakage", "mxfp8+precision", "max"]), 0.0);
    assert!(num(&r, &["leakage", "leaky-fp8", "max"]) > 1e-3);
    assert_eq!(num(&r, &["leakage", "doc_isolation", "max"]), 0.0);
    assert!(num(&r, &["wall_s"]) > 0.0);
}

#[test]
fn table_mode_and_bad_arguments() {
    let out = check(&[
        "--lens",
        "40,20",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--head-dim",
        "64",
        "--path",
        "nvfp4",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.lines().any(|l| l.starts_with("nvfp4")), "{table}");
    assert!(
        !table.lines().any(|l| l.starts_with("mxfp8")),
        "only the asked path: {table}"
    );
    assert!(table.contains("wall time"), "{table}");
    assert!(
        table.contains("checks: all 4 as expected"),
        "the leakage checks are reported: {table}"
    );
    // Without the leakage figures there is nothing to check, and no verdict line.
    let out = check(&[
        "--lens",
        "40,20",
        "--heads",
        "2",
        "--head-dim",
        "64",
        "--path",
        "mxfp8",
        "--no-leakage",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("checks:"));

    let out = check(&["--head-dim", "96", "--lens", "10"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("allowed: 64, 128"));
    let out = check(&["--path", "exact", "--lens", "10"]);
    assert!(!out.status.success());
    let out = check(&["--heads", "3", "--kv-heads", "2", "--lens", "10"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiple of KV heads"));
}
