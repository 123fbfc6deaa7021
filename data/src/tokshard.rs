//! The pre-tokenised shard format (`.ftok`), written by `flamia data tokenize` for runs where
//! tokenising on the fly would starve the GPUs.
//!
//! Layout (little-endian): magic `FLAMTOK1` (8 bytes), `n_docs: u64`, `n_tokens: u64`,
//! `fp_len: u32`, the tokenizer fingerprint (`fp_len` UTF-8 bytes), then `tokens: [u32; n_tokens]`
//! (documents back to back, without end-of-text: the loader appends it), then
//! `offsets: [u64; n_docs + 1]` (document `i` is `tokens[offsets[i]..offsets[i+1]]`). Units are
//! chunks of [`DOCS_PER_UNIT`] documents, read one at a time by seeking.
//!
//! [`TokWriter`] writes `OUT.tmp` and renames it over `OUT` in [`TokWriter::finish`]
//! ([`crate::atomic`]): a failed or killed run leaves the previous `OUT` as it was.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::atomic::Staged;
use crate::error::{DataError, Result};

/// File magic.
pub const MAGIC: &[u8; 8] = b"FLAMTOK1";
/// Documents per unit (the granularity of rank sharding and shuffling).
pub const DOCS_PER_UNIT: usize = 1024;

/// Streams documents into a `.ftok` file; offsets are kept in memory (8 bytes per document).
/// The file is written under a temporary name and renamed into place by [`TokWriter::finish`];
/// dropped unfinished, it removes the temporary file and leaves `path` untouched.
pub struct TokWriter {
    path: PathBuf,
    staged: Staged,
    out: BufWriter<File>,
    offsets: Vec<u64>,
}

impl TokWriter {
    /// Starts `path` (as `path.tmp`) for documents tokenised by the tokenizer with `fingerprint`.
    pub fn create(path: &Path, fingerprint: &str) -> Result<Self> {
        let werr = |e: std::io::Error| DataError::Write {
            path: path.into(),
            problem: e.to_string(),
        };
        let (staged, file) = Staged::create(path)?;
        let mut out = BufWriter::new(file);
        out.write_all(MAGIC).map_err(werr)?;
        out.write_all(&[0u8; 16]).map_err(werr)?; // n_docs, n_tokens: patched in finish()
        out.write_all(&(fingerprint.len() as u32).to_le_bytes())
            .map_err(werr)?;
        out.write_all(fingerprint.as_bytes()).map_err(werr)?;
        Ok(TokWriter {
            path: path.into(),
            staged,
            out,
            offsets: vec![0],
        })
    }

