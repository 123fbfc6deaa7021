//! Shards as they ship: Hugging Face directory layouts, every parquet codec, string columns of any
//! arrow string type, bytes that are not UTF-8, empty files, held-out validation splits, and the
//! footer parsed once per file.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, DictionaryArray, LargeStringArray, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use common::{doc_text, docs_of, write_shard};
use flamia_data::source::Filters;
use flamia_data::{Config, DataError, Loader, Plan};
use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;

fn cfg(train: Vec<String>) -> Config {
    Config {
        val: train.clone(),
        train,
        seq_len: 64,
        batch_rows: 4,
        num_threads: 1,
        ..Config::default()
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Every document of a one-pass loader over `c.val`.
fn val_docs(c: &Config) -> Vec<String> {
    let ids: Vec<u32> = Loader::validation(c, 0, 1)
        .unwrap()
        .flat_map(|b| b.unwrap().tokens)
        .collect();
    docs_of(&ids)
}

/// A one-column (`text`) parquet file with `rows_per_group` rows per row group.
fn write_column(path: &Path, col: ArrayRef, compression: Compression, rows_per_group: usize) {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "text",
        col.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![col]).unwrap();
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_size(rows_per_group)
        .build();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props))
            .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(doc_text).collect()
}

#[test]
fn directories_are_searched_recursively_like_hf_datasets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("data").join("CC-MAIN-2024-10");
    std::fs::create_dir_all(&d).unwrap();
    write_shard(&d, "train-00000-of-00002.parquet", 0, 20, 7);
    write_shard(&d, "train-00001-of-00002.parquet", 20, 15, 7);
    // Partial downloads under .cache/ and other files are not shards.
    let cache = dir.path().join("data").join(".cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("x.parquet"), b"partial").unwrap();
    std::fs::write(dir.path().join("data").join("README.md"), b"# card").unwrap();
    let c = cfg(vec![s(&dir.path().join("data"))]);
    assert_eq!(val_docs(&c), texts(35));
    // A glob naming directories walks them too.
    let c = cfg(vec![format!("{}/data/CC-*", dir.path().display())]);
    assert_eq!(val_docs(&c), texts(35));
    // A glob skips what a directory skips: names starting with `.` and files that are not shards.
    std::fs::write(dir.path().join("data").join(".partial.parquet"), b"partial").unwrap();
    let c = cfg(vec![format!("{}/data/*", dir.path().display())]);
    assert_eq!(val_docs(&c), texts(35));
    let c = cfg(vec![format!("{}/data/*.parquet", dir.path().display())]);
    let e = Loader::validation(&c, 0, 1).unwrap_err();
    assert!(matches!(e, DataError::NoShards { .. }), "{e}");
}

#[test]
fn every_parquet_codec_reads() {
    let dir = tempfile::tempdir().unwrap();
    let col: ArrayRef = Arc::new(StringArray::from(texts(30)));
    for (name, codec) in [
        ("none", Compression::UNCOMPRESSED),
        ("snappy", Compression::SNAPPY),
        ("gzip", Compression::GZIP(GzipLevel::default())),
        ("lz4", Compression::LZ4),
        ("lz4raw", Compression::LZ4_RAW),
        ("brotli", Compression::BROTLI(BrotliLevel::default())),
        ("zstd", Compression::ZSTD(ZstdLevel::default())),
    ] {
        let p = dir.path().join(format!("{name}.parquet"));
        write_column(&p, col.clone(), codec, 10);
        assert_eq!(val_docs(&cfg(vec![s(&p)])), texts(30), "codec {name}");
    }
}

