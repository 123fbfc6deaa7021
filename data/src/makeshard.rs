//! Writing FineWeb-Edu-schema parquet shards: `flamia data make-shard` (text files split into
//! paragraph-aligned documents, used to build the embedded shards reproducibly; or JSON lines,
//! one document per line, as `scripts/make-corpus.py` writes them) and a synthetic shard
//! generator for memory and throughput measurements. Shards are written as `OUT.tmp` and renamed
//! over `OUT` when complete ([`crate::atomic`]), so a failure leaves the previous `OUT`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rand::{Rng, SeedableRng};

use crate::atomic::Staged;
use crate::error::{DataError, Result};

/// Target document size of `make-shard` in characters (documents end at a paragraph break).
pub const DEFAULT_DOC_CHARS: usize = 4000;
/// Rows per row group of `make-shard` (small groups give the embedded shard many units to deal
/// to ranks).
pub const DEFAULT_ROWS_PER_GROUP: usize = 64;

/// One row of the FineWeb-Edu schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Document text.
    pub text: String,
    /// Unique id.
    pub id: String,
    /// Crawl dump name (free text for non-crawl sources).
    pub dump: String,
    /// Source URL or name.
    pub url: String,
    /// Source file.
    pub file_path: String,
    /// Language code.
    pub language: String,
    /// Language-id confidence.
    pub language_score: f64,
    /// Tokens of the text under the producer's tokenizer.
    pub token_count: i64,
    /// Educational score.
    pub score: f64,
    /// Rounded educational score.
    pub int_score: i64,
}

/// The FineWeb-Edu arrow schema.
pub fn fineweb_schema() -> Arc<Schema> {
    let s = |n: &str| Field::new(n, DataType::Utf8, true);
    Arc::new(Schema::new(vec![
        s("text"),
        s("id"),
        s("dump"),
        s("url"),
        s("file_path"),
        s("language"),
        Field::new("language_score", DataType::Float64, true),
        Field::new("token_count", DataType::Int64, true),
        Field::new("score", DataType::Float64, true),
        Field::new("int_score", DataType::Int64, true),
    ]))
}

/// Writes rows into a zstd-compressed parquet shard, one row group per `rows_per_group` rows,
/// under a temporary name renamed into place by [`ShardWriter::finish`] (dropped unfinished, the
/// temporary file is removed and `path` left as it was).
pub struct ShardWriter {
    path: PathBuf,
    staged: Staged,
    writer: ArrowWriter<File>,
    pending: Vec<Row>,
    rows_per_group: usize,
    rows: u64,
}

impl ShardWriter {
    /// Starts `path` (written as `path.tmp` until [`ShardWriter::finish`]).
    pub fn create(path: &Path, rows_per_group: usize) -> Result<Self> {
        let werr = |problem: String| DataError::Write {
            path: path.into(),
            problem,
        };
        let (staged, file) = Staged::create(path)?;
        let level = ZstdLevel::try_new(9).map_err(|e| werr(e.to_string()))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(level))
            .set_max_row_group_size(rows_per_group.max(1))
            .build();
        let writer =
            ArrowWriter::try_new(file, fineweb_schema(), Some(props)).map_err(|e| werr(e.to_string()))?;
        Ok(ShardWriter {
            path: path.into(),
            staged,
            writer,
            pending: Vec::new(),
            rows_per_group: rows_per_group.max(1),
            rows: 0,
        })
    }

    /// Adds a row; a full group is written out at once (memory holds one group).
    pub fn push(&mut self, row: Row) -> Result<()> {
        self.pending.push(row);
        if self.pending.len() == self.rows_per_group {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.pending);
        let strs =
            |f: fn(&Row) -> &str| Arc::new(StringArray::from_iter_values(rows.iter().map(f))) as ArrayRef;
        let cols: Vec<ArrayRef> = vec![
            strs(|r| &r.text),
            strs(|r| &r.id),
            strs(|r| &r.dump),
            strs(|r| &r.url),
            strs(|r| &r.file_path),
            strs(|r| &r.language),
            Arc::new(Float64Array::from_iter_values(
                rows.iter().map(|r| r.language_score),
            )),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.token_count))),
            Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.score))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.int_score))),
        ];
        let werr = |problem: String| DataError::Write {
            path: self.path.clone(),
            problem,
        };
        let batch = RecordBatch::try_new(fineweb_schema(), cols).map_err(|e| werr(e.to_string()))?;
        self.writer.write(&batch).map_err(|e| werr(e.to_string()))?;
        self.writer.flush().map_err(|e| werr(e.to_string()))?;
        self.rows += rows.len() as u64;
        Ok(())
    }

    /// Writes the last group and the footer, fsyncs and renames the shard into place; returns
    /// the row count.
    pub fn finish(mut self) -> Result<u64> {
        self.flush()?;
        let path = self.path.clone();
        let file = self.writer.into_inner().map_err(|e| DataError::Write {
            path,
            problem: e.to_string(),
        })?;
        self.staged.commit(file)?;
        Ok(self.rows)
    }
}

