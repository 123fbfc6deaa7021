//! `flamia train` end to end on CPU: 20 steps straight give bitwise the same losses as 12 steps,
//! stop, `--resume` from the mid-run checkpoint of step 10, 10 more; checkpoints are complete, pruned to `keep_checkpoints`, and the
//! resolved config and metrics land in the run directory. Validation during training
//! (`training.val_every`) is repeatable and leaves the training losses bitwise unchanged. A stop
//! signal during the run's last step ends it complete (status 0, not the requeue status 75).

use std::path::Path;

mod support;
use support::{flamia, losses, repo, val_losses, SMALL};

/// `flamia train` of the tiny config on the CPU with [`SMALL`] rows, `steps` steps, into `dir`,
/// with further arguments `args` (later `--set`s win); the process's output, success or not.
fn tiny_output(dir: &Path, steps: usize, args: &[&str]) -> std::process::Output {
    flamia()
        .current_dir(repo())
        .args(["train", "--config", "configs/tiny-cpu.toml"])
        .args(["--set", &format!("training.steps={steps}")])
        .args(["--set", &format!("run.dir={}", dir.display())])
        .args(["--set", "run.device=cpu"])
        .args(SMALL)
        .args(args)
        .output()
        .expect("run flamia train")
}

/// [`tiny_output`] that fails the test if the run fails, else returns its stdout.
fn tiny(dir: &Path, steps: usize, args: &[&str]) -> String {
    let out = tiny_output(dir, steps, args);
    assert!(
        out.status.success(),
        "flamia train {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn train(dir: &Path, extra: &[&str]) {
    let mut args = vec!["--set", "run.log_every=1", "--set", "run.checkpoint_every=5"];
    args.extend_from_slice(extra);
    tiny(dir, 20, &args);
}

#[test]
fn twenty_steps_equal_a_stopped_run_resumed_from_a_mid_run_checkpoint_bitwise() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("straight"), tmp.path().join("resumed"));
    train(&a, &[]);
    train(&b, &["--stop-after", "12"]);
    assert_eq!(losses(&b).len(), 12, "the stopped run logs 12 steps");
    // Resume from step 10's checkpoint, written mid-run (the loader had already read step 11's
    // batches then): the data position saved must be the step's own.
    std::fs::remove_dir_all(b.join("checkpoints/step_00000012")).unwrap();
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