#[test]
fn dictionary_large_view_and_binary_text_columns_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let t = texts(25);
    let dict: DictionaryArray<Int32Type> = t.iter().map(String::as_str).collect();
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("dict", Arc::new(dict)),
        ("large", Arc::new(LargeStringArray::from(t.clone()))),
        (
            "view",
            Arc::new(arrow::array::StringViewArray::from_iter_values(t.iter())),
        ),
        (
            "binary",
            Arc::new(BinaryArray::from_iter_values(t.iter().map(|x| x.as_bytes()))),
        ),
    ];
    for (name, col) in cols {
        let p = dir.path().join(format!("{name}.parquet"));
        write_column(&p, col, Compression::SNAPPY, 8);
        assert_eq!(val_docs(&cfg(vec![s(&p)])), t, "{name} column");
    }
    // A column that is not text is refused with its type.
    let p = dir.path().join("ints.parquet");
    write_column(
        &p,
        Arc::new(arrow::array::Int64Array::from(vec![1, 2])),
        Compression::SNAPPY,
        8,
    );
    let e = Loader::validation(&cfg(vec![s(&p)]), 0, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ints.parquet") && e.contains("Int64"), "{e}");
    let _ = DataType::Utf8;
}

#[test]
fn text_that_is_not_utf8_is_named_or_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<Vec<u8>> = texts(12).into_iter().map(String::into_bytes).collect();
    rows[9] = b"caf\xe9 latin-1".to_vec();
    let p = dir.path().join("latin1.parquet");
    write_column(
        &p,
        Arc::new(BinaryArray::from_iter_values(rows.iter())),
        Compression::SNAPPY,
        5,
    );
    let c = cfg(vec![s(&p)]);
    let e = Loader::validation(&c, 0, 1)
        .unwrap()
        .find_map(|b| b.err())
        .expect("the bad row is an error");
    assert!(matches!(e, DataError::NotUtf8 { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.contains("latin1.parquet") && m.contains("row 4 of row group 1") && m.contains("offset 3"),
        "{m}"
    );
    let c = Config {
        skip_bad_shards: true,
        ..c
    };
    let mut l = Loader::validation(&c, 0, 1).unwrap();
    let mut ids = Vec::new();
    while let Some(b) = l.next_batch().unwrap() {
        ids.extend(b.tokens);
    }
    let want: Vec<String> = (0..12).filter(|&i| i != 9).map(doc_text).collect();
    assert_eq!(docs_of(&ids), want);
    assert_eq!((l.drops().bad_utf8, l.drops().rows()), (1, 1));
}

#[test]
fn an_empty_file_is_named_or_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("train-00001-of-00002.parquet");
    std::fs::write(&empty, b"").unwrap();
    let good = write_shard(dir.path(), "train-00000-of-00002.parquet", 0, 10, 5);
    let c = cfg(vec![s(dir.path())]);
    let e = Loader::validation(&c, 0, 1).unwrap_err();
    assert!(matches!(e, DataError::EmptyFile { .. }), "{e}");
    assert!(e.to_string().contains("train-00001-of-00002.parquet") && e.to_string().contains("0 bytes"));
    let c = Config {
        skip_bad_shards: true,
        ..c
    };
    assert_eq!(val_docs(&c), texts(10));
    let _ = good;
}

