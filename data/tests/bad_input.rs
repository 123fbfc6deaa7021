//! Bad input gives a typed error naming the file; `skip_bad_shards` logs and continues.

mod common;

use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use common::{docs_of, write_shard};
use flamia_data::{Config, DataError, Loader};

fn cfg(train: Vec<String>) -> Config {
    Config {
        train,
        seq_len: 32,
        batch_rows: 2,
        num_threads: 1,
        ..Config::default()
    }
}

fn err(c: &Config) -> DataError {
    Loader::new(c, 0, 1, None).unwrap_err()
}

fn no_text_column(path: &std::path::Path) {
    let schema = Arc::new(Schema::new(vec![Field::new("int_score", DataType::Int64, false)]));
    let col: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
    let batch = RecordBatch::try_new(schema.clone(), vec![col]).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn each_bad_shard_is_named_with_its_problem() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = write_shard(d, "good.parquet", 0, 30, 5);
    let s = |p: &std::path::Path| p.display().to_string();

    let missing = d.join("missing.parquet");
    let e = err(&cfg(vec![s(&missing)]));
    assert!(matches!(e, DataError::Open { .. }), "{e}");
    assert!(e.to_string().contains("missing.parquet"), "{e}");

    let bytes = std::fs::read(&good).unwrap();
    let truncated = d.join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let e = err(&cfg(vec![s(&truncated)]));
    assert!(matches!(e, DataError::Parquet { .. }), "{e}");
    assert!(
        e.to_string().contains("truncated.parquet") && e.to_string().contains("corrupt or truncated"),
        "{e}"
    );

    let corrupt = d.join("corrupt.parquet");
    std::fs::write(&corrupt, b"this is not a parquet file at all, just some bytes").unwrap();
    let e = err(&cfg(vec![s(&corrupt)]));
    assert!(e.to_string().contains("corrupt.parquet"), "{e}");

    let notext = d.join("notext.parquet");
    no_text_column(&notext);
    let e = err(&cfg(vec![s(&notext)]));
    assert!(matches!(e, DataError::Column { .. }), "{e}");
    assert!(
        e.to_string().contains("notext.parquet") && e.to_string().contains("`text` is missing"),
        "{e}"
    );

    let empty = d.join("empty.parquet");
    flamia_data::makeshard::ShardWriter::create(&empty, 8)
        .unwrap()
        .finish()
        .unwrap();
    let e = err(&cfg(vec![s(&empty)]));
    assert!(matches!(e, DataError::EmptyShard { .. }), "{e}");
    assert!(e.to_string().contains("empty.parquet"), "{e}");

    let e = err(&cfg(vec![format!("{}/nothing-*.parquet", d.display())]));
    assert!(matches!(e, DataError::NoShards { .. }), "{e}");

    let bad_tok = d.join("tokenizer.json");
    std::fs::write(&bad_tok, "{\"model\": 3}").unwrap();
    let c = Config {
        tokenizer: s(&bad_tok),
        ..cfg(vec![s(&good)])
    };
    let e = err(&c);
    assert!(
        matches!(e, DataError::Tokenizer { .. }) && e.to_string().contains("tokenizer.json"),
        "{e}"
    );

    // A filter needing a column the shard lacks.
    let c = Config {
        min_int_score: Some(3),
        ..cfg(vec![s(&notext)])
    };
    assert!(err(&c).to_string().contains("notext.parquet"));

    // skip_bad_shards: every bad shard is skipped, the good one is read in full.
    let all = vec![
        s(&missing),
        s(&truncated),
        s(&corrupt),
        s(&notext),
        s(&empty),
        s(&good),
    ];
    let c = Config {
        skip_bad_shards: true,
        val: all.clone(),
        ..cfg(all.clone())
    };
    let ids: Vec<u32> = Loader::validation(&c, 0, 1)
        .unwrap()
        .flat_map(|b| b.unwrap().tokens)
        .collect();
    let docs = docs_of(&ids);
    assert!(docs.len() >= 30 && docs[..30] == (0..30).map(common::doc_text).collect::<Vec<_>>()[..]);
    // Without it, the first bad shard stops the run.
    assert!(Loader::new(&cfg(all), 0, 1, None).is_err());
    // Only bad shards: nothing usable even when skipping.
    let c = Config {
        skip_bad_shards: true,
        ..cfg(vec![s(&corrupt), s(&empty)])
    };
    assert!(matches!(err(&c), DataError::NoData(_)));
}

