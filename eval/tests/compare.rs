//! Comparison of two generated run directories: loss summaries, paired task differences, the
//! validation table, the markdown report and the PNG (with its text actually drawn).

mod common;

use flamia_eval::compare::{self, metric_rows, task_rows, Arm, CompareOptions};
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
        perplexity: None,
        num_fewshot: 0,
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
    make_run_val(dir, floor, tps, piqa, leak, floor);
}

/// Like `make_run` with the validation (training path) loss `val` (exact = val + leak); the
/// training log carries validation losses too (`val_loss` at steps 25 and 50, the last one
/// `val + 0.1`).
fn make_run_val(dir: &Path, floor: f64, tps: f64, piqa: &str, leak: f64, val_loss: f64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut lines = String::from("{\"event\":\"start\",\"config\":{}}\n");
    for step in 1..=50u64 {
        let loss = floor + (10.0 - floor) * (-(step as f64) / 8.0).exp();
        let val = match step {
            25 => format!(",\"val_loss\":{}", val_loss + 1.0),
            50 => format!(",\"val_loss\":{}", val_loss + 0.1),
            _ => String::new(),
        };
        lines += &format!(
            "{{\"step\":{step},\"loss\":{loss},\"lr\":0.001,\"tokens_per_s\":{}{val}}}\n",
            tps + step as f64
        );
    }
    std::fs::write(dir.join("metrics.jsonl"), lines).unwrap();
    let mut tasks = BTreeMap::new();
    tasks.insert("piqa".into(), task("piqa", piqa));
    let training = val("training", val_loss);
    let exact = val("exact", val_loss + leak);
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
            prefix_token: Some(257),
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
    let arms = compare::load_arms(&[a.display().to_string(), format!("fp8={}", b.display())]).unwrap();
    let runs: Vec<Run> = arms.iter().map(|a| a.runs[0].clone()).collect();
    assert_eq!(arms[1].label, "fp8");
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
        &arms,
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
    // One run per arm: no seed interval.
    assert!(
        md.contains("| validation loss, exact attention | 3.0000 | 3.1500 | n/a |"),
        "{md}"
    );
    let png = std::fs::read(&w.png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 900); // IHDR width
}

