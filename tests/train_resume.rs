//! `flamia train` end to end on CPU: 20 steps straight give bitwise the same losses as 10 steps,
//! stop, `--resume`, 10 more; checkpoints are complete, pruned to `keep_checkpoints`, and the
//! resolved config and metrics land in the run directory.

use std::path::Path;

mod support;
use support::{flamia, losses, repo, SMALL};

fn train(dir: &Path, extra: &[&str]) {
    let out = flamia()
        .current_dir(repo())
        .args([
            "train",
            "--config",
            "configs/tiny-cpu.toml",
            "--set",
            "training.steps=20",
        ])
        .args(["--set", &format!("run.dir={}", dir.display())])
        .args([
            "--set",
            "run.log_every=1",
            "--set",
            "run.device=cpu",
            "--set",
            "run.checkpoint_every=5",
        ])
        .args(SMALL)
        .args(extra)
        .output()
        .expect("run flamia train");
    assert!(
        out.status.success(),
        "flamia train {extra:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn twenty_steps_equal_ten_then_resume_ten_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("straight"), tmp.path().join("resumed"));
    train(&a, &[]);
    train(&b, &["--stop-after", "10"]);
    assert_eq!(losses(&b).len(), 10, "the stopped run logs 10 steps");
    train(&b, &["--resume"]);

    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(la.len(), 20);
    assert_eq!(
        la.iter().map(|x| x.0).collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    for ((sa, x), (sb, y)) in la.iter().zip(&lb) {
        assert_eq!(sa, sb);
        assert_eq!(x.to_bits(), y.to_bits(), "step {sa}: straight {x} vs resumed {y}");
    }
    // Training did something: the loss falls from ln(258) ~ 5.55.
    assert!(la[0].1 > 5.0 && la[19].1 < la[0].1 - 0.5, "losses {la:?}");

    // Checkpoints: every 5 steps, the last 2 kept, each complete.
    let ck: Vec<String> = std::fs::read_dir(a.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(ck, vec!["step_00000015", "step_00000020"]);
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
        "config.toml",
    ] {
        assert!(
            a.join("checkpoints/step_00000020").join(f).is_file(),
            "{f} missing"
        );
    }
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(a.join("checkpoints/step_00000020/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["step"], 20);
    assert!(
        state["data"]["fingerprint"].is_string(),
        "data state saved: {state}"
    );
    let cfg = std::fs::read_to_string(a.join("config.toml")).unwrap();
    assert!(
        cfg.contains("steps = 20") && cfg.contains("seq_len = 64"),
        "resolved config:\n{cfg}"
    );
}