#[test]
fn the_footer_is_read_once_per_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_shard(dir.path(), "a.parquet", 0, 40, 10);
    let plan = Plan::build(&[s(&p)], &Filters::default(), false).unwrap();
    assert_eq!(plan.units.len(), 4);
    // Destroy the footer after opening: row groups still read, so it was not parsed again.
    let mut bytes = std::fs::read(&p).unwrap();
    let n = bytes.len();
    bytes[n - 8..].fill(0);
    std::fs::write(&p, &bytes).unwrap();
    let docs: Vec<String> = plan
        .documents(&Filters::default(), None)
        .unwrap()
        .into_iter()
        .map(|d| match d {
            flamia_data::source::RawDoc::Text(t) => t,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(docs, texts(40));
}

fn shard_files(dir: &Path) -> Vec<PathBuf> {
    vec![
        write_shard(dir, "train-00000-of-00003.parquet", 0, 100, 5),
        write_shard(dir, "train-00001-of-00003.parquet", 100, 100, 5),
        write_shard(dir, "train-00002-of-00003.parquet", 200, 100, 5),
    ]
}

#[test]
fn a_validation_split_is_held_out_of_the_training_files() {
    let dir = tempfile::tempdir().unwrap();
    shard_files(dir.path());
    let f = Filters::default();
    let all: Vec<String> = texts(300);
    let doc_texts = |p: &Plan| -> Vec<String> {
        p.documents(&f, None)
            .unwrap()
            .into_iter()
            .map(|d| match d {
                flamia_data::source::RawDoc::Text(t) => t,
                other => panic!("{other:?}"),
            })
            .collect()
    };
    // A deterministic fraction of row groups.
    let c = Config {
        val: vec![],
        holdout_fraction: 0.1,
        ..cfg(vec![s(dir.path())])
    };
    let train = Plan::training(&c, &f).unwrap();
    let val = Plan::validation(&c, &f).unwrap();
    assert_eq!(train.units.len() + val.units.len(), 60);
    assert!(
        (2..=14).contains(&val.units.len()),
        "{} of 60 held out",
        val.units.len()
    );
    let (mut t, v) = (doc_texts(&train), doc_texts(&val));
    assert!(v.iter().all(|d| !t.contains(d)), "disjoint");
    t.extend(v.iter().cloned());
    t.sort();
    let mut want = all.clone();
    want.sort();
    assert_eq!(t, want, "together they cover every document");
    // The validation loader reads exactly the held-out documents, in order.
    assert_eq!(val_docs(&c), v);
    // The same split again (deterministic).
    assert_eq!(doc_texts(&Plan::validation(&c, &f).unwrap()), v);

    // A held-out file pattern.
    let c = Config {
        val: vec![],
        holdout_files: vec!["*-00002-of-*.parquet".into()],
        ..cfg(vec![s(dir.path())])
    };
    assert_eq!(val_docs(&c), texts(300)[200..].to_vec());
    let train = doc_texts(&Plan::training(&c, &f).unwrap());
    assert_eq!(train, texts(200));
    // The training loader never sees a held-out document.
    let mut l = Loader::new(&c, 0, 1, None).unwrap();
    for _ in 0..40 {
        let b = l.next_batch().unwrap().unwrap();
        let ids: Vec<u32> = b.tokens.iter().copied().filter(|&t| t < 256).collect();
        let text = String::from_utf8(ids.iter().map(|&t| t as u8).collect()).unwrap();
        for i in 200..300 {
            assert!(
                !text.contains(&format!("<{i}>")),
                "held-out document {i} in training"
            );
        }
    }
    // Holding out everything is an error that says so.
    let c = Config {
        val: vec![],
        holdout_files: vec!["*.parquet".into()],
        ..cfg(vec![s(dir.path())])
    };
    let e = Loader::new(&c, 0, 1, None).unwrap_err().to_string();
    assert!(e.contains("no training data"), "{e}");
}

#[test]
fn tokenize_drops_only_the_rows_that_are_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<Vec<u8>> = texts(12).into_iter().map(String::into_bytes).collect();
    rows[6] = b"caf\xe9 latin-1".to_vec();
    let p = dir.path().join("latin1.parquet");
    write_column(
        &p,
        Arc::new(BinaryArray::from_iter_values(rows.iter())),
        Compression::SNAPPY,
        5,
    );
    let tok = flamia_data::Tokenizer::Bytes;
    let out = dir.path().join("latin1.ftok");
    let e =
        flamia_data::pretokenize::tokenize(&[s(&p)], &Filters::default(), &tok, &out, 1, false).unwrap_err();
    assert!(matches!(e, DataError::NotUtf8 { .. }), "{e}");
    let r = flamia_data::pretokenize::tokenize(&[s(&p)], &Filters::default(), &tok, &out, 2, true).unwrap();
    assert_eq!(r.docs, 11);
    assert_eq!((r.drops.bad_utf8, r.drops.bad_units, r.drops.rows()), (1, 0, 1));
    // The rest of row group 1 (rows 5, 7, 8, 9) is in the shard, in order.
    let want: Vec<String> = (0..12).filter(|&i| i != 6).map(doc_text).collect();
    assert_eq!(val_docs(&cfg(vec![s(&out)])), want);
}