#[test]
fn arms_of_seeds_give_differences_of_means_with_welch_intervals() {
    let tmp = tempfile::tempdir().unwrap();
    let d = |n: &str| tmp.path().join(n);
    // Validation (exact) losses: control 1.47, 1.48, 1.475; mxfp8 1.49, 1.485, 1.495.
    for (name, v) in [("b0", 1.47), ("b1", 1.48), ("b2", 1.475)] {
        make_run_val(&d(name), 3.0, 10.0, "1100", 0.0, v);
    }
    for (name, v) in [("m0", 1.49), ("m1", 1.485), ("m2", 1.495)] {
        make_run_val(&d(name), 3.0, 10.0, "1110", 0.0, v);
    }
    let spec = |label: &str, dirs: [&str; 3]| {
        format!(
            "{label}={}",
            dirs.iter()
                .map(|n| d(n).display().to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let arms = compare::load_arms(&[
        spec("bf16", ["b0", "b1", "b2"]),
        spec("mxfp8", ["m0", "m1", "m2"]),
    ])
    .unwrap();
    assert_eq!((arms[0].runs.len(), arms[1].label.as_str()), (3, "mxfp8"));
    let rows = metric_rows(&arms, 5);
    let v = rows
        .iter()
        .find(|r| r.metric == "validation loss, exact attention")
        .unwrap();
    assert!((v.values[0].mean - 1.475).abs() < 1e-12 && (v.values[0].sd - 0.005).abs() < 1e-12);
    // 0.015 -+ t(0.975, 4) * sqrt(2 * 0.005^2 / 3) (see stats::tests).
    let diff = v.diffs[1].unwrap();
    assert!(
        (diff.mean - 0.015).abs() < 1e-12 && (diff.lo - 0.003_665_21).abs() < 1e-7,
        "{diff:?}"
    );
    let acc = rows.iter().find(|r| r.metric == "piqa acc").unwrap();
    assert!((acc.diffs[1].unwrap().mean - 0.25).abs() < 1e-12);
    // The last validation loss logged during training (step 50): the same difference of means.
    let t = rows
        .iter()
        .find(|r| r.metric == "validation loss during training (training attention path, step 50)")
        .unwrap();
    assert!(t.note.is_none() && t.mismatch.is_none());
    assert!((t.values[0].mean - 1.575).abs() < 1e-12, "{:?}", t.values[0]);
    assert!((t.diffs[1].unwrap().mean - 0.015).abs() < 1e-12);
    let md = compare::markdown(&arms, 5, None);
    assert!(
        md.starts_with("# Comparison: bf16 (3 runs) (control) vs mxfp8 (3 runs)"),
        "{md}"
    );
    assert!(
        md.contains("| validation loss, exact attention | 1.4750 ± 0.0050 | 1.4900 ± 0.0050 | +0.0150 [+0.0037, +0.0263] |"),
        "{md}"
    );
    assert!(
        md.contains("| piqa acc | 50.0 ± 0.0 | 75.0 ± 0.0 | +25.0 [+25.0, +25.0] |"),
        "{md}"
    );
    assert!(md.contains("| mxfp8/m1 |"), "{md}");
    // The plot: per-arm means and the difference panel.
    let curves = plot::arm_curves(&arms);
    assert_eq!(curves.len(), 2);
    let diff = plot::difference(&curves[0].1, &curves[1].1);
    assert_eq!(diff.len(), 50);
    assert!(diff.iter().all(|p| p.1.abs() < 1e-12), "same training curves");
    let px = plot::render_rgb(&arms, 600, 480).unwrap();
    assert_eq!(px.len(), 600 * 480 * 3);
}

#[test]
fn smoothing_means_and_differences() {
    let c: Vec<(u64, f64)> = (1..=10).map(|s| (s, s as f64)).collect();
    let sm = plot::smooth(&c, 3);
    assert_eq!(sm[0], (1, 1.0));
    assert_eq!(sm[1], (2, 1.5));
    assert_eq!(sm[9], (10, 9.0));
    let other: Vec<(u64, f64)> = (2..=12).step_by(2).map(|s| (s, 2.0 * s as f64)).collect();
    let m = plot::mean_curve(&[c.clone(), other.clone()]);
    assert_eq!(m, vec![(2, 3.0), (4, 6.0), (6, 9.0), (8, 12.0), (10, 15.0)]);
    let d = plot::difference(&c, &other);
    assert_eq!(d, vec![(2, 2.0), (4, 4.0), (6, 6.0), (8, 8.0), (10, 10.0)]);
    assert_eq!((plot::window(10), plot::window(1000)), (1, 40));
}

#[test]
fn unpaired_examples_are_reported_not_compared() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    make_run(&a, 3.0, 10.0, "1100", 0.0);
    make_run(&b, 3.0, 10.0, "110011", 0.0);
    let arms = compare::load_arms(&[a.display().to_string(), b.display().to_string()]).unwrap();
    let runs: Vec<Run> = arms.iter().map(|a| a.runs[0].clone()).collect();
    let rows = task_rows(&runs, true);
    assert!(rows[0].diffs[1]
        .clone()
        .unwrap()
        .unwrap_err()
        .contains("different examples"));
    let md = compare::markdown(&arms, 10, None);
    assert!(md.contains("not paired: different examples (n 4 vs 6)"), "{md}");
}

#[test]
fn plot_draws_text_without_system_fonts() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    make_run(&a, 3.0, 10.0, "1", 0.0);
    let arms = vec![Arm {
        label: "a".into(),
        runs: vec![Run::load(&a, None).unwrap()],
    }];
    let (w, h) = (400u32, 300u32);
    let px = plot::render_rgb(&arms, w, h).unwrap();
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
    assert!(e.to_string().contains("at least 2 arms"));
}

/// Rewrites a run's `eval.json` through `edit`.
fn edit_eval(dir: &Path, edit: impl FnOnce(&mut EvalResults)) {
    let path = dir.join("eval.json");
    let mut e = EvalResults::read(&path).unwrap();
    edit(&mut e);
    e.write(&path).unwrap();
}

/// Rewrites every line of a run's `metrics.jsonl` through `edit`.
fn edit_metrics(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let out: String = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            edit(&mut v);
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&path, out).unwrap();
}

