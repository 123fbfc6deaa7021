//! Validation loss and bits per byte on a held-out shard, through the training attention path and
//! through exact causal attention. The gap between the two is the leakage signal: a kernel that
//! lets masked future tokens influence earlier outputs scores well through itself and worse
//! through exact attention (paper section 4.5; hopper-kernels.md section 5).
//!
//! Each document is tokenised as `[prefix] + encode(text)` and cut into disjoint windows of at most
//! `seq_len` predicted tokens (window `k` feeds tokens `[k*L, (k+1)*L)` and predicts
//! `[k*L+1, (k+1)*L]`, each window its own causal document). Every token of `encode(text)` is
//! predicted exactly once, so bits per byte = total NLL / ln 2 / UTF-8 bytes of the texts.

use crate::error::{Error, Result};
use crate::loader::read_records;
use crate::scorer::{AttnMode, LanguageModel};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Validation options.
#[derive(Debug, Clone, Copy)]
pub struct ValidationOptions {
    /// Predicted tokens per window (at most the model's `max_len`).
    pub seq_len: usize,
    /// Windows per [`LanguageModel::score_tokens`] call.
    pub batch_size: usize,
}

/// Loss and bits per byte through one attention mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValStats {
    /// `training` or `exact`.
    pub attn: String,
    /// Mean negative log-likelihood per predicted token (nats).
    pub loss: f64,
    /// Total NLL in bits divided by the texts' UTF-8 bytes.
    pub bpb: f64,
    pub tokens: u64,
    pub bytes: u64,
    pub docs: usize,
}

/// Both modes side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationReport {
    /// The held-out file.
    pub source: String,
    pub seq_len: usize,
    /// The token every document was prefixed with (the model's BOS, or EOS without one).
    #[serde(default)]
    pub prefix_token: Option<u32>,
    pub training: ValStats,
    pub exact: ValStats,
    /// `exact.loss - training.loss`: near zero for a causally safe path; clearly positive when the
    /// training path leaks (it looks better through itself than through exact attention).
    pub gap_loss: f64,
    /// `exact.bpb - training.bpb`.
    pub gap_bpb: f64,
}

impl ValidationReport {
    /// The report of both passes over `source`, its gaps derived from them.
    pub fn new(
        source: String,
        seq_len: usize,
        prefix_token: u32,
        training: ValStats,
        exact: ValStats,
    ) -> Self {
        ValidationReport {
            source,
            seq_len,
            prefix_token: Some(prefix_token),
            gap_loss: exact.loss - training.loss,
            gap_bpb: exact.bpb - training.bpb,
            training,
            exact,
        }
    }
}

/// Tokenised windows of a set of documents, with the byte and token totals they predict.
#[derive(Debug, Clone, PartialEq)]
pub struct Windows {
    pub windows: Vec<Vec<u32>>,
    pub tokens: u64,
    pub bytes: u64,
    pub docs: usize,
}

/// Cuts `texts` into windows (see the module doc). Empty texts are skipped.
pub fn windows<M: LanguageModel + ?Sized>(model: &M, texts: &[String], seq_len: usize) -> Result<Windows> {
    if seq_len == 0 || seq_len > model.max_len() {
        return Err(Error::Invalid(format!(
            "validation seq_len {seq_len} must be in 1..={} (the model's context)",
            model.max_len()
        )));
    }
    let mut out = Windows {
        windows: Vec::new(),
        tokens: 0,
        bytes: 0,
        docs: 0,
    };
    for text in texts {
        let enc = model.encode(text)?;
        if enc.is_empty() {
            continue;
        }
        let mut toks = Vec::with_capacity(enc.len() + 1);
        toks.push(model.prefix_token());
        toks.extend(enc);
        let mut start = 1;
        while start < toks.len() {
            let end = (start + seq_len).min(toks.len());
            out.windows.push(toks[start - 1..end].to_vec());
            start = end;
        }
        out.tokens += (toks.len() - 1) as u64;
        out.bytes += text.len() as u64;
        out.docs += 1;
    }
    if out.windows.is_empty() {
        return Err(Error::Invalid(
            "validation shard has no non-empty document".into(),
        ));
    }
    Ok(out)
}

/// Loss and bits per byte of `w` through `attn`.
pub fn evaluate<M: LanguageModel + ?Sized>(
    model: &mut M,
    w: &Windows,
    attn: AttnMode,
    batch_size: usize,
) -> Result<ValStats> {
    let mut nll = 0.0f64;
    let mut counted = 0u64;
    for chunk in w.windows.chunks(batch_size.max(1)) {
        let scores = model.score_tokens(chunk, attn)?;
        if scores.len() != chunk.len() {
            return Err(Error::Scorer(format!(
                "returned {} rows for {} windows",
                scores.len(),
                chunk.len()
            )));
        }
        for (row, win) in scores.iter().zip(chunk) {
            if row.len() != win.len() - 1 {
                return Err(Error::Scorer(format!(
                    "returned {} token scores for a window of {} tokens (expected {})",
                    row.len(),
                    win.len(),
                    win.len() - 1
                )));
            }
            nll -= row.iter().map(|t| f64::from(t.logprob)).sum::<f64>();
            counted += row.len() as u64;
        }
    }
    debug_assert_eq!(counted, w.tokens);
    Ok(ValStats {
        attn: attn.name().to_string(),
        loss: nll / w.tokens as f64,
        bpb: nll / std::f64::consts::LN_2 / w.bytes as f64,
        tokens: w.tokens,
        bytes: w.bytes,
        docs: w.docs,
    })
}

/// Validation through the training path and through exact attention, and their gap.
pub fn report<M: LanguageModel + ?Sized>(
    model: &mut M,
    texts: &[String],
    opts: &ValidationOptions,
    source: &str,
) -> Result<ValidationReport> {
    let w = windows(model, texts, opts.seq_len)?;
    let training = evaluate(model, &w, AttnMode::Training, opts.batch_size)?;
    let exact = evaluate(model, &w, AttnMode::Exact, opts.batch_size)?;
    Ok(ValidationReport::new(
        source.to_string(),
        opts.seq_len,
        model.prefix_token(),
        training,
        exact,
    ))
}

/// Reads held-out documents: a `.txt` file is one document; `.jsonl`/`.json`/`.parquet` records
/// give their `column` field (FineWeb-Edu's is `text`). At most `limit` documents.
pub fn read_texts(path: &Path, column: &str, limit: Option<usize>) -> Result<Vec<String>> {
    if path.extension().and_then(|e| e.to_str()) == Some("txt") {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        return Ok(vec![text]);
    }
    read_records(path, limit)?
        .into_iter()
        .enumerate()
        .map(|(i, r)| match r.get(column) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            _ => Err(Error::Invalid(format!(
                "{}: record {i} has no string field {column:?} (choose the text column with --val-column)",
                path.display()
            ))),
        })
        .collect()
}
