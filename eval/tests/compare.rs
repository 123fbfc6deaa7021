//! Comparison of two generated run directories: loss summaries, paired task differences, the
//! validation table, the markdown report and the PNG (with its text actually drawn).

mod common;

use flamia_eval::compare::{self, task_rows, CompareOptions};
use flamia_eval::results::{EvalResults, SCHEMA};
use flamia_eval::runs::Run;
use flamia_eval::validation::{ValStats, ValidationReport};
use flamia_eval::{plot, TaskResult};
use std::collections::BTreeMap;
use std::path::Path;

fn task(name: &str, correct: &str) -> TaskResult {
    let n = correct.len();
    TaskResult {
        task: name.into(),
        split: "validation".into(),
        files: vec![],
        n,
        acc: correct.chars().filter(|&c| c == '1').count() as f64 / n as f64,
        acc_ci95: [0.0, 1.0],
        acc_norm: 0.0,
        acc_norm_ci95: [0.0, 1.0],
        fingerprint: "00000000000000aa".into(),
        correct: correct.into(),
        correct_norm: correct.into(),
    }
}

fn val(attn: &str, loss: f64) -> ValStats {
    ValStats {
        attn: attn.into(),
        loss,
        bpb: loss / 2f64.ln() / 4.0,
        tokens: 1000,
        bytes: 4000,
        docs: 3,
    }
}

/// A run directory with `steps` logged losses decaying from 10 towards `floor`, and an eval.json.
fn make_run(dir: &Path, floor: f64, tps: f64, piqa: &str, leak: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut lines = String::from("{\"event\":\"start\",\"config\":{}}\n");
    for step in 1..=50u64 {
        let loss = floor + (10.0 - floor) * (-(step as f64) / 8.0).exp();
        lines += &format!(
            "{{\"step\":{step},\"loss\":{loss},\"lr\":0.001,\"tokens_per_s\":{}}}\n",
            tps + step as f64
        );
    }
    std::fs::write(dir.join("metrics.jsonl"), lines).unwrap();
    let mut tasks = BTreeMap::new();
    tasks.insert("piqa".into(), task("piqa", piqa));
    let training = val("training", floor);
    let exact = val("exact", floor + leak);
    let results = EvalResults {
        schema: SCHEMA.into(),
        checkpoint: dir.join("checkpoints/step-50").display().to_string(),
        step: Some(50),
        train_attn: if leak > 0.0 { "mxfp8".into() } else { "bf16".into() },
        task_attn: "exact".into(),
        created_unix: 0,
        tasks,
        validation: Some(ValidationReport {
            source: "heldout.jsonl".into(),
            seq_len: 64,
            gap_loss: exact.loss - training.loss,
            gap_bpb: exact.bpb - training.bpb,
            training,
            exact,
        }),
    };
    results.write(&dir.join("eval.json")).unwrap();
}

#[test]
fn two_runs_compare_with_paired_differences() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("bf16"), tmp.path().join("mxfp8"));
    // Control gets 6/10 right; the other run the same plus 2 more: paired difference exactly +20%.
    make_run(&a, 3.0, 1000.0, "1111110000", 0.0);
    make_run(&b, 3.1, 1500.0, "1111111100", 0.05);
    let runs = compare::load_runs(&[a.display().to_string(), format!("fp8={}", b.display())]).unwrap();
    assert_eq!(runs[1].label, "fp8");
    assert_eq!(runs[0].losses.len(), 50); // the event line is skipped
    assert_eq!(runs[0].last_step(), 50);
    let tail: f64 = (46..=50)
        .map(|s| 3.0 + 7.0 * (-(s as f64) / 8.0).exp())
        .sum::<f64>()
        / 5.0;
    assert!((runs[0].last_n_mean(5) - tail).abs() < 1e-12);
    assert_eq!(runs[1].tokens_per_s(), Some(1525.5)); // median of 1501..=1550

    let rows = task_rows(&runs, false);
    assert_eq!(rows.len(), 1);
    assert!((rows[0].values[0].unwrap().mean - 0.6).abs() < 1e-12);
    let d = rows[0].diffs[1].clone().unwrap().unwrap();
    assert!((d.mean - 0.2).abs() < 1e-12);
    assert!(d.lo >= 0.0 && d.hi <= 0.5, "{d:?}");

    let out = tmp.path().join("report");
    let w = compare::write(
        &runs,
        &CompareOptions {
            last_n: 5,
            out_dir: out.clone(),
        },
    )
    .unwrap();
    let md = std::fs::read_to_string(&w.markdown).unwrap();
    assert!(md.starts_with("# Comparison: bf16 (control) vs fp8"), "{md}");
    assert!(md.contains("![training loss](loss.png)"));
    assert!(md.contains("| fp8 | mxfp8 | 3.1000 | 3.1500 | +0.0500 |"), "{md}");
    assert!(md.contains("| piqa | 10 | 60.0 ["), "{md}");
    assert!(md.contains("| +20.0 ["), "{md}");
    let png = std::fs::read(&w.png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 900); // IHDR width
}

#[test]
fn unpaired_examples_are_reported_not_compared() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    make_run(&a, 3.0, 10.0, "1100", 0.0);
    make_run(&b, 3.0, 10.0, "110011", 0.0);
    let runs = compare::load_runs(&[a.display().to_string(), b.display().to_string()]).unwrap();
    let rows = task_rows(&runs, true);
    assert!(rows[0].diffs[1]
        .clone()
        .unwrap()
        .unwrap_err()
        .contains("different examples"));
    let md = compare::markdown(&runs, 10, None);
    assert!(md.contains("not paired: different examples (n 4 vs 6)"), "{md}");
}

#[test]
fn plot_draws_text_without_system_fonts() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    make_run(&a, 3.0, 10.0, "1", 0.0);
    let runs = vec![Run::load(&a, None).unwrap()];
    let (w, h) = (400u32, 300u32);
    let px = plot::render_rgb(&runs, w, h).unwrap();
    // The caption "training loss" sits in the top band, centred; with the embedded font it puts dark
    // pixels there (no font would leave the band white).
    let dark_in_caption = (4..30)
        .flat_map(|y| (120..280).map(move |x| (y * w as usize + x) * 3))
        .filter(|&i| px[i] < 128 && px[i + 1] < 128 && px[i + 2] < 128)
        .count();
    assert!(dark_in_caption > 50, "caption drew {dark_in_caption} dark pixels");
}

#[test]
fn missing_metrics_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Run::load(tmp.path(), None).unwrap_err().to_string();
    assert!(e.contains("metrics.jsonl") && e.contains("run directory"), "{e}");
    std::fs::write(tmp.path().join("metrics.jsonl"), "{\"event\":\"x\"}\n").unwrap();
    let e = Run::load(tmp.path(), None).unwrap_err().to_string();
    assert!(e.contains("no line with a numeric \"step\""), "{e}");
    let e = compare::write(
        &[],
        &CompareOptions {
            last_n: 1,
            out_dir: tmp.path().into(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("at least 2 runs"));
}