    /// Appends one document's ids.
    pub fn push(&mut self, ids: &[u32]) -> Result<()> {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        for &t in ids {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        self.out.write_all(&buf).map_err(|e| self.werr(e))?;
        let last = self.offsets.last().copied().unwrap_or(0);
        self.offsets.push(last + ids.len() as u64);
        Ok(())
    }

    /// Writes the offsets and header counts, fsyncs and renames the file into place; returns
    /// (documents, tokens).
    pub fn finish(mut self) -> Result<(u64, u64)> {
        let n_docs = (self.offsets.len() - 1) as u64;
        let n_tokens = self.offsets.last().copied().unwrap_or(0);
        let mut buf = Vec::with_capacity(self.offsets.len() * 8);
        for &o in &self.offsets {
            buf.extend_from_slice(&o.to_le_bytes());
        }
        self.out.write_all(&buf).map_err(|e| self.werr(e))?;
        let mut f = self.out.into_inner().map_err(|e| DataError::Write {
            path: self.path.clone(),
            problem: e.to_string(),
        })?;
        let werr = |e: std::io::Error| DataError::Write {
            path: self.path.clone(),
            problem: e.to_string(),
        };
        f.seek(SeekFrom::Start(8)).map_err(werr)?;
        f.write_all(&n_docs.to_le_bytes()).map_err(werr)?;
        f.write_all(&n_tokens.to_le_bytes()).map_err(werr)?;
        self.staged.commit(f)?;
        Ok((n_docs, n_tokens))
    }

    fn werr(&self, e: std::io::Error) -> DataError {
        DataError::Write {
            path: self.path.clone(),
            problem: e.to_string(),
        }
    }
}

/// `; it was written by an older flamia ...` for a shard fingerprint `found` from a version 1
/// `tokenizer.json` encoding (`hf:...`, which turned special-token text inside documents into
/// special ids), else empty: appended to the error that refuses such a shard.
pub fn old_fingerprint_hint(found: &str) -> String {
    if found.starts_with("hf:") {
        format!(
            "; it was written by an older flamia whose encoding differs ({found:?} is a version 1 fingerprint, this build writes {}): re-run `flamia data tokenize` on its parquet shards",
            crate::tokenizer::HF_FINGERPRINT_TAG
        )
    } else {
        String::new()
    }
}

/// Reads the header of a `.ftok` file and its units on demand.
#[derive(Debug)]
pub struct TokReader {
    path: PathBuf,
    file: File,
    /// Documents in the file.
    pub n_docs: u64,
    /// Tokens in the file.
    pub n_tokens: u64,
    /// Fingerprint of the tokenizer that wrote it.
    pub fingerprint: String,
    tokens_at: u64,
}

impl TokReader {
    /// Opens and checks the header and the file length (a truncated file is reported here).
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |problem: String| DataError::TokShard {
            path: path.into(),
            problem,
        };
        let mut file = File::open(path).map_err(|e| DataError::Open {
            path: path.into(),
            source: e,
        })?;
        let len = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        let mut head = [0u8; 28];
        file.read_exact(&mut head)
            .map_err(|_| bad(format!("only {len} bytes: shorter than the header")))?;
        if &head[..8] != MAGIC {
            return Err(bad(
                "wrong magic: not a flamia pre-tokenised shard (made by `flamia data tokenize`)".into(),
            ));
        }
        let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap_or([0; 8]));
        let (n_docs, n_tokens) = (u64_at(8), u64_at(16));
        let fp_len = u32::from_le_bytes(head[24..28].try_into().unwrap_or([0; 4])) as u64;
        if fp_len > 4096 {
            return Err(bad(format!(
                "fingerprint length {fp_len} is corrupt (at most 4096)"
            )));
        }
        let mut fp = vec![0u8; fp_len as usize];
        file.read_exact(&mut fp)
            .map_err(|_| bad("truncated inside the header".into()))?;
        let tokens_at = 28 + fp_len;
        let want = n_tokens
            .checked_mul(4)
            .and_then(|t| {
                n_docs
                    .checked_add(1)?
                    .checked_mul(8)?
                    .checked_add(t)?
                    .checked_add(tokens_at)
            })
            .ok_or_else(|| bad("header counts overflow: corrupt".into()))?;
        if len != want {
            return Err(bad(format!(
                "{len} bytes but the header ({n_docs} documents, {n_tokens} tokens) needs {want}: truncated or corrupt"
            )));
        }
        let fingerprint = String::from_utf8(fp).map_err(|_| bad("fingerprint is not UTF-8".into()))?;
        Ok(TokReader {
            path: path.into(),
            file,
            n_docs,
            n_tokens,
            fingerprint,
            tokens_at,
        })
    }

    /// Documents per unit, in order.
    pub fn unit_rows(&self) -> Vec<usize> {
        let n = self.n_docs as usize;
        (0..n.div_ceil(DOCS_PER_UNIT))
            .map(|u| DOCS_PER_UNIT.min(n - u * DOCS_PER_UNIT))
            .collect()
    }

    /// The documents of unit `u`.
    pub fn read_unit(&mut self, u: usize) -> Result<Vec<Vec<u32>>> {
        let first = (u * DOCS_PER_UNIT) as u64;
        let last = (first + DOCS_PER_UNIT as u64).min(self.n_docs);
        let offs = self.read_u64s(
            self.tokens_at + 4 * self.n_tokens + 8 * first,
            (last - first + 1) as usize,
        )?;
        let (lo, hi) = (offs[0], offs[offs.len() - 1]);
        if offs.windows(2).any(|w| w[0] > w[1]) || hi > self.n_tokens {
            return Err(DataError::TokShard {
                path: self.path.clone(),
                problem: "offsets are corrupt".into(),
            });
        }
        let raw = self.read_bytes(self.tokens_at + 4 * lo, 4 * (hi - lo) as usize)?;
        let toks: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
            .collect();
        Ok(offs
            .windows(2)
            .map(|w| toks[(w[0] - lo) as usize..(w[1] - lo) as usize].to_vec())
            .collect())
    }

    fn read_u64s(&mut self, at: u64, n: usize) -> Result<Vec<u64>> {
        let raw = self.read_bytes(at, n * 8)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    fn read_bytes(&mut self, at: u64, n: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        self.file
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.file.read_exact(&mut buf))
            .map_err(|e| DataError::TokShard {
                path: self.path.clone(),
                problem: format!("read failed: {e}"),
            })?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_round_trip_and_truncation_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.ftok");
        let mut w = TokWriter::create(&p, "bytes").unwrap();
        let docs: Vec<Vec<u32>> = (0..2500u32)
            .map(|i| (0..(i % 7)).map(|j| i * 10 + j).collect())
            .collect();
        for d in &docs {
            w.push(d).unwrap();
        }
        assert_eq!(w.finish().unwrap().0, 2500);
        let mut r = TokReader::open(&p).unwrap();
        assert_eq!(r.fingerprint, "bytes");
        assert_eq!(r.unit_rows(), vec![1024, 1024, 452]);
        let mut all = Vec::new();
        for u in 0..3 {
            all.extend(r.read_unit(u).unwrap());
        }
        assert_eq!(all, docs);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 5]).unwrap();
        let e = TokReader::open(&p).unwrap_err().to_string();
        assert!(e.contains("a.ftok") && e.contains("truncated"), "{e}");
        std::fs::write(&p, b"garbage garbage garbage garbage").unwrap();
        assert!(TokReader::open(&p).unwrap_err().to_string().contains("magic"));
    }
}