/// Splits `text` into documents of about `target_chars` characters at blank-line (paragraph)
/// boundaries; CRLF is normalised and surrounding whitespace trimmed.
pub fn split_documents(text: &str, target_chars: usize) -> Vec<String> {
    let text = text.replace("\r\n", "\n");
    let mut docs = Vec::new();
    let mut cur = String::new();
    for para in text.split("\n\n") {
        let para = para.trim_matches('\n');
        if para.trim().is_empty() {
            continue;
        }
        if !cur.is_empty() {
            cur.push_str("\n\n");
        }
        cur.push_str(para);
        if cur.len() >= target_chars {
            docs.push(std::mem::take(&mut cur));
        }
    }
    if !cur.trim().is_empty() {
        docs.push(cur);
    }
    docs
}

/// `flamia data make-shard`: documents from text files (in the order given) into one shard.
/// Metadata columns are constants for non-crawl text: dump `flamia-embedded`, url and file_path the
/// file name, language `en` (score 1.0), score 3.0 / int_score 3, token_count the UTF-8 byte count.
pub fn make_shard(
    files: &[PathBuf],
    out: &Path,
    target_chars: usize,
    rows_per_group: usize,
) -> Result<(u64, u64)> {
    let mut w = ShardWriter::create(out, rows_per_group)?;
    let mut bytes = 0u64;
    for f in files {
        let raw = std::fs::read(f).map_err(|e| DataError::Input {
            path: f.clone(),
            problem: e.to_string(),
        })?;
        let text = String::from_utf8(raw).map_err(|e| DataError::Input {
            path: f.clone(),
            problem: format!("not UTF-8 text: {e}"),
        })?;
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = f
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (i, doc) in split_documents(&text, target_chars).into_iter().enumerate() {
            bytes += doc.len() as u64;
            w.push(Row {
                token_count: doc.len() as i64,
                text: doc,
                id: format!("{stem}/{i:04}"),
                dump: "flamia-embedded".into(),
                url: name.clone(),
                file_path: name.clone(),
                language: "en".into(),
                language_score: 1.0,
                score: 3.0,
                int_score: 3,
            })?;
        }
    }
    Ok((w.finish()?, bytes))
}

