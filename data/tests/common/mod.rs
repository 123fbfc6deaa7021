//! Shared helpers of the data crate's tests: small FineWeb-schema shards with known documents.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use flamia_data::makeshard::{Row, ShardWriter};

/// Document `i` of the test shards: unique, varied lengths (1..=80 bytes).
pub fn doc_text(i: usize) -> String {
    let len = 1 + (i * 37) % 80;
    let mut s = format!("<{i}>");
    while s.len() < len {
        s.push(char::from(b'a' + (i % 26) as u8));
    }
    s
}

/// A row of `text` with the given score and language.
pub fn row(text: String, int_score: i64, language: &str) -> Row {
    Row {
        token_count: text.len() as i64,
        text,
        id: String::new(),
        dump: "test".into(),
        url: String::new(),
        file_path: String::new(),
        language: language.into(),
        language_score: 1.0,
        score: int_score as f64,
        int_score,
    }
}

/// Writes documents `first..first+n` into `dir/name` with `per_group` rows per row group.
pub fn write_shard(dir: &Path, name: &str, first: usize, n: usize, per_group: usize) -> PathBuf {
    let p = dir.join(name);
    let mut w = ShardWriter::create(&p, per_group).unwrap();
    for i in first..first + n {
        w.push(row(
            doc_text(i),
            (i % 6) as i64,
            if i % 3 == 0 { "fr" } else { "en" },
        ))
        .unwrap();
    }
    w.finish().unwrap();
    p
}

/// Splits a byte-tokenizer id stream into document texts: every document is
/// `<|begin_of_text|>` (257) + bytes + `<|end_of_text|>` (256) (padding end-of-text ids at the end
/// are skipped); panics on any other layout.
pub fn docs_of(ids: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<Vec<u8>> = None;
    for (i, &t) in ids.iter().enumerate() {
        match (t, cur.as_mut()) {
            (257, None) => cur = Some(Vec::new()),
            (256, Some(_)) => out.push(String::from_utf8(cur.take().unwrap()).unwrap()),
            (0..=255, Some(c)) => c.push(t as u8),
            // The padding of a validation pass's last row: end-of-text to the end.
            (256, None) if ids[i..].iter().all(|&x| x == 256) => break,
            _ => panic!(
                "token {t} at {i} breaks the [BOS] text [EOS] layout: {:?}",
                &ids[i.saturating_sub(5)..(i + 5).min(ids.len())]
            ),
        }
    }
    out
}
