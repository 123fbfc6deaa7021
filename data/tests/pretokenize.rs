//! `flamia data tokenize` as a library: `.ftok` inputs from another tokenizer refused, the output
//! never read as its own input, the previous output kept whole when a run fails, progress after
//! every unit; `make-shard` outputs written atomically too; `inspect` of a directory reports every
//! shard.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, RecordBatch};
use arrow::datatypes::{Field, Schema};
use common::{doc_text, docs_of, write_shard};
use flamia_data::pretokenize::{tokenize, tokenize_with_progress, Progress, ProgressLog};
use flamia_data::source::Filters;
use flamia_data::{Config, DataError, Loader, Tokenizer};

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Every document (as text) of a `.ftok` made with the byte tokenizer, in order.
fn ftok_docs(p: &Path) -> Vec<String> {
    let c = Config {
        val: vec![s(p)],
        train: vec![s(p)],
        seq_len: 64,
        batch_rows: 4,
        num_threads: 1,
        ..Config::default()
    };
    let ids: Vec<u32> = Loader::validation(&c, 0, 1)
        .unwrap()
        .flat_map(|b| b.unwrap().tokens)
        .collect();
    docs_of(&ids)
}

/// A byte-level BPE tokenizer.json with Llama-3's specials (BOS = 256, EOS = 257): not "bytes".
fn bpe_tokenizer(dir: &Path) -> PathBuf {
    let ranks = dir.join("bytes.tiktoken");
    let lines: String = (0..=255u8)
        .map(|b| format!("{} {b}\n", flamia_data::tiktoken::b64_encode(&[b])))
        .collect();
    std::fs::write(&ranks, lines).unwrap();
    let tj = dir.join("llama3.json");
    flamia_data::tiktoken::convert(&ranks, "llama3", &tj).unwrap();
    tj
}

fn no_tmp_left(dir: &Path) {
    let tmp: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
}

#[test]
fn a_ftok_input_from_another_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let pq = write_shard(&input, "a.parquet", 0, 20, 7);
    // An earlier run with another tokenizer left its .ftok in the input directory.
    let bpe = Tokenizer::from_file(&bpe_tokenizer(dir.path())).unwrap();
    let old = input.join("old-bpe.ftok");
    tokenize(&[s(&pq)], &Filters::default(), &bpe, &old, 1, false).unwrap();
    let out = dir.path().join("out.ftok");
    for skip_bad in [false, true] {
        let e = tokenize(
            &[s(&input)],
            &Filters::default(),
            &Tokenizer::Bytes,
            &out,
            1,
            skip_bad,
        )
        .unwrap_err();
        assert!(matches!(e, DataError::TokShard { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.contains("old-bpe.ftok")
                && m.contains(&bpe.fingerprint())
                && m.contains("tokenizer bytes (bytes)")
                && m.contains("copied unchanged"),
            "{m}"
        );
        assert!(!out.exists(), "nothing written");
        no_tmp_left(dir.path());
    }
    // The same tokenizer's .ftok is copied through: the output holds both inputs' documents.
    tokenize(&[s(&input)], &Filters::default(), &bpe, &out, 1, false).unwrap();
    let r = flamia_data::tokshard::TokReader::open(&out).unwrap();
    assert_eq!(
        (r.n_docs, r.fingerprint.as_str()),
        (40, bpe.fingerprint().as_str())
    );
}

#[test]
fn the_output_is_never_read_as_an_input_and_survives_a_failed_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_shard(d, "a.parquet", 0, 30, 7);
    let out = d.join("all.ftok");
    let tok = Tokenizer::Bytes;
    let f = Filters::default();
    let first = tokenize(&[s(d)], &f, &tok, &out, 2, false).unwrap();
    assert_eq!(first.docs, 30);
    let want: Vec<String> = (0..30).map(doc_text).collect();
    assert_eq!(ftok_docs(&out), want);
    // Re-run into the input directory: the old output is not an input (it would double the
    // documents, or be read while truncated).
    let again = tokenize(&[s(d)], &f, &tok, &out, 2, false).unwrap();
    assert_eq!((again.docs, again.tokens), (first.docs, first.tokens));
    assert_eq!(ftok_docs(&out), want);
    // The same through a glob and through another spelling of the path.
    let glob = format!("{}/*", d.display());
    assert_eq!(tokenize(&[glob], &f, &tok, &out, 1, false).unwrap().docs, 30);
    // Naming the output as an input file is an error, and the output is untouched.
    let before = std::fs::read(&out).unwrap();
    let dotted = format!("{}/./all.ftok", d.display());
    let e = tokenize(&[dotted], &f, &tok, &out, 1, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is the output file") && e.contains("all.ftok"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    // A run that fails part way (row 3 of row group 0 is not UTF-8) leaves the previous output.
    let bad = d.join("sub");
    std::fs::create_dir(&bad).unwrap();
    let mut rows: Vec<Vec<u8>> = (0..8).map(|i| doc_text(i).into_bytes()).collect();
    rows[3] = b"caf\xe9".to_vec();
    let col: ArrayRef = Arc::new(BinaryArray::from_iter_values(rows.iter()));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "text",
        col.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![col]).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(bad.join("latin1.parquet")).unwrap(),
        schema,
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let e = tokenize(&[s(d)], &f, &tok, &out, 1, false).unwrap_err();
    assert!(matches!(e, DataError::NotUtf8 { .. }), "{e}");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "the previous output is kept"
    );
    no_tmp_left(d);
}

