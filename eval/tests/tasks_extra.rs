//! Hugging Face `<config>/<split>/` download layouts, LAMBADA (greedy accuracy and perplexity)
//! and few-shot prompts.

mod common;

use flamia_eval::harness::{evaluate, with_fewshot, FEWSHOT_DELIMITER};
use flamia_eval::loader::{load_task, task_files};
use flamia_eval::{HarnessOptions, LogLik, Request, Result, Scorer, Task};
use std::path::Path;

fn put(root: &Path, rel: &str, lines: &[&str]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, lines.join("\n") + "\n").unwrap();
}

const PIQA: &str = r#"{"goal": "g", "sol1": "a", "sol2": "b", "label": 0}"#;

#[test]
fn refs_convert_parquet_layouts_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // refs/convert/parquet: <config>/<split>/0000.parquet (JSON lines here; same lookup).
    put(d, "piqa/plain_text/train/0000.jsonl", &[PIQA, PIQA, PIQA]);
    put(d, "piqa/plain_text/validation/0000.jsonl", &[PIQA]);
    put(d, "piqa/.cache/huggingface/validation/x.jsonl", &["not json"]);
    let files = task_files(d, Task::Piqa).unwrap();
    assert_eq!(files, vec![d.join("piqa/plain_text/validation/0000.jsonl")]);
    assert_eq!(load_task(d, Task::Piqa, None).unwrap().1.len(), 1);

    // Several configurations: the task's own is taken.
    let arc = r#"{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "A"}"#;
    put(d, "arc_easy/ARC-Challenge/test-00000-of-00001.jsonl", &[arc, arc]);
    put(d, "arc_easy/ARC-Easy/test-00000-of-00001.jsonl", &[arc]);
    put(
        d,
        "arc_easy/ARC-Easy/train-00000-of-00001.jsonl",
        &[arc, arc, arc],
    );
    assert_eq!(
        task_files(d, Task::ArcEasy).unwrap(),
        vec![d.join("arc_easy/ARC-Easy/test-00000-of-00001.jsonl")]
    );
    let wino = r#"{"sentence": "A _ b.", "option1": "x", "option2": "y", "answer": "1"}"#;
    put(d, "winogrande/winogrande_xs/validation/0000.jsonl", &[wino]);
    put(d, "winogrande/winogrande_xl/validation/0000.jsonl", &[wino, wino]);
    put(d, "winogrande/winogrande_xl/validation/0001.jsonl", &[wino]);
    assert_eq!(
        task_files(d, Task::Winogrande).unwrap(),
        vec![
            d.join("winogrande/winogrande_xl/validation/0000.jsonl"),
            d.join("winogrande/winogrande_xl/validation/0001.jsonl")
        ]
    );
    // Unknown configurations side by side: an error that lists them.
    let siqa =
        r#"{"context": "c", "question": "q", "answerA": "a", "answerB": "b", "answerC": "c", "label": "1"}"#;
    put(d, "siqa/one/validation/0000.jsonl", &[siqa]);
    put(d, "siqa/two/validation/0000.jsonl", &[siqa]);
    let e = task_files(d, Task::Siqa).unwrap_err().to_string();
    assert!(e.contains("\"one\"") && e.contains("\"two\""), "{e}");
    // Nothing for the split: the message says where it looked.
    let e = task_files(d, Task::Boolq).unwrap_err().to_string();
    assert!(e.contains("validation/ directory"), "{e}");
}