/// Every metrics line of a run directory.
fn records(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_stop_signal_during_the_last_step_ends_the_run_complete_with_status_0() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // One step of ~1 s (8K tokens): the signal, sent once the handlers are in, lands inside it.
    let mut child = flamia()
        .current_dir(repo())
        .args(["train", "--config", "configs/tiny-cpu.toml"])
        .args(["--set", "training.steps=1", "--set", "run.device=cpu"])
        .args(["--set", &format!("run.dir={}", dir.display())])
        .args(["--set", "data.seq_len=256", "--set", "data.batch_rows=8"])
        .args([
            "--set",
            "data.max_doc_tokens=256",
            "--set",
            "training.grad_accum=4",
        ])
        .args(["--set", "training.val_every=0", "--set", "run.progress=false"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run flamia train");
    let mut err = String::new();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        err.push_str(&line);
        err.push('\n');
        if line.contains("SIGTERM / SIGUSR1 from here on") {
            let sent = std::process::Command::new("kill")
                .args(["-USR1", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            break;
        }
    }
    for line in lines {
        err.push_str(&line.unwrap());
        err.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(
        err.contains("SIGUSR1 came during the run's last step (step 1)"),
        "the signal must land in the run's one step: {err}"
    );
    assert_eq!(
        status.code(),
        Some(0),
        "a complete run must not ask for a requeue (75): {err}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 1);
    assert!(summary["stopped_by"].is_null(), "{summary}");
    assert!(dir.join("checkpoints/step_00000001/model.safetensors").is_file());
}

#[test]
fn validation_during_training_is_repeatable_and_leaves_training_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, val_every: &str, extra: &[&str]| {
        let dir = tmp.path().join(name);
        let every = format!("training.val_every={val_every}");
        let mut args = vec!["--set", "run.log_every=2", "--set", "run.final_checkpoint=false"];
        args.extend(["--set", &every, "--set", "training.val_tokens=512"]);
        args.extend_from_slice(extra);
        let stdout = tiny(&dir, 6, &args);
        (dir, stdout)
    };
    let (a, stdout) = run("val", "4", &[]);
    let (often, _) = run("val-often", "2", &[]);
    let (none, _) = run("no-val", "0", &[]);

    // Validated after steps 4 and 6 (the run's end), each a logged step; not elsewhere.
    let va = val_losses(&a);
    assert_eq!(va.iter().map(|v| v.0).collect::<Vec<_>>(), vec![4, 6], "{va:?}");
    let logged: Vec<u64> = records(&a).iter().map(|v| v["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, vec![2, 4, 6]);
    let counts: Vec<u64> = records(&a)
        .iter()
        .filter_map(|v| v.get("val_tokens")?.as_u64())
        .collect();
    // 512 tokens budget = four 2 x 64-token batches (end-of-text targets are not scored), the
    // same ones every pass.
    assert!(counts.len() == 2 && counts[0] == counts[1], "{counts:?}");
    assert!((400..=512).contains(&counts[0]), "val_tokens {counts:?}");
    // A byte model after a few steps: near ln(258) = 5.55, and the update moved it.
    assert!(va.iter().all(|v| v.1 > 3.0 && v.1 < 6.5), "{va:?}");
    assert_ne!(va[0].1.to_bits(), va[1].1.to_bits());
    // Repeatable bitwise in another process, whatever passes came before (the same tokens
    // every pass), and in summary.json too.
    let vb = val_losses(&often);
    assert_eq!(vb.iter().map(|v| v.0).collect::<Vec<_>>(), vec![2, 4, 6]);
    assert_eq!(
        va.iter().map(|v| v.1.to_bits()).collect::<Vec<_>>(),
        vb[1..].iter().map(|v| v.1.to_bits()).collect::<Vec<_>>()
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["val_losses"][1][1].as_f64(), Some(va[1].1));
    let line = format!("| validation loss {:.4} at step 6 |", va[1].1);
    assert!(stdout.contains(&line), "{stdout}");
    // Training is bitwise the same without validation.
    let (la, ln) = (losses(&a), losses(&none));
    assert_eq!(la.len(), ln.len());
    for ((s, x), (_, y)) in la.iter().zip(&ln) {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "step {s}: with validation {x}, without {y}"
        );
    }
    assert!(val_losses(&none).is_empty());

    // The held-out part of the training shard is a validation split too (val = []).
    let (held, _) = run(
        "holdout",
        "3",
        &["--set", "data.val=[]", "--set", "data.holdout_fraction=0.1"],
    );
    let vh = val_losses(&held);
    assert_eq!(vh.iter().map(|v| v.0).collect::<Vec<_>>(), vec![3, 6], "{vh:?}");
}

/// The run's stderr when it fails (the test fails if it succeeds).
fn refused(dir: &Path, steps: usize, args: &[&str]) -> String {
    let out = tiny_output(dir, steps, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "flamia train {args:?} was expected to fail:\n{err}"
    );
    err
}

#[test]
fn a_fresh_start_over_checkpoints_is_refused_and_a_resume_names_what_it_may_not_change() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("run");
    let every = ["--set", "run.checkpoint_every=2", "--set", "run.log_every=1"];
    tiny(&d, 4, &every);
    let ckpts = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(ckpts(&d), vec!["step_00000002", "step_00000004"]);

    // A fresh start would prune its own checkpoints against these and a later --resume could
    // take the old run's: refused, naming the ways out; nothing is touched.
    let err = refused(&d, 4, &every);
    assert!(
        err.contains("already holds 2 checkpoint(s)")
            && err.contains("--resume")
            && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(ckpts(&d), vec!["step_00000002", "step_00000004"]);
    // The checkpoint is at training.steps: a finished run (e.g. a requeued job) has nothing to
    // do and says so, exit 0, leaving its summary as it was; past the end is an error.
    let summary = std::fs::read_to_string(d.join("summary.json")).unwrap();
    let out = tiny(&d, 4, &["--resume"]);
    assert!(
        out.contains("is complete") && out.contains("nothing to train"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(d.join("summary.json")).unwrap(), summary);
    let err = refused(&d, 3, &["--resume"]);
    assert!(err.contains("past training.steps = 3"), "{err}");
    // A different model or data stream is refused, naming each key with both values.
    let err = refused(
        &d,
        6,
        &[
            "--resume",
            "--set",
            "model.rope_theta=10000.0",
            "--set",
            "data.seq_len=32",
        ],
    );
    assert!(
        err.contains("model.rope_theta = 10000.0 (the checkpoint's: 500000.0)")
            && err.contains("data.seq_len = 32"),
        "{err}"
    );
    // Fewer rows per batch (the trainer's own advice after an out-of-memory error) is allowed.
    tiny(
        &d,
        6,
        &[
            "--resume",
            "--set",
            "data.batch_rows=1",
            "--set",
            "run.log_every=1",
        ],
    );
    assert_eq!(
        losses(&d).iter().map(|l| l.0).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );

    // --overwrite deletes the earlier run's checkpoints and starts at step 1.
    let out = tiny(&d, 2, &["--overwrite", "--set", "run.log_every=1"]);
    assert!(out.contains("steps 2"), "{out}");
    assert_eq!(ckpts(&d), vec!["step_00000002"]);
    assert_eq!(losses(&d).len(), 2);
}

#[test]
fn a_flamia_run_also_validates_through_exact_attention_without_changing_training() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let dir = tmp.path().join(name);
        let mut args = vec!["--set", "attention.path=mxfp8", "--set", "run.log_every=2"];
        args.extend([
            "--set",
            "run.final_checkpoint=false",
            "--set",
            "training.val_every=2",
        ]);
        args.extend(["--set", "training.val_tokens=256"]);
        args.extend_from_slice(extra);
        let stdout = tiny(&dir, 4, &args);
        (dir, stdout)
    };
    let exact_losses = |dir: &Path| -> Vec<(u64, f64)> {
        records(dir)
            .iter()
            .filter_map(|v| Some((v["step"].as_u64()?, v.get("val_loss_exact")?.as_f64()?)))
            .collect()
    };
    let (both, stdout) = run("both", &[]);
    let (own, _) = run("own-only", &["--set", "training.val_exact=false"]);
    // A BF16 control's own pass is the exact one: logged under both names, printed once.
    let (control, out) = run("control", &["--set", "attention.path=bf16"]);
    let bits = |v: Vec<(u64, f64)>| v.into_iter().map(|x| (x.0, x.1.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(val_losses(&control)), bits(exact_losses(&control)));
    assert!(!out.contains("exact attention"), "{out}");
    let (v, e) = (val_losses(&both), exact_losses(&both));
    assert_eq!(e.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 4], "{e:?}");
    // The same tokens through another attention: close, not the same bits.
    for ((_, a), (_, b)) in v.iter().zip(&e) {
        assert!(
            (a - b).abs() < 0.05 && a.to_bits() != b.to_bits(),
            "mxfp8 {a} vs exact {b}"
        );
    }
    let line = format!(
        "validation loss {:.4} (exact attention {:.4}) at step 4",
        v[1].1, e[1].1
    );
    assert!(stdout.contains(&line), "{stdout}");
    // Off: no exact pass; the run's own validation and its training bitwise as with it.
    assert!(exact_losses(&own).is_empty());
    assert_eq!(
        v.iter().map(|x| x.1.to_bits()).collect::<Vec<_>>(),
        val_losses(&own).iter().map(|x| x.1.to_bits()).collect::<Vec<_>>()
    );
    let (la, lb) = (losses(&both), losses(&own));
    assert_eq!(la.len(), lb.len());
    for ((s, x), (_, y)) in la.iter().zip(&lb) {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "step {s}: with the exact pass {x}, without {y}"
        );
    }
}