#[test]
fn pretokenized_shards_feed_the_same_stream_and_check_their_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 70, 9);
    let out = dir.path().join("a.ftok");
    let tok = flamia_data::Tokenizer::Bytes;
    let specs = vec![p.display().to_string()];
    let filters = flamia_data::source::Filters::default();
    let r = flamia_data::pretokenize::tokenize(&specs, &filters, &tok, &out, 2, false).unwrap();
    assert_eq!(r.docs, 70);
    let take = |train: String| -> Vec<flamia_data::Batch> {
        let c = Config {
            shuffle: false,
            ..cfg(vec![train])
        };
        Loader::new(&c, 0, 1, None)
            .unwrap()
            .take(10)
            .map(|b| b.unwrap())
            .collect()
    };
    assert_eq!(take(p.display().to_string()), take(out.display().to_string()));
    let reports = flamia_data::inspect::inspect(&out.display().to_string(), &tok, 100).unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!((reports[0].rows, reports[0].format.as_str()), (70, "ftok"));
    // Truncated .ftok: named, reported at open.
    let bytes = std::fs::read(&out).unwrap();
    std::fs::write(&out, &bytes[..bytes.len() - 3]).unwrap();
    let e = Loader::new(&cfg(vec![out.display().to_string()]), 0, 1, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a.ftok") && e.contains("truncated"), "{e}");
}

#[test]
fn a_corrupt_row_group_fails_or_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "mid.parquet", 0, 30, 5);
    // Overwrite the page header of row group 1's `text` column: the footer stays valid.
    let meta = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&p).unwrap(),
    )
    .unwrap()
    .metadata()
    .clone();
    let at = meta.row_group(1).column(0).data_page_offset() as usize;
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[at..at + 12].fill(0xff);
    std::fs::write(&p, bytes).unwrap();
    let spec = vec![p.display().to_string()];
    let c = Config {
        val: spec.clone(),
        ..cfg(spec.clone())
    };
    let results: Vec<_> = Loader::validation(&c, 0, 1).unwrap().collect();
    let e = results
        .into_iter()
        .find_map(|r| r.err())
        .expect("the corrupt row group is an error");
    assert!(e.to_string().contains("mid.parquet"), "{e}");
    let c = Config {
        skip_bad_shards: true,
        ..c
    };
    let ids: Vec<u32> = Loader::validation(&c, 0, 1)
        .unwrap()
        .flat_map(|b| b.unwrap().tokens)
        .collect();
    let want: Vec<String> = (0..30)
        .filter(|i| !(5..10).contains(i))
        .map(common::doc_text)
        .collect();
    let docs = docs_of(&ids);
    assert_eq!(docs[..want.len()], want[..]);
}

#[test]
fn a_pretokenized_shard_from_another_tokenizer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 10, 5);
    let out = dir.path().join("a.ftok");
    let filters = flamia_data::source::Filters::default();
    let tok = flamia_data::Tokenizer::Bytes;
    flamia_data::pretokenize::tokenize(&[p.display().to_string()], &filters, &tok, &out, 1, false).unwrap();
    // A byte-level BPE with no merges: a different tokenizer from "bytes".
    let ranks = dir.path().join("bytes.tiktoken");
    let lines: String = (0..=255u8)
        .map(|b| format!("{} {b}\n", flamia_data::tiktoken::b64_encode(&[b])))
        .collect();
    std::fs::write(&ranks, lines).unwrap();
    let tj = dir.path().join("tokenizer.json");
    flamia_data::tiktoken::convert(&ranks, "llama3", &tj).unwrap();
    let c = Config {
        tokenizer: tj.display().to_string(),
        ..cfg(vec![out.display().to_string()])
    };
    let e = err(&c).to_string();
    assert!(
        e.contains("a.ftok") && e.contains("made with tokenizer bytes"),
        "{e}"
    );
}

