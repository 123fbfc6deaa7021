//! `flamia eval`, `flamia compare` and `flamia export` end to end on CPU: two short tiny runs (the
//! bf16 control and mxfp8), each evaluated on the task fixtures and three short held-out documents
//! through both attention paths, compared into a markdown report with a PNG, and exported to
//! Hugging Face format; and, on a run with a filtered validation shard and two checkpoints, what
//! `flamia eval` reads before scoring, how it resolves a run directory, filters the run's
//! validation split, reports progress and merges `eval.json`.

use std::path::Path;

mod support;
use support::{flamia, repo, SMALL};

fn ok(cmd: &mut std::process::Command, what: &str) -> String {
    let out = cmd
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run flamia {what}: {e}"));
    assert!(
        out.status.success(),
        "flamia {what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn train(dir: &Path, path: &str) {
    ok(
        flamia()
            .args([
                "train",
                "--config",
                "configs/tiny-cpu.toml",
                "--set",
                "training.steps=8",
            ])
            .args([
                "--set",
                &format!("run.dir={}", dir.display()),
                "--set",
                &format!("attention.path={path}"),
            ])
            .args(["--set", "run.log_every=1", "--set", "run.device=cpu"])
            .args(SMALL),
        "train",
    );
}

fn eval(dir: &Path) -> serde_json::Value {
    ok(
        flamia()
            .arg("eval")
            .args([
                "--checkpoint",
                &dir.join("checkpoints/step_00000008").display().to_string(),
            ])
            .args([
                "--tasks",
                "all",
                "--data-dir",
                "eval/fixtures/tasks",
                "--batch-size",
                "8",
            ])
            .args(["--val-data", "eval/fixtures/heldout.jsonl", "--val-seq-len", "64"]),
        "eval",
    );
    serde_json::from_str(&std::fs::read_to_string(dir.join("eval.json")).expect("eval.json written")).unwrap()
}

/// Runs `flamia` and returns its output whatever its exit status.
fn output(cmd: &mut std::process::Command) -> std::process::Output {
    cmd.current_dir(repo()).output().expect("run flamia")
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `flamia eval ARGS`, which must succeed; returns its stderr and the `eval.json` of `run`.
fn eval_ok(run: &Path, args: &[&str]) -> (String, serde_json::Value) {
    let out = output(flamia().arg("eval").args(args));
    assert!(
        out.status.success(),
        "flamia eval {args:?} failed:\n{}",
        stderr(&out)
    );
    let json = std::fs::read_to_string(run.join("eval.json")).expect("eval.json written");
    (stderr(&out), serde_json::from_str(&json).unwrap())
}

#[test]
fn eval_reads_inputs_first_filters_validation_and_merges_results() {
    let tmp = tempfile::tempdir().unwrap();
    // A validation shard of four documents of which only the second and the fourth pass the
    // run's filters (int_score >= 3, language en).
    let docs = [
        (
            "A first document, too low a score to be kept by the run.",
            2,
            "en",
        ),
        ("The second document: int_score four, English, kept.", 4, "en"),
        ("Le troisième document : bonne note, mais en français.", 4, "fr"),
        (
            "The fourth and last document, scored five, in English; kept as well.",
            5,
            "en",
        ),
    ];
    let jsonl: String = docs
        .iter()
        .map(|(t, s, l)| {
            format!(
                "{}\n",
                serde_json::json!({"text": t, "int_score": s, "language": l})
            )
        })
        .collect();
    let kept_bytes: usize = [docs[1].0, docs[3].0].iter().map(|t| t.len()).sum();
    std::fs::write(tmp.path().join("val.jsonl"), jsonl).unwrap();
    let shard = tmp.path().join("val.parquet");
    ok(
        flamia().args(["data", "make-shard", "--jsonl"]).args([
            &tmp.path().join("val.jsonl").display().to_string(),
            "--out",
            &shard.display().to_string(),
        ]),
        "data make-shard",
    );
    let run = tmp.path().join("run");
    ok(
        flamia()
            .args(["train", "--config", "configs/tiny-cpu.toml"])
            .args(["--set", "training.steps=4", "--set", "run.checkpoint_every=2"])
            .args(["--set", &format!("run.dir={}", run.display())])
            .args(["--set", &format!("data.val=[\"{}\"]", shard.display())])
            .args(["--set", "data.min_int_score=3", "--set", "data.language=\"en\""])
            .args(["--set", "run.device=cpu", "--set", "attention.path=mxfp8"])
            .args(SMALL),
        "train",
    );
    let (step2, step4) = (
        run.join("checkpoints/step_00000002"),
        run.join("checkpoints/step_00000004"),
    );
    assert!(step2.join("state.json").exists() && step4.join("state.json").exists());
    let run_s = run.display().to_string();
    let step4_s = step4.display().to_string();

    // A run directory stands for its newest checkpoint; the run's own validation split is read
    // through the run's filters; each validation pass reports its progress.
    let (err, e) = eval_ok(
        &run,
        &["--checkpoint", &run_s, "--val-seq-len", "64", "--batch-size", "2"],
    );
    assert!(
        err.contains("is a run directory") && err.contains("step_00000004"),
        "{err}"
    );
    assert_eq!(e["step"], 4);
    assert!(
        e["checkpoint"].as_str().unwrap().ends_with("step_00000004"),
        "{e}"
    );
    let v = e["validation"].clone();
    assert_eq!(v["exact"]["docs"], 2, "the filtered split: {v}");
    assert_eq!(v["exact"]["bytes"], kept_bytes as u64, "{v}");
    assert!(
        v["source"]
            .as_str()
            .unwrap()
            .ends_with("filtered: min_int_score 3, language en"),
        "{v}"
    );
    for pass in [
        "validation through the training path (mxfp8): 0/",
        "validation through exact attention: 0/",
    ] {
        assert!(err.contains(pass), "no progress line {pass:?}:\n{err}");
    }
    assert!(err.contains(" windows (100%)"), "{err}");

    // A validation input that cannot be read fails before any task is scored, and leaves the
    // earlier eval.json as it was.
    let before = std::fs::read(run.join("eval.json")).unwrap();
    let tasks = ["--tasks", "all", "--data-dir", "eval/fixtures/tasks"];
    let out = output(
        flamia()
            .args(["eval", "--checkpoint", &step4_s])
            .args(tasks)
            .args([
                "--val-data",
                "eval/fixtures/heldout.jsonl",
                "--val-column",
                "body",
            ]),
    );
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("--val-column") && err.contains("\"body\""), "{err}");
    assert!(
        !err.contains("piqa:"),
        "a task was scored before the failure:\n{err}"
    );
    assert_eq!(std::fs::read(run.join("eval.json")).unwrap(), before);

    // Tasks without validation: the earlier validation of this checkpoint is kept.
    let (err, e) = eval_ok(
        &run,
        &[
            "--checkpoint",
            &step4_s,
            "--tasks",
            "piqa,arc_easy",
            "--data-dir",
            "eval/fixtures/tasks",
            "--no-val",
        ],
    );
    assert!(
        err.contains("kept from the earlier") && err.contains("validation"),
        "{err}"
    );
    assert!(
        err.contains("piqa: 0/") && err.contains(" requests (100%)"),
        "{err}"
    );
    assert_eq!(e["validation"], v);
    let arc_n = e["tasks"]["arc_easy"]["n"].clone();
    assert!(e["tasks"]["piqa"]["n"].as_u64().unwrap() > 1, "{e}");
    // A task re-scored replaces its earlier result; the others stay.
    let (_, e) = eval_ok(
        &run,
        &[
            "--checkpoint",
            &step4_s,
            "--tasks",
            "piqa",
            "--data-dir",
            "eval/fixtures/tasks",
            "--no-val",
            "--limit",
            "1",
        ],
    );
    assert_eq!(e["tasks"]["piqa"]["n"], 1);
    assert_eq!(e["tasks"]["arc_easy"]["n"], arc_n);
    assert_eq!(e["validation"], v);

    // Another checkpoint replaces the file whole, with a warning naming both.
    let (err, e) = eval_ok(
        &run,
        &[
            "--checkpoint",
            &step2.display().to_string(),
            "--tasks",
            "piqa",
            "--data-dir",
            "eval/fixtures/tasks",
            "--no-val",
        ],
    );
    assert!(
        err.contains("warning:")
            && err.contains("step_00000004 (step 4)")
            && err.contains("step_00000002 (step 2)"),
        "{err}"
    );
    assert_eq!(e["step"], 2);
    assert_eq!(e["tasks"].as_object().unwrap().len(), 1);
    assert!(e["validation"].is_null(), "{e}");

    // Directories that are neither a checkpoint nor a run with one.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(empty.join("checkpoints")).unwrap();
    for (dir, says) in [
        (empty.clone(), "without a complete checkpoint"),
        (tmp.path().to_path_buf(), "neither a checkpoint directory"),
        (tmp.path().join("missing"), "no such directory"),
    ] {
        let out = output(flamia().args(["eval", "--checkpoint", &dir.display().to_string()]));
        assert!(!out.status.success());
        assert!(stderr(&out).contains(says), "{}: {}", dir.display(), stderr(&out));
    }
}

/// `flamia export` of a `train` run's last checkpoint into `out`.
fn export(run: &Path, out: &Path) {
    ok(
        flamia()
            .args([
                "export",
                "--checkpoint",
                &run.join("checkpoints/step_00000008").display().to_string(),
            ])
            .args(["--out", &out.display().to_string()]),
        "export",
    );
}

#[test]
fn eval_compare_export_two_tiny_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("bf16"), tmp.path().join("mxfp8"));
    train(&a, "bf16");
    train(&b, "mxfp8");
    let (ea, eb) = (eval(&a), eval(&b));
    for (e, path) in [(&ea, "bf16"), (&eb, "mxfp8")] {
        assert_eq!(e["schema"], "flamia-eval/1");
        assert_eq!(e["train_attn"], path);
        assert_eq!(e["step"], 8);
        assert_eq!(e["tasks"].as_object().unwrap().len(), 11);
        assert!(e["tasks"]["lambada_openai"]["perplexity"].as_f64().unwrap() > 1.0);
        let v = &e["validation"];
        let (lt, le) = (
            v["training"]["loss"].as_f64().unwrap(),
            v["exact"]["loss"].as_f64().unwrap(),
        );
        // Eight steps from ln(258) = 5.55: finite, below uniform, and the same tokens both ways.
        assert!(lt.is_finite() && le < 5.6 && le > 1.0, "{v}");
        assert_eq!(v["training"]["tokens"], v["exact"]["tokens"]);
        assert!((v["gap_loss"].as_f64().unwrap() - (le - lt)).abs() < 1e-12);
        // Evaluation starts every document with BOS, as training does.
        assert_eq!(v["prefix_token"], 257);
    }
    // The control's training path is exact attention: no gap at all.
    assert_eq!(ea["validation"]["gap_loss"], 0.0);
    // Same fixtures, same examples: paired comparisons are possible.
    assert_eq!(
        ea["tasks"]["piqa"]["fingerprint"],
        eb["tasks"]["piqa"]["fingerprint"]
    );

    let out = tmp.path().join("report");
    let md = ok(
        flamia()
            .args(["compare", &a.display().to_string(), &b.display().to_string()])
            .args(["--out", &out.display().to_string(), "--last-n", "3"]),
        "compare",
    );
    assert!(md.starts_with("# Comparison: bf16 (control) vs mxfp8"), "{md}");
    assert!(
        md.contains("| mxfp8 | 8 |") && md.contains("| piqa | 2 |"),
        "{md}"
    );
    assert!(md.contains("mxfp8 − bf16"), "{md}");
    let png = std::fs::read(out.join("loss.png")).expect("loss.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    let hf = tmp.path().join("hf");
    export(&a, &hf);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["architectures"][0], "LlamaForCausalLM");
    assert_eq!(
        (cfg["hidden_size"].as_u64(), cfg["vocab_size"].as_u64()),
        (Some(128), Some(258))
    );
    assert!(hf.join("model.safetensors").metadata().unwrap().len() > 100_000);
    // BOS / EOS of the byte tokenizer, a tokenizer.json for it and a tokenizer_config.json.
    assert_eq!(
        (cfg["bos_token_id"].as_u64(), cfg["eos_token_id"].as_u64()),
        (Some(257), Some(256))
    );
    let tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(tc["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(
        (tc["bos_token"].as_str(), tc["eos_token"].as_str()),
        (Some("<|begin_of_text|>"), Some("<|end_of_text|>"))
    );
    assert_eq!(tc["model_max_length"], 64);
    let tok = flamia_data::Tokenizer::from_file(&hf.join("tokenizer.json")).unwrap();
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.vocab_size()),
        (Some(257), 256, 258)
    );
}

