//! `flamia data ...` and `flamia tokenizer ...` end to end: make-shard, inspect, tokenize, bench,
//! convert-tiktoken, and bad input naming the file.

use std::process::Output;

mod support;
use support::flamia;

fn run(args: &[&str]) -> Output {
    flamia().args(args).output().expect("run flamia")
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "flamia {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn make_shard_inspect_tokenize_and_bench() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = d.join("a.txt");
    let b = d.join("b.txt");
    let para = "Of man's first disobedience, and the fruit\nOf that forbidden tree.\n\n";
    std::fs::write(&a, para.repeat(200)).unwrap();
    std::fs::write(&b, "Sing, heavenly Muse.\n\n".repeat(300)).unwrap();
    let shard = d.join("s.parquet");
    let s = |p: &std::path::Path| p.display().to_string();
    let out = ok(&[
        "data",
        "make-shard",
        "--out",
        &s(&shard),
        "--doc-chars",
        "1000",
        "--from",
        &s(&a),
        &s(&b),
    ]);
    assert!(out.contains("documents"), "{out}");

    let out = ok(&["data", "inspect", &s(&shard)]);
    assert!(out.contains("text: String") && out.contains("int_score"), "{out}");
    assert!(out.contains("row groups") && out.contains("tokens"), "{out}");
    let out = ok(&["data", "inspect", "embedded:val"]);
    assert!(out.contains("embedded:val"), "{out}");

    let ftok = d.join("s.ftok");
    let out = ok(&[
        "data",
        "tokenize",
        "--input",
        &s(&shard),
        "--out",
        &s(&ftok),
        "--threads",
        "2",
    ]);
    assert!(out.contains("tokens/s"), "{out}");
    let out = ok(&["data", "inspect", &s(&ftok)]);
    assert!(out.contains("ftok"), "{out}");

    let out = ok(&[
        "data",
        "bench",
        "--train",
        &s(&ftok),
        "--seq-len",
        "128",
        "--batch-rows",
        "4",
        "--batches",
        "20",
        "--threads",
        "2",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["batches"], 20);
    assert_eq!(v["tokens"], 20 * 4 * 128);
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_input_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken.parquet");
    std::fs::write(&bad, b"PAR1 definitely not parquet PAR1").unwrap();
    let out = run(&["data", "inspect", &bad.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.parquet"), "{err}");
    let out = run(&[
        "data",
        "bench",
        "--train",
        "/nonexistent/x.parquet",
        "--batches",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.parquet"));
}

#[test]
fn convert_tiktoken_writes_a_llama3_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    // Bytes, then merges " t", "he", " the" (each a merge of earlier tokens).
    let mut ranks = String::new();
    let b64 = |b: &[u8]| flamia_b64(b);
    for b in 0..=255u8 {
        ranks.push_str(&format!("{} {b}\n", b64(&[b])));
    }
    for (i, t) in [&b" t"[..], b"he", b" the"].iter().enumerate() {
        ranks.push_str(&format!("{} {}\n", b64(t), 256 + i));
    }
    let rank_file = dir.path().join("tiny.tiktoken");
    std::fs::write(&rank_file, ranks).unwrap();
    let tj = dir.path().join("tokenizer.json");
    let s = |p: &std::path::Path| p.display().to_string();
    let out = ok(&[
        "tokenizer",
        "convert-tiktoken",
        "--ranks",
        &s(&rank_file),
        "--pattern",
        "llama3",
        "--out",
        &s(&tj),
    ]);
    assert!(out.contains("vocabulary 515"), "{out}");
    let out = ok(&["tokenizer", "encode", "--tokenizer", &s(&tj), "in the heath"]);
    let ids: Vec<u32> = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    // "in", " the" (merged to 258), " he" -> " " + "he"(257), "ath".
    assert_eq!(ids, vec![105, 110, 258, 32, 257, 97, 116, 104]);
    assert_eq!(out.lines().nth(1), Some("in the heath"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tj).unwrap()).unwrap();
    let added = json["added_tokens"].as_array().unwrap();
    assert_eq!(added.len(), 256);
    assert_eq!(added[1]["content"], "<|end_of_text|>");
    assert_eq!(added[1]["id"], 260);
}

fn flamia_b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let v = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() {
                A[((v >> (18 - 6 * i)) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}
