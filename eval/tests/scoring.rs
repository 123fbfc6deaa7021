//! The harness with planted log-likelihoods (accuracies known exactly), the token-level adapter's
//! lm-evaluation-harness tokenisation rules, and validation loss / bits per byte with a planted
//! leak.

mod common;

use common::ByteModel;
use flamia_eval::harness::{evaluate, score_docs};
use flamia_eval::loader::load_task;
use flamia_eval::scorer::windows;
use flamia_eval::validation::{self, ValidationOptions};
use flamia_eval::{AttnMode, HarnessOptions, LogLik, ModelScorer, Request, Result, Scorer, Task};
use std::collections::HashMap;

/// Returns planted log-likelihoods keyed by continuation; records batch sizes.
struct Planted {
    table: HashMap<&'static str, f64>,
    batches: Vec<usize>,
}

impl Scorer for Planted {
    fn loglikelihood(&mut self, requests: &[Request]) -> Result<Vec<LogLik>> {
        self.batches.push(requests.len());
        Ok(requests
            .iter()
            .map(|r| LogLik {
                logprob: self.table[r.continuation.trim_start()],
                greedy: false,
            })
            .collect())
    }
}

#[test]
fn planted_scores_give_exact_accuracies() {
    // arc_easy fixture: 3 questions, 4 + 4 + 3 choices.
    // q0 (gold 0, lengths 21, 22, ..): -10 beats -10.4, but -10.4/22 beats -10/21 -> acc right, norm wrong.
    // q1 (gold 3): right both ways. q2 (gold "wind", lengths 4, 4, 3): -3.1 wins raw, -4/4 wins normed.
    let table = HashMap::from([
        ("muscular and skeletal", -10.0),
        ("digestive and muscular", -10.4),
        ("skeletal and respiratory", -48.0),
        ("respiratory and digestive", -50.0),
        ("a wax crayon", -5.0),
        ("a plastic spoon", -20.0),
        ("a rubber eraser", -20.0),
        ("an iron nail", -4.0),
        ("coal", -4.4),
        ("wind", -4.0),
        ("oil", -3.1),
    ]);
    let mut scorer = Planted {
        table,
        batches: Vec::new(),
    };
    let (_, records) = load_task(&common::task_fixtures(), Task::ArcEasy, None).unwrap();
    let opts = HarnessOptions {
        batch_size: 3,
        ..HarnessOptions::default()
    };
    let r = evaluate(&mut scorer, Task::ArcEasy, &records, &opts).unwrap();
    assert_eq!(scorer.batches, vec![3, 3, 3, 2]);
    assert_eq!(r.n, 3);
    assert_eq!(r.correct, "110");
    assert_eq!(r.correct_norm, "011");
    assert!((r.acc - 2.0 / 3.0).abs() < 1e-12 && (r.acc_norm - 2.0 / 3.0).abs() < 1e-12);
    assert!(r.acc_ci95[0] <= r.acc && r.acc <= r.acc_ci95[1]);

    // --limit 2 scores the first two questions only.
    scorer.batches.clear();
    let r = evaluate(
        &mut scorer,
        Task::ArcEasy,
        &records,
        &HarnessOptions {
            batch_size: 100,
            limit: Some(2),
            ..HarnessOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        (r.n, r.correct.as_str(), r.correct_norm.as_str()),
        (2, "11", "01")
    );
    assert_eq!(scorer.batches, vec![8]);
}

#[test]
fn wrong_result_count_is_an_error() {
    struct Short;
    impl Scorer for Short {
        fn loglikelihood(&mut self, _: &[Request]) -> Result<Vec<LogLik>> {
            Ok(vec![])
        }
    }
    let (_, records) = load_task(&common::task_fixtures(), Task::Piqa, None).unwrap();
    let docs = flamia_eval::harness::docs_of(Task::Piqa, &records).unwrap();
    let e = score_docs(&mut Short, &docs, 4).unwrap_err().to_string();
    assert!(e.contains("returned 0 results for 4 requests"), "{e}");
}

#[test]
fn model_scorer_follows_harness_tokenisation() {
    let mut m = ByteModel::new(64);
    let mut s = ModelScorer::new(&mut m, AttnMode::Exact);
    // Trailing context whitespace moves to the continuation: "Answer: " + "x" scores " x".
    let (seq, n) = s
        .encode_request(&Request {
            context: "Answer: ".into(),
            continuation: "x".into(),
        })
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        seq,
        [0].into_iter()
            .chain(b"Answer: x".iter().map(|&b| u32::from(b) + 1))
            .collect::<Vec<_>>()
    );
    // Sum over the continuation only: 2 tokens at -ln 256; " " is "greedy" in the toy model, "x" not.
    let out = s
        .loglikelihood(&[Request {
            context: "Answer:".into(),
            continuation: " x".into(),
        }])
        .unwrap();
    assert!((out[0].logprob + 2.0 * 256f64.ln()).abs() < 1e-4);
    assert!(!out[0].greedy);
    // Long contexts are cut from the left to max_len + 1 tokens, the continuation is kept.
    let mut m = ByteModel::new(8);
    let mut s = ModelScorer::new(&mut m, AttnMode::Exact);
    let (seq, n) = s
        .encode_request(&Request {
            context: "abcdefghijkl".into(),
            continuation: " yz".into(),
        })
        .unwrap();
    assert_eq!((seq.len(), n), (16, 3));
    let w = windows(&seq, n, 8);
    assert_eq!(w, vec![(seq[7..].to_vec(), 3)]);
    // A continuation longer than the context is scored in chunks of max_len tokens, every token once.
    let (seq, n) = s
        .encode_request(&Request {
            context: "ab".into(),
            continuation: " 0123456789abcdef".into(),
        })
        .unwrap();
    assert_eq!((seq.len(), n), (20, 17));
    let w = windows(&seq, n, 8);
    assert_eq!(w.iter().map(|x| x.1).collect::<Vec<_>>(), vec![8, 8, 1]);
    assert_eq!(w[0].0, seq[2..11].to_vec());
    assert_eq!(w[1].0, seq[10..19].to_vec());
    assert_eq!(w[2].0, seq[11..20].to_vec());
    let out = s
        .loglikelihood(&[Request {
            context: "ab".into(),
            continuation: " 0123456789abcdef".into(),
        }])
        .unwrap();
    assert!((out[0].logprob + 17.0 * 256f64.ln()).abs() < 1e-3);
    // An empty continuation cannot be scored.
    let e = s
        .encode_request(&Request {
            context: "a".into(),
            continuation: String::new(),
        })
        .unwrap_err();
    assert!(e.to_string().contains("encodes to no tokens"));
}

