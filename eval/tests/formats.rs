//! Every task's fixture file converts into the prompts lm-evaluation-harness builds for it.

mod common;

use flamia_eval::loader::{load_task, read_records, task_files};
use flamia_eval::{Doc, Request, Task};

fn docs(task: Task) -> Vec<Doc> {
    let (_, records) = load_task(&common::task_fixtures(), task, None).expect("load fixture");
    flamia_eval::harness::docs_of(task, &records).expect("convert fixture")
}

fn req(context: &str, continuation: &str) -> Request {
    Request {
        context: context.into(),
        continuation: continuation.into(),
    }
}

#[test]
fn every_task_has_a_fixture_that_converts() {
    for task in Task::ALL {
        let d = docs(task);
        assert!(d.len() >= 2, "{task}: fixture too small");
        for doc in &d {
            // LAMBADA scores one continuation; the others choose among several.
            let min = if task == Task::Lambada { 1 } else { 2 };
            assert!(doc.requests.len() >= min && doc.gold < doc.requests.len());
            assert_eq!(doc.norm_lens.len(), doc.requests.len());
        }
    }
}

#[test]
fn hellaswag_preprocesses_like_the_harness() {
    let d = docs(Task::Hellaswag);
    assert_eq!(
        d[0].requests[3],
        req(
            "Roof shingle removal: A man is sitting on a roof. He",
            " starts pulling up roofing on a roof."
        )
    );
    assert_eq!(d[0].gold, 3);
    assert_eq!(d[0].norm_lens[3], "starts pulling up roofing on a roof.".len());
    // ctx_b "the lady" is capitalised; WikiHow brackets are removed, " [title]" becomes ". ".
    assert_eq!(
        d[1].requests[0].context,
        "Clean and Jerk: A lady walks to a barbell. She bends down and grabs the pole. The lady"
    );
    // Like Python's preprocess, removing a leading "[step]" leaves its space (" Add ..."), and the
    // delimiter adds another.
    assert_eq!(
        d[2].requests[0],
        req(
            "Home and Garden: How to clean a vase. Fill the vase with warm water.",
            "  Add a drop of dish soap."
        )
    );
}

#[test]
fn arc_maps_answer_key_through_labels() {
    let d = docs(Task::ArcEasy);
    assert_eq!(
        d[0].requests[0],
        req(
            "Question: Which two body systems are directly involved in movement?\nAnswer:",
            " muscular and skeletal"
        )
    );
    assert_eq!([d[0].gold, d[1].gold, d[2].gold], [0, 3, 1]); // "A", "4" of 1..4, "B"
    assert_eq!(d[2].requests.len(), 3);
    assert_eq!(docs(Task::ArcChallenge)[1].gold, 1);
}

#[test]
fn piqa_siqa_csqa_obqa_boolq_mmlu_prompts() {
    let p = docs(Task::Piqa);
    assert_eq!(
        p[1].requests[1],
        req(
            "Question: To cool down a hot drink quickly,\nAnswer:",
            " pour it over a glass of ice."
        )
    );
    assert_eq!((p[0].gold, p[1].gold), (0, 1));

    let s = docs(Task::Siqa);
    assert_eq!(
        s[0].requests[2],
        req("Q: Tracy didn't go home that evening and resisted Riley's attacks. What does Tracy need to do before this?\nA:", " Find somewhere to go")
    );
    assert_eq!((s[0].gold, s[1].gold), (2, 0));

    let c = docs(Task::CommonsenseQa);
    assert_eq!(c[0].requests.len(), 5);
    assert_eq!(c[0].requests[4].continuation, " new york");
    assert!(
        c[0].requests[0].context.starts_with("Question: A revolving door")
            && c[0].requests[0].context.ends_with("at a what?\nAnswer:")
    );

    let o = docs(Task::OpenBookQa);
    assert_eq!(
        o[0].requests[3],
        req(
            "The sun is responsible for",
            " plants sprouting, blooming and wilting"
        )
    );
    assert_eq!((o[0].gold, o[1].gold), (3, 2));

    let b = docs(Task::Boolq);
    assert_eq!(
        b[0].requests[1],
        req(
            "The Sun is the star at the center of the Solar System.\nQuestion: is the sun a star?\nAnswer:",
            " yes"
        )
    );
    assert_eq!((b[0].gold, b[1].gold, b[2].gold), (1, 0, 1)); // label 1, label 0, answer true
    assert_eq!(b[0].norm_lens, vec![2, 3]);

    let m = docs(Task::Mmlu);
    assert_eq!(
        m[0].requests[1],
        req("The following are questions (with answers) about abstract algebra.\n\nQuestion: Find the degree for the given field extension Q(sqrt(2)) over Q.\nAnswer:", " 2")
    );
    assert_eq!((m[0].gold, m[1].gold), (1, 3)); // integer 1, letter "D"
}

#[test]
fn winogrande_uses_partial_scoring() {
    let w = docs(Task::Winogrande);
    assert_eq!(
        w[0].requests[0],
        req(
            "Sarah was a much better surgeon than Maria so Sarah",
            " always got the harder cases."
        )
    );
    assert_eq!(
        w[0].requests[1],
        req(
            "Sarah was a much better surgeon than Maria so Maria",
            " always got the harder cases."
        )
    );
    assert_eq!((w[0].gold, w[1].gold, w[2].gold), (0, 0, 1));
    let n = "always got the harder cases.".len();
    assert_eq!(w[0].norm_lens, vec![n, n]);
}

#[test]
fn bad_records_name_the_field() {
    let rec =
        serde_json::json!({"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "Z"});
    let e = Task::ArcEasy.doc(&rec, 7).unwrap_err().to_string();
    assert!(e.contains("record 7") && e.contains("answerKey \"Z\""), "{e}");
    let e = Task::Piqa
        .doc(&serde_json::json!({"goal": "g"}), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing field \"sol1\""), "{e}");
    let e = "nope".parse::<Task>().unwrap_err().to_string();
    assert!(e.contains("allowed: all, hellaswag"), "{e}");
}

#[test]
fn task_lists_and_directory_layout() {
    assert_eq!(
        Task::parse_list("piqa, arc_easy,piqa").unwrap(),
        vec![Task::ArcEasy, Task::Piqa]
    );
    assert_eq!(Task::parse_list("all").unwrap().len(), 11);
    // A Hugging Face snapshot layout: files under <task>/, the split's file picked by name.
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("arc_easy").join("ARC-Easy");
    std::fs::create_dir_all(&sub).unwrap();
    let src = common::task_fixtures().join("arc_easy.jsonl");
    std::fs::copy(&src, sub.join("test-00000-of-00001.jsonl")).unwrap();
    std::fs::write(sub.join("train-00000-of-00001.jsonl"), "not json\n").unwrap();
    let files = task_files(dir.path(), Task::ArcEasy).unwrap();
    assert_eq!(files.len(), 1);
    assert!(files[0].ends_with("test-00000-of-00001.jsonl"));
    let (_, recs) = load_task(dir.path(), Task::ArcEasy, Some(2)).unwrap();
    assert_eq!(recs.len(), 2);
    let e = task_files(dir.path(), Task::Piqa).unwrap_err().to_string();
    assert!(e.contains("piqa.jsonl") && e.contains("docs/eval.md"), "{e}");
    assert_eq!(read_records(&src, Some(1)).unwrap().len(), 1);
}