#[test]
fn progress_is_reported_after_every_unit() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_shard(dir.path(), "a.parquet", 0, 20, 7); // 3 row groups
    let b = write_shard(dir.path(), "b.parquet", 20, 10, 4); // 3 row groups
    let out = dir.path().join("x.ftok");
    let mut seen: Vec<Progress> = Vec::new();
    let f = Filters {
        min_int_score: Some(2),
        language: None,
    };
    let r = tokenize_with_progress(&[s(&a), s(&b)], &f, &Tokenizer::Bytes, &out, 2, false, &mut |p| {
        seen.push(*p)
    })
    .unwrap();
    assert_eq!(
        seen.iter().map(|p| p.units_done).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert!(seen.iter().all(|p| p.units == 6 && p.rows == 30));
    assert_eq!(
        seen.iter().map(|p| p.rows_done).collect::<Vec<_>>(),
        [7, 14, 20, 24, 28, 30]
    );
    assert!(seen
        .windows(2)
        .all(|w| w[0].docs <= w[1].docs && w[0].seconds <= w[1].seconds));
    let last = seen.last().unwrap();
    assert_eq!((last.docs, last.tokens), (r.docs, r.tokens));
    assert!(r.docs < 30, "the filter dropped rows: {}", r.docs);
    // Log lines: every unit with a zero interval, none within a long one.
    let mut log = ProgressLog::new(std::time::Duration::ZERO);
    let line = log.line(last).unwrap();
    assert!(
        line.starts_with("tokenize: 6/6 row groups, 30/30 rows (100.0%)")
            && line.contains(&format!("{} documents, {} tokens", r.docs, r.tokens)),
        "{line}"
    );
    let mut log = ProgressLog::new(std::time::Duration::from_secs(3600));
    assert!(seen.iter().all(|p| log.line(p).is_none()));
    let late = Progress {
        seconds: 3600.0,
        ..*last
    };
    assert!(log.line(&late).is_some());
    assert!(log.line(&late).is_none(), "not twice in one interval");
}

#[test]
fn make_shard_keeps_the_previous_output_when_it_fails() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.parquet");
    let a = dir.path().join("a.txt");
    std::fs::write(&a, "one\n\ntwo\n\nthree\n").unwrap();
    assert_eq!(
        flamia_data::makeshard::make_shard(std::slice::from_ref(&a), &out, 1, 2)
            .unwrap()
            .0,
        3
    );
    let before = std::fs::read(&out).unwrap();
    // The second input is missing: found after the first was written into the new shard.
    let e = flamia_data::makeshard::make_shard(&[a.clone(), dir.path().join("gone.txt")], &out, 1, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gone.txt"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    // JSON lines: a bad line after good ones.
    let j = dir.path().join("p.jsonl");
    std::fs::write(&j, "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\nnot json\n").unwrap();
    let e = flamia_data::makeshard::make_shard_jsonl(&j, &out, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 3"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
    no_tmp_left(dir.path());
    // make-synthetic writes through the same writer: complete file, no temporary left.
    let syn = dir.path().join("syn.parquet");
    let (rows, _) = flamia_data::makeshard::make_synthetic(&syn, 1, 16, 0).unwrap();
    let shard =
        flamia_data::source::open(&flamia_data::source::ShardSource::File(syn), &Filters::default()).unwrap();
    assert_eq!(shard.unit_rows.iter().sum::<usize>() as u64, rows);
    no_tmp_left(dir.path());
}

#[test]
fn inspect_of_a_directory_reports_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("x");
    std::fs::create_dir(&sub).unwrap();
    write_shard(dir.path(), "a.parquet", 0, 10, 4);
    write_shard(&sub, "b.parquet", 10, 7, 4);
    let reports = flamia_data::inspect::inspect(&s(dir.path()), &Tokenizer::Bytes, 100).unwrap();
    let got: Vec<(String, u64, usize)> = reports
        .iter()
        .map(|r| {
            let name = Path::new(&r.path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, r.rows, r.row_groups)
        })
        .collect();
    assert_eq!(
        got,
        [("a.parquet".to_string(), 10, 3), ("b.parquet".to_string(), 7, 2)]
    );
    assert_eq!(reports[1].docs_counted, 7);
    let e = flamia_data::inspect::inspect(&s(&dir.path().join("none/*.parquet")), &Tokenizer::Bytes, 1)
        .unwrap_err();
    assert!(matches!(e, DataError::NoShards { .. }), "{e}");
}
