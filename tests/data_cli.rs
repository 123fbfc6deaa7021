//! `flamia data ...` and `flamia tokenizer ...` end to end: make-shard, inspect (of a file and of a
//! directory), tokenize (progress lines, its output never read as an input, .ftok inputs of
//! another tokenizer refused), bench, convert-tiktoken, and bad input naming the file; and
//! `flamia export`'s tokenizer (written as tokenizer.json with BOS added, taken from --tokenizer)
//! on a checkpoint made here without training.

use std::path::{Path, PathBuf};
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

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        !out.status.success(),
        "flamia {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `tokenizer convert-tiktoken` of a tiny rank file (bytes, then " t", "he", " the") into
/// `dir/name`: 515 ids, `<|begin_of_text|>` = 259, `<|end_of_text|>` = 260.
fn tiny_llama3_tokenizer(dir: &Path, name: &str) -> PathBuf {
    let mut ranks = String::new();
    for b in 0..=255u8 {
        ranks.push_str(&format!("{} {b}\n", flamia_b64(&[b])));
    }
    for (i, t) in [&b" t"[..], b"he", b" the"].iter().enumerate() {
        ranks.push_str(&format!("{} {}\n", flamia_b64(t), 256 + i));
    }
    let rank_file = dir.join("tiny.tiktoken");
    std::fs::write(&rank_file, ranks).unwrap();
    let tj = dir.join(name);
    ok(&[
        "tokenizer",
        "convert-tiktoken",
        "--ranks",
        &s(&rank_file),
        "--out",
        &s(&tj),
    ]);
    tj
}

#[test]
fn tokenize_logs_progress_never_reads_its_output_and_refuses_another_tokenizers_ftok() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let text = dir.path().join("a.txt");
    std::fs::write(&text, "A paragraph of text.\n\n".repeat(400)).unwrap();
    ok(&[
        "data",
        "make-shard",
        "--out",
        &s(&input.join("a.parquet")),
        "--doc-chars",
        "100",
        "--rows-per-group",
        "16",
        "--from",
        &s(&text),
    ]);
    let out = input.join("all.ftok");
    let args = [
        "data",
        "tokenize",
        "--input",
        &s(&input),
        "--out",
        &s(&out),
        "--progress-every",
        "0",
    ];
    let first = run(&args);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let err = String::from_utf8_lossy(&first.stderr);
    // 400 paragraphs of 22 bytes in documents of >= 100 characters: 80 documents, 5 row groups.
    assert!(
        err.contains("tokenize: 1/5 row groups")
            && err.contains("tokenize: 5/5 row groups, 80/80 rows (100.0%): 80 documents"),
        "{err}"
    );
    let wrote = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(wrote.contains(": 80 documents"), "{wrote}");
    // Again into the input directory: the previous output is left out, not read (or truncated).
    let again = run(&args);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stdout).contains(": 80 documents"));
    assert!(String::from_utf8_lossy(&again.stderr).contains("leaving the output"));
    let e = fails(&["data", "tokenize", "--input", &s(&out), "--out", &s(&out)]);
    assert!(e.contains("is the output file"), "{e}");
    // With another tokenizer the bytes .ftok in the directory is refused, and nothing written.
    let tj = tiny_llama3_tokenizer(dir.path(), "llama3.json");
    let other = dir.path().join("llama.ftok");
    let e = fails(&[
        "data",
        "tokenize",
        "--input",
        &s(&input),
        "--out",
        &s(&other),
        "--tokenizer",
        &s(&tj),
    ]);
    assert!(
        e.contains("all.ftok") && e.contains("made with tokenizer bytes") && e.contains("llama3.json"),
        "{e}"
    );
    assert!(!other.exists());
    // inspect of the directory: every shard, then the totals.
    let listing = ok(&["data", "inspect", &s(&input)]);
    assert!(
        listing.contains("2 shards in")
            && listing.contains("a.parquet (parquet")
            && listing.contains("all.ftok (ftok")
            && listing.contains("total       160 rows in 6 row groups"),
        "{listing}"
    );
}

/// A checkpoint directory like `flamia train` writes (the resolved `config.toml` and a
/// `model.safetensors` of zeros in the trainer's names) for the tiny model with `data.tokenizer =
/// tokenizer` and an embedding of `rows` rows.
fn fake_checkpoint(dir: &Path, tokenizer: &str, rows: usize) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let toml = format!("[model]\nsize = \"tiny\"\n\n[data]\ntokenizer = {tokenizer:?}\nseq_len = 64\n");
    std::fs::write(dir.join("config.toml"), &toml).unwrap();
    let sh = flamia_trainer::config::TrainConfig::from_toml(&toml)
        .unwrap()
        .model
        .shape(rows)
        .unwrap();
    let (d, q, kv, f) = (
        sh.dim,
        sh.n_heads * sh.head_dim,
        sh.n_kv_heads * sh.head_dim,
        sh.ffn_dim,
    );
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("tok_embeddings.weight".into(), vec![rows, d]),
        ("norm.weight".into(), vec![d]),
    ];
    if !sh.tied {
        t.push(("output.weight".into(), vec![rows, d]));
    }
    for i in 0..sh.n_layers {
        for (n, shape) in [
            ("attention.wq.weight", vec![q, d]),
            ("attention.wk.weight", vec![kv, d]),
            ("attention.wv.weight", vec![kv, d]),
            ("attention.wo.weight", vec![d, q]),
            ("feed_forward.w1.weight", vec![f, d]),
            ("feed_forward.w3.weight", vec![f, d]),
            ("feed_forward.w2.weight", vec![d, f]),
            ("attention_norm.weight", vec![d]),
            ("ffn_norm.weight", vec![d]),
        ] {
            t.push((format!("layers.{i}.{n}"), shape));
        }
    }
    // safetensors: u64 header length, JSON header (offsets into the data), f32 data.
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (n, shape) in &t {
        let bytes = 4 * shape.iter().product::<usize>();
        header.insert(
            n.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [off, off + bytes]}),
        );
        off += bytes;
    }
    let mut h = serde_json::Value::Object(header).to_string();
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(h.as_bytes());
    file.resize(file.len() + off, 0);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    dir.to_path_buf()
}