/// `flamia data make-shard --jsonl`: one document per JSON line into one shard. `text` is
/// required; `id`, `dump`, `url`, `file_path`, `language` (strings), `language_score`, `score`
/// (numbers), `token_count`, `int_score` (integers) are taken when present (defaults: id =
/// `<file stem>/<line>`, language `en` with score 1.0, score 3.0 / int_score 3, token_count = UTF-8
/// bytes). Returns (rows, text bytes).
pub fn make_shard_jsonl(input: &Path, out: &Path, rows_per_group: usize) -> Result<(u64, u64)> {
    use std::io::BufRead;
    let bad = |problem: String| DataError::Input {
        path: input.into(),
        problem,
    };
    let f = File::open(input).map_err(|e| bad(e.to_string()))?;
    let stem = input
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut w = ShardWriter::create(out, rows_per_group)?;
    let mut bytes = 0u64;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| bad(format!("line {}: {e}", i + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| bad(format!("line {}: invalid JSON: {e}", i + 1)))?;
        let text = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| bad(format!("line {}: no string field \"text\"", i + 1)))?
            .to_string();
        let st = |k: &str, d: String| v.get(k).and_then(|x| x.as_str()).map_or(d, str::to_string);
        let num = |k: &str, d: f64| v.get(k).and_then(|x| x.as_f64()).unwrap_or(d);
        let int = |k: &str, d: i64| v.get(k).and_then(|x| x.as_i64()).unwrap_or(d);
        bytes += text.len() as u64;
        w.push(Row {
            token_count: int("token_count", text.len() as i64),
            id: st("id", format!("{stem}/{i}")),
            dump: st("dump", "flamia-jsonl".into()),
            url: st("url", String::new()),
            file_path: st("file_path", String::new()),
            language: st("language", "en".into()),
            language_score: num("language_score", 1.0),
            score: num("score", 3.0),
            int_score: int("int_score", 3),
            text,
        })?;
    }
    Ok((w.finish()?, bytes))
}

/// A synthetic shard of about `mb` MiB of text (pseudo-random words, documents of 1-16 KiB, with
/// varied `int_score` and `language`), for memory and throughput measurements. Deterministic in
/// `seed`. Returns (rows, text bytes).
pub fn make_synthetic(out: &Path, mb: u64, rows_per_group: usize, seed: u64) -> Result<(u64, u64)> {
    const WORDS: [&str; 16] = [
        "the", "of", "energy", "cell", "history", "students", "water", "and", "learn", "river", "theory",
        "a", "measure", "planet", "in", "language",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut w = ShardWriter::create(out, rows_per_group)?;
    let (mut bytes, mut i) = (0u64, 0u64);
    while bytes < mb << 20 {
        let want = rng.random_range(1024..16 * 1024);
        let mut text = String::with_capacity(want + 16);
        while text.len() < want {
            text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
            // Random digits keep the text from compressing to nothing.
            text.push_str(&rng.random_range(0..1000u32).to_string());
            text.push(' ');
        }
        bytes += text.len() as u64;
        w.push(Row {
            token_count: text.len() as i64,
            text,
            id: format!("synthetic/{i}"),
            dump: "synthetic".into(),
            url: String::new(),
            file_path: String::new(),
            language: if i % 10 == 0 { "fr".into() } else { "en".into() },
            language_score: 0.9,
            score: (i % 6) as f64,
            int_score: (i % 6) as i64,
        })?;
        i += 1;
    }
    Ok((w.finish()?, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_documents_become_rows() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("pages.jsonl");
        std::fs::write(
            &input,
            "{\"text\": \"first page\", \"url\": \"file:///a.html\", \"id\": \"a\"}\n\n{\"text\": \"second\"}\n",
        )
        .unwrap();
        let out = dir.path().join("s.parquet");
        assert_eq!(make_shard_jsonl(&input, &out, 1).unwrap(), (2, 16));
        let shard = crate::source::open(
            &crate::source::ShardSource::File(out.clone()),
            &crate::source::Filters::default(),
        )
        .unwrap();
        assert_eq!(shard.unit_rows, vec![1, 1]);
        std::fs::write(&input, "{\"txt\": 1}\n").unwrap();
        let e = make_shard_jsonl(&input, &out, 1).unwrap_err().to_string();
        assert!(e.contains("pages.jsonl") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn split_keeps_paragraphs_and_all_text() {
        let t = "a b\r\n\r\nc d\n\n\n\ne f\n\ng";
        let d = split_documents(t, 3);
        assert_eq!(d, vec!["a b", "c d", "e f", "g"]);
        let d = split_documents(t, 100);
        assert_eq!(d, vec!["a b\n\nc d\n\ne f\n\ng"]);
    }
}