/// Drops the `val_loss` of the given steps from a run's `metrics.jsonl` (as if the run stopped
/// before them, or validated on another schedule).
fn drop_val_steps(dir: &Path, steps: &[u64]) {
    edit_metrics(dir, |v| {
        let step = v.get("step").and_then(serde_json::Value::as_u64);
        if step.is_some_and(|s| steps.contains(&s)) {
            v.as_object_mut().unwrap().remove("val_loss");
        }
    });
}

/// Seed arms `bf16` (b0..b2, exact validation 1.47, 1.48, 1.475) and `mxfp8` (m0..m2, 1.49,
/// 1.485, 1.495), piqa 2/4 and 3/4; `seeds` writes each run's config.toml with run.seed =
/// data.seed = its index.
fn seed_arms(root: &Path, seeds: bool) -> Vec<String> {
    let d = |n: &str| root.join(n);
    for (name, v) in [("b0", 1.47), ("b1", 1.48), ("b2", 1.475)] {
        make_run_val(&d(name), 3.0, 10.0, "1100", 0.0, v);
    }
    for (name, v) in [("m0", 1.49), ("m1", 1.485), ("m2", 1.495)] {
        make_run_val(&d(name), 3.0, 10.0, "1110", 0.0, v);
    }
    if seeds {
        for name in ["b0", "b1", "b2", "m0", "m1", "m2"] {
            let s = &name[1..];
            std::fs::write(
                d(name).join("config.toml"),
                format!("[run]\nname = \"{name}\"\nseed = {s}\n\n[data]\nseed = {s}\n"),
            )
            .unwrap();
        }
    }
    let spec = |label: &str, dirs: [&str; 3]| {
        let dirs: Vec<String> = dirs.iter().map(|n| d(n).display().to_string()).collect();
        format!("{label}={}", dirs.join(","))
    };
    vec![
        spec("bf16", ["b0", "b1", "b2"]),
        spec("mxfp8", ["m0", "m1", "m2"]),
    ]
}

fn row<'a>(rows: &'a [compare::MetricRow], prefix: &str) -> &'a compare::MetricRow {
    rows.iter()
        .find(|r| r.metric.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row {prefix:?}"))
}

#[test]
fn training_validation_row_names_its_path_and_step() {
    let tmp = tempfile::tempdir().unwrap();
    let specs = seed_arms(tmp.path(), false);
    // mxfp8/m1 stopped before its step-50 validation: every run is compared at step 25.
    drop_val_steps(&tmp.path().join("m1"), &[50]);
    let arms = compare::load_arms(&specs).unwrap();
    let rows = metric_rows(&arms, 5);
    let t = row(&rows, compare::TRAINING_VAL_ROW);
    assert_eq!(
        t.metric,
        "validation loss during training (training attention path, step 25)"
    );
    // Step 25 logged val + 1: 2.475 and 2.49.
    assert!((t.values[0].mean - 2.475).abs() < 1e-12, "{:?}", t.values[0]);
    assert!((t.diffs[1].unwrap().mean - 0.015).abs() < 1e-12);
    let note = t.note.as_deref().unwrap();
    assert!(
        note.contains("bf16/b0 50") && !note.contains("mxfp8/m1"),
        "{note}"
    );
    let md = compare::markdown(&arms, 5, None);
    assert!(
        md.contains(
            "| validation loss during training (training attention path, step 25) | 2.4750 ± 0.0050 |"
        ),
        "{md}"
    );
    assert!(md.contains("not an exact-attention measurement"), "{md}");
    assert!(
        md.contains("Judge quality by `validation loss, exact attention`"),
        "{md}"
    );

    // No step every run logged (m1 only 25, the rest only 50): shown at each run's last step,
    // flagged, no difference.
    for n in ["b0", "b1", "b2", "m0", "m2"] {
        drop_val_steps(&tmp.path().join(n), &[25]);
    }
    let arms = compare::load_arms(&specs).unwrap();
    let rows = metric_rows(&arms, 5);
    let t = row(&rows, compare::TRAINING_VAL_ROW);
    assert!(
        t.metric.ends_with("(training attention path, last logged step)"),
        "{}",
        t.metric
    );
    let why = t.mismatch.as_deref().unwrap();
    assert!(
        why.contains(
            "validation step differs: 50 (bf16/b0, bf16/b1, bf16/b2, mxfp8/m0, mxfp8/m2) vs 25 (mxfp8/m1)"
        ),
        "{why}"
    );
    assert!(t.diffs[1].is_none() && t.paired[1].is_none());
    let md = compare::markdown(&arms, 5, None);
    assert!(
        md.contains("(training attention path, last logged step) ⚠ | 1.5750 ± 0.0050 | 1.8900 ± 0.5153 | not compared ⚠ |"),
        "{md}"
    );
    assert!(md.contains("⚠ Not like for like"), "{md}");
}