/// Planted log-likelihood and greedy flag per continuation.
struct Planted(Vec<(&'static str, f64, bool)>, Vec<Request>);

impl Scorer for Planted {
    fn loglikelihood(&mut self, requests: &[Request]) -> Result<Vec<LogLik>> {
        self.1.extend(requests.iter().cloned());
        Ok(requests
            .iter()
            .map(|r| {
                let (_, lp, g) = self.0.iter().find(|x| x.0 == r.continuation).unwrap();
                LogLik {
                    logprob: *lp,
                    greedy: *g,
                }
            })
            .collect())
    }
}

#[test]
fn lambada_scores_the_last_word_greedy_accuracy_and_perplexity() {
    let (_, records) = load_task(&common::task_fixtures(), Task::Lambada, None).unwrap();
    let mut s = Planted(
        vec![
            (" tea", -1.0, true),
            (" compass", -2.0, false),
            (" envelope", -3.0, true),
        ],
        Vec::new(),
    );
    let r = evaluate(&mut s, Task::Lambada, &records, &HarnessOptions::default()).unwrap();
    assert_eq!(
        s.1[0].context,
        "She poured the tea, handed him the cup and waited for him to drink the"
    );
    assert_eq!(s.1[0].continuation, " tea");
    assert_eq!((r.n, r.correct.as_str()), (3, "101"));
    assert!((r.acc - 2.0 / 3.0).abs() < 1e-12);
    // exp(-mean(-1, -2, -3)) = e^2.
    assert!(
        (r.perplexity.unwrap() - 2f64.exp()).abs() < 1e-9,
        "{:?}",
        r.perplexity
    );
    assert_eq!(Task::parse_list("lambada_openai").unwrap(), vec![Task::Lambada]);
}

#[test]
fn few_shot_prompts_put_solved_examples_before_the_question() {
    let (_, records) = load_task(&common::task_fixtures(), Task::ArcEasy, None).unwrap();
    let docs = flamia_eval::harness::docs_of(Task::ArcEasy, &records).unwrap();
    assert_eq!(docs.len(), 3);
    let shot = with_fewshot(&docs, 3, 2, FEWSHOT_DELIMITER).unwrap();
    for (i, d) in shot.iter().enumerate() {
        let others: Vec<String> = (0..3).filter(|&j| j != i).map(|j| docs[j].solved()).collect();
        let ctx = &d.requests[0].context;
        // Both other examples, solved, each followed by the delimiter, then the question.
        assert!(
            ctx.ends_with(&format!("{FEWSHOT_DELIMITER}{}", docs[i].requests[0].context)),
            "{ctx:?}"
        );
        for o in &others {
            assert!(
                ctx.contains(&format!("{o}{FEWSHOT_DELIMITER}")),
                "{ctx:?} lacks {o:?}"
            );
        }
        assert!(!ctx.contains(&docs[i].solved()));
        // Choices and gold are unchanged; every choice shares the prompt.
        assert_eq!(d.gold, docs[i].gold);
        assert!(d.requests.iter().all(|r| &r.context == ctx));
    }
    // Deterministic, and a different delimiter is used as given.
    assert_eq!(shot, with_fewshot(&docs, 3, 2, FEWSHOT_DELIMITER).unwrap());
    let one = with_fewshot(&docs, 1, 1, "\n###\n").unwrap();
    assert!(one[0].requests[0].context.contains("\n###\nQuestion:"));
    assert!(
        with_fewshot(&docs, 3, 3, "\n\n").is_err(),
        "not enough other examples"
    );
    // Through the harness: n counts the scored examples; the result records the shots.
    let mut s = Planted(Vec::new(), Vec::new());
    for d in &docs {
        for r in &d.requests {
            let c: &'static str = Box::leak(r.continuation.clone().into_boxed_str());
            s.0.push((c, -1.0, false));
        }
    }
    let opts = HarnessOptions {
        num_fewshot: 1,
        limit: Some(2),
        ..HarnessOptions::default()
    };
    let r = evaluate(&mut s, Task::ArcEasy, &records, &opts).unwrap();
    assert_eq!((r.n, r.num_fewshot), (2, 1));
    assert!(s.1.iter().all(|q| q.context.matches("Question:").count() == 2));
}

#[test]
fn mmlu_few_shot_puts_the_subject_line_once_in_front() {
    let (_, records) = load_task(&common::task_fixtures(), Task::Mmlu, None).unwrap();
    let docs = flamia_eval::harness::docs_of(Task::Mmlu, &records).unwrap();
    let head = "The following are questions (with answers) about abstract algebra.\n\n";
    let q0 = "Question: Find the degree for the given field extension Q(sqrt(2)) over Q.\nAnswer:";
    assert_eq!(docs[0].description, head);
    // Zero-shot prompts are unchanged: the description heads the question.
    assert_eq!(with_fewshot(&docs, 2, 0, FEWSHOT_DELIMITER).unwrap(), docs);
    assert_eq!(docs[0].requests[1].context, format!("{head}{q0}"));
    // The solved example has no description of its own.
    let solved1 = "Question: What is the embryological origin of the hyoid bone?\nAnswer: \
                   The second and third pharyngeal arches";
    assert_eq!(docs[1].solved(), solved1);
    // One shot (the only other example): description + example + delimiter + question, as
    // lm-evaluation-harness builds it.
    let shot = with_fewshot(&docs, 2, 1, FEWSHOT_DELIMITER).unwrap();
    for r in &shot[0].requests {
        assert_eq!(r.context, format!("{head}{solved1}\n\n{q0}"));
    }
    let ctx1 = &shot[1].requests[0].context;
    assert!(
        ctx1.starts_with("The following are questions (with answers) about anatomy.\n\nQuestion: Find"),
        "{ctx1:?}"
    );
    assert_eq!(ctx1.matches("The following are questions").count(), 1, "{ctx1:?}");
    assert_eq!(shot[1].description, docs[1].description);
}