#[test]
fn filters_with_pretokenized_shards_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 30, 5);
    let out = dir.path().join("a.ftok");
    let tok = flamia_data::Tokenizer::Bytes;
    let none = flamia_data::source::Filters::default();
    flamia_data::pretokenize::tokenize(&[p.display().to_string()], &none, &tok, &out, 1, false).unwrap();
    let ftok = vec![out.display().to_string()];
    // Unfiltered, the shard loads.
    Loader::new(&cfg(ftok.clone()), 0, 1, None).unwrap();
    for (score, language) in [(Some(3), None), (None, Some("en".to_string()))] {
        for skip_bad_shards in [false, true] {
            let c = Config {
                min_int_score: score,
                language: language.clone(),
                skip_bad_shards,
                ..cfg(ftok.clone())
            };
            let e = err(&c);
            assert!(matches!(e, DataError::Config(_)), "{e}");
            let m = e.to_string();
            assert!(
                m.contains("a.ftok") && m.contains("flamia data tokenize") && m.contains("unset them"),
                "{m}"
            );
            assert!(
                m.contains(if score.is_some() {
                    "min_int_score = 3"
                } else {
                    "language = \"en\""
                }),
                "{m}"
            );
            let e = Loader::validation(
                &Config {
                    val: ftok.clone(),
                    ..c
                },
                0,
                1,
            )
            .unwrap_err();
            assert!(matches!(e, DataError::Config(_)), "{e}");
        }
    }
    // Re-tokenising a .ftok with a filter is refused the same way.
    let filters = flamia_data::source::Filters {
        min_int_score: Some(3),
        language: None,
    };
    let again = dir.path().join("b.ftok");
    let e = flamia_data::pretokenize::tokenize(&ftok, &filters, &tok, &again, 1, true).unwrap_err();
    assert!(matches!(e, DataError::Config(_)), "{e}");
}

#[test]
fn a_pretokenized_shard_from_the_old_special_token_encoding_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tj = dir.path().join("tokenizer.json");
    std::fs::write(&tj, flamia_data::tokenizer::byte_tokenizer_json().to_string()).unwrap();
    let tok = flamia_data::Tokenizer::from_file(&tj).unwrap();
    // A shard written by the version that encoded special-token text as special ids: its
    // fingerprint had the `hf:` tag.
    let old_fp = tok
        .fingerprint()
        .replacen(flamia_data::tokenizer::HF_FINGERPRINT_TAG, "hf", 1);
    assert!(old_fp.starts_with("hf:"), "{old_fp}");
    let out = dir.path().join("old.ftok");
    let mut w = flamia_data::tokshard::TokWriter::create(&out, &old_fp).unwrap();
    w.push(&[104, 105]).unwrap();
    w.finish().unwrap();
    let c = Config {
        tokenizer: tj.display().to_string(),
        ..cfg(vec![out.display().to_string()])
    };
    let e = err(&c);
    assert!(matches!(e, DataError::TokShard { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("old.ftok") && m.contains("older flamia") && m.contains("re-run `flamia data tokenize`"),
        "{m}"
    );
    // The same shard written now loads.
    let now = dir.path().join("now.ftok");
    let mut w = flamia_data::tokshard::TokWriter::create(&now, &tok.fingerprint()).unwrap();
    w.push(&[104, 105]).unwrap();
    w.finish().unwrap();
    Loader::new(
        &Config {
            tokenizer: tj.display().to_string(),
            ..cfg(vec![now.display().to_string()])
        },
        0,
        1,
        None,
    )
    .unwrap();
}