#[test]
fn seed_arms_get_a_paired_per_seed_difference() {
    let tmp = tempfile::tempdir().unwrap();
    let arms = compare::load_arms(&seed_arms(tmp.path(), true)).unwrap();
    assert_eq!(
        arms[1].runs[2].seeds,
        Some(flamia_eval::runs::Seeds { run: 2, data: 2 })
    );
    let rows = metric_rows(&arms, 5);
    let v = row(&rows, "validation loss, exact attention");
    // Per seed: 1.49 - 1.47, 1.485 - 1.48, 1.495 - 1.475 = 0.02, 0.005, 0.02: mean 0.015, sd
    // 0.0086603, half width t(0.975, 2) * sd / sqrt(3) = 4.3026527 * 0.005 = 0.0215133.
    let p = v.paired[1].unwrap();
    assert_eq!(p.pairs, 3);
    assert!((p.est.mean - 0.015).abs() < 1e-12, "{p:?}");
    assert!(
        (p.est.lo + 0.006_513_3).abs() < 1e-6 && (p.est.hi - 0.036_513_3).abs() < 1e-6,
        "{p:?}"
    );
    let md = compare::markdown(&arms, 5, None);
    assert!(md.contains("| mxfp8 − bf16, paired by seed |"), "{md}");
    assert!(
        md.contains("| +0.0150 [+0.0037, +0.0263] | +0.0150 [-0.0065, +0.0365] (3 seeds) |"),
        "{md}"
    );
    // A seed twice in one arm: which run pairs is ambiguous, so none does.
    std::fs::copy(
        tmp.path().join("m0/config.toml"),
        tmp.path().join("m1/config.toml"),
    )
    .unwrap();
    let arms = compare::load_arms(&seed_arms_specs(tmp.path())).unwrap();
    let rows = metric_rows(&arms, 5);
    assert!(row(&rows, "validation loss, exact attention").paired[1].is_none());
}

fn seed_arms_specs(root: &Path) -> Vec<String> {
    ["bf16=b0,b1,b2", "mxfp8=m0,m1,m2"]
        .iter()
        .map(|s| {
            let (label, dirs) = s.split_once('=').unwrap();
            let dirs: Vec<String> = dirs
                .split(',')
                .map(|n| root.join(n).display().to_string())
                .collect();
            format!("{label}={}", dirs.join(","))
        })
        .collect()
}