#[test]
fn validation_reports_both_paths_and_their_gap() {
    let texts: Vec<String> = vec![
        "hello world, this is a held-out document".into(),
        String::new(),
        "é".repeat(30),
    ];
    let mut m = ByteModel::new(16);
    let opts = ValidationOptions {
        seq_len: 16,
        batch_size: 3,
    };
    let w = validation::windows(&m, &texts, 16).unwrap();
    let bytes = (texts[0].len() + texts[2].len()) as u64;
    // Byte model: one token per byte.
    assert_eq!((w.tokens, w.bytes, w.docs), (bytes, bytes, 2));
    // Every byte predicted once: windows of <= 17 tokens, 16 predictions each except the last.
    assert_eq!(w.windows.iter().map(|x| x.len() as u64 - 1).sum::<u64>(), bytes);
    assert!(w.windows.iter().all(|x| x.len() <= 17));
    let r = validation::report(&mut m, &texts, &opts, "fixture").unwrap();
    assert!((r.exact.bpb - 8.0).abs() < 1e-5, "{}", r.exact.bpb);
    assert!((r.training.bpb - 7.0).abs() < 1e-5);
    assert!((r.exact.loss - 256f64.ln()).abs() < 1e-5);
    assert!((r.gap_loss - 2f64.ln()).abs() < 1e-5 && (r.gap_bpb - 1.0).abs() < 1e-5);
    // Both modes ran, in batches of 3 windows.
    assert!(
        m.calls.iter().any(|c| c.1 == AttnMode::Training) && m.calls.iter().any(|c| c.1 == AttnMode::Exact)
    );
    assert!(m.calls.iter().all(|c| c.0 <= 3));
    let e = validation::windows(&m, &texts, 17).unwrap_err().to_string();
    assert!(e.contains("1..=16"), "{e}");
}