/// `transformers.AutoTokenizer` and `AutoConfig` load an export: needs `transformers` in
/// `$FLAMIA_VENV` (`pip install transformers`), which CI does not install.
#[test]
#[ignore = "needs transformers in $FLAMIA_VENV (pip install transformers)"]
fn transformers_loads_the_exported_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    train(&run, "bf16");
    let hf = tmp.path().join("hf");
    export(&run, &hf);
    let venv = std::env::var("FLAMIA_VENV").unwrap_or_else(|_| ".venv".into());
    let script = r#"
import sys
from transformers import AutoConfig, AutoTokenizer
d = sys.argv[1]
t = AutoTokenizer.from_pretrained(d)
c = AutoConfig.from_pretrained(d)
ids = t("héllo, world", add_special_tokens=False)["input_ids"]
assert ids == list("héllo, world".encode()), ids
assert (t.bos_token_id, t.eos_token_id) == (257, 256), (t.bos_token_id, t.eos_token_id)
assert (c.bos_token_id, c.eos_token_id) == (257, 256), (c.bos_token_id, c.eos_token_id)
assert t.decode(ids) == "héllo, world"
print("transformers ok", type(t).__name__)
"#;
    let out = std::process::Command::new(Path::new(&venv).join("bin/python"))
        .args(["-c", script, &hf.display().to_string()])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("transformers ok"));
}