#[test]
fn seed_rows_flag_runs_measured_differently() {
    let tmp = tempfile::tempdir().unwrap();
    let specs = seed_arms(tmp.path(), false);
    // mxfp8/m1 scored its tasks through its training path, 5-shot; mxfp8/m2 validated on
    // another file.
    edit_eval(&tmp.path().join("m1"), |e| {
        e.task_attn = "training".into();
        e.tasks.get_mut("piqa").unwrap().num_fewshot = 5;
    });
    edit_eval(&tmp.path().join("m2"), |e| {
        e.validation.as_mut().unwrap().source = "other.jsonl".into();
    });
    let arms = compare::load_arms(&specs).unwrap();
    let rows = metric_rows(&arms, 5);
    let acc = row(&rows, "piqa acc");
    let why = acc.mismatch.as_deref().unwrap();
    assert!(
        why.contains(
            "num_fewshot differs: 0 (bf16/b0, bf16/b1, bf16/b2, mxfp8/m0, mxfp8/m2) vs 5 (mxfp8/m1)"
        ) && why.contains("task_attn differs: exact (")
            && why.contains("vs training (mxfp8/m1)"),
        "{why}"
    );
    assert!(acc.diffs[1].is_none());
    let v = row(&rows, "validation loss, exact attention");
    assert!(
        v.mismatch
            .as_deref()
            .unwrap()
            .contains("validation source differs: heldout.jsonl (")
            && v.diffs[1].is_none(),
        "{:?}",
        v.mismatch
    );
    // The training losses and the in-training validation were measured alike: compared.
    assert!(row(&rows, "training loss").mismatch.is_none());
    assert!(row(&rows, compare::TRAINING_VAL_ROW).diffs[1].is_some());
    let md = compare::markdown(&arms, 5, None);
    assert!(
        md.contains("| piqa acc ⚠ | 50.0 ± 0.0 | 75.0 ± 0.0 | not compared ⚠ |"),
        "{md}"
    );
    assert!(md.contains("- `piqa acc`: num_fewshot differs: 0 ("), "{md}");
    // The different examples of one run flag the row as well.
    edit_eval(&tmp.path().join("m1"), |e| {
        e.task_attn = "exact".into();
        let t = e.tasks.get_mut("piqa").unwrap();
        t.num_fewshot = 0;
        t.fingerprint = "00000000000000bb".into();
    });
    let arms = compare::load_arms(&specs).unwrap();
    let rows = metric_rows(&arms, 5);
    let why = row(&rows, "piqa acc").mismatch.clone().unwrap();
    assert!(
        why.starts_with("examples differs: n 4 (fingerprint 00000000000000aa)"),
        "{why}"
    );
}

#[test]
fn tasks_scored_through_other_attention_or_shots_are_not_paired() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    make_run(&a, 3.0, 10.0, "1100", 0.0);
    make_run(&b, 3.0, 10.0, "1110", 0.05);
    make_run(&c, 3.0, 10.0, "1111", 0.05);
    edit_eval(&b, |e| e.task_attn = "training".into());
    edit_eval(&c, |e| e.tasks.get_mut("piqa").unwrap().num_fewshot = 5);
    let arms = compare::load_arms(&[
        a.display().to_string(),
        b.display().to_string(),
        c.display().to_string(),
    ])
    .unwrap();
    let runs: Vec<Run> = arms.iter().map(|a| a.runs[0].clone()).collect();
    let rows = task_rows(&runs, false);
    let why_b = rows[0].diffs[1].clone().unwrap().unwrap_err();
    assert_eq!(why_b, "different task attention (`exact` vs `training`)");
    let why_c = rows[0].diffs[2].clone().unwrap().unwrap_err();
    assert_eq!(why_c, "different shots (0 vs 5)");
    let md = compare::markdown(&arms, 5, None);
    assert!(
        md.contains("not paired: different task attention (`exact` vs `training`)"),
        "{md}"
    );
    assert!(md.contains("not paired: different shots (0 vs 5)"), "{md}");
    // Every run's scoring, and a warning for the one not scored through exact attention.
    assert!(md.contains("| a | 50 | bf16 | `exact` | 0 (zero-shot) |"), "{md}");
    assert!(
        md.contains("| b | 50 | mxfp8 | `training` | 0 (zero-shot) |"),
        "{md}"
    );
    assert!(md.contains("| c | 50 | mxfp8 | `exact` | 5 |"), "{md}");
    assert!(
        md.contains("> **Warning:** tasks of b (`training`) were not scored through exact attention"),
        "{md}"
    );
    assert!(!md.contains("Tasks scored zero-shot"), "{md}");
    // All exact: no warning.
    let md = compare::markdown(&[arms[0].clone(), arms[2].clone()], 5, None);
    assert!(!md.contains("Warning"), "{md}");
    // Same n, other prompts, another checkpoint step.
    let d = tmp.path().join("d");
    make_run(&d, 3.0, 10.0, "1111", 0.0);
    edit_eval(&d, |e| {
        e.step = Some(40);
        e.tasks.get_mut("piqa").unwrap().fingerprint = "00000000000000cc".into();
    });
    let runs = [runs[0].clone(), Run::load(&d, None).unwrap()];
    assert_eq!(
        task_rows(&runs, true)[0].diffs[1].clone().unwrap().unwrap_err(),
        "different examples or prompts (fingerprint 00000000000000aa vs 00000000000000cc); \
         different checkpoint steps (50 vs 40)"
    );
}