fn json_of(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn export_writes_the_tokenizer_as_tokenizer_json_with_bos() {
    let dir = tempfile::tempdir().unwrap();
    let tj = tiny_llama3_tokenizer(dir.path(), "llama3.json");
    let ck = fake_checkpoint(&dir.path().join("ck"), &s(&tj), 515);
    let hf = dir.path().join("hf");
    // An earlier export's tokenizer.json (of another tokenizer) must not survive.
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(hf.join("tokenizer.json"), r#"{"stale": true}"#).unwrap();
    ok(&["export", "--checkpoint", &s(&ck), "--out", &s(&hf)]);
    assert!(!hf.join("llama3.json").exists(), "copied under its own name");
    let exported = flamia_data::Tokenizer::from_file(&hf.join("tokenizer.json")).unwrap();
    let original = flamia_data::Tokenizer::from_file(&tj).unwrap();
    assert_eq!(
        (exported.bos_id(), exported.eos_id(), exported.vocab_size()),
        (Some(259), 260, 515)
    );
    // flamia's own encoding (no special tokens) is unchanged by the added post-processor.
    for text in ["in the heath", "a page quoting <|begin_of_text|>"] {
        assert_eq!(exported.encode(text).unwrap(), original.encode(text).unwrap());
    }
    let pp = json_of(&hf.join("tokenizer.json"))["post_processor"].clone();
    assert_eq!(pp["processors"][1]["type"], "TemplateProcessing", "{pp}");
    assert_eq!(
        pp["processors"][1]["single"][0]["SpecialToken"]["id"],
        "<|begin_of_text|>"
    );
    let c = json_of(&hf.join("config.json"));
    assert_eq!(
        (c["bos_token_id"].as_u64(), c["eos_token_id"].as_u64()),
        (Some(259), Some(260))
    );
    let tc = json_of(&hf.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|begin_of_text|>");
    assert_eq!(tc["add_bos_token"], true);
    let names: Vec<String> = std::fs::read_dir(&hf)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "{names:?}");

    // The run's tokenizer file moved: the default names it and --tokenizer; --tokenizer works
    // without the run's file (it used to be loaded all the same).
    let moved = dir.path().join("moved.json");
    std::fs::rename(&tj, &moved).unwrap();
    let e = fails(&["export", "--checkpoint", &s(&ck), "--out", &s(&hf)]);
    assert!(e.contains("llama3.json") && e.contains("--tokenizer"), "{e}");
    let hf2 = dir.path().join("hf2");
    ok(&[
        "export",
        "--checkpoint",
        &s(&ck),
        "--out",
        &s(&hf2),
        "--tokenizer",
        &s(&moved),
    ]);
    assert!(hf2.join("tokenizer.json").is_file() && !hf2.join("moved.json").exists());
    // A tokenizer that does not fit the embedding is refused, naming both sizes.
    let e = fails(&[
        "export",
        "--checkpoint",
        &s(&ck),
        "--out",
        &s(&hf2),
        "--tokenizer",
        "bytes",
    ]);
    assert!(e.contains("258 ids") && e.contains("515 rows"), "{e}");
}

#[test]
fn export_takes_bos_and_eos_from_the_given_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let tj = tiny_llama3_tokenizer(dir.path(), "llama3.json");
    let ck = fake_checkpoint(&dir.path().join("ck"), &s(&tj), 515);
    // The same vocabulary with other BOS and EOS tokens: EOS `</s>` = 259, BOS `<s>` = 260.
    let mut v = json_of(&tj);
    v["added_tokens"][0]["content"] = "</s>".into();
    v["added_tokens"][1]["content"] = "<s>".into();
    let swapped = dir.path().join("swapped.json");
    std::fs::write(&swapped, v.to_string()).unwrap();
    let hf = dir.path().join("hf");
    let out = run(&[
        "export",
        "--checkpoint",
        &s(&ck),
        "--out",
        &s(&hf),
        "--tokenizer",
        &s(&swapped),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("differs from the run's data.tokenizer"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = json_of(&hf.join("config.json"));
    assert_eq!(
        (c["bos_token_id"].as_u64(), c["eos_token_id"].as_u64()),
        (Some(260), Some(259))
    );
    let tc = json_of(&hf.join("tokenizer_config.json"));
    assert_eq!(
        (tc["bos_token"].as_str(), tc["eos_token"].as_str()),
        (Some("<s>"), Some("</s>"))
    );
    let pp = json_of(&hf.join("tokenizer.json"))["post_processor"].clone();
    assert_eq!(
        pp["processors"][1]["special_tokens"]["<s>"]["ids"],
        serde_json::json!([260])
    );
}