#[test]
fn repeated_steps_keep_their_last_line() {
    let tmp = tempfile::tempdir().unwrap();
    // Steps 1..=10, then a resume from step 5 that appended steps 6..=12 again (other values).
    let mut lines = String::new();
    for step in 1..=10u64 {
        let val = if step == 8 { ",\"val_loss\":9.0" } else { "" };
        lines += &format!(
            "{{\"step\":{step},\"loss\":{},\"tps\":{}{val}}}\n",
            10.0 - step as f64 * 0.1,
            step
        );
    }
    lines += "{\"event\":\"resume\",\"step_from\":5}\n";
    for step in 6..=12u64 {
        let val = if step == 8 { ",\"val_loss\":7.0" } else { "" };
        lines += &format!(
            "{{\"step\":{step},\"loss\":{},\"tps\":{}{val}}}\n",
            5.0 - step as f64 * 0.1,
            100 + step
        );
    }
    std::fs::write(tmp.path().join("metrics.jsonl"), lines).unwrap();
    let r = Run::load(tmp.path(), None).unwrap();
    let steps: Vec<u64> = r.losses.iter().map(|l| l.0).collect();
    assert_eq!(steps, (1..=12).collect::<Vec<_>>());
    assert!(
        (r.losses[4].1 - 9.5).abs() < 1e-12,
        "step 5 from before the resume"
    );
    assert!(
        (r.losses[5].1 - 4.4).abs() < 1e-12,
        "step 6 from after the resume"
    );
    assert_eq!(r.val_losses, vec![(8, 7.0)]);
    // tokens/s: steps 1..=5 (1..5) and 6..=12 (106..112): median (106 + 107) / 2.
    assert_eq!(r.tps.len(), 12);
    assert_eq!(r.tokens_per_s(), Some(106.5));
    assert_eq!(r.last_step(), 12);
}

/// Adds `val_loss_exact` = `val_loss` + `shift` to every validation line of a run's log (as
/// `flamia train` writes with `training.val_exact` on a FLAMIA path).
fn add_exact_val(dir: &Path, shift: f64) {
    edit_metrics(dir, |v| {
        if let Some(x) = v.get("val_loss").and_then(serde_json::Value::as_f64) {
            v["val_loss_exact"] = (x + shift).into();
        }
    });
}

#[test]
fn the_trainers_exact_attention_validation_gets_its_own_row() {
    let tmp = tempfile::tempdir().unwrap();
    let specs = seed_arms(tmp.path(), false);
    let arms = compare::load_arms(&specs).unwrap();
    let rows = metric_rows(&arms, 5);
    assert!(
        !rows
            .iter()
            .any(|r| r.metric.starts_with(compare::TRAINING_VAL_EXACT_ROW)),
        "no run logged val_loss_exact: no row"
    );
    // A control run from before training.val_exact logs none; mxfp8's exact pass reads 0.01 higher.
    for n in ["m0", "m1", "m2"] {
        add_exact_val(&tmp.path().join(n), 0.01);
    }
    let arms = compare::load_arms(&specs).unwrap();
    assert_eq!(
        arms[1].runs[0].val_losses_exact,
        vec![(25, 2.49 + 0.01), (50, 1.59 + 0.01)]
    );
    let rows = metric_rows(&arms, 5);
    let t = row(&rows, compare::TRAINING_VAL_EXACT_ROW);
    assert_eq!(
        t.metric,
        "exact-attention validation loss during training (exact attention, step 50)"
    );
    assert_eq!(t.values[0].n, 0, "the control has no such series");
    assert!(
        (t.values[1].mean - (1.59 + 0.01)).abs() < 1e-12,
        "{:?}",
        t.values[1]
    );
    // The training path's row is unchanged beside it.
    let own = row(&rows, compare::TRAINING_VAL_ROW);
    assert!((own.values[1].mean - 1.59).abs() < 1e-12, "{:?}", own.values[1]);
    let md = compare::markdown(&arms, 5, None);
    assert!(
        md.contains("Judge quality by `exact-attention validation loss during training`"),
        "{md}"
    );
}
